"""Fixtures shared by every test folder; the helpers themselves live in helpers.py."""
import pytest
import torch

import helpers


@pytest.fixture
def cnn64():
    return helpers.cnn64()


@pytest.fixture
def images64():
    return helpers.images64()


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module's tests, restored after: results bit-identical to the subprocesses the audit
    and CLI tests start (OMP_NUM_THREADS=1), and tiny batches do not pay for thread start-up on a loaded machine.
    A module takes it with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

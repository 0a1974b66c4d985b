"""Fixtures shared by every test folder; the helpers themselves live in helpers.py."""
import pytest

import helpers


@pytest.fixture
def cnn64():
    return helpers.cnn64()


@pytest.fixture
def images64():
    return helpers.images64()

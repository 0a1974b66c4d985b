"""The exact SIS loop's own cost (bench_exact.py's linear8-px and linear24-px): fast_sis with default options on a
near-free model (one linear layer), where the time is the loop's (scheduling, bookkeeping, kernels), not the
model's. The calibration cache is warm after the first round, as in a process that explains many batches."""
import pytest
import torch

import overinterp_fast as of
from overinterp_fast.methods import reference
from common import make_case


@pytest.mark.timeout(600)  # 5 rounds of 0.2 s on a quiet machine; minutes where 2 cores are shared by many jobs
@pytest.mark.parametrize("config", ["linear8-px", "linear24-px"])
def test_exact_loop(benchmark, config):
    model, images, features, p = make_case(config, None, torch.device("cpu"))
    of.fast_sis(model, images, 0.5, show_progress=False)  # warm: calibration, kernels, allocator
    benchmark.extra_info.update(images=images.shape[0], features=p)
    results = benchmark.pedantic(of.fast_sis, args=(model, images, 0.5), kwargs={"show_progress": False},
                                 rounds=5, iterations=1)
    # what was timed is exact SIS: the reference transcription (one image at a time) finds the same sets
    want = reference.sis(model, images, 0.5)
    assert [None if r.sis is None else r.sis.tolist() for r in results] == \
        [None if w.sis is None else w.sis.tolist() for w in want]

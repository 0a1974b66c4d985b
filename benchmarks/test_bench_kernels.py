"""Microbenchmarks of the compiled ops on the CPU (the kernel where the extension is built, else the pure-PyTorch
op; the benchmark's name says which): mask_apply, backselect_update, rect_fill and patch_gather at the sizes of
a small exact SIS job (256 candidates of 3 x 16 x 16 images, p = 256), a batch of responsibility mutants and an
incremental-inference window."""
import pytest
import torch

from overinterp_fast import ops
from overinterp_fast.ops import kernels

GEN = torch.Generator().manual_seed(0)


def _impl(name: str) -> str:
    return next(r.implementation for r in ops.ops_info(["cpu"]) if r.op == name)


@pytest.fixture(scope="module")
def job():
    """Two 3 x 16 x 16 float32 images, pixel features (p = 256), 256 candidates: one step of both images."""
    n, c, s = 2, 3, 16
    p = s * s
    images = torch.randn(n, c, s, s, generator=GEN)
    baseline = torch.zeros(1, c, s, s)
    fmap = torch.arange(p).view(s, s).expand(c, s, s).contiguous()
    present = torch.rand(n, p, generator=GEN) < 0.7
    cand = torch.arange(256)
    return images, baseline, fmap, present, cand % n, cand % n, cand % p


def test_mask_apply(benchmark, job):
    images, baseline, fmap, present, image, row, feature = job
    benchmark.extra_info["implementation"] = _impl("mask_apply")
    out = benchmark(kernels.mask_apply, images, baseline, fmap, present, image, row, feature, False)
    assert out.shape == (256, 3, 16, 16)


def test_backselect_update(benchmark):
    n, p = 64, 256
    benchmark.extra_info["implementation"] = _impl("backselect_update")
    scores = torch.rand(n, p + 1, generator=GEN, dtype=torch.float64)
    rows, counts, steps = torch.arange(n), torch.full((n,), p), torch.zeros(n, dtype=torch.int64)

    def fresh():  # each round starts from every feature present: the update runs in place
        remaining = torch.cat([torch.arange(p).expand(n, p), torch.full((n, 1), -1)], 1).contiguous()
        state = (remaining, torch.ones(n, p, dtype=torch.bool), torch.full((n, p), -1, dtype=torch.int64),
                 torch.zeros(n, p, dtype=torch.float64))
        return (scores, rows, counts, steps, *state, False), {}

    benchmark.pedantic(kernels.backselect_update, setup=fresh, rounds=200, iterations=1)
    (_, _, _, _, remaining, present, order, values, _), _ = fresh()
    kernels.backselect_update(scores, rows, counts, steps, remaining, present, order, values, False)
    # the step's choice, from the scores alone: each row's best candidate (torch.argmax: the first, the lowest id)
    want = scores[:, :p].argmax(1)
    assert torch.equal(order[:, 0], want) and torch.equal(values[:, 0], scores[:, :p].amax(1))
    assert not present[torch.arange(n), want].any() and present.sum() == n * (p - 1)


def test_rect_fill(benchmark):
    """The coverage of 32 images' mutants: 14 x 4 rectangles each on 224 x 224 maps."""
    r, n, s = 32 * 14 * 4, 32, 224
    y0, x0 = torch.randint(0, s // 2, (2, r), generator=GEN)
    rects = torch.stack([y0, x0, y0 + s // 2, x0 + s // 2], 1)
    owner, weights = torch.arange(r) % n, torch.ones(r, dtype=torch.int64)
    benchmark.extra_info["implementation"] = _impl("rect_fill")
    out = benchmark(kernels.rect_fill, rects, owner, weights, n, s, s, False)
    assert out.shape == (n, s, s)


def test_patch_gather(benchmark):
    """512 candidates' 8 x 8 windows of 16-channel 16 x 16 maps, each with a recomputed 4 x 4 patch."""
    n, c, s, b = 4, 16, 16, 512
    stored = torch.randn(n, c, s, s, generator=GEN)
    image = torch.arange(b) % n
    patch = torch.randn(b, c, 4, 4, generator=GEN)
    origin = torch.randint(0, s - 4, (b, 2), generator=GEN)
    valid = torch.cat([origin, origin + 4], 1)
    region = origin - 2
    benchmark.extra_info["implementation"] = _impl("patch_gather")
    out, _ = benchmark(kernels.patch_gather, stored, image, patch, origin, valid, region, 8, 8, 0.0, False)
    assert out.shape == (b, c, 8, 8)

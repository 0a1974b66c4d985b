"""Causal responsibility maps and minimal pixel sets (method="responsibility")."""
import pytest
import torch
from torch import nn

import overinterp_fast as of

from conftest import assert_sets_sufficient, make_cnn, make_images


class PatchModel(nn.Module):
    """Class 0 wins when at least ~30% of a known patch's evidence is present; nothing else matters."""

    def __init__(self, rows=slice(4, 12), cols=slice(14, 22)):
        super().__init__()
        self.rows, self.cols = rows, cols

    def forward(self, x):
        patch = x[:, 0, self.rows, self.cols]
        s = patch.flatten(1).sum(1) - 0.3 * patch[0].numel()
        return torch.stack([s, torch.zeros_like(s)], 1)


def patch_images(n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return 0.5 + torch.rand(n, 3, 24, 32, generator=g)


def test_planted_evidence_mps_inside_the_patch():
    model = PatchModel().eval()
    x = patch_images()
    res = of.fast_sis(model, x, method="responsibility", iterations=20, refine=False)  # ReX's settings
    inside = torch.zeros(24, 32, dtype=torch.bool)
    inside[model.rows, model.cols] = True
    for r in res:
        assert r.sis is not None and r.mask.any()
        assert not (r.mask & ~inside).any(), "MPS pixels outside the planted patch"
        assert r.queries > 0 and r.order.numel() == 24 * 32


def test_every_mps_restores_the_top1_class():
    model = make_cnn(2, torch.float32, h=12, w=12)
    images = make_images(4, h=12, w=12, seed=4, dtype=torch.float32)
    res = of.fast_sis(model, images, method="responsibility", iterations=5, collection=True,
                      refine=False)
    assert assert_sets_sufficient(model, images, res, criterion="top1", rel=1e-5) == sum(len(r.collection) for r in res)
    for r in res:
        for c in r.collection:  # steps of 10 pixels, or all that the round had
            assert c.sis.numel() % 10 == 0 or c.sis.numel() == c.order.numel()


def test_deterministic_for_a_seed_and_batching_invariant():
    model = make_cnn(2, torch.float32, h=12, w=12)
    images = make_images(3, h=12, w=12, seed=4, dtype=torch.float32)
    a = of.responsibility(model, images, iterations=4, seed=3)
    b = of.responsibility(model, images, iterations=4, seed=3, batch_size=7)
    c = of.responsibility(model, images, iterations=4, seed=4)
    alone = of.responsibility(model, images[1:2], iterations=4, seed=3)
    for x, y in zip(a, b):
        assert torch.equal(x.map, y.map) and x.queries == y.queries
    assert torch.equal(alone[0].map, a[1].map)
    assert any(not torch.equal(x.map, y.map) for x, y in zip(a, c))
    assert all(m.map.shape == (12, 12) and m.map.dtype == torch.float64 for m in a)


def test_batched_descent_equals_the_plain_transcription():
    """All iterations of all images in one batch per level (duplicate mutants scored once) give
    the map of ReX's loop run one image, one iteration, one box at a time."""
    model = make_cnn(2, torch.float32, h=12, w=12)
    images = make_images(3, h=12, w=12, seed=4, dtype=torch.float32)
    fast = of.responsibility(model, images, iterations=6, seed=2, min_box=4)
    plain = of.reference.responsibility(model, images, iterations=6, seed=2, min_box=4)
    for a, (ref_map, ref_queries) in zip(fast, plain):
        torch.testing.assert_close(a.map, ref_map, rtol=0, atol=1e-12)
        assert 0 < a.queries <= ref_queries
    assert sum(a.queries for a in fast) < sum(q for _, q in plain), "no duplicate mutant was shared"
    assert any(bool((m.map != m.map.flatten()[0]).any()) for m in fast), "flat maps test nothing"
    with pytest.raises(ValueError, match="iterations"):
        of.reference.responsibility(model, images, iterations=0)


def test_tiny_image_below_the_minimum_box():
    x = 0.5 + torch.rand(2, 1, 3, 3)
    model = PatchModel(slice(0, 3), slice(0, 3)).eval()
    maps = of.responsibility(model, x)
    assert all(m.queries == 0 and torch.equal(m.map, torch.zeros(3, 3, dtype=torch.float64)) for m in maps)
    res = of.fast_sis(model, x, method="responsibility")
    assert all(r.sis is not None for r in res)


def test_mps_that_needs_the_whole_image():
    class AllPixels(nn.Module):
        def forward(self, t):
            s = t.flatten(1).sum(1)
            full = 3 * 12 * 12 * 1.0
            return torch.stack([s - (full - 0.5), torch.zeros_like(s)], 1)

    x = torch.ones(1, 3, 12, 12)
    res = of.fast_sis(AllPixels().eval(), x, method="responsibility", iterations=3)
    assert res[0].sis.numel() == 144 and res[0].mask.all()


def test_collection_gives_disjoint_sets():
    model = PatchModel().eval()
    x = patch_images(2)
    res = of.fast_sis(model, x, method="responsibility", iterations=5, collection=True)
    for r in res:
        assert len(r.collection) >= 2
        seen = torch.zeros(24, 32, dtype=torch.bool)
        for c in r.collection:
            assert not (c.mask & seen).any()
            assert c.order.numel() == 24 * 32 - int(seen.sum())  # each round ranks only what is left
            seen |= c.mask
    assert assert_sets_sufficient(model, x, res, criterion="top1", rel=1e-5) == sum(len(r.collection) for r in res)


def test_threshold_criterion_and_bad_options():
    model = make_cnn(2, torch.float32, h=12, w=12)
    images = make_images(2, h=12, w=12, seed=4, dtype=torch.float32)
    with torch.no_grad():
        f = torch.softmax(model(images), 1).max(1).values
    res = of.fast_sis(model, images, 0.9 * f, method="responsibility", criterion="threshold", iterations=3)
    assert all(r.sis_score >= r.threshold for r in res)
    assert assert_sets_sufficient(model, images, res, rel=1e-5) == 2
    with pytest.raises(ValueError, match="criterion"):
        of.fast_sis(model, images, method="responsibility", criterion="top5")
    with pytest.raises(ValueError, match="iterations"):
        of.responsibility(model, images, iterations=0)
    with pytest.raises(ValueError, match="default pixel features"):
        of.fast_sis(model, images, method="responsibility", features=torch.zeros(12, 12, dtype=torch.int64))


def test_sufficient_subset_equals_a_sequential_scan():
    model = make_cnn(1)
    images = make_images(3, seed=9)
    g = torch.Generator().manual_seed(0)
    ranking = torch.randint(0, 5, (3, 5, 5), generator=g).double()  # ties: higher pixel index first
    with torch.no_grad():
        f = torch.softmax(model(images), 1).max(1).values
    tau = (0.9 * f).tolist()
    res = of.sufficient_subset(model, images, ranking, tau)
    for i, r in enumerate(res):
        keys = [(-float(ranking[i].flatten()[j]), -j) for j in range(25)]
        order = [j for _, j in sorted(zip(keys, range(25)))]
        assert r.order.tolist() == order
        want = None
        for size in range(1, 26):
            keep = torch.zeros(25, dtype=torch.bool)
            keep[order[:size]] = True
            x = torch.where(keep.view(5, 5), images[i], torch.zeros((), dtype=images.dtype))
            with torch.no_grad():
                if float(torch.softmax(model(x[None]), 1)[0, r.target]) >= tau[i]:
                    want = order[:size]
                    break
        assert r.sis.tolist() == want

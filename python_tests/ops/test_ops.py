"""Each op: the compiled kernel against its pure-PyTorch version (overinterp_fast.ops.pure), both against
independent loop references and hand-built expectations, the shared index checks, torch.library.opcheck,
and the choice between kernel and pure version (self-check, fallback, OVERINTERP_FAST_OPS, ops_info).
"""
import itertools
import math
import subprocess
import sys
import json
import os
import warnings
import pytest
import torch
import overinterp_fast as of
from overinterp_fast.ops import kernels as _ops
from overinterp_fast.ops import pure as ops_torch
from overinterp_fast import ops
from overinterp_fast.ops.pure import PURE_OPS, PureOp
from helpers import backselect_update_ref, cuda, mask_apply_ref

IMPLS = {"kernel": lambda name: _ops.kernel(name), "torch": lambda name: PURE_OPS[name].fn}


@pytest.fixture(params=sorted(IMPLS))
def impl(request):
    """impl(name): the compiled kernel or the pure-PyTorch version of op ``name``."""
    return lambda name: IMPLS[request.param](name)


def random_case(device="cpu", dtype=torch.float32, n=3, c=2, h=4, w=5, per_image_baseline=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, c, h, w, generator=g).to(device, dtype)
    baseline = torch.randn(n if per_image_baseline else 1, c, h, w, generator=g).to(device, dtype)
    p = 7
    fm = torch.randint(0, p, (c, h, w), generator=g)
    fm.view(-1)[:p] = torch.arange(p)  # every id used
    fm = fm.to(device)
    present = (torch.rand(4, p, generator=g) > 0.3).to(device)
    b = 11
    img = torch.randint(0, n, (b,), generator=g).to(device)
    row = torch.randint(0, 4, (b,), generator=g).to(device)
    feat = torch.randint(-1, p, (b,), generator=g).to(device)
    return base, baseline, fm, present, img, row, feat


DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


def test_mask_apply_matches_the_loop_reference(impl):
    for dtype, per_image, channels_last in itertools.product(DTYPES, (False, True), (False, True)):
        args = random_case(dtype=dtype, per_image_baseline=per_image, seed=int(per_image))
        base = args[0].contiguous(memory_format=torch.channels_last) if channels_last else args[0]
        out = impl("mask_apply")(base, *args[1:])
        assert out.dtype == dtype and out.is_contiguous(memory_format=torch.channels_last) == channels_last
        assert torch.equal(out, mask_apply_ref(*args))


def test_mask_apply_kernel_equals_pure_version():
    for seed in range(6):
        for args in PURE_OPS["mask_apply"].sample(torch.device("cpu"), torch.Generator().manual_seed(seed)):
            got, want = _ops.kernel("mask_apply")(*args), ops_torch.mask_apply(*args)
            assert got.stride() == want.stride() and torch.equal(got, want)


def test_mask_apply_by_hand(impl):
    base = torch.tensor([[1.0, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]])
    fm = torch.tensor([0, 0, 1, 2, 2, 3])
    present = torch.tensor([[True, True, False, True]])
    img, row, feat = torch.tensor([1, 0]), torch.tensor([0, 0]), torch.tensor([3, -1])
    out = impl("mask_apply")(base, torch.full((1, 6), -1.0), fm, present, img, row, feat)
    # candidate 0: image 1 without feature 2 (absent) and feature 3 (removed); candidate 1: image 0 without 2
    assert out.tolist() == [[7, 8, 9, -1, -1, -1], [1, 2, 3, -1, -1, 6]]
    empty = torch.zeros(0, dtype=torch.int64)
    assert impl("mask_apply")(base, torch.zeros(1, 6), fm, present, empty, empty, empty).shape == (0, 6)


def test_mask_apply_rejects_bad_arguments(impl):
    f = impl("mask_apply")
    base, baseline, fm, present, img, row, feat = random_case()
    with pytest.raises(RuntimeError, match=r"mask_apply: cand_image 1[0-2] out of range \[0, 3\)"):
        f(base, baseline, fm, present, img + 10, row, feat)
    bad_row, bad_feat = row.clone(), feat.clone()
    bad_row[3], bad_feat[5] = -1, 7
    with pytest.raises(RuntimeError, match=r"mask_apply: cand_row -1 out of range \[0, 4\)"):
        f(base, baseline, fm, present, img, bad_row, feat)
    with pytest.raises(RuntimeError, match=r"mask_apply: cand_feature 7 out of range \[-1, 7\)"):
        f(base, baseline, fm, present, img, row, bad_feat)
    with pytest.raises(RuntimeError, match=r"mask_apply: feature_map id 10[0-6] out of range \[0, 7\)"):
        f(base, baseline, fm + 100, present, img, row, feat)
    with pytest.raises(RuntimeError, match="baseline dtype"):
        f(base, baseline.double(), fm, present, img, row, feat)
    with pytest.raises(RuntimeError, match="feature_map must be"):
        f(base, baseline, fm[0], present, img, row, feat)


def bookkeeping_case(device="cpu", seed=0):
    """6 rows, 11 features (12 slots), 4 distinct rows stepped; coarse scores make exact ties."""
    (case,) = PURE_OPS["backselect_update"].sample(torch.device(device), torch.Generator().manual_seed(seed))
    return case


def check_backselect_update(fn, device):
    for seed in range(20):
        got = bookkeeping_case(device, seed)
        want = [t.cpu().clone() for t in got]
        fn(*got)
        backselect_update_ref(*want)
        for a, b in zip(got, want):
            assert torch.equal(a.cpu(), b)


def test_backselect_update_matches_the_loop_reference(impl):
    check_backselect_update(impl("backselect_update"), "cpu")


def test_backselect_update_kernel_equals_pure_version():
    for seed in range(10):
        for case in PURE_OPS["backselect_update"].sample(torch.device("cpu"), torch.Generator().manual_seed(seed)):
            got, want = [t.clone() for t in case], [t.clone() for t in case]
            _ops.kernel("backselect_update")(*got)
            ops_torch.backselect_update(*want)
            assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_backselect_update_tie_goes_to_lowest_feature(impl):
    scores = torch.tensor([[0.5, 0.7, 0.7, 0.1, 0.0]], dtype=torch.float64)
    remaining = torch.tensor([[3, 2, 0, 1, -1]])
    present = torch.ones(1, 4, dtype=torch.bool)
    order = torch.full((1, 4), -1)
    values = torch.zeros(1, 4, dtype=torch.float64)
    one = torch.tensor([0])
    impl("backselect_update")(scores, one, torch.tensor([4]), one, remaining, present, order, values)
    assert order[0, 0] == 0 and values[0, 0] == 0.7  # features 2 and 0 tie at 0.7
    assert remaining[0].tolist() == [3, 2, 1, -1, -1] and present[0].tolist() == [False, True, True, True]


def test_backselect_update_with_nan_scores_still_picks_a_scored_feature(impl):
    """The engines raise on non-finite scores afterwards; the step itself must stay well formed."""
    for row_scores in ([float("nan")] * 4, [0.2, float("nan"), 0.9, float("nan")], [float("nan"), 0.1, 0.3, 0.2]):
        scores = torch.tensor([row_scores + [0.0]], dtype=torch.float64)
        remaining = torch.tensor([[2, 0, 3, 1, -1]])
        present, order = torch.ones(1, 4, dtype=torch.bool), torch.full((1, 4), -1)
        one = torch.tensor([0])
        impl("backselect_update")(scores, one, torch.tensor([4]), one, remaining, present, order,
                                  torch.zeros(1, 4, dtype=torch.float64))
        picked = int(order[0, 0])
        assert picked in (0, 1, 2, 3) and not present[0, picked] and int(present.sum()) == 3
        assert sorted(remaining[0, :3].tolist()) == sorted({0, 1, 2, 3} - {picked}) and remaining[0, 3] == -1


def test_backselect_update_rejects_bad_arguments(impl):
    f = impl("backselect_update")
    for k, bad_value, message in ((1, 6, r"row 6 out of range \[0, 6\)"), (2, 0, r"count 0 out of range \[1, 12\)"),
                                  (2, 12, r"count 12 out of range \[1, 12\)"), (3, 11, r"step 11 out of range \[0, 11\)")):
        args = bookkeeping_case()
        args[k] = args[k].clone()
        args[k][1] = bad_value
        with pytest.raises(RuntimeError, match="backselect_update: " + message):
            f(*args)
    args = bookkeeping_case()
    args[4][args[1][0], 0] = -1  # a stepped row: a hole among its scored features
    with pytest.raises(RuntimeError, match=r"backselect_update: remaining feature -1 out of range \[0, 11\)"):
        f(*args)
    bad = bookkeeping_case()
    bad[0] = bad[0].float()
    with pytest.raises(RuntimeError, match="float64"):
        f(*bad)


def rect_fill_ref(rects, owner, weights, n, h, w):
    """Paints each rectangle: independent of the difference arrays of both implementations."""
    out = torch.zeros(n, h, w, dtype=torch.int64)
    for (y0, x0, y1, x1), o, wt in zip(rects.tolist(), owner.tolist(), weights.tolist()):
        y0, y1 = min(max(y0, 0), h), min(max(y1, 0), h)
        x0, x1 = min(max(x0, 0), w), min(max(x1, 0), w)
        out[o, y0:y1, x0:x1] += wt
    return out


def test_rect_fill_matches_painting_and_kernel_equals_pure_version(impl):
    for seed in range(6):
        for case in PURE_OPS["rect_fill"].sample(torch.device("cpu"), torch.Generator().manual_seed(seed)):
            got = impl("rect_fill")(*case)
            assert torch.equal(got, rect_fill_ref(*case))
            assert torch.equal(got, _ops.kernel("rect_fill")(*case))
    by_hand = impl("rect_fill")(torch.tensor([[0, 0, 2, 2], [1, 1, 9, 3]]), torch.tensor([0, 0]),
                                torch.tensor([2, -1]), 1, 3, 3)
    assert by_hand.tolist() == [[[2, 2, 0], [2, 1, -1], [0, -1, -1]]]


def test_rect_fill_checks_owner_even_when_nothing_is_painted(impl):
    """The owner check comes before any early return (n, height or width 0), as on the CPU before."""
    f = impl("rect_fill")
    rect, one = torch.tensor([[0, 0, 1, 1]]), torch.tensor([1])
    for n, h, w in ((0, 3, 3), (2, 0, 3), (2, 3, 0), (1, 3, 3)):
        with pytest.raises(RuntimeError, match=r"rect_fill: owner %d out of range \[0, %d\)" % (n, n)):
            f(rect, torch.tensor([n]), one, n, h, w)
        with pytest.raises(RuntimeError, match=r"rect_fill: owner -1 out of range \[0, %d\)" % n):
            f(rect, torch.tensor([-1]), one, n, h, w)
    empty, z = torch.zeros(0, 4, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)
    assert torch.equal(f(empty, z, z, 2, 3, 4), torch.zeros(2, 3, 4, dtype=torch.int64))


def test_rect_fill_check_indices_false_skips_only_the_owner_check(impl):
    """check_indices=False (the responsibility paintings, whose owners are checked on the host where they are
    made) paints the same maps as the painting reference."""
    for case in PURE_OPS["rect_fill"].sample(torch.device("cpu"), torch.Generator().manual_seed(3)):
        assert torch.equal(impl("rect_fill")(*case, False), rect_fill_ref(*case))
    with pytest.raises(RuntimeError, match=r"rect_fill: owner 1 out of range \[0, 1\)"):
        impl("rect_fill")(torch.tensor([[0, 0, 1, 1]]), torch.tensor([1]), torch.tensor([1]), 1, 3, 3)


def test_opcheck_mask_apply():
    for per_image in (False, True):
        args = random_case(per_image_baseline=per_image)
        torch.library.opcheck(torch.ops.overinterp_fast.mask_apply.default, args)
    base, baseline, fm, present, img, row, feat = random_case()
    cl = (base.contiguous(memory_format=torch.channels_last), baseline, fm, present, img, row, feat)
    torch.library.opcheck(torch.ops.overinterp_fast.mask_apply.default, cl)


def test_opcheck_backselect_update():
    torch.library.opcheck(torch.ops.overinterp_fast.backselect_update.default, bookkeeping_case())


def test_opcheck_rect_fill():
    (case,) = PURE_OPS["rect_fill"].sample(torch.device("cpu"), torch.Generator().manual_seed(0))
    torch.library.opcheck(torch.ops.overinterp_fast.rect_fill.default, case)


# ------------------------------------------------------------ choosing kernel or pure version


def test_every_extension_op_has_a_pure_version_and_a_self_check_case():
    names = _ops.extension_ops()
    assert {"mask_apply", "backselect_update", "rect_fill"} <= set(names)
    missing = sorted(set(names) - set(PURE_OPS))
    assert not missing, f"ops without a pure-PyTorch version in overinterp_fast/ops/pure.py: {missing}"
    for name in names:
        assert PURE_OPS[name].sample(torch.device("cpu"), torch.Generator().manual_seed(0))


def sample_cases(name, seeds=(_ops._SELF_CHECK_SEED, 1, 2)):
    return [case for seed in seeds
            for case in PURE_OPS[name].sample(torch.device("cpu"), torch.Generator().manual_seed(seed))]


def test_self_check_cases_reach_every_branch_of_the_kernels():
    """The self-check (and the kernel-against-pure tests that reuse its cases) is only as good as its cases:
    each op's cases must hold every layout, dtype and edge its kernels branch on, within the valid ranges."""
    cases = sample_cases("mask_apply")
    seen = set()
    for base, baseline, fm, present, img, row, feat in cases:
        n, p = base.shape[0], present.shape[1]
        seen |= {base.dtype, ("channels_last", ops_torch.is_channels_last(base)), ("per_image", baseline.shape[0] > 1)}
        assert fm.shape == base.shape[1:] and img.shape == row.shape == feat.shape and img.numel() > n
        assert 0 <= int(img.min()) and int(img.max()) < n and 0 <= int(row.min()) and int(row.max()) < len(present)
        assert int(feat.min()) == -1 and int(feat.max()) < p and bool((feat >= 0).any())  # -1: nothing removed
        assert 0 <= int(fm.min()) and int(fm.max()) < p and present.any() and not present.all()
        assert len(set(fm.flatten().tolist())) > 1 and bool((baseline != base[:1]).all())
    assert seen == {torch.float32, torch.float16, ("channels_last", True), ("channels_last", False),
                    ("per_image", True), ("per_image", False)}

    for scores, rows, counts, steps, remaining, present, order, values in sample_cases("backselect_update"):
        n, p = present.shape
        assert scores.shape == remaining.shape == (n, p + 1) and order.shape == values.shape == (n, p)
        assert 0 < rows.numel() < n and len(set(rows.tolist())) == rows.numel()  # some rows, not all
        assert counts.tolist() == [int(present[r].sum()) for r in rows.tolist()]
        assert int(counts.min()) >= 1 and 0 <= int(steps.min()) and int(steps.max()) < p
        for r in range(n):
            k = int(present[r].sum())
            ids = remaining[r, :k]
            assert sorted(ids.tolist()) == sorted(present[r].nonzero().flatten().tolist())
            assert bool((remaining[r, k:] == -1).all())
        scored = [scores[r, :c] for r, c in zip(rows.tolist(), counts.tolist())]
        assert any(int((s == s.max()).sum()) > 1 for s in scored)  # exact ties among the best scores
        assert bool((order == -1).all()) and bool((values == 0).all())

    for rects, owner, weights, n, h, w in sample_cases("rect_fill"):
        y0, x0, y1, x1 = rects.unbind(1)
        assert bool(((y0 < 0) | (x0 < 0)).any()) and bool(((y1 > h) | (x1 > w)).any())  # clipped at every side
        assert bool(((y0 >= y1) | (x0 >= x1)).any())  # empty or inverted
        inside = (y0 >= 0) & (x0 >= 0) & (y1 <= h) & (x1 <= w) & (y0 < y1) & (x0 < x1)
        assert bool(inside.any()) and set(owner.tolist()) == set(range(n))
        assert bool((weights < 0).any()) and bool((weights > 1).any()) and bool((weights == 0).any())

    seen = set()
    for stored, image, patch, origin, valid, region, height, width, pad in sample_cases("patch_gather"):
        b, (_, _, hh, ww) = image.numel(), stored.shape
        seen |= {("channels_last", ops_torch.is_channels_last(stored)), ("patch", patch.numel() > 0), ("pad", pad)}
        assert stored.dtype == torch.float64 and 0 <= int(image.min()) and int(image.max()) < stored.shape[0]
        assert origin.shape == region.shape == (b, 2) and valid.shape == (b, 4)
        assert bool((region < 0).any()) and bool((region[:, 0] + height > hh).any())  # windows leave the map
        if patch.numel() > 0:
            assert patch.shape[:2] == (b, stored.shape[1])
            assert bool((origin < 0).any())  # patches hanging over the map's edge
            ph, pw = patch.shape[2:]
            narrower = (valid[:, 0] > origin[:, 0]) | (valid[:, 2] < origin[:, 0] + ph)
            assert bool(narrower.any()) and bool((~narrower).any())  # valid cuts some patches, not all
            under = torch.tensor([stored[i, :, max(y, 0):y + ph, max(x, 0):x + pw].numel() > 0
                                 for i, (y, x) in zip(image.tolist(), origin.tolist())])
            assert bool(under.all())
    assert seen == {("channels_last", True), ("channels_last", False), ("patch", True), ("patch", False),
                    ("pad", 0.0), ("pad", -math.inf)}


def test_self_check_cases_are_reproducible_and_use_every_index():
    """The cases come from the generator alone (a failed self-check can be replayed), and the self-check's own
    seed reaches every image, row and feature id, a row's last feature and empty windows."""
    for name in PURE_OPS:
        a, b, other = (sample_cases(name, (seed,)) for seed in (_ops._SELF_CHECK_SEED, _ops._SELF_CHECK_SEED, 1))
        assert len(a) == len(b) == len(other)
        for ca, cb, co in zip(a, b, other):
            for xa, xb in zip(ca, cb):
                assert type(xa) is type(xb)
                assert torch.equal(xa, xb) if isinstance(xa, torch.Tensor) else xa == xb
        assert any(not torch.equal(xa, xo) for ca, co in zip(a, other) for xa, xo in zip(ca, co)
                   if isinstance(xa, torch.Tensor) and xa.shape == xo.shape)
    seed = (_ops._SELF_CHECK_SEED,)
    for base, baseline, fm, present, img, row, feat in sample_cases("mask_apply", seed):
        assert set(img.tolist()) == set(range(base.shape[0])) and set(row.tolist()) == set(range(len(present)))
        assert set(fm.flatten().tolist()) == set(range(present.shape[1]))
    (case,) = sample_cases("backselect_update", seed)
    assert 1 in case[2].tolist()  # a row whose last remaining feature goes
    combos = set()
    for stored, image, patch, origin, valid, *_ in sample_cases("patch_gather", seed):
        combos.add((ops_torch.is_channels_last(stored), patch.numel() > 0))
        assert set(image.tolist()) == set(range(stored.shape[0]))
        assert bool(((valid[:, 2] <= valid[:, 0]) | (valid[:, 3] <= valid[:, 1])).any())  # empty valid windows
        if patch.numel():
            ph, pw = patch.shape[2:]
            same = patch == stored[image][:, :, :ph, :pw]
            assert bool(same.any()) and not bool(same.all())  # patch values equal to the stored ones, and not
    assert combos == {(False, True), (True, True), (False, False)}


@pytest.fixture
def fresh_choices(monkeypatch):
    """Forget earlier choices, self-check on the CPU too (as on each CUDA device), restore afterwards."""
    monkeypatch.setattr(_ops, "_choices", {})
    monkeypatch.setattr(_ops, "SELF_CHECK_DEVICE_TYPES", {"cpu", "cuda"})
    monkeypatch.delenv(_ops.ENV_VAR, raising=False)


def info(op, device="cpu"):
    (row,) = [r for r in of.ops_info([device]) if r.op == op]
    return row


def test_self_check_passes_on_the_real_kernels(fresh_choices):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rows = of.ops_info(["cpu"])
    assert {r.op for r in rows} == set(PURE_OPS)
    for r in rows:
        assert (r.implementation, r.reason) == ("kernel", "passed its self-check on cpu"), str(r)


def _broken(real, name, how):
    def kernel(*args):
        if how == "launch error":
            raise RuntimeError("CUDA error: unspecified launch failure\nCUDA kernel errors might be reported later")
        out = real(*args)
        if name == "backselect_update" and how == "in place":
            args[7].add_(1.0)  # values written wrong
        elif out is not None:
            out.as_strided((1,), (1,)).add_(1)  # one element wrong
        return out

    return kernel


@pytest.mark.parametrize("name,how", [("mask_apply", "result"), ("rect_fill", "result"),
                                      ("backselect_update", "in place"), ("mask_apply", "launch error")])
def test_a_failed_self_check_warns_once_and_uses_the_pure_version(fresh_choices, monkeypatch, name, how):
    real_kernel = _ops.kernel
    monkeypatch.setattr(_ops, "kernel", lambda n: _broken(real_kernel(n), n, how) if n == name else real_kernel(n))
    case = PURE_OPS[name].sample(torch.device("cpu"), torch.Generator().manual_seed(99))[0]
    want = [a.clone() if isinstance(a, torch.Tensor) else a for a in case]
    want_out = PURE_OPS[name].fn(*want)
    with pytest.warns(RuntimeWarning, match=f"the {name} kernel failed its self-check on cpu") as caught:
        for _ in range(3):
            got = [a.clone() if isinstance(a, torch.Tensor) else a for a in case]
            out = getattr(ops, name)(*got)
    assert len([w for w in caught if "self-check" in str(w.message)]) == 1
    assert (out is None and want_out is None) or torch.equal(out, want_out)
    assert all(torch.equal(a, b) for a, b in zip(got, want) if isinstance(a, torch.Tensor))
    row = info(name)
    assert row.implementation == "torch" and row.reason.startswith("failed its self-check on cpu")
    if how == "launch error":
        assert "RuntimeError: CUDA error: unspecified launch failure" in row.reason
    others = [r for r in of.ops_info(["cpu"]) if r.op != name]
    assert all(r.implementation == "kernel" for r in others)


def test_env_var_selects_the_pure_versions(fresh_choices, monkeypatch):
    calls = []
    spec = PURE_OPS["mask_apply"]
    monkeypatch.setitem(PURE_OPS, "mask_apply", PureOp("mask_apply", lambda *a: calls.append(1) or spec.fn(*a),
                                                       spec.sample))
    args = random_case()
    monkeypatch.setenv(_ops.ENV_VAR, "torch")
    assert torch.equal(ops.mask_apply(*args), mask_apply_ref(*args)) and calls == [1]
    assert all((r.implementation, r.reason) == ("torch", "OVERINTERP_FAST_OPS=torch") for r in of.ops_info(["cpu"]))
    monkeypatch.setenv(_ops.ENV_VAR, "auto")
    ops.mask_apply(*args)  # the first use self-checks the kernel against the pure version
    calls.clear()
    assert torch.equal(ops.mask_apply(*args), mask_apply_ref(*args)) and calls == []
    assert info("mask_apply").implementation == "kernel"
    monkeypatch.setenv(_ops.ENV_VAR, "cuda")
    with pytest.raises(ValueError, match="OVERINTERP_FAST_OPS must be one of"):
        ops.mask_apply(*args)


def test_a_device_without_kernels_uses_the_pure_versions(fresh_choices, monkeypatch):
    monkeypatch.setattr(_ops, "_has_kernel", lambda name, device_type: False)
    args = random_case()
    with pytest.warns(RuntimeWarning, match="no compiled cpu kernel for") as caught:
        assert torch.equal(ops.mask_apply(*args), mask_apply_ref(*args))
        assert all(r.reason == "the extension has no cpu kernel" for r in of.ops_info(["cpu"]))
        ops.mask_apply(*args)
    assert len(caught) == len(PURE_OPS)  # once per op


def test_an_extension_built_from_older_sources_uses_pure_versions_for_its_missing_ops(fresh_choices, monkeypatch):
    # A .so built before an op was added loads, but does not define that op: that op falls back, the rest don't.
    defined = [n for n in _ops.extension_ops() if n != "mask_apply"]
    monkeypatch.setattr(_ops, "extension_ops", lambda: defined)
    monkeypatch.setattr(_ops, "SELF_CHECK_DEVICE_TYPES", {"cuda"})
    args = random_case()
    with pytest.warns(RuntimeWarning, match="does not define mask_apply") as caught:
        assert torch.equal(ops.mask_apply(*args), mask_apply_ref(*args))
        ops.mask_apply(*args)
    assert len(caught) == 1
    by_op = {r.op: r for r in of.ops_info(["cpu"])}
    assert by_op["mask_apply"].implementation == "torch" and "does not define it" in by_op["mask_apply"].reason
    assert all(r.implementation == "kernel" for name, r in by_op.items() if name != "mask_apply")


MISSING_EXTENSION = """
import json, sys, warnings
sys.modules["overinterp_fast._C"] = None  # what a missing or unloadable extension looks like to the import
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import torch, overinterp_fast as of
    sys.path.insert(0, "python_tests")
    from helpers import make_cnn, make_images
    model, x = make_cnn(0), make_images(2)
    exact = of.fast_sis(model, x, 0.5)
    resp = of.fast_sis(model, x, method="responsibility", options=of.MinimalPixelSetOptions(iterations=2))
print(json.dumps({
    "warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)],
    "loaded": of.ops.extension_loaded(),
    "info": [[r.op, r.implementation, r.reason] for r in of.ops_info(["cpu"])],
    "exact": [r.order.tolist() for r in exact], "resp": [r.order.tolist() for r in resp],
}))
"""


def test_without_the_extension_everything_runs_on_the_pure_versions():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop(_ops.ENV_VAR, None)
    proc = subprocess.run([sys.executable, "-c", MISSING_EXTENSION], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not got["loaded"]
    assert len(got["warnings"]) == 1 and "compiled extension could not be loaded" in got["warnings"][0]
    assert all(impl == "torch" and "could not be loaded" in why for _, impl, why in got["info"])
    from helpers import make_cnn, make_images

    model, x = make_cnn(0), make_images(2)
    assert got["exact"] == [r.order.tolist() for r in of.fast_sis(model, x, 0.5)]
    assert got["resp"] == [r.order.tolist() for r in of.fast_sis(model, x, method="responsibility",
                                                                 options=of.MinimalPixelSetOptions(iterations=2))]


# ------------------------------------------------------------------------------------------ CUDA


@cuda
def test_kernels_equal_pure_versions_cuda():
    assert ops.has_cuda_kernels()
    dev = torch.device("cuda")
    for name, spec in PURE_OPS.items():
        for seed in range(5):
            for case in spec.sample(dev, torch.Generator().manual_seed(seed)):
                got = [a.clone() if isinstance(a, torch.Tensor) else a for a in case]
                want = [a.clone() if isinstance(a, torch.Tensor) else a for a in case]
                out, ref = _ops.kernel(name)(*got), spec.fn(*want)
                # None (in-place ops), one tensor, or a tuple of tensors (patch_gather: windows, changed)
                outs, refs = (out, ref) if isinstance(out, tuple) else ((out,), (ref,))
                assert len(outs) == len(refs)
                for o, r in zip(outs, refs):
                    assert (o is None and r is None) or (o.stride() == r.stride() and torch.equal(o, r))
                assert all(torch.equal(a, b) for a, b in zip(got, want) if isinstance(a, torch.Tensor))
    args = random_case("cuda")
    assert torch.equal(_ops.kernel("mask_apply")(*args).cpu(), mask_apply_ref(*random_case()))
    check_backselect_update(_ops.kernel("backselect_update"), "cuda")


@cuda
def test_cuda_kernels_check_indices_on_the_host():
    """A bad index raises the CPU's RuntimeError and leaves the CUDA context usable."""
    args = list(random_case("cuda"))
    args[4] = args[4] + 10
    with pytest.raises(RuntimeError, match="cand_image .* out of range"):
        _ops.kernel("mask_apply")(*args)
    bad = bookkeeping_case("cuda")
    bad[2] = bad[2] + 100
    with pytest.raises(RuntimeError, match="count .* out of range"):
        _ops.kernel("backselect_update")(*bad)
    with pytest.raises(RuntimeError, match="owner 1 out of range"):
        _ops.kernel("rect_fill")(torch.tensor([[0, 0, 1, 1]], device="cuda"), torch.tensor([1], device="cuda"),
                                 torch.tensor([1], device="cuda"), 0, 3, 3)
    torch.cuda.synchronize()
    assert torch.equal(_ops.kernel("mask_apply")(*random_case("cuda")).cpu(), mask_apply_ref(*random_case()))


@cuda
def test_ops_info_cuda_self_check():
    rows = of.ops_info(["cuda:0"])
    assert all(r.implementation == "kernel" and r.reason == "passed its self-check on cuda:0" for r in rows), rows


@cuda
def test_opcheck_cuda():
    torch.library.opcheck(torch.ops.overinterp_fast.mask_apply.default, random_case("cuda"))
    torch.library.opcheck(torch.ops.overinterp_fast.backselect_update.default, bookkeeping_case("cuda"))
    (case,) = PURE_OPS["rect_fill"].sample(torch.device("cuda"), torch.Generator().manual_seed(0))
    torch.library.opcheck(torch.ops.overinterp_fast.rect_fill.default, case)


def patch_gather_ref(stored, image, patch, patch_origin, valid, region_origin, h, w, pad_value):
    """Plain PyTorch: one candidate at a time, the map rebuilt in full; changed looks only inside the region."""
    outs, changed = [], []
    for b in range(image.numel()):
        m = stored[image[b]].clone()
        ry, rx = region_origin[b].tolist()
        diff = False
        if patch is not None:
            py, px = patch_origin[b].tolist()
            y0, x0, y1, x1 = valid[b].tolist()
            for y in range(max(y0, py, 0), min(y1, py + patch.shape[2], m.shape[1])):
                for x in range(max(x0, px, 0), min(x1, px + patch.shape[3], m.shape[2])):
                    v = patch[b, :, y - py, x - px]
                    if ry <= y < ry + h and rx <= x < rx + w:
                        diff |= bool((v != m[:, y, x]).any())
                    m[:, y, x] = v
        out = torch.full((m.shape[0], h, w), pad_value, dtype=m.dtype)
        for i in range(h):
            for j in range(w):
                if 0 <= ry + i < m.shape[1] and 0 <= rx + j < m.shape[2]:
                    out[:, i, j] = m[:, ry + i, rx + j]
        outs.append(out)
        changed.append(diff)
    return torch.stack(outs), torch.tensor(changed)


def patch_gather_case(dtype=torch.float64, seed=0, channels_last=False, with_patch=True):
    g = torch.Generator().manual_seed(seed)
    n, c, hh, ww, b, ph, pw = 3, 4, 7, 6, 9, 3, 4
    stored = (torch.randn(n, c, hh, ww, generator=g) * 4).to(dtype)
    image = torch.randint(0, n, (b,), generator=g)
    patch_origin = torch.stack([torch.randint(-1, hh - 1, (b,), generator=g),
                                torch.randint(-2, ww - 2, (b,), generator=g)], 1)
    patch = stored[image][:, :, :ph, :pw].clone()
    patch += (torch.rand(patch.shape, generator=g) < 0.3).to(dtype) * 2  # some patch values differ from stored
    for k in range(b):  # patch values equal to stored under them, except where changed above
        py, px = patch_origin[k].tolist()
        for i in range(ph):
            for j in range(pw):
                if 0 <= py + i < hh and 0 <= px + j < ww and bool(torch.rand(1, generator=g) < 0.5):
                    patch[k, :, i, j] = stored[image[k], :, py + i, px + j]
    lo = patch_origin + torch.randint(-1, 2, (b, 2), generator=g)
    valid = torch.cat([lo, lo + torch.randint(0, 5, (b, 2), generator=g)], 1)
    valid[0] = torch.tensor([3, 3, 3, 5])  # empty box
    region_origin = patch_origin + torch.randint(-2, 2, (b, 2), generator=g)
    region_origin[1] = torch.tensor([0, ww])  # wholly right of the map: all padding
    region_origin[2] = torch.tensor([-4, 1])  # wholly above it
    if channels_last == "strided":  # neither layout: a view with x stride 2 (and a strided patch)
        wide = torch.zeros(n, c, hh, 2 * ww, dtype=dtype)
        wide[..., ::2] = stored
        stored = wide[..., ::2]
        wide_patch = torch.zeros(b, c, ph, 2 * pw, dtype=dtype)
        wide_patch[..., ::2] = patch
        patch = wide_patch[..., ::2]
    elif channels_last:
        stored = stored.contiguous(memory_format=torch.channels_last)
    return stored, image, patch if with_patch else None, patch_origin, valid, region_origin, 4, 5


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("channels_last", [False, True, "strided"])
def test_patch_gather_matches_the_loop_reference(impl, dtype, channels_last):
    counts = []
    for seed in range(3):
        for with_patch in (True, False):
            args = patch_gather_case(dtype, seed, channels_last, with_patch)
            pad = -math.inf if dtype.is_floating_point and seed == 1 else 0.0
            stored, image, patch, po, valid, ro, h, w = args
            if patch is None:
                patch = stored.new_empty((0, stored.shape[1], 0, 0))
            out, changed = impl("patch_gather")(stored, image, patch, po, valid, ro, h, w, pad)
            want, want_changed = patch_gather_ref(*args, pad_value=pad)
            assert out.dtype == dtype and out.shape == want.shape
            assert out.is_contiguous(memory_format=torch.channels_last if channels_last is True
                                     else torch.contiguous_format)
            torch.testing.assert_close(out, want, rtol=0, atol=0)
            assert changed.tolist() == want_changed.tolist()
            if with_patch:
                counts.append(int(changed.sum()))
    assert 0 < sum(counts) < 9 * len(counts), "the cases should have changed and unchanged rows"


def test_patch_gather_rejects_bad_arguments(impl):
    stored, image, patch, po, valid, ro, h, w = patch_gather_case()
    op = impl("patch_gather")
    with pytest.raises(RuntimeError, match=r"patch_gather: image \d+ out of range"):
        op(stored, image + 5, patch, po, valid, ro, h, w, 0.0)
    with pytest.raises(RuntimeError, match="patch must be"):
        op(stored, image, patch.float(), po, valid, ro, h, w, 0.0)
    with pytest.raises(RuntimeError, match="valid must be"):
        op(stored, image, patch, po, valid[:, :2], ro, h, w, 0.0)
    with pytest.raises(RuntimeError, match="stored must be"):
        op(stored[0], image, patch, po, valid, ro, h, w, 0.0)


def test_patch_gather_kernel_equals_pure_version():
    for seed in range(5):
        for args in PURE_OPS["patch_gather"].sample(torch.device("cpu"), torch.Generator().manual_seed(seed)):
            got, want = _ops.kernel("patch_gather")(*args), PURE_OPS["patch_gather"].fn(*args)
            assert got[0].stride() == want[0].stride()
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_opcheck_patch_gather():
    for case in PURE_OPS["patch_gather"].sample(torch.device("cpu"), torch.Generator().manual_seed(0)):
        torch.library.opcheck(torch.ops.overinterp_fast.patch_gather.default, case)


@cuda
def test_patch_gather_cuda():
    for channels_last in (False, True):
        args = patch_gather_case(torch.float32, 0, channels_last)
        out, changed = ops.patch_gather(*[a.cuda() if isinstance(a, torch.Tensor) else a for a in args])
        want, want_changed = patch_gather_ref(*args, pad_value=0.0)
        torch.testing.assert_close(out.cpu(), want, rtol=0, atol=0)
        assert changed.cpu().tolist() == want_changed.tolist()


def test_check_indices_false_skips_only_the_range_checks(impl):
    """check_indices=False (the exact loop, whose indices are checked where they are made) gives the same results
    on valid indices, kernel and pure version alike; with the default a bad index still raises."""
    args = random_case()
    want = mask_apply_ref(*args)
    assert torch.equal(impl("mask_apply")(*args, False), want)
    assert torch.equal(impl("mask_apply")(*args, True), want)
    bad = list(args)
    bad[4] = bad[4] + 100
    with pytest.raises(RuntimeError, match="cand_image .* out of range"):
        impl("mask_apply")(*bad)
    checked, unchecked = bookkeeping_case(), bookkeeping_case()
    impl("backselect_update")(*checked)
    impl("backselect_update")(*unchecked, False)
    assert all(torch.equal(a, b) for a, b in zip(checked, unchecked))
    bad = bookkeeping_case()
    bad[2] = bad[2] + 100
    with pytest.raises(RuntimeError, match="count .* out of range"):
        impl("backselect_update")(*bad)


def test_opcheck_with_check_indices_off():
    torch.library.opcheck(torch.ops.overinterp_fast.mask_apply.default, (*random_case(), False))
    torch.library.opcheck(torch.ops.overinterp_fast.backselect_update.default, (*bookkeeping_case(), False))
    stored, image, patch, po, valid, ro, h, w = patch_gather_case()
    torch.library.opcheck(torch.ops.overinterp_fast.patch_gather.default,
                          (stored, image, patch, po, valid, ro, h, w, 0.0, False))
    for case in PURE_OPS["rect_fill"].sample(torch.device("cpu"), torch.Generator().manual_seed(0)):
        torch.library.opcheck(torch.ops.overinterp_fast.rect_fill.default, (*case, False))


def test_patch_gather_check_indices_false_skips_only_the_range_check(impl):
    """patch_gather with check_indices=False (incremental inference in the exact loop) gives the loop reference's
    windows on valid indices; with the default a bad image index still raises."""
    stored, image, patch, po, valid, ro, h, w = patch_gather_case()
    want, want_changed = patch_gather_ref(stored, image, patch, po, valid, ro, h, w, pad_value=0.0)
    out, changed = impl("patch_gather")(stored, image, patch, po, valid, ro, h, w, 0.0, False)
    assert torch.equal(out, want) and torch.equal(changed, want_changed)
    with pytest.raises(RuntimeError, match=r"patch_gather: image \d+ out of range"):
        impl("patch_gather")(stored, image + stored.shape[0], patch, po, valid, ro, h, w, 0.0)

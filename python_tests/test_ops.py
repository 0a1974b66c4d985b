"""Each compiled op against a plain-PyTorch reference, plus torch.library.opcheck."""
import pytest
import torch

from overinterp_fast import ops

from conftest import cuda


def mask_apply_ref(base, baseline, fm, present, img, row, feat):
    keep = present[row][:, fm]  # [B, *D]
    keep &= fm.unsqueeze(0) != feat.view(-1, *([1] * fm.dim()))
    bl = baseline[img] if baseline.shape[0] > 1 else baseline.expand(img.numel(), *baseline.shape[1:])
    return torch.where(keep, base[img], bl)


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


def check_mask_apply(device):
    for dtype in DTYPES:
        for per_image in (False, True):
            args = random_case(device, dtype, per_image_baseline=per_image)
            out = ops.mask_apply(*args)
            assert out.dtype == dtype and out.device.type == device
            torch.testing.assert_close(out, mask_apply_ref(*args), rtol=0, atol=0)


def test_mask_apply_cpu():
    check_mask_apply("cpu")


def test_mask_apply_channels_last_cpu():
    base, baseline, fm, present, img, row, feat = random_case()
    base_cl = base.contiguous(memory_format=torch.channels_last)
    out = ops.mask_apply(base_cl, baseline, fm, present, img, row, feat)
    assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()
    torch.testing.assert_close(out, mask_apply_ref(base, baseline, fm, present, img, row, feat), rtol=0, atol=0)


def test_mask_apply_vectors_and_empty_batch():
    base = torch.randn(2, 6)
    fm = torch.tensor([0, 0, 1, 2, 2, 3])
    present = torch.tensor([[True, True, False, True]])
    img, row, feat = torch.tensor([1, 0]), torch.tensor([0, 0]), torch.tensor([3, -1])
    out = ops.mask_apply(base, torch.zeros(1, 6), fm, present, img, row, feat)
    torch.testing.assert_close(out, mask_apply_ref(base, torch.zeros(1, 6), fm, present, img, row, feat))
    assert out[0, 5] == 0 and out[1, 5] == base[0, 5] and out[0, 3] == 0 and out[0, 2] == base[1, 2]
    empty = torch.zeros(0, dtype=torch.int64)
    assert ops.mask_apply(base, torch.zeros(1, 6), fm, present, empty, empty, empty).shape == (0, 6)


def test_mask_apply_rejects_bad_arguments():
    base, baseline, fm, present, img, row, feat = random_case()
    with pytest.raises(RuntimeError, match="out of range"):
        ops.mask_apply(base, baseline, fm, present, img + 10, row, feat)
    with pytest.raises(RuntimeError, match="feature_map ids"):
        ops.mask_apply(base, baseline, fm + 100, present, img, row, feat)
    with pytest.raises(RuntimeError, match="baseline dtype"):
        ops.mask_apply(base, baseline.double(), fm, present, img, row, feat)
    with pytest.raises(RuntimeError, match="feature_map must be"):
        ops.mask_apply(base, baseline, fm[0], present, img, row, feat)


def backselect_update_ref(scores, rows, counts, steps, remaining, present, order, values):
    for i, count, step in zip(rows.tolist(), counts.tolist(), steps.tolist()):
        cand = [(-scores[i, j].item(), remaining[i, j].item(), j) for j in range(count)]
        _, feature, slot = min(cand)
        order[i, step] = feature
        values[i, step] = scores[i, slot]
        present[i, feature] = False
        remaining[i, slot] = remaining[i, count - 1]
        remaining[i, count - 1] = -1


def bookkeeping_case(device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    n, p = 5, 9
    remaining = torch.full((n, p + 1), -1, dtype=torch.int64)
    present = torch.zeros(n, p, dtype=torch.bool)
    counts = []
    for i in range(n):
        k = int(torch.randint(1, p + 1, (1,), generator=g))
        ids = torch.randperm(p, generator=g)[:k]
        remaining[i, :k] = ids
        present[i, ids] = True
        counts.append(k)
    # coarse scores create exact ties, which must go to the lowest feature id
    scores = torch.randint(0, 3, (n, p + 1), generator=g).double() / 2
    rows = torch.tensor([3, 0, 4])
    counts = torch.tensor([counts[3], counts[0], counts[4]])
    steps = torch.tensor([0, 2, 5])
    order = torch.full((n, p), -1, dtype=torch.int64)
    values = torch.zeros(n, p, dtype=torch.float64)
    ts = [scores, rows, counts, steps, remaining, present, order, values]
    return [t.to(device) for t in ts]


def check_backselect_update(device):
    for seed in range(20):
        got = bookkeeping_case(device, seed)
        want = [t.cpu().clone() for t in got]
        ops.backselect_update(*got)
        backselect_update_ref(*want)
        for a, b in zip(got, want):
            torch.testing.assert_close(a.cpu(), b, rtol=0, atol=0)


def test_backselect_update_cpu():
    check_backselect_update("cpu")


def test_backselect_update_tie_goes_to_lowest_feature():
    scores = torch.tensor([[0.5, 0.7, 0.7, 0.1, 0.0]], dtype=torch.float64)
    remaining = torch.tensor([[3, 2, 0, 1, -1]])
    present = torch.ones(1, 4, dtype=torch.bool)
    order = torch.full((1, 4), -1)
    values = torch.zeros(1, 4, dtype=torch.float64)
    one = torch.tensor([0])
    ops.backselect_update(scores, one, torch.tensor([4]), one, remaining, present, order, values)
    assert order[0, 0] == 0 and values[0, 0] == 0.7  # features 2 and 0 tie at 0.7
    assert remaining[0].tolist() == [3, 2, 1, -1, -1] and present[0].tolist() == [False, True, True, True]


def test_backselect_update_rejects_bad_arguments():
    args = bookkeeping_case()
    bad = list(args)
    bad[2] = args[2] + 100
    with pytest.raises(RuntimeError, match="count"):
        ops.backselect_update(*bad)
    bad = list(args)
    bad[0] = args[0].float()
    with pytest.raises(RuntimeError, match="float64"):
        ops.backselect_update(*bad)


def test_opcheck_mask_apply():
    for per_image in (False, True):
        args = random_case(per_image_baseline=per_image)
        torch.library.opcheck(torch.ops.overinterp_fast.mask_apply.default, args)
    base, baseline, fm, present, img, row, feat = random_case()
    cl = (base.contiguous(memory_format=torch.channels_last), baseline, fm, present, img, row, feat)
    torch.library.opcheck(torch.ops.overinterp_fast.mask_apply.default, cl)


def test_opcheck_backselect_update():
    torch.library.opcheck(torch.ops.overinterp_fast.backselect_update.default, bookkeeping_case())


@cuda
def test_mask_apply_cuda():
    assert ops.has_cuda_kernels()
    check_mask_apply("cuda")
    base, baseline, fm, present, img, row, feat = random_case("cuda")
    out = ops.mask_apply(base.contiguous(memory_format=torch.channels_last), baseline, fm, present, img, row, feat)
    assert out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, mask_apply_ref(base, baseline, fm, present, img, row, feat), rtol=0, atol=0)


@cuda
def test_backselect_update_cuda():
    check_backselect_update("cuda")


@cuda
def test_opcheck_cuda():
    torch.library.opcheck(torch.ops.overinterp_fast.mask_apply.default, random_case("cuda"))
    torch.library.opcheck(torch.ops.overinterp_fast.backselect_update.default, bookkeeping_case("cuda"))

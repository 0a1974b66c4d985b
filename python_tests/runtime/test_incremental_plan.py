"""The incremental plan (docs: algorithms.md, Incremental inference), checked apart from the answers it gives.

Exactness tests (test_incremental.py) cannot see a plan that is exact but slow: a node classified
"dense" instead of windowed, a window larger than the reach, a change flag that never drops, an
estimate of the work that is off. Here the expected plans come from the module docstring's rules,
worked by hand, and the reach of each feature from the model itself: a dense forward pass with the
feature perturbed shows where each map changes.
"""
import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from overinterp_fast.runtime import incremental
from overinterp_fast.runtime.inputs import prepare
from overinterp_fast.runtime.model import ModelFn
from helpers import kinds, seeded

SPATIAL = ("input", "window", "pointwise", "alias", "merge")


class Planned(nn.Module):
    """Every windowed kind of the docstring on an 8x8 image: padded and strided convolutions, a batch norm
    folded into its convolution, strided slicing, channel padding, concatenation along channels, a sum,
    max pooling (padded), average pooling, the global mean, and a dense linear layer."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 3, stride=2, padding=1)
        self.pool = nn.MaxPool2d(3, stride=1, padding=1)
        self.avg = nn.AvgPool2d(2)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        a = torch.relu(self.bn1(self.conv1(x)))  # 8x8
        y = F.pad(a[:, :, ::2, ::2], (0, 0, 0, 0, 2, 2))  # 4x4, 8 channels
        z = self.conv2(a)  # 4x4, 4 channels
        m = torch.cat([y, F.pad(z, (0, 0, 0, 0, 2, 2))], dim=1) + 1.0  # 16 channels
        m = m[:, :8] + m[:, 8:]
        return self.fc(self.avg(self.pool(m)).mean((2, 3)))


def plan_of(model, images, features=None):
    prep = prepare(images, features=features)
    return incremental.plan(ModelFn(model), prep), prep


def test_each_node_is_classified_as_the_docstring_says():
    pl, _ = plan_of(seeded(Planned()), torch.randn(2, 3, 8, 8, dtype=torch.float64))
    assert kinds(pl) == {
        "x": "input",
        "conv1": "window",
        "bn1": "alias",  # folded into conv1 (its only reader)
        "relu": "pointwise",
        "getitem": "window",  # a[:, :, ::2, ::2]
        "pad": "pointwise",  # channels only
        "conv2": "window",
        "pad_1": "pointwise",
        "cat": "merge",
        "add": "pointwise",  # + a constant
        "getitem_1": "dense",  # a channel slice (m[:, :8]): not one of the windowed kinds
        "getitem_2": "dense",
        "add_1": "dense",  # reads dense maps
        "pool": "dense",
        "avg": "dense",
        "mean": "dense",
        "fc": "dense",
    }


class Geometric(Planned):
    """Windowed kinds only, so the plan's boxes can be compared with where each map really changes."""

    def __init__(self):
        super().__init__()
        self.conv3 = nn.Conv2d(8, 6, 3, padding=2, dilation=2, groups=2)
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        a = torch.relu(self.bn1(self.conv1(x)))  # 8x8
        y = F.pad(a[:, :, ::2, ::2], (0, 0, 0, 0, 2, 2))  # 4x4, 8 channels
        z = F.pad(self.conv2(a), (0, 0, 0, 0, 2, 2))  # 4x4, 8 channels
        m = torch.cat([y, z], dim=1)[:, 4:12, :, :]  # a channel slice of the whole map
        return self.fc(self.avg(self.pool(self.conv3(m) * 2.0)).mean((2, 3)))


def node_values(gm: fx.GraphModule, x: torch.Tensor) -> dict:
    """Every node's value on x (a plain fx.Interpreter run of the traced model)."""
    out = {}

    class Recorder(fx.Interpreter):
        def run_node(self, n):
            out[n] = super().run_node(n)
            return out[n]

    Recorder(gm).run(x)
    return out


def changed_box(a: torch.Tensor, b: torch.Tensor):
    """(y0, x0, y1, x1), half-open, of the positions where maps a and b [C, H, W] differ; None if nowhere."""
    diff = (a != b).any(0)
    if not diff.any():
        return None
    ys, xs = torch.nonzero(diff, as_tuple=True)
    return (int(ys.min()), int(xs.min()), int(ys.max()) + 1, int(xs.max()) + 1)


def test_feature_boxes_of_a_hand_drawn_feature_map():
    fm = torch.tensor([[[0, 0, 1, 1],
                        [0, 2, 2, 1],
                        [3, 3, 2, 1]],
                       [[0, 0, 1, 1],
                        [0, 2, 2, 3],
                        [3, 3, 3, 1]]])
    assert incremental.feature_boxes(fm, 4).tolist() == [
        [0, 0, 2, 2],  # 0: rows 0-1, columns 0-1
        [0, 2, 3, 4],  # 1: rows 0-2, columns 2-3
        [1, 1, 3, 3],  # 2: rows 1-2, columns 1-2
        [1, 0, 3, 4],  # 3: rows 1-2 (channel 1 adds (1, 3)), columns 0-3
    ]


# With random weights, +-1e6 on a feature changes every position its receptive field reaches, in some channel
# (the ReLU passes one of the two signs; max pooling takes the huge value), so each box the plan holds must be
# exactly the region where the map changed: larger is slow (a bigger window than needed), smaller is wrong.


@pytest.mark.parametrize("features", ["pixels", "squares", "stripes"])
def test_each_box_is_where_the_feature_changes_the_map_and_the_window_holds_it(features):
    torch.manual_seed(0)
    model = seeded(Geometric())
    x = torch.randn(1, 3, 8, 8, dtype=torch.float64)
    fmap = {"pixels": None,
            "squares": (torch.arange(8).view(8, 1) // 2 * 4 + torch.arange(8).view(1, 8) // 2),  # 2x2 blocks
            "stripes": (torch.arange(8).view(8, 1) + 2 * torch.arange(8).view(1, 8)) % 5}[features]
    pl, prep = plan_of(model, x, fmap)
    k = kinds(pl)
    assert all(k[n] in SPATIAL for n in ("conv1", "bn1", "relu", "getitem", "pad", "conv2", "pad_1", "cat",
                                         "getitem_1", "conv3", "mul", "pool", "avg")), k
    base = node_values(pl.gm, x)
    fm = prep.feature_map
    for f in range(prep.num_features):
        runs = []
        for sign in (1.0, -1.0):
            xf = x.clone()
            xf[0][fm == f] += sign * 1e6
            runs.append(node_values(pl.gm, xf))
        for node, g in pl.geo.items():
            y0, x0, y1, x1 = g.table[f, 2:].tolist()
            sy, sx = g.table[f, :2].tolist()
            boxes = [changed_box(r[node][0], base[node][0]) for r in runs]
            got = [b for b in boxes if b is not None]
            assert got, (node.name, f)
            union = (min(b[0] for b in got), min(b[1] for b in got), max(b[2] for b in got), max(b[3] for b in got))
            assert union == (y0, x0, y1, x1), (node.name, f)
            # the window: g.wh x g.ww inside the map, over the box
            assert 0 <= sy <= g.height - g.wh and 0 <= sx <= g.width - g.ww
            assert sy <= y0 and y1 <= sy + g.wh and sx <= x0 and x1 <= sx + g.ww, (node.name, f)
        assert g.table[-1].tolist() == [0] * 6  # "no feature"


def test_window_sizes_by_hand():
    """Pixel features on 8x8, the largest reach of any pixel (docstring: one window size per layer):
    conv1 3x3 pad 1 -> 3 (a pixel inside reaches rows y-1..y+1); relu and bn1 the same; the ::2 slice of a
    3-row box [y-1, y+2) starting at an even row -> 2; conv2 (3x3, stride 2, pad 1) of [y-1, y+2) -> 3
    (y = 2: [1, 4) -> output rows 0..2); cat: the hull of the slice's and conv2's boxes (y = 4: [2, 3) and [1, 4))
    -> 3; the channel slice keeps it; conv3 (3x3, dilation 2, pad 2) grows 2 each side on a 4x4 map -> 4 (the
    map); max pooling 3x3 pad 1 -> 4; average pooling 2x2 on 4x4 -> 2 (the map)."""
    pl, _ = plan_of(seeded(Geometric()), torch.randn(1, 3, 8, 8, dtype=torch.float64))
    sizes = {n.name: (g.wh, g.ww, g.height) for n, g in pl.geo.items()}
    assert sizes == {"x": (1, 1, 8), "conv1": (3, 3, 8), "bn1": (3, 3, 8), "relu": (3, 3, 8),
                     "getitem": (2, 2, 4), "pad": (2, 2, 4), "conv2": (3, 3, 4), "pad_1": (3, 3, 4),
                     "cat": (3, 3, 4), "getitem_1": (3, 3, 4), "conv3": (4, 4, 4), "mul": (4, 4, 4),
                     "pool": (4, 4, 4), "avg": (2, 2, 2)}


class OneConv(nn.Module):
    def __init__(self, padding):
        super().__init__()
        self.conv = nn.Conv2d(3 if padding else 1, 4 if padding else 2, 3, padding=padding)
        self.fc = nn.Linear(4, 2) if padding else nn.Linear(32, 3)

    def forward(self, x):
        x = self.conv(x)
        return self.fc(x.mean((2, 3)) if self.conv.padding == (1, 1) else torch.flatten(x, 1))


def test_estimated_work_by_hand_with_global_mean():
    """conv 3->4, 3x3, pad 1 on 8x8, pixel features: window 3x3, so 108 multiply-adds x 9 outputs + 4 x 9
    (output writes) + 2 x 3 channels x 5x5 (the gathered region) = 1158 against 108 x 64 = 6912 dense;
    the global mean: 4 x 4 channels x 3x3 = 144 (dense: 0); the linear layer 8 both ways."""
    pl, _ = plan_of(seeded(OneConv(1)), torch.randn(2, 3, 8, 8, dtype=torch.float64))
    assert [st.kind for st in pl.steps] == ["input", "window", "gap", "dense"]
    assert pl.cost_ratio == pytest.approx((1158 + 144 + 8) / (6912 + 8), rel=1e-12)
    # the largest candidate state: the region conv gathers, 3 channels x 5x5
    assert pl.state_elems == 75


def test_estimated_work_by_hand_with_a_dense_flatten():
    """conv 1->2, 3x3, no padding on 6x6 (4x4 out), pixel features: window 3x3: 18 x 9 + 2 x 9 + 2 x 1 x 5x5
    = 230 against 18 x 16 = 288; flatten is dense: 32 outputs + 2 x 32 to write the window back into the full
    map = 96 (dense 32); the linear layer 32 x 3 = 96 both ways."""
    pl, _ = plan_of(seeded(OneConv(0)), torch.randn(2, 1, 6, 6, dtype=torch.float64))
    assert [st.kind for st in pl.steps] == ["input", "window", "dense", "dense"]
    assert pl.cost_ratio == pytest.approx((230 + 96 + 96) / (288 + 32 + 96), rel=1e-12)
    assert pl.state_elems == 32  # the flattened map
    assert pl.batch_size() == 4096  # 2^20 / 32, capped


def test_plans_are_kept_per_model_while_its_weights_and_the_inputs_stay(monkeypatch):
    """A second job of the same model and inputs reuses the plan (no new trace); a changed weight (in place: the
    same address, a new version), another feature map or image size makes a new one; a model that cannot be
    planned is not traced again either, and keeps its reason."""
    traced = []
    real = incremental.trace
    monkeypatch.setattr(incremental, "trace", lambda m: traced.append(m) or real(m))
    model = seeded(Planned(), 0)
    fn, prep = ModelFn(model), prepare(torch.randn(2, 3, 8, 8, dtype=torch.float64))
    first = incremental.choose(fn, prep, True)
    assert incremental.choose(fn, prep, True) is first and len(traced) == 1
    with torch.no_grad():
        model.conv1.weight[0, 0, 0, 0] += 1.0
    assert incremental.choose(fn, prep, True) is not first and len(traced) == 2
    again = incremental.choose(fn, prep, True)
    assert len(traced) == 2
    pixels2 = prepare(torch.randn(2, 3, 8, 8, dtype=torch.float64), torch.arange(64).view(8, 8) // 2)
    assert incremental.choose(fn, pixels2, True) is not again and len(traced) == 3
    assert incremental.choose(ModelFn(model), prepare(torch.randn(1, 3, 12, 12, dtype=torch.float64)), True) \
        is not again and len(traced) == 4

    class Branchy(nn.Module):  # data-dependent control flow: torch.fx cannot trace it
        def forward(self, x):
            return x.flatten(1)[:, :3] if x.sum() > 0 else -x.flatten(1)[:, :3]

    bad = ModelFn(Branchy())
    for _ in range(2):
        with pytest.raises(ValueError, match="incremental=True, but torch.fx cannot trace the model"):
            incremental.choose(bad, prep, True)
    assert len(traced) == 5

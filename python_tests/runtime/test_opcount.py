"""counting_ops: the aten ops outside a model told from its own, forward calls, rows and shapes."""
import torch
from torch import nn

from overinterp_fast.runtime.opcount import counting_ops


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))


def test_ops_inside_and_outside_the_model():
    m = _model()
    x = torch.randn(5, 4)
    with counting_ops(m) as ops:
        y = m(x)                 # inside: two linear layers and a relu (nested modules count once)
        p = torch.softmax(y, 1)  # outside: softmax
        q = p + 1                # outside: add
        m(x[:2])                 # inside
    assert ops.forward_calls == 2 and ops.rows == 7
    assert ops.shapes == {(5, 4), (2, 4)}
    assert ops.outside == 2 and dict(ops.by_op) == {"_softmax": 1, "add": 1}
    assert ops.inside >= 6  # at least 2 linears and a relu per call, however linear decomposes
    assert ops.outside_per_call == 1.0
    assert q.shape == (5, 2)


def test_backward_through_the_model_counts_inside_and_views_not_at_all():
    m = _model()
    x = torch.randn(5, 4, requires_grad=True)
    with counting_ops(m) as ops:
        y = m(x * 2)             # outside: mul
        s = y[:, 0].sum()        # outside: sum (the slice is a view: not counted)
        # the seed gradient (ones_like) is made outside; every backward node, the mul's included, counts inside
        (g,) = torch.autograd.grad(s, x)
    assert dict(ops.by_op) == {"mul": 1, "sum": 1, "ones_like": 1}
    assert ops.outside == 3
    assert g.shape == x.shape


def test_no_forward_call():
    m = _model()
    with counting_ops(m) as ops:
        torch.ones(3).add_(1)
    assert ops.forward_calls == 0 and ops.outside_per_call == float("inf")
    assert ops.outside == 2  # ones, add_
    # the hooks are gone after the block
    with counting_ops(m):
        pass
    m(torch.randn(1, 4))
    assert ops.forward_calls == 0

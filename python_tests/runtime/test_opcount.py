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


def test_a_copy_made_for_the_job_counts_as_the_model():
    """A job that scores its candidates with a channels_last copy of the model: the copy's calls are the model's
    (the same forward calls and rows as the job on the model as given, and the images' pass once more), and its ops
    are inside."""
    import overinterp_fast as of
    from overinterp_fast.runtime import model_state

    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                      nn.Linear(16, 5)).eval()
    x = torch.randn(2, 3, 5, 5, generator=torch.Generator().manual_seed(1))
    seen = {}
    for cl in (False, True):
        with counting_ops(m) as ops:
            of.fast_sis(m, x, 0.5, engine="torch", batch_size=16, options=of.ExactOptions(channels_last=cl))
        seen[cl] = ops
    copy = model_state.state_of(m).get("copy", "channels_last")
    assert copy is not None and copy is not m  # the second job ran a copy
    # the same candidates' calls, and the images' own pass once more (f(x) taken again from the copy)
    assert seen[True].forward_calls == seen[False].forward_calls + 1 > 2
    assert seen[True].rows == seen[False].rows + x.shape[0]
    assert seen[True].inside > seen[False].inside  # the copy's own ops counted inside, as the model's are
    assert not model_state.made_from(nn.Linear(2, 2), m)

"""A run's info (runtime/runinfo.py): the decisions noted inside a collecting block, nested blocks sharing it."""
from overinterp_fast.runtime import runinfo


def test_notes_go_to_the_innermost_run_and_nowhere_outside():
    runinfo.note("ignored", "no run collects this")
    with runinfo.collecting() as outer:
        runinfo.note("method", "exact")
        with runinfo.collecting() as inner:  # a run split into parts: one info
            runinfo.note("channels_last", "off: float64 inputs")
        assert inner is outer
    assert outer == {"method": "exact", "channels_last": "off: float64 inputs"}
    with runinfo.collecting() as other:
        pass
    assert other == {} and other is not outer

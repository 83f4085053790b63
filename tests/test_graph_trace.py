"""benchmarks/graph_trace.py's verdict: a graph run that parts from eager before any eager run does is flagged; a
parting as late as the eager runs' own (the GPU's atomics) is not."""
import numpy as np

from benchmarks.graph_trace import COLUMNS, first_over, judge


def _trace(epochs=60, jump_at=None, size=0.0, column=0):
    t = np.ones((epochs, len(COLUMNS)))
    if jump_at is not None:
        t[jump_at - 1:, column] += size
    return t


def test_first_over_counts_epochs_from_one():
    assert first_over(np.array([0.0, 0.0, 2e-3, 0.0]), 1e-3) == 3
    assert first_over(np.zeros(4), 1e-3) is None


def test_a_graph_run_that_parts_at_the_recording_epoch_is_flagged():
    ref = _trace()
    eager_first = 20  # the eager runs' earliest parting by 1e-5 on this rank
    early = judge(_trace(jump_at=4, size=2e-2, column=3), ref, eager_first, graph=True)
    assert early["parted_alone"]
    assert early["first_epoch_over"] == {"1e-07": 4, "1e-05": 4, "0.001": 4, "0.01": 4}
    assert early["parted_first_in"] == "loss_d"
    # as late as the atomics: not flagged; an eager run is never flagged
    assert not judge(_trace(jump_at=31, size=2e-3), ref, eager_first, graph=True)["parted_alone"]
    assert not judge(_trace(jump_at=4, size=2e-2), ref, eager_first, graph=False)["parted_alone"]
    same = judge(ref.copy(), ref, eager_first, graph=True)
    assert same["final"] == 0.0 and same["parted_first_in"] is None and not same["parted_alone"]

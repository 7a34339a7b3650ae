"""streamtrace.steps: a rank's ProfilerStep#N ops, and the run's steps on the
report's timeline (the HTML report's step marks; the end-to-end checks
against the fixture's truth are in test_html_report)."""
import numpy as np
import pandas as pd

from streamtrace.steps import rank_steps, step_table


def test_a_rank_keeps_each_step_numbers_earliest_op():
    names = ["ProfilerStep#3", "ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#x", "aten::mm", "ProfilerStep#10"]
    rank, numbers, starts, ends = rank_steps(5, names, [300, 200, 250, 100, 50, 900], [400, 290, 260, 150, 60, 990])
    assert rank == 5
    assert numbers.tolist() == [2, 3, 10]
    assert starts.tolist() == [200, 250, 900] and ends.tolist() == [290, 260, 990]


def test_step_table_is_on_the_sheets_clock():
    """us since the earliest base time; offsets subtracted only where align applied them."""
    per_rank = [rank_steps(0, ["ProfilerStep#7", "ProfilerStep#8"], [1_000, 9_000], [8_000, 15_000]),
                rank_steps(1, ["ProfilerStep#7", "ProfilerStep#8"], [500, 8_000], [7_000, 16_000]),
                rank_steps(2, [], [], [])]
    ranks = pd.DataFrame({"rank": [0, 1, 2], "base_ns": [10_000, 12_000, 10_000]})
    applied = pd.DataFrame({"rank": [0, 1, 2], "offset_ns": [0, 3_000, 0], "applied": [True] * 3})
    t = step_table(per_rank, {"align.ranks": ranks, "align.clocks": applied})
    # rank 1 on the common clock: base +2,000 ns, offset -3,000 ns -> its times -1,000 ns
    assert t["step"].tolist() == [7, 8]
    np.testing.assert_allclose(t["start_us"], [-0.5, 7.0])
    np.testing.assert_allclose(t["last_start_us"], [1.0, 9.0])
    np.testing.assert_allclose(t["end_us"], [8.0, 15.0])
    assert t["ranks"].tolist() == [2, 2]
    not_applied = applied.assign(applied=False)
    t = step_table(per_rank, {"align.ranks": ranks, "align.clocks": not_applied})
    np.testing.assert_allclose(t["start_us"], [1.0, 9.0])   # rank 1: +2 us of base only
    np.testing.assert_allclose(t["last_start_us"], [2.5, 10.0])


def test_no_step_data_and_no_steps_differ():
    ranks = pd.DataFrame({"rank": [0], "base_ns": [0]})
    assert step_table(None, {"align.ranks": ranks}) is None   # nothing to look in
    empty = step_table([rank_steps(0, [], [], [])], {"align.ranks": ranks})
    assert empty is not None and not len(empty) and list(empty.columns) == ["step", "start_us", "last_start_us",
                                                                           "end_us", "ranks"]

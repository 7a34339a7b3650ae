"""The critical path's graph (streamtrace.critical): made per step in the
blocking analysis' reduce, replayed unchanged it gives the measured times
back, its path covers the step and passes through the rank waited for."""
import io
import os

import numpy as np
import pytest

from generate_fixture import generate
from streamtrace import RankInput, critical
from streamtrace.chain import correlated_tables, extract

STRAGGLER = 2


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("cp")
    truth = generate(str(d), ranks=4, steps=3, straggler_rank=STRAGGLER)
    return d, truth, correlated_tables([str(d)], critical=True)


def test_unchanged_replay_gives_the_measured_times(run):
    _, _, tables = run
    graphs = critical.graphs(tables)
    assert len(graphs) == 3
    for _, g in graphs:
        start, end = g.replay()
        assert np.array_equal(start, g.start) and np.array_equal(end, g.end)


def test_path_covers_each_step_and_waits_on_the_straggler(run):
    _, truth, tables = run
    out = critical.compute(tables)
    path, steps = out["critical_path"], out["critical_steps"]
    assert sorted(steps["step"]) == [s["number"] for s in truth["profiler_steps"]]
    for step, seg in path.groupby("step"):
        want = steps.set_index("step").loc[step, "step_us"]
        assert seg["dur_us"].sum() == pytest.approx(want, rel=1e-9)
        # contiguous: each segment starts where the one before it ended
        assert np.allclose(seg["start_us"].to_numpy()[1:], seg["end_us"].to_numpy()[:-1])
        waits = seg[seg["category"] == "late rank wait"]
        assert len(waits) and set(waits["waited_for"]) == {STRAGGLER}
    assert all(str(STRAGGLER) in v.split() for v in steps["ranks_visited"])
    summary = out["critical_path_summary"]
    assert {"compute", "communication", "late rank wait", "host launch gap"} <= set(summary["category"])
    assert summary["share_pct"].sum() == pytest.approx(100.0)


def test_nodes_are_each_steps_own_events(run):
    """The graph is per step: every node lies in its step's window on its
    rank (collectives go with their first member's step)."""
    _, _, tables = run
    nodes, windows = tables[critical.NODES], tables[critical.STEPS]
    comp = nodes[nodes["kind"] == 0].merge(windows, on=["step", "rank"], suffixes=("", "_w"))
    assert len(comp) == (nodes["kind"] == 0).sum()
    assert ((comp["start"] >= comp["start_w"]) & (comp["start"] < comp["end_w"])).all()


def test_stream_input_gives_the_same_graph(run):
    """From an extracted stream (summaries read, correlate run again for its
    timelines) the critical tables are those of the traces."""
    d, truth, tables = run
    buf = io.BytesIO()
    extract([RankInput(os.path.join(str(d), f), int(r)) for r, f in sorted(truth["files"].items())], buf)
    path = os.path.join(str(d), "run.stev")
    with open(path, "wb") as f:
        f.write(buf.getvalue())
    try:
        again = correlated_tables([path], critical=True)
    finally:
        os.unlink(path)
    for name in (critical.NODES, critical.STEPS):
        a, b = tables[name], again[name]
        assert len(a) == len(b)
        assert np.array_equal(a["start"].to_numpy(), b["start"].to_numpy())
        assert np.array_equal(a["end"].to_numpy(), b["end"].to_numpy())


def test_without_the_graph_tables_one_line_error(run):
    from streamtrace.errors import StreamtraceError

    _, _, tables = run
    with pytest.raises(StreamtraceError, match="critical=True"):
        critical.compute({k: v for k, v in tables.items() if not k.startswith("critical.")})


def test_the_report_charts_each_steps_path(run, tmp_path):
    """The HTML report's chart: a stacked bar per step by category (the
    numbers behind it are the path's), the ranks visited in the sentence;
    blockers --html draws it."""
    pytest.importorskip("plotly")
    from streamtrace import plots
    from streamtrace.chain import blockers

    d, _, tables = run
    path = critical.compute(tables)["critical_path"]
    chart = next(c for c in plots.charts({"critical_path": path}) if c.key == "critical_path")
    per = path.groupby(["step", "category"])["dur_us"].sum()
    for cat in ("compute", "late rank wait", "host launch gap"):
        assert chart.data[cat] == pytest.approx([per.get((s, cat), 0.0) for s in chart.data["step"]])
    assert [t.name for t in chart.figure.data][0] == "compute"
    assert str(STRAGGLER) in chart.sentence
    page = tmp_path / "b.html"
    blockers([str(d)], html_path=str(page))
    assert 'id="critical_path"' in page.read_text()


def test_a_late_rank_wait_says_what_the_late_rank_was_doing(tmp_path):
    """A GPU backlog: rank 3's slow kernel delays its last collective; the
    others' wait is rank 3's chain, the slow kernel named in it."""
    generate(str(tmp_path), ranks=4, steps=2, slow_kernel_rank=3, slow_kernel_factor=10, slow_kernel_at_end=True)
    path = critical.compute(correlated_tables([str(tmp_path)], critical=True))["critical_path"]
    waits = path[path["category"] == "late rank wait"]
    assert set(waits["waited_for"]) == {3}
    slow = waits[waits["detail"].str.startswith("rank 3: compute void slow_gemm_kernel")]
    assert set(slow["step"]) == set(path["step"])
    assert (slow.groupby("step")["dur_us"].sum() > 1000).all()   # most of the 1.35 ms it ran too long

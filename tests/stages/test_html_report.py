"""The HTML report (issue #27): the numbers behind each chart are the sheets'
(and the generator's truth), the page draws in a real browser with the
network off, hostile names stay text, an empty run says so, and bad output
paths fail in one line before any output is written."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import browser
import generate_fixture
from streamtrace import plots
from streamtrace.cli import main
from streamtrace.html_report import CELL_CHARS
from streamtrace.plots import _short

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")
HOSTILE_KERNEL = "<script>alert('k')</script>\"'=cmd|' /C calc'!A0 " + "k" * 10_000
HOSTILE_PG = "</script><img src=x onerror=alert(1)>\"'=cmd|'x"


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def embedded(page, prefix, key):
    """The JSON embedded in the page file as <script id="{prefix}-{key}">."""
    text = open(page, encoding="utf-8").read()
    m = re.search(r'<script type="application/json" id="' + re.escape(f"{prefix}-{key}") + r'">(.*?)</script>',
                  text, re.S)
    assert m, f"no {prefix}-{key} in {page}"
    return json.loads(m.group(1))


def chart_keys(page):
    return re.findall(r'<div class="chart" id="chart-([^"]+)"', open(page, encoding="utf-8").read())


@pytest.fixture(scope="module")
def straggler_run(tmp_path_factory):
    """Rank 3 arrives 300 us late; all-to-all-v on; blocking analysis on."""
    d = tmp_path_factory.mktemp("html_straggler")
    truth = generate_fixture.generate(str(d / "traces"), ranks=8, steps=3, straggler_rank=3, straggler_us=300.0,
                                      all2allv=True)
    page, csvs = d / "report.html", d / "csvs"
    res = invoke("collective-report", "--trace_dir", d / "traces", "--world_size", 8, "--all2allv_heatmap",
                 "--blocking_analysis", "--output_csvs_dir", csvs, "--output_html_path", page, "-q")
    assert res.exit_code == 0, res.output
    return truth, str(page), str(csvs)


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    """A slow kernel on rank 2 (the top blocker) and the process group named
    with markup, quotes and a spreadsheet formula; the kernel's name is 10 kB."""
    d = tmp_path_factory.mktemp("html_hostile")
    truth = generate_fixture.generate(str(d / "traces"), ranks=4, steps=3, slow_kernel_rank=2,
                                      slow_kernel_factor=3.0, seed=5)
    old_kernel = json.dumps(truth["slow_kernel"]["kernel_name"])
    for r in range(4):
        path = d / "traces" / truth["files"][str(r)]
        text = path.read_text()
        assert old_kernel in text
        text = text.replace(old_kernel, json.dumps(HOSTILE_KERNEL))
        text = re.sub(r'("(?:Process Group Name|pg_name)": *)"0"', lambda m: m.group(1) + json.dumps(HOSTILE_PG),
                      text)
        path.write_text(text)
    page, xlsx = d / "blockers.html", d / "report.xlsx"
    res = invoke("blockers", d / "traces", "--html", page, "-q")
    assert res.exit_code == 0, res.output
    res = invoke("collective-report", "--trace_dir", d / "traces", "--world_size", 4, "--blocking_analysis",
                 "--output_xlsx_path", xlsx, "-q")
    assert res.exit_code == 0, res.output
    return truth, str(page), str(xlsx)


@pytest.fixture(scope="module")
def empty_run(tmp_path_factory):
    """Traces whose collective kernels were removed: CPU-side collectives only."""
    d = tmp_path_factory.mktemp("html_empty")
    truth = generate_fixture.generate(str(d / "traces"), ranks=2, steps=1)
    for r in range(2):
        path = d / "traces" / truth["files"][str(r)]
        doc = json.loads(path.read_text())
        doc["traceEvents"] = [e for e in doc["traceEvents"]
                              if not (e.get("cat") == "kernel" and "nccl" in e.get("name", "").lower())]
        path.write_text(json.dumps(doc))
    page = d / "empty.html"
    res = invoke("collective-report", "--trace_dir", d / "traces", "--world_size", 2, "--output_html_path", page,
                 "-q")
    assert res.exit_code == 0, res.output
    return str(page)


# ---------------------------------------------------------------------- the numbers behind the charts

def _implicit(csvs):
    imp = pd.read_csv(os.path.join(csvs, "nccl_implicit_sync.csv"))
    ts = imp[[c for c in imp.columns if re.fullmatch(r"rank_\d+_ts", c)]]
    return imp.assign(_start=ts.min(axis=1)).sort_values("_start", kind="stable")


def test_wait_heatmap_is_the_sheet_and_the_truth(straggler_run):
    truth, page, csvs = straggler_run
    data = embedded(page, "data", "wait_heatmap")
    imp = _implicit(csvs)
    (group,) = data["groups"]
    assert not group["binned"]
    assert group["instances"] == imp["collective_id"].astype(str).tolist()
    for rank, row in zip(group["ranks"], group["wait_us"]):
        np.testing.assert_allclose(row, imp[f"rank_{rank}_wait_time"].to_numpy(), rtol=0, atol=1e-9)
    assert group["late_rank"] == imp["straggler_rank"].astype(float).tolist()
    # the truth: every implicit-sync collective waits for rank 3, by max(ts) - ts_r
    implicit = sorted((c for c in truth["collectives"] if c["implicit_sync"]),
                      key=lambda c: min(float(p["ts_us"]) for p in c["per_rank"].values()))
    assert len(implicit) == len(group["instances"])
    for c, col in zip(implicit, np.array(group["wait_us"]).T):
        ts = {int(r): float(p["ts_us"]) for r, p in c["per_rank"].items()}
        expect = [max(ts.values()) - ts[r] for r in group["ranks"]]
        np.testing.assert_allclose(col, expect, atol=1e-3)
    assert set(group["late_rank"]) == {truth["straggler"]["rank"]}
    text = open(page, encoding="utf-8").read()
    assert f"Rank {truth['straggler']['rank']} arrived last at 100% of the {len(implicit)} collectives" in text


def test_timeline_bandwidth_and_clocks_are_the_sheets(straggler_run):
    _, page, csvs = straggler_run
    imp = _implicit(csvs)
    t0 = imp["_start"].min()
    for series in embedded(page, "data", "skew_timeline")["kinds"]:
        part = imp[imp["Collective name"] == series["kind"]]
        assert series["collective_id"] == part["collective_id"].astype(str).tolist()
        column = {"skew": "skew in start time", "latency": "comm_latency"}[series["metric"]]
        np.testing.assert_allclose(series["value_us"], part[column].to_numpy(), atol=1e-9)
        np.testing.assert_allclose(series["t_s"], (part["_start"] - t0).to_numpy() / 1e6, atol=1e-12)
    bw = embedded(page, "data", "bandwidth")["series"]
    assert {s["kind"] for s in bw} == set(imp["Collective name"])
    for s in bw:
        part = imp[(imp["Collective name"] == s["kind"]) & (imp["Group size"] == s["group_size"])]
        med = part.groupby("Full msg size (MB)")["bus bw (GB/s)"].median()
        np.testing.assert_allclose(s["sizes_mib"], med.index.to_numpy())
        np.testing.assert_allclose(s["median_bus_bw"], med.to_numpy())
        assert s["points"] == s["shown"] == len(part)
    clocks = pd.read_csv(os.path.join(csvs, "clock_alignment.csv")).sort_values("rank")
    data = embedded(page, "data", "clocks")
    assert data["rank"] == clocks["rank"].tolist()
    for col in ("offset_us", "residual_us", "max_residual_us"):
        np.testing.assert_allclose(data[col], clocks[col].to_numpy())


def test_all2allv_matrix_is_the_sheet_and_the_truth(straggler_run):
    truth, page, csvs = straggler_run
    data = embedded(page, "data", "all2allv")
    m = np.array(data["sent_mib"])
    hm = pd.read_csv(os.path.join(csvs, "nccl_all2allv_heatmap.csv"))
    assert data["bin"] == 1 and data["ranks"] == list(range(8))
    np.testing.assert_allclose(m[hm["src_rank"], hm["dst_rank"]], hm["total_sent_MB"])
    assert m.sum() == pytest.approx(hm["total_sent_MB"].sum())
    for cell in truth["heatmap"]:
        assert m[cell["src"], cell["dst"]] == pytest.approx(cell["bytes"] / 2 ** 20)


def test_blocking_charts_are_the_sheets(straggler_run):
    _, page, csvs = straggler_run
    cb = pd.read_csv(os.path.join(csvs, "collective_blockers.csv"))
    data = embedded(page, "data", "blocking_breakdown")
    assert data["collective_id"] == cb["collective_id"].astype(str).tolist()
    for col in ("delta_us", "host_launch_lateness_us", "gpu_dependency_wait_us", "gpu_backlog_us"):
        np.testing.assert_allclose(data[col], cb[col].to_numpy())
    ex = pd.read_csv(os.path.join(csvs, "exposed_comm.csv"))
    ex = ex[ex["step"] == "all"].sort_values("rank")
    data = embedded(page, "data", "exposed_comm")
    assert data["rank"] == ex["rank"].tolist()
    for col in ("hidden_us", "exposed_waiting_us", "exposed_transfer_us"):
        np.testing.assert_allclose(data[col], ex[col].to_numpy())
    pairs = pd.read_csv(os.path.join(csvs, "contention_pairs.csv")).nlargest(15, "overlap_us")
    data = embedded(page, "data", "contention_pairs")
    # names cut as the tables cut them (the whole names are in the CSVs)
    assert data["label"] == [_short(k, CELL_CHARS) for k in pairs["compute_kernel"]]
    np.testing.assert_allclose(data["overlap_us"], pairs["overlap_us"].to_numpy())


def test_blockers_page_names_the_injected_kernel(hostile_run):
    truth, page, _ = hostile_run
    data = embedded(page, "data", "blocking_kernels")
    # the slow kernel is the top blocker, its 10 kB name cut as the tables cut it
    assert data["label"][0] == HOSTILE_KERNEL[:CELL_CHARS - 1] + "\u2026"
    late = embedded(page, "data", "wait_heatmap")["groups"][0]
    assert late["group"] == HOSTILE_PG
    assert truth["slow_kernel"]["rank"] in late["late_rank"]


# ---------------------------------------------------------------------- profiler steps on the time axis

def _truth_steps(truth, key):
    """{step number: (earliest rank's start, latest rank's start)} of the
    truth's ProfilerStep ops, ns (``key``: written_start_ns or true_start_ns)."""
    return {s["number"]: (min(int(p[key]) for p in s["per_rank"].values()),
                          max(int(p[key]) for p in s["per_rank"].values())) for s in truth["profiler_steps"]}


def _truth_first_arrival(truth, key):
    """The chart's time origin: the first arrival at an implicit-sync collective, ns."""
    return min(int(p[key]) for c in truth["collectives"] if c["implicit_sync"] for p in c["per_rank"].values())


def _check_steps(truth, page, key, atol_s):
    """The skew chart's embedded steps are the truth's: every step, each at
    its earliest rank's start (seconds since the first arrival, within
    ``atol_s``); one dotted line per panel and a number per step."""
    steps = embedded(page, "data", "skew_timeline")["steps"]
    want, t0 = _truth_steps(truth, key), _truth_first_arrival(truth, key)
    assert len(want) == truth["steps"] and steps["step"] == sorted(want)
    np.testing.assert_allclose(steps["t_s"], [(want[n][0] - t0) / 1e9 for n in steps["step"]], rtol=0, atol=atol_s)
    np.testing.assert_allclose(np.subtract(steps["last_start_us"], steps["start_us"]),
                               [(want[n][1] - want[n][0]) / 1e3 for n in steps["step"]], rtol=0, atol=2e6 * atol_s)
    assert steps["ranks"] == [truth["ranks"]] * len(want) and steps["marked_every"] == 1
    layout = embedded(page, "fig", "skew_timeline")["layout"]
    lines = [sh["x0"] for sh in layout["shapes"] if sh.get("line", {}).get("dash") == "dot"]
    np.testing.assert_allclose(sorted(lines), sorted(steps["t_s"] * 2))
    labels = [a["text"] for a in layout["annotations"] if a.get("yref") == "y domain"]
    assert labels == [str(n) for n in steps["step"]]
    text = open(page, encoding="utf-8").read()
    assert (f"Dotted lines mark where each profiler step starts ({len(want)} steps, #{min(want)} to #{max(want)}, "
            "numbered at the top): the earliest rank&#x27;s ProfilerStep#N annotation.") in text
    return steps


def test_skew_timeline_marks_the_profiler_steps(straggler_run):
    """Times as recorded (collective-report's default): the steps are where
    the traces wrote them, on the sheets' clock; rank 3, the straggler,
    starts every step 300 us after the earliest rank."""
    truth, page, csvs = straggler_run
    steps = _check_steps(truth, page, "written_start_ns", atol_s=1e-9)
    imp = _implicit(csvs)
    np.testing.assert_allclose(np.array(steps["start_us"]) - imp["_start"].min(), np.array(steps["t_s"]) * 1e6,
                               atol=1e-3)
    assert min(np.subtract(steps["last_start_us"], steps["start_us"])) >= 300.0


@pytest.mark.parametrize("blocking", [False, True], ids=["report", "blocking_analysis"])
def test_profiler_steps_on_the_aligned_clock(tmp_path, blocking):
    """--align_clocks on traces written with clock offsets of hundreds of us:
    the steps move with the collectives, onto the true clock (the offsets are
    estimated to within 1 us a rank, so 2 us here), whether the ranks are
    read for the report alone or for the blocking analysis too."""
    truth = generate_fixture.generate(str(tmp_path / "t"), ranks=4, steps=4, seed=3,
                                      clock_offsets_us=[0, 400, -250, 900])
    page = tmp_path / "r.html"
    res = invoke("collective-report", "--trace_dir", tmp_path / "t", "--world_size", 4, "--align_clocks",
                 "--output_html_path", page, "-q", *(["--blocking_analysis"] if blocking else []))
    assert res.exit_code == 0, res.output
    _check_steps(truth, str(page), "true_start_ns", atol_s=2e-6)


def test_stream_of_tables_only_leaves_the_steps_unmarked(tmp_path):
    """A stream that kept only align's tables has no events to find the
    steps in: the chart is drawn unmarked and its sentence says why."""
    from streamtrace.stream.format import Kind, StreamWriter, iter_frames

    generate_fixture.generate(str(tmp_path / "t"), ranks=2, steps=2)
    full, tables_only, page = tmp_path / "a.stev", tmp_path / "tables.stev", tmp_path / "r.html"
    assert invoke("extract", "--trace_dir", tmp_path / "t", "--world_size", 2, "-o", tmp_path / "e.stev",
                  "-q").exit_code == 0
    assert invoke("align", tmp_path / "e.stev", "-o", full).exit_code == 0
    with open(tables_only, "wb") as f:
        w = StreamWriter(f)
        w.write_all(fr for fr in iter_frames(str(full)) if fr.kind == Kind.TABLE)
        w.close()
    res = invoke("report", tables_only, "--output_html_path", page, "-q")
    assert res.exit_code == 0, res.output
    assert embedded(str(page), "data", "skew_timeline")["steps"] is None
    assert "Profiler steps are not marked: the report had no events to find them in" in page.read_text()
    assert not embedded(str(page), "fig", "skew_timeline")["layout"].get("shapes")


def test_blockers_page_of_a_stream_marks_the_steps(tmp_path):
    """blockers --html on an extracted stream (align and correlate run on its
    frames): the steps come from the stream's events."""
    truth = generate_fixture.generate(str(tmp_path / "t"), ranks=4, steps=3, straggler_rank=2, straggler_us=250.0)
    stream, page = tmp_path / "e.stev", tmp_path / "b.html"
    assert invoke("extract", "--trace_dir", tmp_path / "t", "--world_size", 4, "-o", stream, "-q").exit_code == 0
    res = invoke("blockers", stream, "--html", page, "-q")
    assert res.exit_code == 0, res.output
    _check_steps(truth, str(page), "written_start_ns", atol_s=1e-9)


def test_real_traces_step_is_marked(real_dir, tmp_path):
    """param-dlrm, the one complete real rank set: its one step,
    ProfilerStep#10, starts where the earliest rank's trace says (absolute
    microseconds, each rank's own ts)."""
    import gzip

    d = os.path.join(real_dir, "param-dlrm")
    starts = []
    for name in sorted(os.listdir(d)):
        with gzip.open(os.path.join(d, name), "rt") as f:
            events = json.load(f)["traceEvents"]
        starts += [float(e["ts"]) for e in events if e.get("name") == "ProfilerStep#10" and e.get("ph") == "X"]
    assert len(starts) == 8
    page = tmp_path / "dlrm.html"
    res = invoke("collective-report", "--trace_dir", d, "--world_size", 8, "--output_html_path", page, "-q")
    assert res.exit_code == 0, res.output
    steps = embedded(str(page), "data", "skew_timeline")["steps"]
    assert steps["step"] == [10] and steps["ranks"] == [8]
    assert steps["start_us"] == [min(starts)] and steps["last_start_us"] == [max(starts)]


# ---------------------------------------------------------------------- hostile names, empty runs

def test_hostile_names_stay_text_in_the_page(hostile_run):
    _, page, _ = hostile_run
    text = open(page, encoding="utf-8").read()
    assert "<script>alert" not in text and "<img src=x" not in text
    # every <script> element is one of ours: plotly.js, a figure, a data block, the renderer
    scripts = re.findall(r"<script[^>]*>", text)
    keys = chart_keys(page)
    assert len(scripts) == 2 + 2 * len(keys)
    assert "&lt;script&gt;alert(&#x27;k&#x27;)" in text          # in a table cell, escaped
    assert "\\u003c/script\\u003e\\u003cimg" in text               # in the embedded JSON, escaped
    # plotly.js reads some HTML in titles, labels and hover text: names reach it escaped
    heatmap = embedded(page, "fig", "wait_heatmap")
    assert "<img" not in json.dumps(heatmap)
    assert any("process group &lt;/script&gt;&lt;img" in a["text"] for a in heatmap["layout"]["annotations"])
    kernels = embedded(page, "fig", "blocking_kernels")
    assert "<script>" not in json.dumps(kernels)
    assert kernels["data"][0]["y"][-1].startswith("1. &lt;script&gt;alert(")


def test_hostile_names_stay_text_in_the_workbook(hostile_run):
    import openpyxl

    _, _, xlsx = hostile_run
    wb = openpyxl.load_workbook(xlsx, read_only=True)
    ws = wb["blocking_kernels"]
    rows = list(ws.iter_rows(values_only=True))
    assert rows[1][0] == HOSTILE_KERNEL
    ws = wb["nccl_implicit_sync"]
    header, first = list(ws.iter_rows(min_row=1, max_row=2, values_only=True))
    assert first[header.index("Process Group Name")] == HOSTILE_PG
    wb.close()
    wb = openpyxl.load_workbook(xlsx)   # formulas as written: none
    cell = wb["nccl_implicit_sync"].cell(row=2, column=header.index("Process Group Name") + 1)
    assert cell.data_type == "s" and cell.value == HOSTILE_PG


def test_empty_report_says_so(empty_run):
    text = open(empty_run, encoding="utf-8").read()
    assert "No collectives were found in this run" in text
    assert chart_keys(empty_run) == []


# ---------------------------------------------------------------------- a real browser

def _check_in_browser(page, name):
    loaded = browser.load(page)
    assert loaded.body_attr("data-rendered") == "yes", loaded.stderr[-2000:]
    assert loaded.errors() == []
    divs = loaded.chart_divs()
    assert sorted(divs) == sorted(chart_keys(page))
    for key, inner in divs.items():
        assert 'class="main-svg"' in inner, f"{name}: chart {key} has no plot"
    png = browser.screenshot(page, os.path.join(browser.artifacts_dir(), f"{name}.png"))
    print(f"screenshot: {png} (page {os.path.getsize(page):,} bytes, drawn in "
          f"{loaded.body_attr('data-render-ms')} ms)")
    return loaded, png


def test_straggler_page_draws_in_chromium(straggler_run):
    _, page, _ = straggler_run
    loaded, png = _check_in_browser(page, "straggler")
    assert len(loaded.chart_divs()) == 9
    browser.assert_not_blank(png)


def test_hostile_page_draws_in_chromium(hostile_run):
    _, page, _ = hostile_run
    loaded, png = _check_in_browser(page, "hostile-blockers")
    assert "blocking_kernels" in loaded.chart_divs()
    assert "<script>alert" not in loaded.dom   # the parsed page holds the names as text only
    browser.assert_not_blank(png)


def test_empty_page_draws_in_chromium(empty_run):
    loaded, _ = _check_in_browser(empty_run, "empty")
    assert loaded.chart_divs() == {}
    assert "No collectives were found" in loaded.dom


# ---------------------------------------------------------------------- large runs

def _synthetic_sheets(ranks, instances, seed=0):
    """nccl_implicit_sync / straggler_summary / clock_alignment of a large run, built directly."""
    rng = np.random.default_rng(seed)
    ts = 1e9 + np.arange(instances)[:, None] * 500.0 + rng.uniform(0, 40, (instances, ranks))
    dur = 60 + rng.uniform(0, 5, (instances, ranks))
    wait = ts.max(axis=1, keepdims=True) - ts
    kinds = np.array(["allreduce", "_allgather_base", "_reduce_scatter_base"])[np.arange(instances) % 3]
    size = 2.0 ** (np.arange(instances) % 12 - 4)
    lat = dur.min(axis=1)
    cols = {"collective_id": [f"0_{i}" for i in range(instances)], "Process Group Name": "0",
            "Collective name": kinds, "Group size": ranks, "Full msg size (MB)": size, "comm_latency": lat,
            "skew in start time": wait.max(axis=1), "bus bw (GB/s)": size / 1024 / (lat / 1e6),
            "straggler_rank": wait.argmin(axis=1)}
    for r in range(ranks):
        cols[f"rank_{r}_ts"] = ts[:, r]
        cols[f"rank_{r}_dur"] = dur[:, r]
    for r in range(ranks):
        cols[f"rank_{r}_wait_time"] = wait[:, r]
    imp = pd.DataFrame(cols)
    clocks = pd.DataFrame({"rank": range(ranks), "offset_us": rng.normal(0, 2, ranks),
                           "residual_us": rng.uniform(0, 1, ranks), "max_residual_us": rng.uniform(1, 2, ranks),
                           "applied": False})
    return {"nccl_implicit_sync": imp, "clock_alignment": clocks}


@pytest.mark.parametrize("ranks,instances", [(4, 25_004), (1024, 60)])
def test_large_runs_give_small_pages_that_draw(tmp_path, ranks, instances):
    from streamtrace.html_report import write_html

    sheets = _synthetic_sheets(ranks, instances)
    page = str(tmp_path / f"large-{ranks}.html")
    write_html(sheets, page)
    assert os.path.getsize(page) < 10_000_000
    group = embedded(page, "data", "wait_heatmap")["groups"][0]
    cells = len(group["ranks"]) * len(group["instances"])
    assert cells <= plots.HEATMAP_MAX_CELLS
    if ranks == 4:   # binned: each column is the largest wait of its instances
        assert group["binned"] and len(group["instances"]) == plots.HEATMAP_MAX_COLUMNS
        w = sheets["nccl_implicit_sync"]["rank_0_wait_time"].to_numpy()
        edges = np.linspace(0, instances, plots.HEATMAP_MAX_COLUMNS + 1).astype(int)
        np.testing.assert_allclose(group["wait_us"][0], [w[a:b].max() for a, b in zip(edges[:-1], edges[1:])])
        assert "consecutive instances" in open(page, encoding="utf-8").read()
    _, png = _check_in_browser(page, f"large-{ranks}-ranks")
    browser.assert_not_blank(png)


def test_many_steps_mark_one_in_k():
    """3,572 steps (the dense set's count): every step is in the chart's data,
    one in ceil(3572 / STEP_MARKS_MAX) is drawn and numbered, and the note says so."""
    sheets = _synthetic_sheets(4, 600)
    t0 = sheets["nccl_implicit_sync"][[f"rank_{r}_ts" for r in range(4)]].min(axis=1).min()
    n = 3572
    steps = pd.DataFrame({"step": np.arange(12, 12 + n), "start_us": t0 + 80.0 * np.arange(n),
                          "last_start_us": t0 + 80.0 * np.arange(n) + 5, "end_us": t0 + 80.0 * np.arange(n) + 70,
                          "ranks": 4})
    (chart,) = [c for c in plots.charts(sheets, steps) if c.key == "skew_timeline"]
    every = -(-n // plots.STEP_MARKS_MAX)
    assert chart.data["steps"]["step"] == list(range(12, 12 + n)) and chart.data["steps"]["marked_every"] == every
    np.testing.assert_allclose(chart.data["steps"]["t_s"], 80e-6 * np.arange(n))
    labels = [a.text for a in chart.figure.layout.annotations if a.yref == "y domain"]
    assert labels == [str(12 + i) for i in range(0, n, every)] and len(labels) <= plots.STEP_MARKS_MAX
    assert len(chart.figure.layout.shapes) == 2 * len(labels)
    assert f"one profiler step in {every} marked, of 3,572" in chart.note
    assert "(3,572 steps, #12 to #3583, numbered at the top)" in chart.sentence


# ---------------------------------------------------------------------- command line

def test_report_through_pipes_writes_only_the_page(tmp_path):
    d = tmp_path / "t"
    truth = generate_fixture.generate(str(d), ranks=4, steps=2, straggler_rank=1, straggler_us=200.0)
    page = tmp_path / "piped.html"
    extract = subprocess.Popen([BIN, "extract", "--trace_dir", str(d), "--world_size", "4", "-q"],
                               stdout=subprocess.PIPE)
    align = subprocess.Popen([BIN, "align"], stdin=extract.stdout, stdout=subprocess.PIPE)
    extract.stdout.close()
    report = subprocess.run([BIN, "report", "--output_html_path", str(page)], stdin=align.stdout,
                            capture_output=True, text=True, timeout=300)
    align.stdout.close()
    assert extract.wait() == 0 and align.wait() == 0
    assert report.returncode == 0, report.stderr
    assert f"wrote {page}" in report.stderr
    assert sorted(os.listdir(tmp_path)) == ["piped.html", "t"]   # no workbook beside it
    group = embedded(str(page), "data", "wait_heatmap")["groups"][0]
    assert set(group["late_rank"]) == {1}
    # the steps, from the stream's events (one node: times as recorded)
    _check_steps(truth, str(page), "written_start_ns", atol_s=1e-9)


@pytest.mark.parametrize("command", ["collective-report", "report", "blockers"])
def test_bad_html_path_is_one_line_before_any_output(tmp_path, command):
    traces = tmp_path / "traces"
    generate_fixture.generate(str(traces), ranks=2, steps=1)
    stream = tmp_path / "s.stev"
    assert invoke("extract", "--trace_dir", traces, "--world_size", 2, "-o", stream, "-q").exit_code == 0
    (tmp_path / "adir").mkdir()
    csvs = tmp_path / "csvs"
    for bad, problem in ((tmp_path / "missing" / "r.html", "the output directory does not exist"),
                         (tmp_path / "adir", "is a directory")):
        if command == "collective-report":
            args = [command, "--trace_dir", traces, "--world_size", 2, "--output_csvs_dir", csvs,
                    "--output_html_path", bad]
        elif command == "report":
            args = [command, stream, "--output_csvs_dir", csvs, "--output_html_path", bad]
        else:
            args = [command, stream, "--html", bad]
        res = invoke(*args)
        if problem == "is a directory":   # refused by click as a usage error, as --output_xlsx_path is
            assert res.exit_code == 2
            assert res.output.strip().splitlines()[-1].endswith(f"'{bad}' is a directory."), res.output
        else:
            assert res.exit_code == 1
            assert res.output.strip() == f"Error: {bad}: {problem}", res.output
        assert not csvs.exists()
        assert sorted(os.listdir(tmp_path)) == ["adir", "s.stev", "traces"]


def test_html_gz_is_written_compressed_and_other_compressions_refused(tmp_path):
    import gzip

    traces = tmp_path / "traces"
    generate_fixture.generate(str(traces), ranks=2, steps=1)
    page = tmp_path / "r.html.gz"
    res = invoke("collective-report", "--trace_dir", traces, "--world_size", 2, "--output_html_path", page, "-q")
    assert res.exit_code == 0, res.output
    with gzip.open(page, "rt", encoding="utf-8") as f:
        assert f.read().startswith("<!DOCTYPE html>")
    for suffix in (".xz", ".zst", ".bz2"):
        bad = tmp_path / f"r.html{suffix}"
        res = invoke("collective-report", "--trace_dir", traces, "--world_size", 2, "--output_html_path", bad,
                     "--output_csvs_dir", tmp_path / "csvs")
        assert res.exit_code == 1
        line = res.output.strip()
        assert line.startswith(f"Error: {bad}: {suffix} output is not supported") and "\n" not in line, line
        assert sorted(os.listdir(tmp_path)) == ["r.html.gz", "traces"]


def test_data_blocks_cut_texts_as_the_tables_do(hostile_run):
    """The numbers behind the charts hold no text longer than a table cell
    (the 10 kB kernel name, ~200 kB in real traces, was embedded whole)."""
    _, page, _ = hostile_run
    text = open(page, encoding="utf-8").read()

    def texts(obj):
        if isinstance(obj, str):
            yield obj
        elif isinstance(obj, dict):
            for v in obj.values():
                yield from texts(v)
        elif isinstance(obj, list):
            for v in obj:
                yield from texts(v)

    keys = chart_keys(page)
    assert "blocking_kernels" in keys
    longest = max(len(t) for key in keys for t in texts(embedded(page, "data", key)))
    assert longest <= CELL_CHARS
    assert "k" * 400 not in text   # nowhere in the page whole (hover texts stop at 300)


def test_missing_plotly_is_one_line(tmp_path, monkeypatch):
    traces = tmp_path / "traces"
    generate_fixture.generate(str(traces), ranks=2, steps=1)
    for name in [m for m in sys.modules if m == "plotly" or m.startswith("plotly.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "plotly", None)   # import plotly raises ImportError
    res = invoke("collective-report", "--trace_dir", traces, "--world_size", 2, "--output_html_path",
                 tmp_path / "r.html", "--output_csvs_dir", tmp_path / "csvs")
    assert res.exit_code == 1
    assert res.output.strip().startswith("Error: the HTML report needs plotly, which is not installed")
    assert len(res.output.strip().splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == ["traces"]


def test_plots_api_returns_figures(straggler_run):
    import plotly.graph_objects as go

    from streamtrace import plots

    _, _, csvs = straggler_run
    sheets = {f[:-4]: pd.read_csv(os.path.join(csvs, f)) for f in os.listdir(csvs)}
    for fn in (plots.wait_heatmap, plots.skew_timeline, plots.bandwidth, plots.all2allv,
               plots.blocking_breakdown, plots.exposed_comm, plots.contention_pairs, plots.clock_offsets):
        assert isinstance(fn(sheets), go.Figure), fn.__name__
    assert plots.blocking_kernels({}) is None
    assert [c.key for c in plots.charts(sheets)] == chart_keys(os.path.join(os.path.dirname(csvs), "report.html"))

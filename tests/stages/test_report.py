"""report: every Part A sheet against the spec (columns, formulas, units) and
the fixture generator's ground truth; Part B sheets; writers; robustness."""
import functools
import math
import os

import numpy as np
import openpyxl
import pandas as pd
import pytest

import generate_fixture
from conftest import needs_real, real_id, real_traces
from streamtrace import StreamtraceError, generate_collective_report
from streamtrace.chain import collect_tables_from_traces
from streamtrace.report.sheets import build_report
from streamtrace.report.writers import CsvDir, sheet_parts, write_csvs, write_xlsx
from streamtrace.io.ranks import resolve_inputs
from synthtrace import NCCL_SENDRECV, coll_kernel, compute_kernel, write_trace

MIB = 1 << 20

# ---------------------------------------------------------------------- the spec's column lists (A5)

LONG = ["collective_id", "index_in_group", "rank", "Process Group Name", "Process Group Ranks", "Collective name",
        "Group size", "dtype", "In msg nelems", "In msg size (MB)", "Out msg nelems", "Out msg size (MB)",
        "In split size", "Out split size", "stream", "ts", "dur"]
SUMMARY_LONG = ["rank", "Process Group Name", "Process Group Ranks", "Collective name", "Group size", "dtype",
                "In msg nelems", "Out msg nelems", "In split size", "Out split size", "stream",
                "In msg size (MB)_first", "Out msg size (MB)_first", "dur_sum", "dur_mean", "dur_std", "dur_min",
                "dur_max", "operation_count"]
IMPLICIT = ["collective_id", "Process Group Name", "Process Group Ranks", "Collective name", "Group size", "dtype",
            "In msg nelems", "Out msg nelems", "In msg size (MB)", "Out msg size (MB)", "Full msg size (MB)",
            "comm_latency", "skew in start time", "earliest arrival rank", "avg_wait_time", "skew in end time",
            "algo bw (GB/s)", "bus bw (GB/s)"]
A2AV = ["collective_id", "Process Group Name", "Process Group Ranks", "Collective name", "Group size", "dtype",
        "stream", "total data communicated (MB)", "total nelems communicated", "wall_time (us)", "max_rank_dur (us)",
        "min_rank_dur (us)", "avg_rank_dur (us)", "throughput (GB/s)", "max_rank_throughput (GB/s)",
        "min_rank_throughput (GB/s)", "size_imbalance", "skew in start time", "skew in end time"]
STRAGGLER = ["rank", "total_wait_time_us", "mean_wait_time_us", "times_arrived_last", "times_arrived_first",
             "pct_arrived_last", "num_collectives", "total_nccl_dur_us"]
HEATMAP = ["src_rank", "dst_rank", "total_sent_MB", "avg_sent_MB", "count"]


def summary_implicit_columns(aggs, with_bw=True):
    cols = ["Collective name", "dtype", "In msg nelems", "Process Group Name", "Group size", "Full msg size (MB)"]
    for m in ("comm_latency", "skew in start time", "skew in end time") + (
            ("algo bw (GB/s)", "bus bw (GB/s)") if with_bw else ()):
        cols += [f"{m}_{a}" for a in aggs]
    return cols + ["count", "Total comm latency (ms)"]


def summary_a2av_columns(aggs):
    cols = ["Process Group Name", "dtype"]
    cols += [f"total data communicated (MB)_{a}" for a in aggs]
    cols += [f"wall_time (us)_{a}" for a in aggs] + ["Total wall_time (us)"]
    cols += [f"throughput (GB/s)_{a}" for a in aggs]
    cols += ["size_imbalance_mean", "size_imbalance_max", "max_rank_dur (us)_mean", "max_rank_dur (us)_max",
             "skew in start time_mean", "skew in start time_max", "skew in end time_mean", "skew in end time_max",
             "count", "Process Group Ranks", "Collective name", "Group size", "Total wall_time (ms)"]
    return cols


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def fx_report(tmp_path_factory):
    d = tmp_path_factory.mktemp("fx_report")
    truth = generate_fixture.generate(str(d), ranks=4, steps=2, fill_ops=12, tp=2, clock_offsets="random",
                                      straggler_rank=2, seed=11)
    return str(d), truth


@pytest.fixture(scope="session")
def report_sheets(fx_report):
    """The report without correlate's blocking sheets (those are tested in test_correlate.py)."""
    return generate_collective_report(trace_dir=fx_report[0], world_size=4, all2allv_heatmap=True,
                                      write_files=False, blocking_analysis=False)


@pytest.fixture(scope="session")
def fx_offsets(tmp_path_factory):
    d = tmp_path_factory.mktemp("fx_offsets")
    truth = generate_fixture.generate(str(d), ranks=4, steps=3, fill_ops=12, straggler_rank=3,
                                      clock_offsets_us="0,180.25,-320.5,75", seed=12)
    return str(d), truth


@pytest.fixture(scope="session")
def fx_old_report(tmp_path_factory):
    d = tmp_path_factory.mktemp("fx_old_report")
    truth = generate_fixture.generate(str(d), ranks=4, steps=2, fill_ops=12, layout="old", straggler_rank=0,
                                      clock_offsets="random", seed=13)
    return str(d), truth


def instance_lookup(sheets):
    long = sheets["nccl_long"]
    return {(int(r), float(t)): int(i) for r, t, i in zip(long["rank"], long["ts_raw"], long["instance"])}


def truth_instance(lookup, col):
    ids = {lookup[(int(r), float(p["ts_us"]))] for r, p in col["per_rank"].items()}
    assert len(ids) == 1
    return ids.pop()


def approx(v):
    return pytest.approx(v, rel=1e-9, abs=1e-6)


def check_implicit_against_truth(sheets, truth, true_times=False, tol=1e-6):
    imp = sheets["nccl_implicit_sync"].set_index("instance")
    lookup = instance_lookup(sheets)
    n = 0
    for col in truth["collectives"]:
        if not col["implicit_sync"]:
            continue
        n += 1
        ex = col["expected"]
        row = imp.loc[truth_instance(lookup, col)]
        if not true_times:
            assert row["comm_latency"] == approx(ex["comm_latency"])
            assert row["skew in start time"] == approx(ex["skew_start"])
            assert row["skew in end time"] == approx(ex["skew_end"])
            assert row["avg_wait_time"] == approx(ex["avg_wait"])
            assert row["earliest arrival rank"] == ex["earliest_arrival_rank"]
            assert row["straggler_rank"] == ex["last_arriver"]
            for r, w in ex["waits"].items():
                assert row[f"rank_{r}_wait_time"] == approx(w)
            assert row["In msg size (MB)"] == approx(ex["in_msg_mb"])
            assert row["Out msg size (MB)"] == approx(ex["out_msg_mb"])
            assert row["Full msg size (MB)"] == approx(ex["full_msg_mb"])
            assert row["algo bw (GB/s)"] == approx(ex["algo_bw"])
            assert row["bus bw (GB/s)"] == approx(ex["bus_bw"])
            assert row["Collective name"] == col["trace_collective_name"]
            assert row["Group size"] == col["group_size"] and row["dtype"] == col["dtype"]
        else:
            assert row["skew in start time"] == pytest.approx(ex["true_skew_start"], abs=tol)
            for r, w in ex["true_waits"].items():
                assert row[f"rank_{r}_wait_time"] == pytest.approx(w, abs=tol)
    assert n == len(imp)


def check_straggler_against_truth(sheets, truth):
    st = sheets["straggler_summary"]
    exp = truth["straggler_summary"]
    assert int(st["rank"].iloc[0]) == exp["straggler_rank"]
    rows = st.set_index("rank")
    for r, e in exp["rows"].items():
        got = rows.loc[int(r)]
        for k in ("total_wait_time_us", "mean_wait_time_us", "pct_arrived_last", "total_nccl_dur_us"):
            assert got[k] == pytest.approx(e[k], abs=0.051), (r, k)
        for k in ("times_arrived_last", "times_arrived_first", "num_collectives"):
            assert got[k] == e[k], (r, k)


# ---------------------------------------------------------------------- A7 worked example


def test_worked_example_a7_digit_for_digit(tmp_path):
    ts = ["5000001304.832", "5000001322.204", "5000001340.037", "5000001454.555"]
    dur = ["551.601", "533.516", "515.861", "400.168"]
    for r in range(4):
        write_trace(tmp_path / f"rank{r}_trace.json", [coll_kernel(ts[r], dur[r], corr=100 + r, device=r)],
                    rank=r, world_size=4)
    sheets = generate_collective_report(trace_dir=str(tmp_path), world_size=4, write_files=False)
    imp = sheets["nccl_implicit_sync"]
    assert len(imp) == 1
    row = imp.iloc[0]
    assert row["collective_id"] == "0_0"
    assert row["comm_latency"] == 400.168
    assert [row[f"rank_{r}_wait_time"] for r in range(4)] == [149.723, 132.351, 114.518, 0.0]
    assert row["skew in start time"] == 149.723
    assert row["earliest arrival rank"] == 0
    assert row["avg_wait_time"] == 99.148
    assert row["skew in end time"] == 1.71
    assert row["Full msg size (MB)"] == 4.0
    assert round(row["algo bw (GB/s)"], 6) == 9.761525
    assert round(row["bus bw (GB/s)"], 6) == 14.642288
    assert [row[f"rank_{r}_ts"] for r in range(4)] == [float(t) for t in ts]
    assert [row[f"rank_{r}_dur"] for r in range(4)] == [float(d) for d in dur]
    # the trace's own microseconds in nccl_long
    assert sheets["nccl_long"]["ts"].tolist() == [float(t) for t in ts]
    st = sheets["straggler_summary"]
    assert st["rank"].iloc[0] == 3 and st["total_wait_time_us"].iloc[0] == 0.0
    assert st["times_arrived_last"].iloc[0] == 1 and st["pct_arrived_last"].iloc[0] == 100.0
    assert list(st.set_index("rank").loc[[0, 1, 2], "total_wait_time_us"]) == [149.7, 132.4, 114.5]


# ---------------------------------------------------------------------- columns and order (A4/A5)


def test_sheet_order_and_part_a_columns(report_sheets):
    s = report_sheets
    assert list(s) == ["nccl_summary_implicit_sync", "nccl_summary_long", "nccl_summary_all2allv",
                       "nccl_all2allv_heatmap", "nccl_long", "nccl_implicit_sync", "nccl_all2allv",
                       "straggler_summary", "nccl_summary_by_size", "clock_alignment", "data_quality"]
    aggs = ["mean", "median", "min", "max"]
    # the fixture has 8 deviceProperties entries: node columns are on
    assert list(s["nccl_long"].columns[:19]) == LONG + ["node_id", "node_span"]
    assert list(s["nccl_summary_long"].columns) == SUMMARY_LONG + ["node_id", "node_span"]
    assert list(s["nccl_summary_implicit_sync"].columns) == summary_implicit_columns(aggs)
    ranks = [0, 1, 2, 3]
    imp = IMPLICIT + [f"rank_{r}_{x}" for r in ranks for x in ("ts", "dur")] + [f"rank_{r}_wait_time" for r in ranks]
    assert list(s["nccl_implicit_sync"].columns[:len(imp) + 1]) == imp + ["node_span"]
    assert list(s["nccl_implicit_sync"].columns[len(imp) + 1:len(imp) + 4]) == ["xfer_latency", "straggler_rank",
                                                                                "blame_us"]
    block = ["ts", "dur", "In msg nelems", "Out msg nelems", "In msg size (MB)", "Out msg size (MB)",
             "In split size", "Out split size"]
    a2av = A2AV + [f"rank_{r}_{x}" for r in ranks for x in block] + \
        [f"rank_{r}_skew in {w} time" for r in ranks for w in ("start", "end")]
    assert list(s["nccl_all2allv"].columns[:len(a2av) + 1]) == a2av + ["node_span"]
    assert list(s["nccl_summary_all2allv"].columns) == summary_a2av_columns(aggs) + ["node_span"]
    assert list(s["nccl_all2allv_heatmap"].columns[:5]) == HEATMAP
    assert list(s["straggler_summary"].columns[:9]) == STRAGGLER + ["node_id"]


def test_sorting_rules(report_sheets):
    s = report_sheets
    assert s["nccl_summary_long"]["dur_sum"].is_monotonic_decreasing
    assert s["nccl_summary_implicit_sync"]["Total comm latency (ms)"].is_monotonic_decreasing
    assert s["nccl_all2allv"]["total data communicated (MB)"].is_monotonic_decreasing
    assert s["nccl_summary_all2allv"]["Total wall_time (ms)"].is_monotonic_decreasing
    assert s["straggler_summary"]["total_wait_time_us"].is_monotonic_increasing
    heat = s["nccl_all2allv_heatmap"]
    assert list(zip(heat["src_rank"], heat["dst_rank"])) == sorted(zip(heat["src_rank"], heat["dst_rank"]))
    # B6: deterministic order, by collective time then rank
    long = s["nccl_long"]
    assert long["instance"].is_monotonic_increasing
    assert long.groupby("instance")["rank"].apply(lambda x: x.is_monotonic_increasing).all()


def test_formulas_summary_implicit(report_sheets):
    imp, summ = report_sheets["nccl_implicit_sync"], report_sheets["nccl_summary_implicit_sync"]
    for _, row in summ.iterrows():
        g = imp[(imp["Collective name"] == row["Collective name"]) & (imp["dtype"] == row["dtype"])
                & (imp["In msg nelems"] == row["In msg nelems"])]
        assert row["count"] == len(g)
        assert row["Total comm latency (ms)"] == pytest.approx(g["comm_latency"].sum() / 1000)
        assert row["comm_latency_median"] == pytest.approx(g["comm_latency"].median())
        assert row["bus bw (GB/s)_max"] == pytest.approx(g["bus bw (GB/s)"].max())
        assert row["skew in end time_min"] == pytest.approx(g["skew in end time"].min())
    long, sl = report_sheets["nccl_long"], report_sheets["nccl_summary_long"]
    assert sl["operation_count"].sum() == len(long)
    top = sl.iloc[0]
    g = long[(long["rank"] == top["rank"]) & (long["Process Group Name"] == top["Process Group Name"])
             & (long["Collective name"] == top["Collective name"]) & (long["In msg nelems"] == top["In msg nelems"])]
    assert top["dur_sum"] == pytest.approx(g["dur"].sum()) and top["dur_std"] == pytest.approx(g["dur"].std(ddof=1))
    assert (long["In msg size (MB)"] == long["In msg nelems"].astype(float) * 4 / MIB)[long["dtype"] == "Float"].all()


# ---------------------------------------------------------------------- ground truth


def test_implicit_sync_matches_truth(report_sheets, fx_report):
    check_implicit_against_truth(report_sheets, fx_report[1])


def test_implicit_sync_matches_truth_old_layout(fx_old_report):
    d, truth = fx_old_report
    sheets = generate_collective_report(trace_dir=d, world_size=4, write_files=False)
    check_implicit_against_truth(sheets, truth)
    check_straggler_against_truth(sheets, truth)


def test_collective_dense_fixture_matches_truth(tmp_path):
    """fill_ops=0 (the dense benchmark's traces): only the collectives, their
    CPU side and each step's sync; the report still matches the truth."""
    truth = generate_fixture.generate(str(tmp_path), ranks=4, steps=6, fill_ops=0, straggler_rank=1, seed=5)
    sheets = generate_collective_report(trace_dir=str(tmp_path), world_size=4, write_files=False)
    assert len(sheets["nccl_long"]) == 4 * len(truth["collectives"])
    check_implicit_against_truth(sheets, truth)
    check_straggler_against_truth(sheets, truth)
    assert truth["fill_ops_per_step"] == 0


def test_straggler_summary_matches_truth(report_sheets, fx_report):
    check_straggler_against_truth(report_sheets, fx_report[1])


def test_all2allv_and_heatmap_match_truth(report_sheets, fx_report):
    truth = fx_report[1]
    a2av = report_sheets["nccl_all2allv"].set_index("instance")
    lookup = instance_lookup(report_sheets)
    cols = [c for c in truth["collectives"] if c["collective_name"] == "all_to_allv"]
    assert len(cols) == len(a2av) > 0
    for col in cols:
        ex = col["expected"]
        row = a2av.loc[truth_instance(lookup, col)]
        assert row["total data communicated (MB)"] == approx(ex["total_data_mb"])
        assert row["total nelems communicated"] == ex["total_nelems"]
        assert row["size_imbalance"] == approx(ex["size_imbalance"])
        assert row["wall_time (us)"] == approx(ex["wall_time_us"])
        assert row["max_rank_dur (us)"] == approx(ex["max_rank_dur_us"])
        assert row["min_rank_dur (us)"] == approx(ex["min_rank_dur_us"])
        assert row["avg_rank_dur (us)"] == approx(ex["avg_rank_dur_us"])
        assert row["throughput (GB/s)"] == approx(ex["throughput_gbps"])
        assert row["skew in start time"] == approx(ex["skew_start"])
        assert row["skew in end time"] == approx(ex["skew_end"])
        for r, p in col["per_rank"].items():
            assert row[f"rank_{r}_In msg nelems"] == p["in_nelems"]
            assert row[f"rank_{r}_In split size"] == str(p["in_split"])
        assert not row["metadata_mismatch"] and not row["stream_mismatch"]
    heat = report_sheets["nccl_all2allv_heatmap"]
    got = [(int(s), int(d), round(mb * MIB), int(n)) for s, d, mb, n in
           zip(heat["src_rank"], heat["dst_rank"], heat["total_sent_MB"], heat["count"])]
    assert got == [(h["src"], h["dst"], h["bytes"], h["count"]) for h in truth["heatmap"]]
    assert (heat["avg_sent_MB"] == heat["total_sent_MB"] / heat["count"]).all()


def test_clock_aligned_report_matches_true_times(fx_offsets):
    d, truth = fx_offsets
    raw = generate_collective_report(trace_dir=d, world_size=4, write_files=False)
    check_implicit_against_truth(raw, truth)  # offsets not applied by default on one node
    aligned = generate_collective_report(trace_dir=d, world_size=4, write_files=False, align_clocks=True)
    check_implicit_against_truth(aligned, truth, true_times=True, tol=1.0)
    clock = aligned["clock_alignment"].set_index("rank")
    for r, off in truth["clock_offsets_ns"].items():
        assert clock.loc[int(r), "offset_us"] == pytest.approx(off / 1000, abs=1.0)
    assert clock["applied"].all() and "applied" in clock["note"].iloc[0]
    assert int(aligned["straggler_summary"]["rank"].iloc[0]) == truth["straggler_summary"]["straggler_rank_true"]
    long = aligned["nccl_long"]
    assert np.allclose(long["ts_raw"] - long["clock_offset_us"], long["ts"], atol=1e-3, rtol=0)


# ---------------------------------------------------------------------- Part B extras


def test_part_b_columns(report_sheets):
    imp = report_sheets["nccl_implicit_sync"]
    ts = {r: imp[f"rank_{r}_ts"] for r in range(4)}
    dur = {r: imp[f"rank_{r}_dur"] for r in range(4)}
    starts = pd.concat(ts, axis=1)
    ends = pd.concat({r: ts[r] + dur[r] for r in range(4)}, axis=1)
    assert np.allclose(imp["xfer_latency"], ends.min(axis=1) - starts.max(axis=1), atol=1e-6)
    srt = np.sort(starts.to_numpy(), axis=1)
    two = starts.notna().sum(axis=1) >= 2
    last_two = np.array([row[~np.isnan(row)][-2:] for row in srt[two.to_numpy()]])
    assert np.allclose(imp.loc[two, "blame_us"], last_two[:, 1] - last_two[:, 0], atol=1e-6)
    st = report_sheets["straggler_summary"]
    assert (st["pct_arrived_last_of_participated"] >= st["pct_arrived_last"]).all()
    blame = imp.groupby("straggler_rank")["blame_us"].sum()
    for r, b in blame.items():
        assert st.set_index("rank").loc[r, "total_blame_us"] == pytest.approx(b, abs=0.051)
    by_size = report_sheets["nccl_summary_by_size"]
    assert by_size["count"].sum() == report_sheets["nccl_long"]["instance"].nunique()
    assert (by_size["p99_latency_us"] >= by_size["p50_latency_us"]).all()
    ar = by_size[by_size["Collective name"] == "allreduce"]
    assert set(ar["size_bucket"]) <= {"<1 MiB", "<32 MiB", ">=32 MiB"}
    assert report_sheets["clock_alignment"]["applied"].eq(False).all()
    assert "estimated only" in report_sheets["clock_alignment"]["note"].iloc[0]


def test_detailed_analysis_toggle_and_agg_metrics(fx_report):
    s = generate_collective_report(trace_dir=fx_report[0], world_size=4, write_files=False,
                                   detailed_analysis=False, agg_metrics=["mean", "max"], gpus_per_node=2)
    assert {"nccl_long", "nccl_implicit_sync", "nccl_all2allv"}.isdisjoint(s)
    assert list(s["nccl_summary_implicit_sync"].columns) == summary_implicit_columns(["mean", "max"])
    assert list(s["nccl_summary_all2allv"].columns) == summary_a2av_columns(["mean", "max"]) + ["node_span"]
    # 2 GPUs per node: the world group spans nodes, the TP groups [0,1]/[2,3] do not
    spans = s["nccl_summary_long"].drop_duplicates("Process Group Ranks").set_index("Process Group Ranks")["node_span"]
    assert spans["[0, 1, 2, 3]"] == "inter_node" and spans["[0, 1]"] == "intra_node"
    assert spans["[0, 2]"] == "inter_node"
    with pytest.raises(StreamtraceError, match="agg_metrics"):
        generate_collective_report(trace_dir=fx_report[0], world_size=4, write_files=False, agg_metrics=["bogus"])
    with pytest.raises(StreamtraceError, match="gpus_per_node"):
        generate_collective_report(trace_dir=fx_report[0], world_size=4, write_files=False, gpus_per_node=0)


def test_parallel_and_sequential_give_identical_sheets(fx_report, report_sheets):
    """report_sheets ran with the default (ranks in parallel threads)."""
    seq = generate_collective_report(trace_dir=fx_report[0], world_size=4, all2allv_heatmap=True,
                                     write_files=False, jobs=1, blocking_analysis=False)
    par = generate_collective_report(trace_dir=fx_report[0], world_size=4, all2allv_heatmap=True,
                                     write_files=False, jobs=3, blocking_analysis=False)
    for other in (par, report_sheets):
        assert list(other) == list(seq)
        for name in seq:
            pd.testing.assert_frame_equal(other[name], seq[name])


def test_blocking_analysis_with_ranks_in_threads_gives_the_sheets_of_one_at_a_time(fx_report):
    """With --blocking_analysis, -j N extracts N ranks at once in threads
    whose frames interleave; every sheet is that of -j 1."""
    seq = generate_collective_report(trace_dir=fx_report[0], world_size=4, write_files=False, jobs=1,
                                     blocking_analysis=True)
    par = generate_collective_report(trace_dir=fx_report[0], world_size=4, write_files=False, jobs=3,
                                     blocking_analysis=True)
    assert list(par) == list(seq) and "collective_blockers" in seq
    for name in seq:
        pd.testing.assert_frame_equal(par[name], seq[name])


def test_build_report_from_stream_path_frames_or_tables(tmp_path, fx_report, report_sheets):
    from streamtrace.report.tables import collect_tables

    from test_align import stream_of

    path = tmp_path / "s.stev"
    path.write_bytes(stream_of(fx_report[0], 4).getvalue())
    a = build_report(str(path), all2allv_heatmap=True)  # not aligned yet: aligned in-process
    from streamtrace.stream.format import iter_frames

    b = build_report(collect_tables(iter_frames(str(path))), all2allv_heatmap=True)
    for name in report_sheets:
        pd.testing.assert_frame_equal(a[name], report_sheets[name], check_dtype=False)
        pd.testing.assert_frame_equal(b[name], report_sheets[name], check_dtype=False)


# ---------------------------------------------------------------------- robustness (TraceLens crashes)


def _set(tmp_path, per_rank, **kw):
    for r, events in enumerate(per_rank):
        write_trace(tmp_path / f"rank{r}_trace.json", events, rank=r, world_size=len(per_rank), **kw)
    return str(tmp_path)


def test_zero_collectives_gives_empty_valid_report(tmp_path, caplog):
    d = _set(tmp_path, [[compute_kernel("100.0", "5.0")], [compute_kernel("101.0", "5.0")]])
    out = tmp_path / "out.xlsx"
    s = generate_collective_report(trace_dir=d, world_size=2, output_xlsx_path=str(out),
                                   output_csvs_dir=str(tmp_path / "csv"))
    ours = ["nccl_summary_implicit_sync", "nccl_summary_long", "nccl_long", "nccl_implicit_sync",
            "nccl_summary_by_size", "clock_alignment", "data_quality"]
    assert [n for n in s if n in ours] == ours and list(s)[-1] == "data_quality"
    assert {"nccl_summary_all2allv", "nccl_all2allv", "straggler_summary"}.isdisjoint(s)
    assert all(len(s[n]) == 0 for n in ("nccl_summary_implicit_sync", "nccl_long", "nccl_implicit_sync"))
    assert list(s["nccl_long"].columns[:17]) == LONG
    assert list(s["nccl_implicit_sync"].columns[:18]) == IMPLICIT
    assert "no_collectives" in set(s["data_quality"]["category"])
    wb = openpyxl.load_workbook(out)
    assert wb.sheetnames == list(s)
    assert os.path.exists(tmp_path / "csv" / "nccl_long.csv")
    assert any("no collective kernels" in r.getMessage() for r in caplog.records)


def _big_group_set(tmp_path, n=32, with_pg_config=True):
    tmp_path.mkdir()
    truncated = "[" + ", ".join(map(str, range(30))) + ", ...]"
    pg_config = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": n,
                  "ranks": list(range(n))}] if with_pg_config else None
    for r in range(n):
        events = [coll_kernel(f"{1000 + r}.5", f"{50 - r % 7}.25", group_size=n, ranks=truncated, device=r % 8,
                              corr=1),
                  coll_kernel(f"{2000 + r}.5", "40.0", coll="all_to_allv", group_size=n, ranks=truncated,
                              in_split=truncated, out_split=truncated, name=NCCL_SENDRECV, device=r % 8, corr=2)]
        write_trace(tmp_path / f"rank{r}_trace.json", events, rank=r, world_size=n, gpus=8, pg_config=pg_config)
    return str(tmp_path)


def test_process_group_larger_than_30_ranks(tmp_path):
    d = _big_group_set(tmp_path / "with")
    s = generate_collective_report(trace_dir=d, world_size=32, all2allv_heatmap=True, write_files=False)
    assert len(s["nccl_implicit_sync"]) == 1 and s["nccl_implicit_sync"]["node_span"].iloc[0] == "inter_node"
    assert s["nccl_long"]["node_id"].tolist() == [r // 8 for r in range(32)] * 2 or \
        sorted(s["nccl_long"]["node_id"]) == sorted([r // 8 for r in range(32)] * 2)
    assert "nccl_all2allv_heatmap" not in s  # truncated split lists: rows skipped, reported
    dq = s["data_quality"]
    assert "heatmap_rows_skipped" in set(dq["category"])
    d2 = _big_group_set(tmp_path / "without", with_pg_config=False)
    s2 = generate_collective_report(trace_dir=d2, world_size=32, write_files=False)
    assert s2["nccl_implicit_sync"]["node_span"].iloc[0] == "unknown"
    assert "node_span_unknown" in set(s2["data_quality"]["category"])


def test_metadata_mismatch_is_flagged_or_strict(tmp_path):
    d = _set(tmp_path, [[coll_kernel("100.0", "20.0", group_size=2)],
                        [coll_kernel("101.0", "19.0", group_size=2, nelems=2048, device=1)]])
    s = generate_collective_report(trace_dir=d, world_size=2, write_files=False)
    row = s["nccl_implicit_sync"].iloc[0]
    assert row["metadata_mismatch"] and row["mismatch_fields"] == "In msg nelems"
    assert row["In msg nelems"] == 1048576  # the lowest rank's value
    assert "metadata_mismatch" in set(s["data_quality"]["category"])
    assert "metadata_mismatch" in s["nccl_long"]["flags"].iloc[0]
    with pytest.raises(StreamtraceError, match="Metadata mismatch in 'In msg nelems'"):
        generate_collective_report(trace_dir=d, world_size=2, write_files=False, strict=True)


def test_all2allv_stream_mismatch_is_flagged(tmp_path):
    kw = dict(coll="all_to_allv", group_size=2, name=NCCL_SENDRECV)
    d = _set(tmp_path, [[coll_kernel("100.0", "20.0", stream=20, in_split="[10, 20]", nelems=30, **kw)],
                        [coll_kernel("101.0", "19.0", stream=21, in_split="[5, 5]", nelems=10, device=1, **kw)]])
    s = generate_collective_report(trace_dir=d, world_size=2, all2allv_heatmap=True, write_files=False)
    row = s["nccl_all2allv"].iloc[0]
    assert row["stream_mismatch"] and not row["metadata_mismatch"]
    assert row["size_imbalance"] == pytest.approx(30 / 20)
    assert row["total nelems communicated"] == 40
    heat = s["nccl_all2allv_heatmap"]
    assert heat["total_sent_MB"].tolist() == [40 / MIB, 80 / MIB, 20 / MIB, 20 / MIB]
    with pytest.raises(StreamtraceError, match="stream"):
        generate_collective_report(trace_dir=d, world_size=2, write_files=False, strict=True)


def test_unknown_and_extended_dtypes(tmp_path):
    d = _set(tmp_path, [[coll_kernel("100.0", "20.0", group_size=2, dtype="Weird"),
                         coll_kernel("200.0", "20.0", group_size=2, dtype="Float8_e4m3fn", corr=2)],
                        [coll_kernel("101.0", "19.0", group_size=2, dtype="Weird", device=1),
                         coll_kernel("201.0", "19.0", group_size=2, dtype="Float8_e4m3fn", device=1, corr=2)]])
    s = generate_collective_report(trace_dir=d, world_size=2, write_files=False)
    imp = s["nccl_implicit_sync"].set_index("dtype")
    assert math.isnan(imp.loc["Weird", "In msg size (MB)"]) and math.isnan(imp.loc["Weird", "algo bw (GB/s)"])
    assert imp.loc["Weird", "comm_latency"] == 19.0
    assert imp.loc["Float8_e4m3fn", "In msg size (MB)"] == 1.0  # 1 byte per element (B2; TraceLens: NaN)
    assert imp.loc["Float8_e4m3fn", "bus bw (GB/s)"] == pytest.approx(1 / 1024 / 19e-6 * 1.0)


def test_missing_rank_file(tmp_path):
    d = _set(tmp_path, [[coll_kernel("100.0", "20.0")], [coll_kernel("101.0", "19.0", device=1)]])
    with pytest.raises(StreamtraceError, match="Missing ranks"):
        generate_collective_report(trace_dir=d, world_size=3, write_files=False)
    s = generate_collective_report(trace_dir=d, world_size=3, allow_missing_ranks=True, write_files=False)
    dq = s["data_quality"]
    assert "missing_ranks" in set(dq["category"])
    assert sorted(s["nccl_long"]["rank"]) == [0, 1]  # labels never shift


# ---------------------------------------------------------------------- writers


@pytest.mark.parametrize("engine", ["fast", "openpyxl"])
def test_split_rows_and_sheet_titles(tmp_path, engine):
    df = pd.DataFrame({"a": range(25), "b": [f"x{i}" for i in range(25)]})
    parts = sheet_parts("nccl_long", df, max_rows=10)
    assert [t for t, _ in parts] == ["nccl_long", "nccl_long (2)", "nccl_long (3)"]
    assert [len(p) for _, p in parts] == [10, 10, 5]
    long_name = "a_sheet_name_that_is_much_longer_than_31"
    titles = [t for t, _ in sheet_parts(long_name, df, max_rows=10)]
    assert all(len(t) <= 31 for t in titles) and titles[1].endswith(" (2)")
    out = tmp_path / "r.xlsx"
    write_xlsx({"nccl_long": df, "other": df.head(3)}, out, max_rows=10, engine=engine)
    wb = openpyxl.load_workbook(out)
    assert wb.sheetnames == ["nccl_long", "nccl_long (2)", "nccl_long (3)", "other"]
    assert wb["nccl_long (3)"].max_row == 6  # header + 5
    write_csvs({"nccl_long": df}, tmp_path / "csv")
    assert len(pd.read_csv(tmp_path / "csv" / "nccl_long.csv")) == 25


@pytest.mark.parametrize("engine", ["fast", "openpyxl"])
def test_formula_injection_is_neutralised(tmp_path, engine):
    bad = ["=HYPERLINK(\"http://x\",\"y\")", "+1+2", "-3", "@SUM(A1)", "ok", None]
    df = pd.DataFrame({"kernel_name": bad, "v": [1.0, float("nan"), 3.0, 4.0, 5.0, 6.0]})
    write_xlsx({"s": df}, tmp_path / "r.xlsx", engine=engine)
    ws = openpyxl.load_workbook(tmp_path / "r.xlsx")["s"]
    cells = [ws.cell(row=i + 2, column=1) for i in range(len(bad))]
    assert [c.value for c in cells] == bad
    assert all(c.data_type == "s" for c in cells[:5])
    assert ws.cell(row=3, column=2).value is None  # NaN -> empty
    write_csvs({"s": df}, tmp_path / "csv")
    text = (tmp_path / "csv" / "s.csv").read_text()
    for b in bad[:4]:
        assert "'" + b[:3] in text
    assert "\nok," in text


def test_xlsx_engines_agree(tmp_path, report_sheets):
    a, b = tmp_path / "fast.xlsx", tmp_path / "openpyxl.xlsx"
    write_xlsx(report_sheets, a)
    write_xlsx(report_sheets, b, engine="openpyxl")
    assert openpyxl.load_workbook(a).sheetnames == list(report_sheets)
    odd = pd.DataFrame({"t": ["<tag> & \"q\"", " lead", "ctl\x01char", "ünï€"], "i": pd.array([1, None, 3, 4], "Int64"),
                        "b": [True, False, True, False], "f": [0.1, 1e-300, float("inf"), -2.5]})
    write_xlsx({"odd [x]:y": odd}, tmp_path / "odd.xlsx")
    got = pd.read_excel(tmp_path / "odd.xlsx", sheet_name=0)
    assert got["t"].tolist() == ["<tag> & \"q\"", " lead", "ctlchar", "ünï€"]
    assert got["i"].tolist()[0] == 1 and math.isnan(got["i"].tolist()[1])
    assert got["b"].tolist() == [True, False, True, False]
    assert got["f"].tolist()[:2] == [0.1, 1e-300] and math.isnan(got["f"].tolist()[2])
    for name in report_sheets:  # (openpyxl writes 123.0 as 123, read back as int: compare values)
        pd.testing.assert_frame_equal(pd.read_excel(a, sheet_name=name), pd.read_excel(b, sheet_name=name),
                                      check_dtype=False)


def test_writers_are_atomic(tmp_path, monkeypatch):
    df = pd.DataFrame({"a": [1]})
    with pytest.raises(StreamtraceError, match="does not exist"):
        write_xlsx({"s": df}, tmp_path / "nope" / "r.xlsx")

    import streamtrace.report.writers as report_mod

    real_replace = os.replace

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(report_mod.os, "replace", boom)  # fails after the workbook was saved to the temp file
    with pytest.raises(StreamtraceError, match="r.xlsx: cannot replace it: disk full"):
        write_xlsx({"s": df}, tmp_path / "r.xlsx")
    assert os.listdir(tmp_path) == []
    monkeypatch.setattr(report_mod.os, "replace", real_replace)
    monkeypatch.setattr(pd.DataFrame, "to_csv", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(StreamtraceError, match=r"csvs/s\.csv: cannot write it: disk full"):   # the user's path
        write_csvs({"s": df}, tmp_path / "csvs")
    assert os.listdir(tmp_path) == []


def test_default_output_paths(tmp_path):
    from streamtrace.report.files import default_output_path

    assert default_output_path([], trace_dir="/runs/a") == "/runs/a/nccl_analysis_report.xlsx"
    d = tmp_path / "p"
    d.mkdir()
    for r in range(2):
        (d / f"r{r}.json").write_text("{}")
    assert default_output_path([], trace_pattern=str(d / "r*.json"), world_size=2) == \
        str(d / "nccl_analysis_report.xlsx")
    assert default_output_path([], trace_pattern=str(d / "r*.json"), world_size=1) == \
        str(d / "nccl_analysis_report.xlsx")
    assert default_output_path([str(d / "r0.json"), str(tmp_path / "q" / "r1.json")]) == \
        str(tmp_path / "nccl_analysis_report.xlsx")


# ---------------------------------------------------------------------- real traces


@needs_real
@pytest.mark.parametrize("path", [p for p in real_traces() if "param-dlrm" not in p], ids=real_id)
def test_every_single_rank_real_trace_reports(tmp_path, path):
    s = generate_collective_report(paths=[path], output_xlsx_path=str(tmp_path / "r.xlsx"), all2allv_heatmap=True)
    assert os.path.getsize(tmp_path / "r.xlsx") > 0
    assert "data_quality" in s and "nccl_long" in s
    long = s["nccl_long"]
    if "nccl_parser_config" in path:
        assert len(long) == 21 and len(s["nccl_implicit_sync"]) == 15
        assert set(long["Collective name"]) == {"allreduce", "broadcast"}
        assert set(long["Process Group Name"]) == {"0"}
    if "tracelens" in path:
        assert len(long) == 17 and len(s["nccl_implicit_sync"]) == 6
        assert long["Collective name"].isna().sum() == 5  # launched before the window: kind unknown, kept
    if "negative_queue" in path:
        assert len(long) == 80
        assert {"all_to_allv", "_allgather_base", "_reduce_scatter_base", "allreduce"} <= set(long["Collective name"])
    if "df_index_resolver" in path:
        assert len(s["nccl_implicit_sync"]) == 2020


@needs_real
def test_param_dlrm_rank_set(real_dir, tmp_path):
    s = generate_collective_report(trace_glob=f"{real_dir}/param-dlrm/*.json.gz", rank_regex=r"worker(?P<rank>\d+)",
                                   world_size=8, output_csvs_dir=str(tmp_path / "csv"), all2allv_heatmap=True)
    long = s["nccl_long"]
    assert len(long) == 64 and long.groupby("instance")["rank"].nunique().eq(8).all()
    assert long["collective_id"].nunique() == 8
    assert long.groupby("collective_id")["Collective name"].first().value_counts().to_dict() == \
        {"all_to_allv": 5, "allreduce": 3}
    imp = s["nccl_implicit_sync"]
    assert len(imp) == 3 and (imp["skew in end time"] <= 10.0).all()  # ends agree within a few us on one host
    a2av = s["nccl_all2allv"].set_index("collective_id")
    first = a2av.loc["0"]
    assert first["rank_7_dur"] == 10.0 and first["min_rank_dur (us)"] == 10.0  # rank 7 arrived last (MANIFEST)
    assert first["rank_7_skew in start time"] == first["skew in start time"]
    assert (a2av["Group size"] == 8).all() and (a2av["dtype"].notna()).all()
    assert len(s["straggler_summary"]) == 8
    assert not s["data_quality"]["category"].isin(["unmatched", "metadata_mismatch", "sequence_aligned"]).any()
    assert sorted(os.listdir(tmp_path / "csv")) == sorted(f"{n}.csv" for n in s)


def test_fast_csv_writer_is_byte_identical_to_pandas(tmp_path, monkeypatch):
    """The CSV fast path (streamtrace.report.cells) writes what ``to_csv`` writes:
    floats on and off the ns grid, -0.0, inf, NaN, huge ints, nullable ints,
    bools, text needing quotes, formula-like text, mixed object columns."""
    import streamtrace.report.writers as report_mod

    rng = np.random.default_rng(1)
    n = 3000
    special = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e16, 1e12, 999999999999.999, -999999999999.999, 0.001, 1e-4,
               5e-324, 0.1, 2.5, -7.0]
    floats = np.concatenate([rng.integers(-10**15, 10**15, n) / 1000.0,
                             rng.standard_normal(n) * 10.0 ** rng.integers(-12, 20, n), special * 20])
    m = len(floats)
    # (a CR: the fast path quotes that field alone, pandas' csv module cannot,
    # so its fallback quotes every field: tests/test_outputs.py checks both)
    texts = np.array(["a", "=x", "+1", "-2", "@q", "\tt", "x,y", 'q"r', "l\nm", "l\n=m,-n", " sp ", "", "é", None],
                     dtype=object)
    mixed = np.array([np.float64(1.5), 2.5, None, np.int64(3), True, "=x,y", (1, 2), float("nan"), pd.NA, 1],
                     dtype=object)
    df = pd.DataFrame({
        "f": floats, "mb": rng.integers(0, 50, m) / MIB * 3.3, "i": rng.integers(-10**18, 10**18, m),
        "small": rng.integers(0, 8, m), "b": rng.random(m) > 0.5,
        "I": pd.array(np.where(rng.random(m) > 0.3, rng.integers(0, 10**6, m), None), dtype="Int64"),
        "s": texts[rng.integers(0, len(texts), m)], "o": mixed[rng.integers(0, len(mixed), m)],
        "str": pd.Series(texts[rng.integers(0, len(texts), m)]).astype("str"), 'col,"x"': 1.0})
    monkeypatch.setattr(report_mod, "_CHUNK_ROWS", 1000)
    expected = tmp_path / "pandas.csv"
    report_mod._pandas_csv(df, expected)
    monkeypatch.setattr(report_mod, "_pandas_csv", lambda *a: pytest.fail("the fast path fell back to pandas"))
    report_mod._write_csv(df, tmp_path / "fast.csv")
    assert (tmp_path / "fast.csv").read_bytes() == expected.read_bytes()


@pytest.mark.parametrize("case", ["fixture", "big_group"])
def test_sheets_built_in_two_processes_equal_one(case, fx_report, tmp_path, monkeypatch):
    """build_report's two groups of sheets, one in a forked child, give the
    sheets (and data-quality rows, in order) of building them all here: the
    truncated rank list seen by both groups is counted once."""
    import streamtrace.report.sheets as report_mod
    from helpers import serial_and_forked

    if case == "fixture":
        tables = collect_tables_from_traces(resolve_inputs(trace_dir=fx_report[0], world_size=4), world_size=4)
    else:
        d = _big_group_set(tmp_path / "set", with_pg_config=False)
        tables = collect_tables_from_traces(resolve_inputs(trace_dir=d, world_size=32), world_size=32)
    serial, parallel, forks = serial_and_forked(monkeypatch, report_mod,
                                                lambda: build_report(tables, all2allv_heatmap=True))
    assert forks == [True]   # the child really ran
    assert list(parallel) == list(serial)
    for name in serial:
        pd.testing.assert_frame_equal(parallel[name], serial[name], check_exact=True)
    if case == "big_group":
        unknown = serial["data_quality"].query("category == 'node_span_unknown'")
        assert unknown["count"].tolist() == [1]


@pytest.mark.parametrize("case", ["fixture", "big_group"])
def test_sheets_delivered_by_the_process_that_built_them_equal_one(case, fx_report, tmp_path, monkeypatch):
    """The CLI's CSV-only way (``build_report(deliver=CsvDir.write)``: each
    process writes the group of sheets it built, the parent the rest) writes
    the files ``write_csvs`` writes of sheets built here, byte for byte, with
    the same data-quality rows, and returns the names of every sheet."""
    import streamtrace.report.sheets as report_mod
    from helpers import serial_and_forked

    if case == "fixture":
        tables = collect_tables_from_traces(resolve_inputs(trace_dir=fx_report[0], world_size=4), world_size=4)
    else:
        d = _big_group_set(tmp_path / "set", with_pg_config=False)
        tables = collect_tables_from_traces(resolve_inputs(trace_dir=d, world_size=32), world_size=32)

    def delivered():
        out = CsvDir(tmp_path / "delivered")
        try:
            sheets = build_report(tables, all2allv_heatmap=True, deliver=functools.partial(out.write, parallel=False))
            out.write({name: df for name, df in sheets.items() if df is not None})
            out.commit(list(sheets))
        finally:
            out.discard()
        return sheets

    expected = build_report(tables, all2allv_heatmap=True)
    write_csvs(expected, tmp_path / "expected")
    _, sheets, forks = serial_and_forked(monkeypatch, report_mod, delivered)
    assert forks == [True]   # the child really ran (and wrote its sheets)
    assert list(sheets) == list(expected)
    assert {name for name, df in sheets.items() if df is None} >= {"nccl_implicit_sync", "nccl_summary_long",
                                                                   "nccl_long"}
    assert sorted(os.listdir(tmp_path / "delivered")) == sorted(os.listdir(tmp_path / "expected"))
    for name in os.listdir(tmp_path / "expected"):
        assert (tmp_path / "delivered" / name).read_bytes() == (tmp_path / "expected" / name).read_bytes(), name
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".streamtrace-csv-")]   # no staging left behind


@pytest.mark.parametrize("two_processes", [False, True])
def test_strict_errors_from_either_group_of_sheets(tmp_path, monkeypatch, two_processes):
    """--strict raises the same error whether the sheet group that finds the
    disagreement runs here or in the forked child (the all_to_allv group)."""
    import streamtrace.report.sheets as report_mod

    kw = dict(coll="all_to_allv", group_size=2, name=NCCL_SENDRECV)
    d = _set(tmp_path, [[coll_kernel("100.0", "20.0", dtype="Float", **kw)],
                        [coll_kernel("101.0", "19.0", dtype="Half", device=1, **kw)]])
    tables = collect_tables_from_traces(resolve_inputs(trace_dir=d, world_size=2), world_size=2)
    if two_processes:
        monkeypatch.setattr(report_mod, "available_cpus", lambda: 2)
        monkeypatch.setattr(report_mod, "_PARALLEL_MIN_ROWS", 0)
    else:
        monkeypatch.setattr(report_mod, "available_cpus", lambda: 1)
    assert build_report(tables)["nccl_all2allv"]["metadata_mismatch"].tolist() == [True]
    with pytest.raises(StreamtraceError, match=r"dtype.*\(--strict\)"):
        build_report(tables, strict=True)

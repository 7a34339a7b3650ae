"""correlate: injected truths recovered, parts add up, sweeps agree with brute force."""
import itertools
import json
import os

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import generate_fixture
from conftest import needs_real
from streamtrace import _native
from streamtrace.align.stage import align_frames
from streamtrace.correlate.overlap import resident_blocks_per_sm, wave_risk
from streamtrace.correlate.stage import TABLE_PREFIX, correlate_frames
from streamtrace.extract import extract_rank
from streamtrace.io.ranks import resolve_inputs
from streamtrace.stream.format import Kind


def run_chain(paths_by_rank):
    frames = itertools.chain.from_iterable(extract_rank(p, r) for r, p in sorted(paths_by_rank.items()))
    sheets = {}
    for f in correlate_frames(align_frames(frames)):
        if f.kind == 7:
            name, df = f.table()
            if name.startswith(TABLE_PREFIX):
                sheets[name[len(TABLE_PREFIX):]] = df
    return sheets


def generated(tmp_path_factory, name, **opts):
    out = tmp_path_factory.mktemp(name)
    truth = generate_fixture.generate(str(out), **opts)
    return truth, run_chain({int(r): str(out / f) for r, f in truth["files"].items()})


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    return generated(tmp_path_factory, "slow", ranks=4, slow_kernel_rank=2, slow_kernel_factor=3.0)


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    return generated(tmp_path_factory, "host", ranks=4, host_delay_rank=1, host_delay_us=800)


@pytest.fixture(scope="module")
def inflated(tmp_path_factory):
    return generated(tmp_path_factory, "infl", ranks=4, steps=6, inflate_kernel_factor=1.5,
                     clock_offsets_us="random")


def test_geometry_arriving_late_or_early_gives_the_same_sheets(tmp_path):
    """Launch geometry is joined per KERNELS frame to the GPU rows of the
    frame before it (extract's order); KERNELS frames elsewhere in a stream
    (all at a rank's end, or before their events) are joined at the end.
    Nor does the frame size change a result (the in-process chains use
    larger frames than a stream's)."""
    truth = generate_fixture.generate(str(tmp_path), ranks=2, steps=3, slow_kernel_rank=1)
    paths = {int(r): str(tmp_path / f) for r, f in truth["files"].items()}

    def frames(order):
        for r, p in sorted(paths.items()):
            # many EVENTS/KERNELS frame pairs per rank, but for "whole": one of each
            rank_frames = list(extract_rank(p, r, batch_events=1 << 20 if order == "whole" else 256))
            kernels = [f for f in rank_frames if f.kind == Kind.KERNELS]
            others = [f for f in rank_frames if f.kind != Kind.KERNELS]
            assert len(kernels) == 1 if order == "whole" else len(kernels) > 2
            yield from (rank_frames if order == "extract" else
                        others[:-1] + kernels + others[-1:] if order == "late" else kernels + others)

    def sheets(order):
        out = {}
        for f in correlate_frames(align_frames(frames(order))):
            if f.kind == Kind.TABLE:
                name, df = f.table()
                out[name] = df
        return out

    want = sheets("extract")
    assert (want["correlate.collective_overlap"]["top_kernel_grid"].fillna("") != "").any()
    for order in ("late", "early", "whole"):
        got = sheets(order)
        assert got.keys() == want.keys()
        for name in want:
            pd.testing.assert_frame_equal(got[name], want[name])


def test_in_process_chain_without_flows_gives_the_same_tables(tmp_path):
    """The in-process chains (``chain.stage_frames``) leave flow events
    out in the tokenizer: align and correlate read complete events only, so
    every table is the one a full extraction gives, but for what counts
    the events in the stream: align's event indices and events per rank."""
    from streamtrace.chain import stage_frames, trace_frames

    generate_fixture.generate(str(tmp_path), ranks=3, steps=3, slow_kernel_rank=1, host_delay_rank=2)
    inputs = resolve_inputs(trace_dir=str(tmp_path), world_size=3)

    def tables(frames):
        events, out = 0, {}
        for f in correlate_frames(align_frames(frames)):
            if f.kind == Kind.EVENTS:
                events += len(f.records())
            elif f.kind == Kind.TABLE:
                name, df = f.table()
                out[name] = df
        return events, out

    full_events, want = tables(trace_frames(inputs, world_size=3))
    lean_events, got = tables(stage_frames(inputs, world_size=3))
    assert lean_events < 0.8 * full_events   # flows are two per kernel launch
    assert any(n.startswith(TABLE_PREFIX) for n in want) and got.keys() == want.keys()
    assert got["align.ranks"]["events"].sum() == lean_events and want["align.ranks"]["events"].sum() == full_events
    stream_positions = {"align.ranks": ["events"], "align.collectives": [
        "event", "launch_event", "cpu_op_event", "rpc_event", "annotation_event", "c10d_event"]}
    for table in (got, want):
        for name, columns in stream_positions.items():
            table[name] = table[name].drop(columns=columns)
    for name in want:
        pd.testing.assert_frame_equal(got[name], want[name])


def test_runs_under_a_profiler_or_tracer(tmp_path):
    """A profiler (cProfile, coverage, a debugger) holds references to the
    arrays whose methods it sees called: a rank's end then copies its rows
    out instead of shrinking them in place, with the same sheets."""
    import sys

    truth = generate_fixture.generate(str(tmp_path), ranks=2, steps=3, slow_kernel_rank=1)
    paths = {int(r): str(tmp_path / f) for r, f in truth["files"].items()}
    want = run_chain(paths)
    sys.setprofile(lambda frame, event, arg: None)
    try:
        got = run_chain(paths)
    finally:
        sys.setprofile(None)
    assert got.keys() == want.keys()
    for name in want:
        pd.testing.assert_frame_equal(got[name], want[name])


def test_slow_kernel_is_the_top_blocker(slow):
    truth, sheets = slow
    sk = truth["slow_kernel"]
    top = sheets["blocking_kernels"].iloc[0]
    assert top["kernel"] == sk["kernel_name"]
    assert top["grid"] == "[" + ",".join(map(str, sk["grid"])) + "]"
    assert top["ranks"] == str(sk["rank"])
    want = np.mean([i["excess_us"] for i in sk["instances"]])
    assert top["mean_excess_us"] == pytest.approx(want, rel=0.05)
    b = sheets["collective_blockers"]
    for inst in sk["instances"]:
        if inst["blocked_rank_is_last_arriver"]:
            row = b[b["collective_id"] == f"{inst['pg_name']}_{inst['seq']}"].iloc[0]
            assert row["late_rank"] == sk["rank"] and row["dominant_cause"] == "GPU backlog"
            assert row["blocker_1"] == sk["kernel_name"]
            assert row["blocker_1_excess_us"] == pytest.approx(inst["excess_us"], rel=0.05)


def test_host_delay_is_host_launch_lateness(host):
    truth, sheets = host
    hd = truth["host_delay"]
    b = sheets["collective_blockers"]
    for inst in hd["instances"]:
        if inst["delayed_rank_is_last_arriver"]:
            row = b[b["collective_id"] == f"{inst['pg_name']}_{inst['seq']}"].iloc[0]
            assert row["late_rank"] == hd["rank"]
            assert row["dominant_cause"] == "host launch lateness"
            assert row["top_blockers"].startswith(hd["op_name"])
    assert sheets["blocking_host_ops"].iloc[0]["op"] == hd["op_name"]


def test_compute_inflation_factor_recovered(inflated):
    truth, sheets = inflated
    ik = truth["inflated_kernel"]
    ci = sheets["compute_inflation"]
    row = ci[ci["kernel"] == ik["name"]].iloc[0]
    assert row["inflation"] + 1 == pytest.approx(ik["factor"], rel=0.05)
    assert row["median_isolated_us"] == pytest.approx(ik["base_dur_us"], rel=0.05)


@pytest.mark.parametrize("which", ["slow", "host", "inflated"])
def test_parts_add_up_and_overlaps_are_bounded(which, request):
    _, sheets = request.getfixturevalue(which)
    b = sheets["collective_blockers"]
    assert len(b) > 0
    parts = b["host_launch_lateness_us"] + b["gpu_dependency_wait_us"] + b["gpu_backlog_us"]
    assert np.allclose(parts, b["delta_us"], atol=1e-6)
    assert (b[["host_launch_lateness_us", "gpu_dependency_wait_us", "gpu_backlog_us"]] >= 0).all().all()
    assert b["dominant_cause"].notna().all()
    o = sheets["collective_overlap"]
    assert (o["overlap_us"] <= o["dur_us"] + 1e-9).all() and (o["overlap_frac"].between(0, 1)).all()
    e = sheets["exposed_comm"]
    assert np.allclose(e["hidden_us"] + e["exposed_us"], e["comm_us"])
    assert np.allclose(e["exposed_waiting_us"] + e["exposed_transfer_us"], e["exposed_us"])
    assert e["comp_comm_overlap_pct"].notna().all()


# --------------------------------------------------------------- sweeps

intervals = st.lists(st.tuples(st.integers(0, 500), st.integers(0, 80)), max_size=40).map(
    lambda xs: (np.array([s for s, _ in xs], dtype=np.int64), np.array([s + d for s, d in xs], dtype=np.int64)))


def covered(starts, ends):
    pts = set()
    for s, e in zip(starts, ends):
        pts.update(range(s, e))
    return pts


@settings(max_examples=300, deadline=None)
@given(intervals, intervals)
def test_sweeps_agree_with_brute_force(a, b):
    bs, be = b
    order = np.argsort(bs, kind="stable")
    bs, be = bs[order], be[order]
    us, ue = _native.interval_union(bs, be)
    assert covered(us, ue) == covered(bs, be)
    assert all(ue[:-1] < us[1:]) if len(us) > 1 else True
    ov = _native.overlap_with_union(a[0], a[1], us, ue)
    cov = covered(bs, be)
    for s, e, o in zip(a[0], a[1], ov):
        assert o == len(set(range(s, e)) & cov)
    ia, ib, il = _native.intersecting_pairs(a[0], a[1], bs, be, chunk=4)
    want = {(i, j, min(a[1][i], be[j]) - max(a[0][i], bs[j]))
            for i in range(len(a[0])) for j in range(len(bs)) if min(a[1][i], be[j]) > max(a[0][i], bs[j])}
    assert set(zip(ia.tolist(), ib.tolist(), il.tolist())) == want and len(ia) == len(want)


@settings(max_examples=300, deadline=None)
@given(intervals, intervals, st.booleans())
def test_meeting_union_agrees_with_brute_force(q, b, sort_queries):
    qs, qe = q
    if sort_queries:   # the walking path (sorted) and the searching one (any order)
        order = np.argsort(qs, kind="stable")
        qs, qe = qs[order], qe[order]
    order = np.argsort(b[0], kind="stable")
    us, ue = _native.interval_union(b[0][order], b[1][order])
    got = _native.meeting_union(qs, qe, us, ue)
    want = [i for i in range(len(qs)) if any(u0 < qe[i] and u1 > qs[i] for u0, u1 in zip(us, ue))]
    assert got.tolist() == want


def test_sweep_rejects_unsorted():
    with pytest.raises(ValueError):
        _native.interval_union(np.array([5, 1]), np.array([6, 2]))
    with pytest.raises(ValueError):   # overlapping windows are not a union
        _native.meeting_union(np.array([0]), np.array([1]), np.array([0, 5]), np.array([10, 12]))


def test_wave_risk_from_geometry():
    props = {"numSms": 132, "maxThreadsPerMultiProcessor": 2048, "regsPerMultiprocessor": 65536,
             "sharedMemPerMultiprocessor": 233472}
    bpsm = resident_blocks_per_sm(256, 64, 0, props)
    assert bpsm == 4  # registers: 65536 / (64 * 256)
    assert wave_risk(528, bpsm, 132, 24) == (1, 2, True)
    assert wave_risk(100, bpsm, 132, 24) == (1, 1, False)
    assert resident_blocks_per_sm(256, 64, 0, None) is None


# --------------------------------------------------------------- real traces and missing data

@needs_real
def test_param_dlrm_every_instance_gets_a_cause(real_dir):
    inputs = resolve_inputs(trace_glob=f"{real_dir}/param-dlrm/*.json.gz", rank_regex=r"worker(?P<rank>\d+)",
                            world_size=8)
    sheets = run_chain({i.rank: i.path for i in inputs})
    b = sheets["collective_blockers"]
    assert len(b) == 8  # the step's 5 all_to_all + 3 all_reduce, each matched on 8 ranks
    assert b["dominant_cause"].isin(["host launch lateness", "GPU dependency wait", "GPU backlog", "none"]).all()
    parts = b["host_launch_lateness_us"] + b["gpu_dependency_wait_us"] + b["gpu_backlog_us"]
    assert np.allclose(parts, b["delta_us"])
    o = sheets["collective_overlap"]
    assert len(o) == 64 and (o["overlap_us"] <= o["dur_us"] + 1e-9).all()
    assert len(sheets["exposed_comm"]) >= 8


def test_missing_geometry_device_props_and_cpu_side(tmp_path):
    """Traces stripped of launch geometry, deviceProperties and CPU launches still
    analyse: empty columns and data-quality notes, no exception, no NaN parts."""
    truth = generate_fixture.generate(str(tmp_path), ranks=2, slow_kernel_rank=1, slow_kernel_factor=3.0)
    paths = {}
    for r, f in truth["files"].items():
        text = (tmp_path / f).read_text()
        for key in ('"grid"', '"block"', '"registers per thread"', '"deviceProperties"', '"cudaLaunchKernel"'):
            text = text.replace(key, key[:-1] + '_removed"')
        (tmp_path / f"stripped{r}.json").write_text(text)
        paths[int(r)] = str(tmp_path / f"stripped{r}.json")
    sheets = run_chain(paths)
    b = sheets["collective_blockers"]
    parts = b[["host_launch_lateness_us", "gpu_dependency_wait_us", "gpu_backlog_us"]]
    assert parts.notna().all().all()
    assert np.allclose(parts.sum(axis=1), b["delta_us"])
    o = sheets["collective_overlap"]
    assert o["nccl_ctas"].isna().all() and o["waves_alone"].isna().all()
    notes = set(sheets["correlate_quality"]["check"])
    assert "no deviceProperties" in notes


def test_late_rank_without_launch_records_is_noted(tmp_path):
    """The straggler's kernel launches stripped: where it is the late rank,
    host launch lateness counts 0, the delay is all GPU-side, and each such
    collective gets one 'no launch record' note naming the rank."""
    truth = generate_fixture.generate(str(tmp_path), ranks=4, steps=2, straggler_rank=2, straggler_us=300)
    late = truth["straggler"]["rank"]
    paths = {int(r): str(tmp_path / f) for r, f in truth["files"].items()}
    with open(paths[late]) as f:
        doc = json.load(f)
    kept = [e for e in doc["traceEvents"] if not (e.get("cat") == "cuda_runtime" and "Launch" in e.get("name", ""))]
    assert len(kept) < len(doc["traceEvents"])
    doc["traceEvents"] = kept
    with open(paths[late], "w") as f:
        json.dump(doc, f)
    sheets = run_chain(paths)
    b = sheets["collective_blockers"]
    waited = b[(b["late_rank"] == late) & (b["delta_us"] > 0)]
    assert len(waited)
    assert (waited["host_launch_lateness_us"] == 0).all()
    assert np.allclose(waited["gpu_dependency_wait_us"] + waited["gpu_backlog_us"], waited["delta_us"])
    q = sheets["correlate_quality"]
    notes = q[q["check"] == "no launch record"]
    assert set(notes["rank"]) == {late}
    assert sorted(notes["detail"]) == sorted(f"collective {cid}: the late rank's kernel has no launch record; "
                                             "host lateness counted as 0" for cid in waited["collective_id"])


def test_without_align_tables_says_so(tmp_path):
    truth = generate_fixture.generate(str(tmp_path), ranks=2)
    frames = itertools.chain.from_iterable(extract_rank(str(tmp_path / f), int(r)) for r, f in truth["files"].items())
    tables = {f.table()[0]: f.table()[1] for f in correlate_frames(frames) if f.kind == 7}
    assert len(tables[TABLE_PREFIX + "collective_blockers"]) == 0
    assert "no align tables" in set(tables[TABLE_PREFIX + "correlate_quality"]["check"])


# --------------------------------------------------------------- correlate's own sweeps

kernels = st.lists(st.tuples(st.integers(0, 300), st.integers(0, 60), st.integers(0, 3)), min_size=1, max_size=40).map(
    lambda xs: sorted(xs, key=lambda x: x[0]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-1, 2), st.integers(-1, 2)), max_size=40))
def test_factorize_rows_numbers_by_first_appearance(rows):
    arr = np.array(rows, dtype=np.int64).reshape(-1, 2)
    codes, first = _native.factorize_rows(arr)
    seen = {}
    want = [seen.setdefault(tuple(r), len(seen)) for r in rows]
    assert codes.tolist() == want
    assert first.tolist() == [rows.index(r) for r in seen]


@settings(max_examples=200, deadline=None)
@given(kernels, st.data())
def test_window_medians_agree_with_numpy(ks, data):
    s = np.array([k[0] for k in ks]); e = s + np.array([k[1] for k in ks]); c = np.array([k[2] for k in ks])
    n = len(ks)
    win = st.tuples(st.integers(0, n), st.integers(0, n), st.integers(-10, 300)).map(
        lambda w: (min(w[0], w[1]), max(w[0], w[1]), w[2]))
    queries = data.draw(st.lists(st.tuples(win, st.lists(win, max_size=3)), max_size=5))
    q = np.array([w for w, _ in queries], dtype=np.int64).reshape(-1, 3)
    refs = [r for _, rs in queries for r in rs]
    r = np.array(refs, dtype=np.int64).reshape(-1, 3)
    ref_ptr = np.r_[0, np.cumsum([len(rs) for _, rs in queries])]
    ptr, kern, med = _native.window_medians(s, e, c, 4, q[:, 0], q[:, 1], q[:, 2], ref_ptr, r[:, 0], r[:, 1], r[:, 2])
    for i, ((lo, hi, t), rs) in enumerate(queries):
        mine = [j for j in range(lo, hi) if e[j] > t]
        assert kern[ptr[i]:ptr[i + 1]].tolist() == mine
        for j, m in zip(mine, med[ptr[i]:ptr[i + 1]]):
            d = [e[x] - s[x] for a, b, tt in rs for x in range(a, b) if e[x] > tt and c[x] == c[j]]
            assert (np.isnan(m) and not d) or m == np.median(d)


@settings(max_examples=200, deadline=None)
@given(kernels, st.lists(st.tuples(st.integers(0, 300), st.integers(-5, 80)), max_size=4))
def test_innermost_self_time_agrees_with_brute_force(ks, windows):
    s = np.array([k[0] for k in ks]); e = s + np.array([k[1] for k in ks])
    lo = np.array([w[0] for w in windows], dtype=np.int64)
    hi = lo + np.array([w[1] for w in windows], dtype=np.int64)
    a = np.zeros(len(windows), dtype=np.int64); b = np.full(len(windows), len(ks), dtype=np.int64)
    q, idx, self_ns, first = _native.innermost_self(s, e, a, b, lo, hi)
    got = {(int(x), int(i)): (int(t), int(f)) for x, i, t, f in zip(q, idx, self_ns, first)}
    want = {}
    for w in range(len(windows)):
        for x in range(lo[w], hi[w]):
            cover = [i for i in range(len(ks)) if e[i] > lo[w] and s[i] <= x < e[i]]
            if cover:
                i = min(cover, key=lambda i: (e[i] - s[i], i))
                t, f = want.get((w, i), (0, x))
                want[(w, i)] = (t + 1, f)
    assert got == want


def test_a_rank_twice_is_refused(tmp_path):
    """Frames of a rank after its metadata frame (the same rank given twice)
    are refused, as align refuses them."""
    from streamtrace.errors import StreamtraceError

    truth = generate_fixture.generate(str(tmp_path), ranks=2)
    path = str(tmp_path / truth["files"]["0"])
    frames = itertools.chain(extract_rank(path, 0), extract_rank(path, 0))
    with pytest.raises(StreamtraceError, match="rank 0 appears twice"):
        for _ in correlate_frames(frames):
            pass


def _pandas_kernel_summary(hits):
    """The reference: blocking_kernels as a pandas groupby."""
    df = pd.DataFrame(hits, columns=["kernel", "grid", "block", "attributed", "instance", "rank", "excess", "dur",
                                     "baseline"])
    g = df.groupby(["kernel", "grid", "block"], sort=False)
    out = pd.DataFrame({
        "total_blocking_us": g["attributed"].sum() / 1000.0, "instances_delayed": g["instance"].nunique(),
        "ranks": g["rank"].agg(lambda s: ",".join(str(r) for r in sorted(set(s)))),
        "mean_excess_us": g["excess"].mean() / 1000.0, "max_excess_us": g["excess"].max() / 1000.0,
        "mean_duration_us": g["dur"].mean() / 1000.0, "baseline_median_us": g["baseline"].median() / 1000.0,
    }).reset_index()
    return out.sort_values(["total_blocking_us", "kernel"], ascending=[False, True]).reset_index(drop=True)


def _pandas_host_summary(hits):
    """The reference: blocking_host_ops as a pandas groupby."""
    df = pd.DataFrame(hits, columns=["op", "self_ns", "instance", "rank"])
    g = df.groupby("op", sort=False)
    out = pd.DataFrame({
        "total_blocking_us": g["self_ns"].sum() / 1000.0, "instances_delayed": g["instance"].nunique(),
        "ranks": g["rank"].agg(lambda s: ",".join(str(r) for r in sorted(set(s)))),
        "mean_self_us_in_gap": g["self_ns"].mean() / 1000.0, "max_self_us_in_gap": g["self_ns"].max() / 1000.0,
    }).reset_index()
    return out.sort_values(["total_blocking_us", "op"], ascending=[False, True]).reset_index(drop=True)


_floats = st.one_of(st.floats(-1e15, 1e15, allow_nan=False), st.floats(-1e-6, 1e-6, allow_nan=False),
                    st.just(float("nan")))


@given(st.lists(st.tuples(st.sampled_from(["k1", "k2", "k3"]), st.sampled_from(["[1,1,1]", "[64,1,1]"]),
                          st.integers(0, 10**9), st.sampled_from(["0_1", "0_2", "1_1"]), st.integers(0, 7),
                          _floats, st.integers(0, 10**9), _floats), min_size=1, max_size=60),
       st.lists(st.tuples(st.sampled_from(["aten::mm", "cudaLaunchKernel", "op"]), st.integers(0, 10**9),
                          st.sampled_from(["0_1", "2_1"]), st.integers(0, 7)), min_size=1, max_size=60))
@settings(max_examples=200, deadline=None)
def test_blocking_summaries_are_the_pandas_groupbys(kernel_hits, host_hits):
    """blocking_kernels and blocking_host_ops, aggregated mostly in plain
    Python, equal pandas' groupby aggregates exactly (NaN skipped, medians
    of the middle pair, means of extreme floats), order and dtypes included."""
    from streamtrace.correlate.late_rank import _summarize_host, _summarize_kernels

    kernels = [(n, g, "[128,1,1]", a, i, r, np.float64(e), d, np.float64(b)) for n, g, a, i, r, e, d, b in kernel_hits]
    pd.testing.assert_frame_equal(_summarize_kernels(kernels), _pandas_kernel_summary(kernels), check_exact=True)
    pd.testing.assert_frame_equal(_summarize_host(host_hits), _pandas_host_summary(host_hits), check_exact=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 10**6), st.floats(0, 1)), max_size=60))
def test_buckets_by_identity_agree_with_brute_force(kernels):
    from streamtrace.correlate.constants import HIGH_OVERLAP, LOW_OVERLAP
    from streamtrace.correlate.timeline import _buckets_by_identity

    lcode = np.array([k[0] for k in kernels], dtype=np.int64)
    dur = np.array([k[1] for k in kernels], dtype=np.int64)
    frac = np.array([k[2] for k in kernels], dtype=np.float64)
    got = _buckets_by_identity(lcode, dur, frac)
    assert sorted(got) == sorted(set(lcode.tolist()))
    for c, (n, (h_rows, h_dur), (i_rows, i_dur)) in got.items():
        rows = [i for i, k in enumerate(kernels) if k[0] == c]
        assert n == len(rows)
        assert h_rows.tolist() == [i for i in rows if kernels[i][2] >= HIGH_OVERLAP]
        assert i_rows.tolist() == [i for i in rows if kernels[i][2] < LOW_OVERLAP]
        assert h_dur.tolist() == dur[h_rows].tolist() and i_dur.tolist() == dur[i_rows].tolist()


def test_in_row_order_interleaves_identities_sharing_a_kernel_key():
    """Two identities of one rank with the same (name, grid, block) text are
    one compute_inflation row: their durations summed in row order."""
    from streamtrace.correlate.inflation import _in_row_order

    pieces = [(np.array([0, 3, 4]), np.array([10, 13, 14])), (np.array([1, 2, 5]), np.array([11, 12, 15]))]
    assert _in_row_order(pieces).tolist() == [10, 11, 12, 13, 14, 15]
    assert _in_row_order(pieces[:1]).tolist() == [10, 13, 14]


def _tables(frames):
    return {f.table()[0]: f.table()[1] for f in correlate_frames(align_frames(frames)) if f.kind == Kind.TABLE}


def _rank_frames(paths, order):
    for r in order:
        yield from extract_rank(paths[r], r)


@pytest.fixture(scope="module")
def small_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("small")
    truth = generate_fixture.generate(str(out), ranks=3, steps=3, slow_kernel_rank=1, inflate_kernel_factor=1.5)
    return {int(r): str(out / f) for r, f in truth["files"].items()}


def _assert_same_tables(got, want):
    assert got.keys() == want.keys()
    for name in want:
        pd.testing.assert_frame_equal(got[name], want[name])


def test_compute_table_made_as_ranks_end_equals_one_made_at_the_end(small_set, monkeypatch):
    """The table of compute kernels is made a rank at a time as ranks end
    (in ascending order); when ranks come out of order it is made at the end
    instead.  Either way the sheets are those of a table made at the end."""
    from streamtrace.correlate.compute import _Compute

    used = []
    holds = _Compute.holds
    monkeypatch.setattr(_Compute, "holds", lambda self, t: used.append(holds(self, t)) or used[-1])
    streamed = _tables(_rank_frames(small_set, [0, 1, 2]))
    shuffled = _tables(_rank_frames(small_set, [2, 0, 1]))
    assert used == [True]          # in order: used; out of order: none was made
    monkeypatch.setattr(_Compute, "holds", lambda self, t: False)
    at_end = _tables(_rank_frames(small_set, [0, 1, 2]))
    _assert_same_tables(streamed, at_end)
    _assert_same_tables(shuffled, at_end)


def test_compute_table_grown_rank_by_rank_is_the_one_made_at_once(small_set, monkeypatch):
    """With no room made ahead (``room_for=1``) the table grows at every
    rank; the earlier ranks' compute times follow it onto the new arrays,
    and the sheets are those of a table made at the end."""
    from streamtrace.correlate.compute import _Compute

    add, holds, used = _Compute.add, _Compute.holds, []
    monkeypatch.setattr(_Compute, "add", lambda self, r, tl, room_for=1: add(self, r, tl, 1))
    monkeypatch.setattr(_Compute, "holds", lambda self, t: used.append(holds(self, t)) or used[-1])
    grown = _tables(_rank_frames(small_set, [0, 1, 2]))
    assert used == [True]          # the grown table was used
    monkeypatch.setattr(_Compute, "holds", lambda self, t: False)
    _assert_same_tables(grown, _tables(_rank_frames(small_set, [0, 1, 2])))


def test_kernels_linked_by_align_only_are_taken_out_of_compute(tmp_path, monkeypatch):
    """A collective kernel with a name no pattern knows is linked to its
    collective op by align; correlate then classifies that rank again, and
    the table made as ranks ended (with that kernel as compute) is not used."""
    from streamtrace.correlate import inputs
    from streamtrace.correlate.compute import _Compute

    truth = generate_fixture.generate(str(tmp_path), ranks=2, steps=3)
    paths = {int(r): str(tmp_path / f) for r, f in truth["files"].items()}
    with open(paths[1]) as f:
        doc = json.load(f)
    renamed = 0
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and "nccl" in e.get("name", "").lower():
            e["name"] = "custom_collective_kernel"
            renamed += 1
    assert renamed
    with open(paths[1], "w") as f:
        json.dump(doc, f)
    relinked, used = [], []
    classify, holds = inputs._classify, _Compute.holds
    monkeypatch.setattr(inputs, "_classify", lambda tl, linked: relinked.append(len(linked)) or classify(tl, linked))
    monkeypatch.setattr(_Compute, "holds", lambda self, t: used.append(holds(self, t)) or used[-1])
    tables = _tables(_rank_frames(paths, [0, 1]))
    assert any(relinked) and used == [False]   # rank 1 classified again: the table is made anew
    overlap = tables["correlate.collective_overlap"]
    assert set(overlap["rank"]) == {0, 1}
    # a collective kernel is no compute kernel: it never overlaps itself as one
    assert "custom_collective_kernel" not in set(overlap["top_kernel"].dropna())
    assert not tables["correlate.compute_inflation"]["kernel"].str.contains("custom_collective").any()

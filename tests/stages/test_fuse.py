"""streamtrace fuse: the fused file against the inputs, rule by rule (docs/fuse.md).

Every check parses the output with a strict JSON parser and maps each fused
event back to its input by undoing the documented rewrites
(tests/fuse_reference.py), so "every selected event exactly once, fields
intact" is checked event by event, in order, for every rank.
"""
import glob
import importlib
import gzip
import itertools
import json
import os
from collections import defaultdict
from decimal import Decimal

import pytest

import generate_fixture as gen
from conftest import needs_real
from fuse_reference import (GPU_CATS, added_events, check_rank, input_events, interval_violations, load_strict,
                            rank_events, rank_pid, select)
from streamtrace import RankInput, TraceFuse, fuse
from streamtrace.errors import StreamtraceError

RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime"}


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def run_new(tmp_path_factory):
    """4 ranks, new layout (float us relative to baseTimeNanoseconds), gzip, skewed clocks."""
    d = tmp_path_factory.mktemp("fuse_new")
    truth = gen.generate(str(d), ranks=4, format="json.gz", clock_offsets_us=[0, 150, -80.5, 40], seed=1)
    return str(d), truth


@pytest.fixture(scope="module")
def run_old(tmp_path_factory):
    """4 ranks, old layout (integer us, absolute epoch, External id == correlation), plain JSON."""
    d = tmp_path_factory.mktemp("fuse_old")
    truth = gen.generate(str(d), ranks=4, format="json", layout="old", seed=2)
    return str(d), truth


def paths_of(run):
    d, truth = run
    return [os.path.join(d, truth["files"][str(r)]) for r in range(truth["ranks"])]


def fused(tmp_path, inputs, name="merged.json", **kw):
    out = str(tmp_path / name)
    result = fuse(inputs, out, **kw)
    return load_strict(out), result


def expected(path, truncated=False, **opts):
    return select(input_events(path, truncated=truncated)[0], **opts)


def write_trace(path, events, **top):
    doc = dict(top)
    doc["traceEvents"] = events
    with open(path, "w") as f:
        json.dump(doc, f)
    return str(path)


# ---------------------------------------------------------------- completeness

@pytest.mark.parametrize("suffix", [".json", ".json.gz", ".json.zst"])
def test_every_selected_event_appears_once_intact(tmp_path, run_new, suffix):
    paths = paths_of(run_new)
    doc, result = fused(tmp_path, paths, name="merged" + suffix, jobs=2)
    assert sorted(doc["streamtrace"]["inputs"]) == ["0", "1", "2", "3"]
    for r, p in enumerate(paths):
        check_rank(doc, r, expected(p))
    assert result.events_written == sum(len(rank_events(doc, r)) for r in range(4))
    assert result.warnings == []


def test_gzip_output_is_one_member(tmp_path, run_new):
    """Perfetto's gzip reader stops at the end of the first member."""
    import zlib

    out = tmp_path / "m.json.gz"
    fuse(paths_of(run_new), str(out), jobs=2)
    raw = out.read_bytes()
    d = zlib.decompressobj(31)
    text = d.decompress(raw)
    assert d.eof and d.unused_data == b""
    assert text == gzip.decompress(raw)
    json.loads(text)


def test_old_layout_int_timestamps(tmp_path, run_old):
    paths = paths_of(run_old)
    doc, _ = fused(tmp_path, paths, jobs=1)
    for r, p in enumerate(paths):
        got = check_rank(doc, r, expected(p))
        # integer microseconds stay integers when nothing shifts them
        assert all(type(e["ts"]) is int for e in got if "ts" in e)


def test_output_is_compact_and_top_level(tmp_path, run_new):
    out = tmp_path / "m.json"
    fuse(paths_of(run_new), str(out))
    text = out.read_bytes()
    assert b"\n" not in text and b'": ' not in text
    doc = load_strict(text)
    assert list(doc) == ["traceEvents", "displayTimeUnit", "streamtrace"]


# ---------------------------------------------------------------- ids

def _id_values(doc, r):
    vals = defaultdict(set)
    for e in rank_events(doc, r):
        if type(e.get("pid")) is int:
            vals["pid"].add(e["pid"])
        if type(e.get("id")) is int:
            vals["id"].add(e["id"])
        for k in ("correlation", "External id"):
            if type(e["args"].get(k)) is int:
                vals[k].add(e["args"][k])
    return vals


@pytest.mark.parametrize("layout", ["new", "old"])
def test_ids_disjoint_across_ranks(tmp_path, run_new, run_old, layout):
    doc, result = fused(tmp_path, paths_of(run_new if layout == "new" else run_old))
    meta = doc["streamtrace"]
    S, P = meta["id_stride"], meta["pid_stride"]
    per_rank = {r: _id_values(doc, r) for r in range(4)}
    for field in ("pid", "id", "correlation", "External id"):
        for a, b in itertools.combinations(range(4), 2):
            assert not per_rank[a][field] & per_rank[b][field], (field, a, b)
        for r in range(4):
            stride = P if field == "pid" else S
            assert per_rank[r][field], (field, r)
            assert all(r * stride <= v < (r + 1) * stride for v in per_rank[r][field]), (field, r)


def test_id_ranges_come_from_all_inputs(tmp_path):
    """TraceLens sizes the ranges from the first file only; here a later rank
    with larger ids still gets a range of its own."""
    def events(pid, corr):
        return [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": 1, "ts": 10,
                 "dur": 2, "args": {"correlation": corr, "External id": corr}},
                {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 15, "dur": 3,
                 "args": {"correlation": corr, "External id": corr}},
                {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": pid, "tid": 1, "ts": 10},
                {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": 0, "tid": 7, "ts": 15, "bp": "e"}]
    a = write_trace(tmp_path / "r0.json", events(9000, 9000))
    b = write_trace(tmp_path / "r1.json", events(123456, 123456))
    c = write_trace(tmp_path / "r2.json", events(7, 5))
    doc, result = fused(tmp_path, [a, b, c])
    assert result.id_stride == 1_000_000 and result.pid_stride == 1_000_000
    vals = [_id_values(doc, r) for r in range(3)]
    for field in ("pid", "id", "correlation", "External id"):
        assert not (vals[0][field] & vals[1][field] or vals[1][field] & vals[2][field]
                    or vals[0][field] & vals[2][field]), field
    for r, p in enumerate((a, b, c)):
        check_rank(doc, r, expected(p))


# ---------------------------------------------------------------- flows

def flow_pairs(doc):
    """Check every ac2g s/f pair joins a launch to its kernel; return the count."""
    xs = defaultdict(list)
    for e in doc["traceEvents"]:
        if e.get("ph") == "X":
            xs[(e["pid"], e["tid"], Decimal(str(e["ts"])))].append(e)
    flows = defaultdict(lambda: {"s": [], "f": []})
    for e in doc["traceEvents"]:
        if e.get("ph") in ("s", "f") and e.get("cat") in ("ac2g", "async", "async_cpu_to_gpu"):
            flows[e["id"]][e["ph"]].append(e)
    pairs = 0
    for fid, se in flows.items():
        if not (se["s"] and se["f"]):
            continue
        ranks = {e["args"]["rank"] for e in se["s"] + se["f"]}
        assert len(ranks) == 1, f"flow {fid} joins ranks {ranks}"
        for s, f in itertools.product(se["s"], se["f"]):
            launch = [x for x in xs[(s["pid"], s["tid"], Decimal(str(s["ts"])))] if x.get("cat") in RUNTIME_CATS]
            kernel = [x for x in xs[(f["pid"], f["tid"], Decimal(str(f["ts"])))] if x.get("cat") in GPU_CATS]
            assert any(x["args"].get("correlation") == fid for x in launch), (fid, s)
            assert any(x["args"].get("correlation") == fid for x in kernel), (fid, f)
            pairs += 1
    return pairs


@pytest.mark.parametrize("layout", ["new", "old"])
def test_ac2g_flows_still_join_launch_and_kernel(tmp_path, run_new, run_old, layout):
    run = run_new if layout == "new" else run_old
    doc, _ = fused(tmp_path, paths_of(run), align_clocks=(layout == "new"))
    kernels = sum(1 for r in range(4) for e in rank_events(doc, r) if e.get("cat") == "kernel")
    assert flow_pairs(doc) >= 0.9 * kernels


# ---------------------------------------------------------------- labels and metadata

def test_labels_and_sort_indices(tmp_path, run_new):
    paths = paths_of(run_new)
    doc, _ = fused(tmp_path, paths)
    labels = added_events(doc)
    names = {e["pid"]: e["args"]["name"] for e in labels if e["name"] == "process_name"}
    sorts = {e["pid"]: e["args"]["sort_index"] for e in labels if e["name"] == "process_sort_index"}
    devices = {e["pid"]: e["args"]["labels"] for e in labels if e["name"] == "process_labels"}
    assert len(names) == sum(1 for e in labels if e["name"] == "process_name")  # one per process
    assert names.keys() == sorts.keys()
    order = []
    for r, p in enumerate(paths):
        info = doc["streamtrace"]["inputs"][str(r)]
        evs = [e for e in input_events(p)[0] if e.get("ph") != "M"]
        gpu_pids = {e["pid"] for e in evs if e.get("cat") in GPU_CATS}
        int_pids = {e["pid"] for e in select(evs) if type(e.get("pid")) is int}
        assert {int(k) for k in info["pid_map"]} == int_pids
        for raw in sorted(int_pids):
            new = info["pid_map"][str(raw)]
            # TraceLens's names exactly; the device (the GPU pid) as a process label
            want = f"RANK {r} - GPU" if raw in gpu_pids else f"RANK {r} - CPU"
            assert names[new] == want
            if raw in gpu_pids:
                assert devices[new] == f"GPU {raw}"
            order.append((r, raw in gpu_pids, sorts[new]))
        # string pids become per-rank strings, labelled too
        for raw in {e["pid"] for e in select(evs) if isinstance(e.get("pid"), str)}:
            assert rank_pid(raw, r) in names
        # every process that has events is labelled
        assert {e["pid"] for e in rank_events(doc, r)} <= set(names)
    # sort indices order ranks, then CPU before GPU
    by_index = sorted(order, key=lambda t: t[2])
    assert [(r, g) for r, g, _ in by_index] == sorted((r, g) for r, g, _ in order)


def test_thread_names_kept(tmp_path, run_new):
    paths = paths_of(run_new)
    doc, _ = fused(tmp_path, paths)
    for r, p in enumerate(paths):
        want = [e for e in select(input_events(p)[0]) if e.get("name") == "thread_name"]
        got = [e for e in rank_events(doc, r) if e.get("name") == "thread_name"]
        assert want and [e["args"]["name"] for e in got] == [e["args"]["name"] for e in want]


def test_top_level_metadata_kept_per_rank(tmp_path, run_new):
    paths = paths_of(run_new)
    doc, _ = fused(tmp_path, paths)
    for r, p in enumerate(paths):
        _, top = input_events(p)
        kept = doc["streamtrace"]["ranks"][str(r)]
        for key in ("deviceProperties", "distributedInfo", "baseTimeNanoseconds", "traceName", "schemaVersion"):
            assert json.loads(json.dumps(kept[key], default=str)) == json.loads(json.dumps(top[key], default=str))


# ---------------------------------------------------------------- filters

def _window_mid(path):
    ts = [int(Decimal(e["ts"]) * 1000) for e in input_events(path)[0] if e.get("ph") == "X"]
    lo, hi = min(ts), max(ts)
    return lo + (hi - lo) // 3, lo + 2 * (hi - lo) // 3


@pytest.mark.parametrize("opts", [
    {"cats": ["kernel", "gpu_memcpy"]},
    {"name_regex": r"^nccl|AllReduce"},
    {"nccl_only": True},
    {"include_pyfunc": True},
    {"keep_spans": True},
    {"window": "mid"},
    {"window": "mid", "cats": ["cuda_runtime", "ac2g"]},
], ids=["cat", "name", "nccl_only", "pyfunc", "spans", "window", "window+cat"])
def test_filters_select_exactly_what_they_say(tmp_path, run_new, opts):
    paths = paths_of(run_new)
    opts = dict(opts)
    if opts.get("window") == "mid":
        opts["window"] = _window_mid(paths[0])
    doc, _ = fused(tmp_path, paths, **opts)
    total_in = total_out = 0
    for r, p in enumerate(paths):
        events = input_events(p)[0]
        want = select(events, **opts)
        check_rank(doc, r, want)
        total_in += len(events)
        total_out += len([e for e in want if e.get("ph") != "M"])
    assert 0 < total_out < total_in


def test_window_string_form(tmp_path, run_new):
    paths = paths_of(run_new)
    lo, hi = _window_mid(paths[0])
    text = f"{Decimal(lo) / 1000}:{Decimal(hi) / 1000}"
    doc, _ = fused(tmp_path, paths, window=text)
    for r, p in enumerate(paths):
        check_rank(doc, r, expected(p, window=(lo, hi)))
    doc2, _ = fused(tmp_path, paths, name="open.json", window=f"{Decimal(lo) / 1000}:")
    for r, p in enumerate(paths):
        check_rank(doc2, r, expected(p, window=(lo, None)))


def test_ranks_subset(tmp_path, run_new):
    paths = paths_of(run_new)
    doc, result = fused(tmp_path, paths, ranks=[0, 2])
    assert sorted(result.ranks) == [0, 2]
    assert {e["args"]["rank"] for e in doc["traceEvents"] if "rank" in e.get("args", {})} == {0, 2}
    for r in (0, 2):
        check_rank(doc, r, expected(paths[r]))
    with pytest.raises(StreamtraceError, match="no input has that rank"):
        fuse(paths, str(tmp_path / "x.json"), ranks=[9])


def test_bad_options_are_clear_errors(tmp_path, run_new):
    paths = paths_of(run_new)
    with pytest.raises(StreamtraceError, match="not a valid regular expression"):
        fuse(paths, str(tmp_path / "x.json"), name_regex="(")
    with pytest.raises(StreamtraceError, match="END is before START"):
        fuse(paths, str(tmp_path / "x.json"), window="10:5")
    with pytest.raises(StreamtraceError, match="both rank 0"):
        fuse([RankInput(paths[0], 0), RankInput(paths[1], 0)], str(tmp_path / "x.json"))
    assert not os.path.exists(tmp_path / "x.json")


# ---------------------------------------------------------------- lanes

def nesting_violations(events):
    """X events on one (pid, tid) that overlap without nesting."""
    tracks = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and "ts" in e:
            t0 = int(e["ts"] * 1000)  # exact: ts is an int or a Decimal
            dur = int(e.get("dur", 0) * 1000)
            tracks[(e["pid"], e.get("tid"))].append((t0, -(t0 + max(dur, 0))))
    return sum(interval_violations(ivs) for ivs in tracks.values())


def test_overlapping_events_move_to_sibling_lanes(tmp_path):
    ev = [
        {"name": "thread_name", "ph": "M", "pid": 100, "tid": 1, "args": {"name": "thread 1 (main)"}},
        {"name": "thread_sort_index", "ph": "M", "pid": 100, "tid": 1, "args": {"sort_index": 5}},
        {"ph": "X", "cat": "cpu_op", "name": "A", "pid": 100, "tid": 1, "ts": 0, "dur": 10},
        {"ph": "X", "cat": "cpu_op", "name": "B", "pid": 100, "tid": 1, "ts": 5, "dur": 10},   # overlaps A
        {"ph": "X", "cat": "cpu_op", "name": "C", "pid": 100, "tid": 1, "ts": 6, "dur": 2},    # inside A
        {"ph": "X", "cat": "cpu_op", "name": "D", "pid": 100, "tid": 1, "ts": 20, "dur": 10},
        {"ph": "X", "cat": "cpu_op", "name": "E", "pid": 100, "tid": 1, "ts": 20, "dur": 10},  # same as D
        {"ph": "X", "cat": "cpu_op", "name": "F", "pid": 100, "tid": 1, "ts": 30, "dur": 0},   # touches D's end
        {"ph": "X", "cat": "kernel", "name": "k1", "pid": 0, "tid": "stream 7", "ts": 3.5, "dur": 5},
        {"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": "stream 7", "ts": 1, "dur": 5},  # unsorted
        {"ph": "X", "cat": "cpu_op", "name": "G", "pid": 100, "tid": 2, "ts": 0, "dur": 4},
    ]
    p = write_trace(tmp_path / "lanes.json", ev)
    doc, result = fused(tmp_path, [p])
    got = check_rank(doc, 0, expected(p))
    moved = {e["name"]: e for e in got if "lane" in e["args"]}
    assert sorted(moved) == ["B", "k1"]
    assert result.lane_moves == 2
    assert any("2 X events overlapped" in w for w in result.warnings)
    assert nesting_violations(doc["traceEvents"]) == 0
    # the lane rows are named after their track
    b, k1 = moved["B"], moved["k1"]
    assert type(b["tid"]) is int and b["tid"] not in (1, 2)
    assert k1["tid"] == "stream 7 (lane 1)"
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in added_events(doc) if e["name"] == "thread_name"}
    assert names[(b["pid"], b["tid"])] == "thread 1 (main) (lane 1)"
    assert names[(k1["pid"], k1["tid"])] == "stream 7 (lane 1)"
    sorts = {(e["pid"], e["tid"]): e["args"]["sort_index"] for e in added_events(doc)
             if e["name"] == "thread_sort_index"}
    assert sorts[(b["pid"], b["tid"])] == 5


def _without_timing(doc):
    doc["streamtrace"].pop("seconds")
    for info in doc["streamtrace"]["inputs"].values():
        info.pop("interval_runs")
    return doc


def test_spilled_interval_runs_give_the_same_file(tmp_path, run_new, monkeypatch):
    """The scan's external sort: a tiny in-memory budget, many runs, same output."""
    fuse_mod = importlib.import_module("streamtrace.fuse.passes")  # the scan reads it

    paths = paths_of(run_new)
    ref, _ = fused(tmp_path, paths, name="ref.json", jobs=2)
    monkeypatch.setattr(fuse_mod, "INTERVAL_BUDGET", 97)
    doc, result = fused(tmp_path, paths, name="spill.json", jobs=2)
    assert all(info["interval_runs"] > 10 for info in result.ranks.values())
    assert _without_timing(doc) == _without_timing(ref)


@needs_real
def test_real_trace_overlaps_are_resolved(tmp_path, real_dir, monkeypatch):
    fuse_mod = importlib.import_module("streamtrace.fuse.passes")  # the scan reads it

    p = os.path.join(real_dir, "hta", "trace_diff", "test", "test.json.gz")
    assert nesting_violations(input_events(p)[0]) > 0
    doc, result = fused(tmp_path, [p])
    assert result.lane_moves > 0
    assert nesting_violations(doc["traceEvents"]) == 0
    check_rank(doc, 1, expected(p))
    monkeypatch.setattr(fuse_mod, "INTERVAL_BUDGET", 5000)
    spilled, result2 = fused(tmp_path, [p], name="spilled.json")
    assert result2.ranks[1]["interval_runs"] > 5 and result2.lane_moves == result.lane_moves
    assert spilled["traceEvents"] == doc["traceEvents"]


def test_fusing_a_fused_file_warns(tmp_path, run_new):
    first = tmp_path / "first.json"
    fuse(paths_of(run_new)[:2], str(first))
    doc, result = fused(tmp_path, [str(first)], name="again.json")
    assert any("itself a fused trace" in w for w in result.warnings)
    # the earlier rewrite is replaced, not stacked: args.rank and the raws are this run's
    assert all(e["args"]["rank"] == 0 for e in rank_events(doc, 0))


# ---------------------------------------------------------------- truncated input

@pytest.mark.parametrize("fmt", ["json", "json.gz"])
def test_truncated_input_keeps_complete_events(tmp_path, fmt):
    d = tmp_path / "run"
    truth = gen.generate(str(d), ranks=2, format=fmt, truncate_rank=1, truncate_at_fraction=0.6, seed=3)
    paths = [str(d / truth["files"][str(r)]) for r in range(2)]
    doc, result = fused(tmp_path, paths, jobs=2)
    name = truth["files"]["1"]
    assert any(name in w and "truncated" in w for w in result.warnings)
    assert doc["streamtrace"]["inputs"]["1"]["truncated_at_byte"] > 0
    check_rank(doc, 0, expected(paths[0]))
    got = check_rank(doc, 1, expected(paths[1], truncated=True))
    assert len(got) > 100


# ---------------------------------------------------------------- clocks

def _base_trace(path, base, pid, events_ts):
    """Events with ts written exactly as given (decimal text)."""
    ev = ",".join(f'{{"ph":"X","cat":"cpu_op","name":"op{i}","pid":{pid},"tid":{pid},"ts":{ts},"dur":1.5}}'
                  for i, ts in enumerate(events_ts))
    with open(path, "w") as f:
        f.write(f'{{"traceEvents":[{ev}],"baseTimeNanoseconds":{base}}}')
    return str(path)


def test_time_base_puts_ranks_on_one_epoch(tmp_path):
    a = _base_trace(tmp_path / "a.json", 1_717_000_000_000_000_000, 11, ["100.000", "200.250"])
    b = _base_trace(tmp_path / "b.json", 1_717_000_000_000_004_500, 12, ["100.000", "300.125"])
    doc, result = fused(tmp_path, [a, b], time_base=True)
    assert result.time_base_ns == 1_717_000_000_000_000_000
    assert [doc["streamtrace"]["inputs"][r]["ts_shift_ns"] for r in ("0", "1")] == [0, 4500]
    check_rank(doc, 0, expected(a))
    check_rank(doc, 1, expected(b))
    assert [e["ts"] for e in rank_events(doc, 1)] == [Decimal("104.500"), Decimal("304.625")]
    # without --time_base nothing moves
    doc, _ = fused(tmp_path, [a, b], name="plain.json")
    assert [e["ts"] for e in rank_events(doc, 1)] == [Decimal("100.000"), Decimal("300.125")]
    # with a window, the bases are read before the scan
    doc, _ = fused(tmp_path, [a, b], name="win.json", time_base=True, window="150:400")
    assert [e["name"] for e in rank_events(doc, 0)] == ["op1"]
    assert [e["name"] for e in rank_events(doc, 1)] == ["op1"]


def _align_clocks(paths):
    """Per-rank offsets from the align stage (its align.clocks table)."""
    from streamtrace import extract_rank
    from streamtrace.align.stage import align_frames

    frames = itertools.chain.from_iterable(extract_rank(p, r) for r, p in enumerate(paths))
    tables = {}
    for fr in align_frames(frames, align_clocks=True):
        if fr.kind == 7:  # TABLE
            name, df = fr.table()
            tables[name] = df
    clocks = tables["align.clocks"]
    ranks = tables["align.ranks"]
    return (dict(zip(clocks["rank"].tolist(), clocks["offset_ns"].tolist())),
            dict(zip(ranks["rank"].tolist(), ranks["base_ns"].tolist())))


def test_align_clocks_shifts_by_the_estimated_offsets(tmp_path, run_new):
    paths = paths_of(run_new)
    offsets, bases = _align_clocks(paths)
    truth = run_new[1]["clock_offsets_ns"]
    for r in range(4):  # the estimate recovers the injected skew
        assert abs((offsets[r] - offsets[0]) - (truth[str(r)] - truth["0"])) < 5_000
    doc, result = fused(tmp_path, paths, align_clocks=True, jobs=2)
    common = min(b for b in bases.values() if b)
    for r, p in enumerate(paths):
        info = doc["streamtrace"]["inputs"][str(r)]
        assert info["clock_offset_ns"] == offsets[r]
        assert info["ts_shift_ns"] == (bases[r] or 0) - common - offsets[r]
        check_rank(doc, r, expected(p))  # every ts moved by exactly that shift
    assert [row["offset_ns"] for row in doc["streamtrace"]["clock_alignment"]] == [offsets[r] for r in range(4)]


def test_align_clocks_matches_report_sheet(tmp_path, run_new):
    report = pytest.importorskip("streamtrace.report.sheets")
    if not hasattr(report, "build_report"):
        pytest.skip("the report stage has no build_report yet")
    from streamtrace import extract_rank

    paths = paths_of(run_new)
    frames = itertools.chain.from_iterable(extract_rank(p, r) for r, p in enumerate(paths))
    sheet = report.build_report(frames, align_clocks=True)["clock_alignment"]
    _, result = fused(tmp_path, paths, align_clocks=True)
    for r, off_us in zip(sheet["rank"].tolist(), sheet["offset_us"].tolist()):
        assert result.ranks[r]["clock_offset_ns"] == round(off_us * 1000)


# ---------------------------------------------------------------- TraceLens-compatible API

def keep_nccl_kernels(event):
    """A typical TraceFuse filter (module level, so it pickles)."""
    return event.get("cat") == "kernel" and "nccl" in event.get("name", "").lower()


def _timeline(doc):
    """The input-derived events (no added labels), canonical."""
    return [json.dumps(e, sort_keys=True, default=str) for e in doc["traceEvents"] if "rank" in e.get("args", {})]


def test_tracefuse_list_merge_and_save(tmp_path, run_new):
    paths = paths_of(run_new)
    path = TraceFuse(paths).merge_and_save(str(tmp_path / "merged_trace.json"))
    assert path == str(tmp_path / "merged_trace.json.gz")
    tl = load_strict(path)
    cli_doc, _ = fused(tmp_path, paths, name="cli.json")
    assert tl["traceEvents"] == cli_doc["traceEvents"]
    assert TraceFuse(paths).merge_and_save(str(tmp_path / "x.json.gz")) == str(tmp_path / "x.json.gz")


def test_tracefuse_rank_dict_subset(tmp_path, run_new):
    paths = paths_of(run_new)
    path = TraceFuse({0: paths[0], 2: paths[2]}).merge_and_save(str(tmp_path / "nodes.json"))
    doc = load_strict(path)
    assert sorted(doc["streamtrace"]["inputs"]) == ["0", "2"]
    for r in (0, 2):
        check_rank(doc, r, expected(paths[r]))
    assert doc["streamtrace"]["inputs"]["2"]["id_offset"] == 2 * doc["streamtrace"]["id_stride"]


def test_tracefuse_multiprocessing_and_filter_fn(tmp_path, run_new):
    paths = paths_of(run_new)
    tf = TraceFuse(paths, use_multiprocessing=True, max_workers=2)
    doc = load_strict(tf.merge_and_save(str(tmp_path / "nccl.json"), filter_fn=keep_nccl_kernels))
    cli_doc, _ = fused(tmp_path, paths, name="cli_nccl.json", nccl_only=True)
    ours = [e for e in _timeline(doc)]
    theirs = [e for e in _timeline(cli_doc) if '"ph": "M"' not in e]
    assert ours and ours == theirs
    for r, p in enumerate(paths):  # filter_fn alone decides (it sees metadata too)
        check_rank(doc, r, [e for e in input_events(p)[0] if keep_nccl_kernels(e)])


def test_tracefuse_include_pyfunc_and_merge(tmp_path, run_new):
    paths = paths_of(run_new)
    tf = TraceFuse(paths, use_multiprocessing=True, max_workers=2)
    doc = load_strict(tf.merge_and_save(str(tmp_path / "py.json"), include_pyfunc=True))
    cli_doc, _ = fused(tmp_path, paths, name="cli_py.json", include_pyfunc=True)
    assert _timeline(doc) == _timeline(cli_doc)
    assert any(e.get("cat") == "python_function" for e in doc["traceEvents"])
    events = TraceFuse(paths[:2]).merge()
    assert isinstance(events, list)
    two, _ = fused(tmp_path, paths[:2], name="two.json")
    assert json.loads(json.dumps(events)) == json.loads(json.dumps(two["traceEvents"], default=float))


# ---------------------------------------------------------------- real traces

@needs_real
def test_real_param_dlrm_eight_ranks(tmp_path, real_dir):
    paths = sorted(glob.glob(os.path.join(real_dir, "param-dlrm", "*.json.gz")))
    doc, result = fused(tmp_path, paths, name="dlrm.json.gz", jobs=2)
    assert sorted(result.ranks) == list(range(8))
    for p in paths:
        _, top = input_events(p)
        check_rank(doc, top["distributedInfo"]["rank"], expected(p))
    assert flow_pairs(doc) > 1000
    vals = [_id_values(doc, r) for r in range(8)]
    for field in ("pid", "id", "correlation", "External id"):
        for a, b in itertools.combinations(range(8), 2):
            assert not vals[a][field] & vals[b][field]


@needs_real
@pytest.mark.parametrize("rel", ["kineto-tb/plugin-2020/worker0.pt.trace.json.gz",
                                 "tracelens/resnet_act_checkpoint.json.gz",
                                 "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"])
def test_real_single_traces(tmp_path, real_dir, rel):
    p = os.path.join(real_dir, rel)
    doc, _ = fused(tmp_path, [RankInput(p, 5)], time_base=True, include_pyfunc=True)
    check_rank(doc, 5, expected(p, include_pyfunc=True))

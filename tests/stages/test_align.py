"""align: collective kernels, cross-rank matching and clock offsets, against
the fixture generator's truth.json and hand-built cases."""
import io
import json
import os

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import generate_fixture
from streamtrace import collectives as coll
from streamtrace import extract, resolve_inputs
from streamtrace.align.stage import (CLOCK_COLUMNS, COLLECTIVE_COLUMNS, QUALITY_COLUMNS, RANK_COLUMNS, TABLE_NAMES,
                               align_frames, align_sequences, classify_string, estimate_clock_offsets)
from streamtrace.stream.format import Kind, iter_frames
from synthtrace import write_trace

# ---------------------------------------------------------------------- fixtures


def _gen(tmp_path_factory, name, **options):
    d = tmp_path_factory.mktemp(name)
    truth = generate_fixture.generate(str(d), **options)
    return str(d), truth


@pytest.fixture(scope="session")
def fx_new(tmp_path_factory):
    """4 ranks, TP=2 (world, TP and DP groups), new layout (Seq, comm args), random clock offsets, a straggler."""
    return _gen(tmp_path_factory, "fx_new", ranks=4, steps=2, fill_ops=12, tp=2, clock_offsets="random",
                straggler_rank=2, seed=3)


@pytest.fixture(scope="session")
def fx_old(tmp_path_factory):
    """4 ranks, old layout (integer us, no comm args: CPU-op linkage by time), random offsets."""
    return _gen(tmp_path_factory, "fx_old", ranks=4, steps=3, fill_ops=12, layout="old", clock_offsets="random",
                straggler_rank=1, seed=4)


@pytest.fixture(scope="session")
def fx_shared(tmp_path_factory):
    """TP subgroups sharing one process-group name."""
    return _gen(tmp_path_factory, "fx_shared", ranks=4, steps=2, fill_ops=12, tp=2, shared_pg_name=True, seed=5)


def stream_of(trace_dir, world_size, summaries=True):
    buf = io.BytesIO()
    extract(resolve_inputs(trace_dir=trace_dir, world_size=world_size), buf, summaries=summaries)
    buf.seek(0)
    return buf


def run_align(trace_dir, world_size, **kw):
    frames = list(align_frames(iter_frames(stream_of(trace_dir, world_size)), **kw))
    tables = {}
    for f in frames:
        if f.kind == Kind.TABLE:
            name, df = f.table()
            tables[name] = df
    return tables, frames


@pytest.fixture(scope="session")
def new_tables(fx_new):
    return run_align(fx_new[0], 4)[0]


@pytest.fixture(scope="session")
def old_tables(fx_old):
    return run_align(fx_old[0], 4)[0]


def instance_of(c):
    """(rank, written start ns) -> instance id."""
    return {(int(r), int(t)): int(i) for r, t, i in zip(c["rank"], c["ts_ns"], c["instance"])}


def check_truth_matching(c, truth):
    """Every truth collective is exactly one instance, with exactly its ranks."""
    lookup = instance_of(c)
    parts = c.groupby("instance")["rank"].apply(lambda s: sorted(s.tolist()))
    seen = set()
    for col in truth["collectives"]:
        ids = {lookup[(int(r), int(p["written_start_ns"]))] for r, p in col["per_rank"].items()}
        assert len(ids) == 1, (col["label"], col["step"], ids)
        inst = ids.pop()
        assert parts[inst] == sorted(col["ranks"]), (col["label"], parts[inst])
        assert inst not in seen
        seen.add(inst)
    assert len(seen) == c["instance"].nunique()


# ---------------------------------------------------------------------- taxonomy


def test_rank_lists_and_splits():
    assert coll.parse_rank_list("[0, 1, 2]") == ((0, 1, 2), False)
    assert coll.parse_rank_list([4, 5]) == ((4, 5), False)
    assert coll.parse_rank_list("[0, 1, …, 29, ...]") == ((0, 1), True)
    full = "[" + ", ".join(map(str, range(30))) + ", ...]"
    assert coll.parse_rank_list(full) == (tuple(range(30)), True)
    assert coll.parse_rank_list("") == (None, False)
    assert coll.parse_rank_list(None) == (None, False)
    assert coll.parse_rank_list("garbage") == (None, False)
    assert coll.parse_rank_list("[]") == ((), False)
    assert coll.parse_split("[1, 2, 3]") == [1, 2, 3]
    assert coll.parse_split("[1, 2, ...]") is None
    assert coll.parse_split("[") is None


def test_dtypes_and_sizes():
    for name, size in coll.TRACELENS_DTYPE_BYTES.items():
        assert coll.bytes_per_elem(name) == size
    for name, size in (("Char", 1), ("Float8_e4m3fn", 1), ("Float8_e5m2fnuz", 1), ("ComplexFloat", 8),
                       ("ComplexDouble", 16), ("UInt16", 2), ("UInt32", 4), ("UInt64", 8), ("QInt32", 4)):
        assert coll.bytes_per_elem(name) == size
    assert coll.bytes_per_elem("NotAType") is None
    assert coll.dtype_from_input_type("float") == "Float"
    assert coll.dtype_from_input_type("c10::BFloat16") == "BFloat16"
    assert coll.dtype_from_input_type("long int") == "Long"
    assert coll.dtype_from_input_type("c10::Float8_e4m3fn") == "Float8_e4m3fn"
    assert coll.dtype_from_input_type("TensorList") is None
    assert coll.input_dims_nelems("[[8, 1024, 8816]]") == 8 * 1024 * 8816
    assert coll.input_dims_nelems("[[[2873320]], [], []]") == 2873320
    assert coll.input_dims_nelems("[[], []]") is None
    assert coll.input_dims_nelems("[[65536, 64], [8192, 64], []]", 1) == 8192 * 64


def test_categories_kinds_and_factors():
    assert coll.category("_allgather_base") == "allgather"
    assert coll.category("reduce_scatter") is None  # not in TraceLens's map (A2.2)
    assert coll.kind("reduce_scatter") == "reducescatter"
    assert coll.bus_factor("allreduce", 4) == 1.5
    assert coll.bus_factor("allgather", 4) == 0.75
    assert coll.bus_factor("broadcast", None) == 1.0
    assert coll.bus_factor("allreduce", None) is None
    assert coll.collective_from_ops("nccl:all_to_all", "c10d::alltoall_base_") == ("all_to_allv", "c10d_op")
    assert coll.collective_from_ops("nccl:all_reduce", None) == ("allreduce", "annotation")
    assert coll.collective_from_ops(None, "c10d::_reduce_scatter_base_") == ("_reduce_scatter_base", "c10d_op")
    assert coll.collective_from_ops("nccl:new_thing", None) == ("new_thing", "annotation")
    assert coll.collective_from_ops(None, None) == (None, None)
    assert coll.kernel_kind("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)") == "AllReduce"
    assert coll.kernel_kind("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)") == "Generic"
    assert coll.collective_from_kernel_kind("SendRecv") is None
    assert coll.collective_from_kernel_kind("AllReduce") is None  # B2: never from the NCCL kernel name alone
    assert coll.kernel_kind_hint("AllReduce") == "allreduce"
    assert coll.collective_from_kernel_kind("cross_device_reduce") == "allreduce"
    assert coll.is_collective_kernel_name("void vllm::cross_device_reduce_1stage<float, 8>(...)")
    assert coll.is_collective_kernel_name("rcclGenericKernel")
    assert not coll.is_collective_kernel_name("void gemm_kernel<128>()")
    assert coll.size_bucket(100) == "<128 B" and coll.size_bucket(32 << 20) == ">=32 MiB"
    assert coll.size_bucket(float("nan")) == "unknown"


classify_full = classify_string


def test_string_classes():
    from streamtrace.align.collect import (S_ANNOT, S_C10D, S_KERNEL_CAT, S_LABEL, S_LAUNCH, S_NCCL_NAME, S_RPC,
                                           S_RUNTIME_CAT, S_USER_CAT)

    collect_classify = classify_full

    def classify_string(s):   # without S_LABEL: any name may be a user annotation's
        return collect_classify(s) & ~S_LABEL

    assert classify_string("kernel") == S_KERNEL_CAT
    assert classify_string("Runtime") == S_RUNTIME_CAT
    assert collect_classify("user_annotation") & S_USER_CAT
    assert collect_classify("PP::fwd_send (stage 0)") & S_LABEL
    assert not collect_classify("ProfilerStep#12") & S_LABEL and not collect_classify("nccl:send") & S_LABEL
    assert classify_string("ncclKernel_SendRecv_RING") & S_NCCL_NAME
    assert classify_string("nccl:all_reduce") & S_ANNOT
    assert classify_string("record_param_comms") == S_RPC
    assert classify_string("c10d::allreduce_") == S_C10D
    for api in ("cudaLaunchKernel", "cudaLaunchKernelExC", "hipExtLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch"):
        assert classify_string(api) & S_LAUNCH, api
    assert not classify_string("cudaMemcpyAsync") & S_LAUNCH


# ---------------------------------------------------------------------- sequence alignment


def _seq(n, period=7, seed=0):
    rng = np.random.default_rng(seed)
    sig = np.array([i % period for i in range(n)], dtype=np.int64)
    gaps = rng.integers(200_000, 900_000, size=n)  # 0.2-0.9 ms between collective ends
    end = 10**12 + np.cumsum(gaps)
    return sig, end


def test_align_sequences_identical_is_plain_ordinal():
    sig, end = _seq(50)
    si, ci, d, trivial = align_sequences(sig, end + 5_000, sig, end)
    assert trivial and (si == ci).all() and len(si) == 50 and d == 5_000


@pytest.mark.parametrize("drop_head,drop_tail", [(1, 0), (0, 2), (3, 1), (7, 0), (14, 7)])
def test_align_sequences_window_shift(drop_head, drop_tail):
    sig, end = _seq(60)
    offset = 123_456_789  # a large clock offset: raw times alone would mislead
    s_sig, s_end = sig[drop_head:60 - drop_tail], end[drop_head:60 - drop_tail] + offset
    si, ci, d, trivial = align_sequences(s_sig, s_end, sig, end)
    assert (ci == si + drop_head).all() and len(si) == len(s_sig)
    assert d == offset and not trivial


def test_align_sequences_gap_in_the_middle():
    sig, end = _seq(80)
    keep = np.r_[0:30, 31:80]  # rank missed collective 30
    si, ci, d, _ = align_sequences(sig[keep], end[keep] + 777, sig, end)
    assert (ci == keep[si]).all() and len(si) == 79


def test_align_sequences_periodic_whole_step_shift_uses_time():
    # every step has the same signatures: only end times tell a one-step shift apart
    sig, end = _seq(70, period=7)
    s_sig, s_end = sig[7:], end[7:] + 1_000  # window starts one step later
    si, ci, d, _ = align_sequences(s_sig, s_end, sig[:63], end[:63])  # ...and the reference ends a step earlier
    assert (ci == si + 7).all() and abs(d - 1_000) < 1


# ---------------------------------------------------------------------- clock offsets


def test_estimate_clock_offsets_robust():
    rng = np.random.default_rng(1)
    true = {0: 0, 1: 425_255, 2: -27_530, 3: 3_000_000}
    inst, rank, end = [], [], []
    for k in range(60):
        members = [0, 1, 2, 3] if k % 3 == 0 else ([0, 1] if k % 3 == 1 else [2, 3])
        t = 10**15 + k * 1_000_000
        for r in members:
            noise = int(rng.integers(0, 800))
            if k == 10 and r == 1:
                noise = 400_000  # one outlier
            inst.append(k)
            rank.append(r)
            end.append(t + true[r] + noise)
    est = estimate_clock_offsets(inst, rank, end)
    for r, off in true.items():
        assert abs(est[r]["offset_ns"] - off) < 1_000, (r, est[r])
        assert est[r]["reference_rank"] == 0


# ---------------------------------------------------------------------- the stage contract


def test_align_frames_passes_everything_through(fx_new):
    stream = stream_of(fx_new[0], 4)
    inputs = [f for f in iter_frames(io.BytesIO(stream.getvalue()))]
    out = list(align_frames(iter(inputs)))
    assert out[0].kind == Kind.TABLE and out[0].table()[0] == "align.options"
    passed = [f for f in out[1:] if f.kind not in (Kind.TABLE, Kind.END)]
    expected = [f for f in inputs if f.kind != Kind.END]
    assert len(passed) == len(expected)
    assert all(a.kind == b.kind and a.rank == b.rank and a.payload == b.payload for a, b in zip(passed, expected))
    # the fixture's ranks carry ProfilerStep markers (in their summaries too): align.steps last
    assert [f.table()[0] for f in out if f.kind == Kind.TABLE] == list(TABLE_NAMES) + ["align.steps"]
    assert out[-1].kind == Kind.END and sum(f.kind == Kind.END for f in out) == 1
    # frames come out as they go in: the first output frames precede reading the whole input
    it = align_frames(iter(inputs))
    assert next(it).table()[0] == "align.options"
    assert next(it).payload == inputs[0].payload


def test_align_tables_columns_are_stable(new_tables):
    assert list(new_tables["align.collectives"].columns) == COLLECTIVE_COLUMNS
    assert list(new_tables["align.clocks"].columns) == CLOCK_COLUMNS
    assert list(new_tables["align.quality"].columns) == QUALITY_COLUMNS
    assert list(new_tables["align.ranks"].columns) == RANK_COLUMNS


def test_small_align_tables_have_their_dtypes(new_tables):
    """align.ranks, align.clocks and align.quality are built column by
    column: integers, nullable integers, text as objects with None missing."""
    ranks, clocks, quality = (new_tables[f"align.{t}"] for t in ("ranks", "clocks", "quality"))
    for col in ("rank", "base_ns", "collective_kernels", "events"):
        assert ranks[col].dtype == np.int64
    for col in ("world_size", "trace_rank", "trace_world_size", "gpus", "truncated_at_byte"):
        assert str(ranks[col].dtype) == "Int64"
    assert ranks["truncated_at_byte"].isna().all() and ranks["world_size"].tolist() == [4] * 4
    for col in ("rank", "offset_ns", "collectives", "reference_rank"):
        assert clocks[col].dtype == np.int64
    assert clocks["applied"].dtype == bool and clocks["residual_ns"].dtype == np.float64
    assert len(quality)
    assert str(quality["rank"].dtype) == "Int64" and str(quality["count"].dtype) == "Int64"
    for col in ("severity", "category", "pg", "collective_id", "message"):
        assert quality[col].dtype == object
        assert all(v is None or isinstance(v, str) for v in quality[col])


def test_align_twice_replaces_tables(fx_new):
    once = list(align_frames(iter_frames(stream_of(fx_new[0], 4))))
    twice = list(align_frames(iter(once)))
    names = [f.table()[0] for f in twice if f.kind == Kind.TABLE]
    assert names == list(TABLE_NAMES) + ["align.steps"]   # once each


def test_collector_keeps_only_what_it_needs(fx_new):
    from streamtrace.align.collect import RankCollector

    frames = [f for f in iter_frames(stream_of(fx_new[0], 4)) if f.rank == 0 and f.kind != Kind.END]
    c = RankCollector(0)
    for f in frames[:-1]:  # everything but META
        c.add(f)
    n_events = c.n_events
    kept_ops = sum(len(o) for o in c.ops)
    kept = sum(len(k) for k in c.kernels) + sum(len(x) for x in c.launches) + kept_ops
    assert kept < n_events / 3
    names = {c.strings[i] for o in c.ops for i in o["name"]}
    assert names <= {n for n in c.strings if n == "record_param_comms" or n.startswith(("nccl:", "c10d::"))}


# ---------------------------------------------------------------------- against truth.json


def test_new_layout_matches_truth(fx_new, new_tables):
    _, truth = fx_new
    c = new_tables["align.collectives"]
    check_truth_matching(c, truth)
    assert set(c["match_method"]) == {"seq"}
    lookup = instance_of(c)
    by_inst = c.set_index(["instance", "rank"])
    for col in truth["collectives"]:
        for r, p in col["per_rank"].items():
            row = by_inst.loc[(lookup[(int(r), int(p["written_start_ns"]))], int(r))]
            assert row["collective_name"] == col["trace_collective_name"]
            assert row["pg_name"] == col["pg_name"] and row["group_size"] == col["group_size"]
            assert row["dtype"] == col["dtype"] and row["stream"] == col["stream"]
            want_in = p.get("in_nelems", col["in_nelems"])
            assert row["in_nelems"] == want_in
            assert row["dur_ns"] == int(p["written_end_ns"]) - int(p["written_start_ns"])
            assert row["launch_ts_ns"] == int(round(float(p["launch_ts_us"]) * 1000))
            assert row["link"] == "external_id" and row["cpu_op_name"] == "record_param_comms"
            assert row["seq"] == col["trace_seq"]
            assert row["kernel_name"] == col["kernel_name"]
    assert not c["metadata_mismatch"].any()
    assert c["flags"].eq("").all()


def test_old_layout_matches_truth_through_cpu_ops(fx_old, old_tables):
    _, truth = fx_old
    c = old_tables["align.collectives"]
    check_truth_matching(c, truth)
    assert set(c["link"]) == {"containment"}
    assert set(c["name_source"]) == {"c10d_op"}
    assert set(c["size_source"]) == {"annotation"}
    assert set(c["pg"]) == {"all"}  # A3.2 inference mode: no PG names, one NCCL stream per rank
    lookup = instance_of(c)
    by_inst = c.set_index(["instance", "rank"])
    for col in truth["collectives"]:
        r, p = next(iter(col["per_rank"].items()))
        row = by_inst.loc[(lookup[(int(r), int(p["written_start_ns"]))], int(r))]
        assert row["collective_name"] == col["trace_collective_name"]
        assert row["dtype"] == col["dtype"]
        if col["in_nelems"] is not None:
            assert row["in_nelems"] == col["in_nelems"] and row["out_nelems"] == col["out_nelems"]
        assert row["group_size"] == col["group_size"]


def test_disjoint_subgroups_sharing_a_pg_name(fx_shared):
    d, truth = fx_shared
    tables, _ = run_align(d, 4)
    c = tables["align.collectives"]
    check_truth_matching(c, truth)
    assert not c["metadata_mismatch"].any()
    shared = c[c["pg_desc"] == "tp_group"]
    assert shared["pg_name"].nunique() == 1 and shared["pg_key"].nunique() == 2
    assert shared.groupby("collective_id")["pg_ranks"].nunique().eq(1).all()
    assert "shared_pg_name" in set(tables["align.quality"]["category"])


def _drop_kernels(path, which):
    """Remove NCCL kernels (by index in time order) from a fixture trace file."""
    with open(path) as f:
        doc = json.load(f)
    ev = doc["traceEvents"]
    nccl = sorted((e["ts"], i) for i, e in enumerate(ev) if e.get("cat") == "kernel" and "nccl" in e["name"])
    drop = {nccl[k][1] for k in which}
    doc["traceEvents"] = [e for i, e in enumerate(ev) if i not in drop]
    with open(path, "w") as f:
        json.dump(doc, f)
    return [nccl[k][0] for k in which]


def test_window_shift_is_aligned_not_shifted(tmp_path, fx_old):
    import shutil

    src, truth = fx_old
    d = tmp_path / "shift"
    shutil.copytree(src, d)
    dropped_first = _drop_kernels(d / truth["files"]["1"], [0])  # rank 1's window starts one collective later
    dropped_last = _drop_kernels(d / truth["files"]["2"], [-1, -2])  # rank 2's ends two collectives earlier
    tables, _ = run_align(str(d), 4)
    c = tables["align.collectives"]
    gone = {(1, int(dropped_first[0] * 1000))} | {(2, int(t * 1000)) for t in dropped_last}
    lookup = instance_of(c)
    for col in truth["collectives"]:
        present = {r: p for r, p in col["per_rank"].items() if (int(r), int(p["written_start_ns"])) not in gone}
        ids = {lookup[(int(r), int(p["written_start_ns"]))] for r, p in present.items()}
        assert len(ids) == 1, col["label"]
        assert c[c["instance"] == ids.pop()]["rank"].tolist() == sorted(int(r) for r in present)
    q = tables["align.quality"]
    assert {1, 2} <= set(q[q["category"] == "sequence_aligned"]["rank"].dropna().astype(int))
    assert "partial_instances" not in set(q["category"])  # no rank lists in old traces: nothing to compare


def test_named_groups_without_seq_are_aligned_per_group(tmp_path, fx_new):
    """2024-style traces: PG names and rank lists but no Seq; rank 3's window
    starts one collective later: ordinal matching per process group, aligned."""
    import re
    import shutil

    src, truth = fx_new
    d = tmp_path / "noseq"
    shutil.copytree(src, d)
    for r in range(4):
        path = d / truth["files"][str(r)]
        path.write_text(re.sub(r',\s*"Seq": \d+', "", path.read_text()))
    dropped = _drop_kernels(d / truth["files"]["3"], [0])
    tables, _ = run_align(str(d), 4)
    c = tables["align.collectives"]
    assert c["seq"].isna().all() and set(c["match_method"]) <= {"ordinal", "aligned"}
    first_pg = truth["collectives"][0]["pg_name"]  # the collective rank 3 lost is the run's first
    assert set(c[(c["rank"] == 3) & (c["pg_name"] == first_pg)]["match_method"]) == {"aligned"}
    assert set(c[(c["rank"] == 3) & (c["pg_name"] != first_pg)]["match_method"]) == {"ordinal"}
    gone = (3, int(round(dropped[0] * 1000)))
    lookup = instance_of(c)
    for col in truth["collectives"]:
        present = {r: p for r, p in col["per_rank"].items() if (int(r), int(p["written_start_ns"])) != gone}
        ids = {lookup[(int(r), int(p["written_start_ns"]))] for r, p in present.items()}
        assert len(ids) == 1, col["label"]
    assert not c["metadata_mismatch"].any()
    q = tables["align.quality"]
    assert "partial_instances" in set(q["category"])  # the PG rank lists say rank 3 should be there
    assert "sequence_aligned" in set(q["category"])


def _offset_errors(tables, truth):
    clocks = tables["align.clocks"].set_index("rank")
    off = {int(r): int(v) for r, v in truth["clock_offsets_ns"].items()}
    return {r: abs((clocks.loc[r, "offset_ns"] - clocks.loc[0, "offset_ns"]) - (o - off[0])) for r, o in off.items()}


def test_clock_offsets_recovered_new_layout(fx_new, new_tables):
    errors = _offset_errors(new_tables, fx_new[1])
    assert max(errors.values()) < 1_000, errors
    assert not new_tables["align.clocks"]["applied"].any()  # one node (8 GPUs per node): not applied by default


def test_clock_offsets_recovered_old_layout(fx_old, old_tables):
    errors = _offset_errors(old_tables, fx_old[1])
    assert max(errors.values()) <= 1_000, errors


def test_clock_alignment_applied_on_request_and_across_nodes(fx_new):
    d, truth = fx_new
    on, _ = run_align(d, 4, align_clocks=True)
    clocks = on["align.clocks"].set_index("rank")
    assert clocks["applied"].all()
    c = on["align.collectives"]
    assert (c["ts_aligned_ns"] == c["base_ns"] + c["ts_ns"] - c["rank"].map(clocks["offset_ns"])).all()
    auto, _ = run_align(d, 4, gpus_per_node=2)  # ranks 0-1 and 2-3 on two nodes: on by default
    assert auto["align.clocks"]["applied"].all()
    off, _ = run_align(d, 4, gpus_per_node=2, align_clocks=False)
    assert not off["align.clocks"]["applied"].any()
    assert (off["align.collectives"]["clock_offset_ns"] == 0).all()


# ---------------------------------------------------------------------- hand-built cases


def _trace_set(tmp_path, per_rank, **kw):
    paths = []
    for r, events in enumerate(per_rank):
        paths.append(write_trace(tmp_path / f"rank{r}_trace.json", events, rank=r, world_size=len(per_rank), **kw))
    return paths


def test_kernel_linked_only_by_cpu_op_is_a_collective(tmp_path):
    # a custom all-reduce kernel without an NCCL name, launched inside record_param_comms (External id link)
    events = []
    for r in range(2):
        events.append([
            {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 10, "tid": 10, "ts": 100.0, "dur": 50.0,
             "args": {"External id": 7, "Collective name": "allreduce", "dtype": "Float", "In msg nelems": 1024,
                      "Out msg nelems": 1024, "Group size": 2, "Process Group Name": "0",
                      "Process Group Ranks": "[0, 1]"}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 10, "ts": 110.0,
             "dur": 5.0, "args": {"External id": 7, "correlation": 99}},
            {"ph": "X", "cat": "kernel", "name": "void my_custom_allreduce<float>(float*, int)", "pid": 0, "tid": 30,
             "ts": 120.0, "dur": 10.0, "args": {"External id": 7, "correlation": 99, "stream": 30, "device": 0}},
            {"ph": "X", "cat": "kernel", "name": "void gemm<128>()", "pid": 0, "tid": 7, "ts": 200.0, "dur": 10.0,
             "args": {"External id": 8, "correlation": 100, "stream": 7, "device": 0}},
        ])
    paths = _trace_set(tmp_path, events)
    buf = io.BytesIO()
    extract(resolve_inputs(paths=paths), buf)
    buf.seek(0)
    tables = {f.table()[0]: f.table()[1] for f in align_frames(iter_frames(buf)) if f.kind == Kind.TABLE}
    c = tables["align.collectives"]
    assert len(c) == 2 and set(c["selected_by"]) == {"cpu_op"}
    assert c["collective_name"].tolist() == ["allreduce", "allreduce"] and c["participants"].tolist() == [2, 2]
    assert (c["launch_event"] >= 0).all() and set(c["link"]) == {"external_id"}


def test_align_cli_round_trip(tmp_path, fx_new):
    from click.testing import CliRunner

    from streamtrace.cli import main
    from streamtrace.stream.format import read_tables

    raw = tmp_path / "raw.stev"
    raw.write_bytes(stream_of(fx_new[0], 4).getvalue())
    out = tmp_path / "aligned.stev"
    res = CliRunner().invoke(main, ["align", str(raw), "-o", str(out), "--align_clocks"])
    assert res.exit_code == 0, res.output
    tables = read_tables(str(out))
    assert set(TABLE_NAMES) <= set(tables)
    assert tables["align.clocks"]["applied"].all()
    pd.testing.assert_frame_equal(tables["align.collectives"].drop(columns=["clock_offset_ns", "ts_aligned_ns"]),
                                  run_align(fx_new[0], 4, align_clocks=True)[0]["align.collectives"]
                                  .drop(columns=["clock_offset_ns", "ts_aligned_ns"]))
    assert os.path.getsize(out) > os.path.getsize(raw)


def test_rank_reading_starts_without_pandas(fx_new):
    """collective-report starts reading ranks before pandas is imported: the
    one-shot module and the per-frame collector must not need it."""
    import subprocess
    import sys

    code = f"""
import sys
from streamtrace.chain import RankReading
from streamtrace.align.collect import RankCollector
from streamtrace.extract import extract_rank
from streamtrace.io.ranks import resolve_inputs
inputs = resolve_inputs(trace_dir={fx_new[0]!r}, world_size=4)
c = RankCollector(0)
for frame in extract_rank(inputs[0].path, 0, 4):
    if frame.kind != 1:   # all but META: finishing a rank needs pandas
        c.add(frame)
assert c.n_events > 0
assert "pandas" not in sys.modules, "pandas imported"
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_a_rank_is_described_without_pandas(fx_new):
    """align.describe (finish_rank: a rank's collective kernels selected and
    described) needs numpy only; its rows are the truth's collective kernels."""
    import subprocess
    import sys

    d, truth = fx_new
    code = f"""
import sys
from streamtrace.align.collect import collected_rank
from streamtrace.align.describe import finish_rank
from streamtrace.extract import extract_rank
from streamtrace.io.ranks import resolve_inputs
inputs = resolve_inputs(trace_dir={d!r}, world_size=4)
result = finish_rank(collected_rank(extract_rank(inputs[0].path, 0, 4), 0))
assert "pandas" not in sys.modules, "pandas imported"
print(" ".join(map(str, result.rows["ts"].tolist())))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    want = sorted(int(col["per_rank"]["0"]["written_start_ns"]) for col in truth["collectives"]
                  if "0" in col["per_rank"])
    assert want and [int(t) for t in out.stdout.split()] == want


@pytest.mark.parametrize("align_clocks", [None, True])
def test_clock_offsets_estimated_in_a_child_give_the_same_tables(fx_new, monkeypatch, align_clocks):
    """Unless applied, the clock offsets are estimated in a forked child while
    the rows are built (large sets): every table, and the data-quality rows
    in their order, are those of doing both here."""
    import streamtrace.align.match as match_mod
    from helpers import serial_and_forked
    from streamtrace.chain import RankReading

    results = RankReading(resolve_inputs(trace_dir=fx_new[0], world_size=4), 4).results()
    serial, parallel, forks = serial_and_forked(
        monkeypatch, match_mod, lambda: match_mod.match_ranks(results, align_clocks=align_clocks))
    assert forks == ([] if align_clocks else [True])   # applied offsets change the rows: estimated first, here
    assert serial["align.clocks"]["offset_ns"].abs().sum() > 0   # random offsets were found
    for name in serial:
        pd.testing.assert_frame_equal(parallel[name], serial[name], check_exact=True)


@given(st.lists(st.tuples(st.integers(0, 70000), st.floats(-1e12, 1e12, allow_nan=False, allow_infinity=False)),
                max_size=300), st.integers(1, 40))
@settings(max_examples=300, deadline=None)
def test_medians_by_is_pandas_groupby_median(rows, n_groups):
    """align._medians_by (the clock estimate's group medians) gives exactly
    pandas' groupby median and size, groups sorted, for any grouping: a few
    large groups or many small ones (the block path)."""
    group = np.array([g % n_groups if n_groups < 40 else g for g, _ in rows], dtype=np.int64)
    _same_as_pandas_medians(group, np.array([v for _, v in rows], dtype=np.float64))


def test_medians_by_one_wide_group_among_small_ones():
    """Groups too uneven for one padded block go through the sort path."""
    rng = np.random.default_rng(5)
    group = np.r_[np.full(5001, 7), np.arange(100, 2100)]
    _same_as_pandas_medians(rng.permutation(group), rng.normal(0, 1e6, len(group)).round(1))


def _same_as_pandas_medians(group, values):
    from streamtrace.align.clocks import _medians_by

    ids, medians, counts = _medians_by(group, values)
    want = pd.Series(values).groupby(group).agg(["median", "size"])
    assert ids.tolist() == want.index.tolist()
    assert medians.tolist() == want["median"].tolist() and counts.tolist() == want["size"].tolist()


def test_a_rank_is_being_finished_before_its_metadata_frame_goes_on(fx_new, monkeypatch):
    """align starts finishing a rank (in a thread) before passing its META
    frame downstream, so that correlate's own finishing of the rank overlaps
    it; the results are the same."""
    import streamtrace.align.stage as align_mod

    started = []
    real = align_mod.in_thread

    def recording(fn, *args, **kw):
        started.append(fn.args[0].rank)
        return real(fn, *args, **kw)

    monkeypatch.setattr(align_mod, "in_thread", recording)
    d, truth = fx_new
    seen = []
    frames = []
    for frame in align_frames(iter_frames(stream_of(d, 4, summaries=False))):
        if frame.kind == Kind.META:
            seen.append((frame.rank, list(started)))
        frames.append(frame)
    assert [r for r, _ in seen] == [0, 1, 2, 3]
    for r, begun in seen:
        assert r in begun
    monkeypatch.setattr(align_mod, "in_thread", real)
    again = list(align_frames(iter_frames(stream_of(d, 4, summaries=False))))
    assert [(f.kind, f.rank, f.payload) for f in frames] == [(f.kind, f.rank, f.payload) for f in again]


def test_an_error_finishing_a_rank_is_raised_by_align_frames(fx_new, monkeypatch):
    import streamtrace.align.stage as align_mod
    from streamtrace.errors import StreamtraceError

    def broken(c):
        raise StreamtraceError(f"rank {c.rank}: broken on purpose")

    monkeypatch.setattr(align_mod, "finish_rank", broken)
    d, _ = fx_new
    with pytest.raises(StreamtraceError, match="broken on purpose"):
        list(align_frames(iter_frames(stream_of(d, 4, summaries=False))))


@given(st.integers(0, 60), st.integers(0, 2**32 - 1))
@settings(max_examples=200, deadline=None)
def test_concat_joins_records_in_their_own_layout(n, seed):
    """align._concat gives the fields np.concatenate gives, in the parts' own
    layout (padding kept: numpy's concatenate packs the C core's 96-byte comm
    records to 92 bytes, which sends every later _take to numpy's
    field-by-field gather), for empty, contiguous and strided parts."""
    from streamtrace._native import COMM_DTYPE
    from streamtrace.align.describe import _concat
    from streamtrace.align.collect import _K_DTYPE, _L_DTYPE, _O_DTYPE

    rng = np.random.default_rng(seed)
    packed = np.dtype([("a", "<i8"), ("b", "u1")])
    for dtype in (_K_DTYPE, _L_DTYPE, _O_DTYPE, COMM_DTYPE, packed):
        raw = np.frombuffer(rng.bytes(4 * n * dtype.itemsize), dtype=dtype)
        for parts in ([raw[:n], raw[n:n]], [raw[:n], raw[n:2 * n], raw[2 * n:4 * n]], [raw[::2], raw[:n]], [raw[:0]]):
            got = _concat(parts, dtype)
            assert got.dtype == dtype and len(got) == sum(len(p) for p in parts)
            for name in dtype.names:
                assert got[name].tobytes() == np.concatenate([p[name] for p in parts]).tobytes()
    assert len(_concat([], COMM_DTYPE)) == 0 and _concat([], COMM_DTYPE).dtype == COMM_DTYPE


@given(st.integers(0, 60), st.integers(0, 2**32 - 1))
@settings(max_examples=200, deadline=None)
def test_take_is_numpy_fancy_indexing_of_records(n, seed):
    """align._take (records gathered as rows of 8-byte words) gives what
    ``records[index]`` gives, for the record layouts align uses, a packed
    layout and a strided (non-contiguous) array that it hands to numpy."""
    from streamtrace._native import COMM_DTYPE
    from streamtrace.align.describe import _take
    from streamtrace.align.collect import _K_DTYPE, _L_DTYPE, _O_DTYPE

    rng = np.random.default_rng(seed)
    packed = np.dtype([("a", "<i8"), ("b", "u1")])
    for dtype in (_K_DTYPE, _L_DTYPE, _O_DTYPE, COMM_DTYPE, packed):
        raw = np.frombuffer(rng.bytes(2 * n * dtype.itemsize), dtype=dtype)
        for records in (raw[:n], raw[::2]):
            index = rng.integers(0, n, size=rng.integers(0, 3 * n + 1)) if n else np.zeros(0, np.int64)
            got, want = _take(records, index), records[index]
            assert got.dtype == want.dtype and got.shape == want.shape
            for name in dtype.names:   # fields, not the padding between them (numpy leaves that unset)
                assert got[name].tobytes() == want[name].tobytes()

"""The trace shapes PyTorch / Kineto write today and wrote before (fixtures/formats.py,
docs/trace-shapes.md): each variant of one synthetic run, old and new shape, gives the same
report; contradictory Seq numbers are flagged and matched by alignment; Comms Id, Stream Sync
rows, invalid log members, user labels and custom collective kernels."""
import json
import os
import subprocess
import sys

import pandas as pd
import pytest
from click.testing import CliRunner

import formats
import generate_fixture
from helpers import extract_one
from streamtrace import StreamtraceError, generate_collective_report
from streamtrace.cli import main as cli_main
from synthtrace import NCCL_ALLREDUCE, NCCL_SENDRECV, Num, coll_kernel, write_trace

WORLD = 4


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("formats_base")
    generate_fixture.generate(str(d), ranks=WORLD, steps=2, fill_ops=12, tp=2, seed=21)
    return str(d)


@pytest.fixture(scope="module")
def variant(run_dir, tmp_path_factory):
    """variant(name, shape) -> (directory, formats truths), written once per module."""
    made = {}

    def get(name, shape):
        if (name, shape) not in made:
            d = str(tmp_path_factory.mktemp(f"{name}_{shape}"))
            made[(name, shape)] = (d, formats.write_variant(run_dir, d, name, shape))
        return made[(name, shape)]
    return get


def sheets_of(trace_dir, **kw):
    return generate_collective_report(trace_dir=trace_dir, world_size=WORLD, write_files=False,
                                      blocking_analysis=True, **kw)


@pytest.fixture(scope="module")
def base_sheets(run_dir):
    return sheets_of(run_dir)


def assert_same_sheets(a, b, drop=(), skip=()):
    assert list(a) == list(b)
    for name in a:
        if name in skip:
            continue
        x, y = a[name], b[name]
        cols = [c for c in x.columns if c not in drop]
        pd.testing.assert_frame_equal(x[cols].reset_index(drop=True), y[cols].reset_index(drop=True),
                                      check_dtype=False, obj=name)


def truth_of(run_dir):
    with open(os.path.join(run_dir, "truth.json")) as fh:
        return json.load(fh)


def instances_by_truth(sheets, truth):
    """{collective index: the one instance holding its kernel on every rank} (fails if the
    kernels of one collective are split over instances)."""
    long = sheets["nccl_long"]
    lookup = {(int(r), round(float(t), 3)): int(i) for r, t, i in zip(long["rank"], long["ts_raw"], long["instance"])}
    out = {}
    for c in truth["collectives"]:
        ids = {lookup[(int(r), round(float(p["ts_us"]), 3))] for r, p in c["per_rank"].items()}
        assert len(ids) == 1, (c["index"], ids)
        out[c["index"]] = ids.pop()
    assert len(set(out.values())) == len(out)   # and no two collectives share an instance
    return out


# ---------------------------------------------------------------- every variant, old and new


@pytest.mark.parametrize("name", ["seq", "sync", "log", "labels"])
def test_old_and_new_shape_give_the_same_report(variant, name):
    old = sheets_of(variant(name, "old")[0])
    new = sheets_of(variant(name, "new")[0])
    assert_same_sheets(old, new)


@pytest.mark.parametrize("name", ["seq", "sync", "log"])
def test_shape_changes_nothing_reported(variant, base_sheets, name):
    """These shapes add nothing to the run: the report is the plain run's."""
    for shape in formats.SHAPES:
        assert_same_sheets(base_sheets, sheets_of(variant(name, shape)[0]))


# ---------------------------------------------------------------- Seq and Comms Id


def test_comms_id_is_extracted_from_kernels_and_cpu_ops(variant):
    d, _ = variant("seq", "new")
    path = os.path.join(d, "rank0_trace.json")
    with open(path) as fh:
        doc = json.load(fh)
    written = sorted(str(e["args"]["Comms Id"]) for e in doc["traceEvents"] if "Comms Id" in e.get("args", {}))
    assert written and any(int(x) >= 1 << 63 for x in written)   # uint64: above int64's range too
    rank = extract_one(path)
    strings = rank.strings
    got = sorted(strings[c["comms_id"]] for c in rank.comms if c["comms_id"] != 0xFFFFFFFF)
    assert got == written


def test_contradictory_seq_is_flagged_and_matched_by_alignment(variant, run_dir):
    d_new, info = variant("bad_seq", "new")
    d_old, _ = variant("bad_seq", "old")
    truth = truth_of(run_dir)
    # the fixture really numbers one rank two ahead
    some = next(iter(info["written_seq"]["0"]))
    assert info["written_seq"][str(formats.BAD_SEQ_RANK)][some] == info["written_seq"]["0"][some] + 2
    new, old = sheets_of(d_new), sheets_of(d_old)
    dq = new["data_quality"]
    flagged = dq[dq["category"] == "seq_contradictory"]
    assert len(flagged) >= 1
    assert "seq_contradictory" not in set(old["data_quality"]["category"])
    # every collective of the run is one instance, as in the trace with the right numbers
    instances_by_truth(new, truth)
    instances_by_truth(old, truth)
    # the groups of the rank that numbers ahead are matched by alignment, the others by Seq
    long = new["nccl_long"]
    bad_groups = {g["name"] for g in truth["process_groups"] if formats.BAD_SEQ_RANK in g["ranks"]}
    in_bad = long["Process Group Name"].astype(str).isin(bad_groups)
    assert set(long[in_bad]["match_method"]) <= {"ordinal", "aligned"}
    assert set(long[~in_bad]["match_method"]) == {"seq"}
    assert set(flagged["pg"]) == bad_groups
    assert set(old["nccl_long"]["match_method"]) == {"seq"}
    assert_same_sheets(old, new, drop=("match_method", "flags"), skip=("data_quality",))


def test_p2p_ops_have_their_own_seq_counter(tmp_path):
    """Point-to-point ops count Seq apart from collectives in the same process group
    (ProcessGroupNCCL's seqP2P_ and seqCollective_): equal numbers are different ops."""
    for rank in (0, 1):
        events, t = [], 1000
        for k in range(3):
            events.append(coll_kernel(f"{t}.000", "50.000", group_size=2, seq=k + 1, corr=10 + k))
            t += 200
            p2p = "send" if rank == 0 else "recv"
            events.append(coll_kernel(f"{t}.000", "30.000", coll=p2p, group_size=2, seq=k + 1, corr=20 + k,
                                      name=NCCL_SENDRECV))
            t += 200
        write_trace(tmp_path / f"rank{rank}_trace.json", events, rank=rank, world_size=2)
    s = generate_collective_report(trace_dir=str(tmp_path), world_size=2, write_files=False)
    long = s["nccl_long"]
    p2p = long["Collective name"].isin(("send", "recv"))
    assert set(long[~p2p]["match_method"]) == {"seq"}
    by_inst = long[~p2p].groupby("instance")["Collective name"].agg(lambda v: tuple(sorted(v)))
    assert sorted(by_inst.tolist()) == [("allreduce", "allreduce")] * 3
    # a send and a recv are paired by the p2p module, never as a collective instance
    assert set(long[p2p]["match_method"]) == {"p2p"} and long[p2p]["instance"].is_unique and p2p.sum() == 6
    assert not {"duplicate_seq", "seq_contradictory"} & set(s["data_quality"]["category"])


def test_seq_that_goes_backwards_is_contradictory(tmp_path):
    for rank in (0, 1):
        seqs = [5, 6, 7] if rank == 0 else [5, 7, 6]
        events = [coll_kernel(f"{1000 + 300 * k}.000", "50.000", group_size=2, seq=s, corr=10 + k,
                              nelems=1024 * (k + 1)) for k, s in enumerate(seqs)]
        write_trace(tmp_path / f"rank{rank}_trace.json", events, rank=rank, world_size=2)
    s = generate_collective_report(trace_dir=str(tmp_path), world_size=2, write_files=False)
    assert "seq_contradictory" in set(s["data_quality"]["category"])
    long = s["nccl_long"]
    # matched in time order, so each instance holds one message size
    assert (long.groupby("instance")["In msg nelems"].nunique() == 1).all()
    assert long["instance"].nunique() == 3


# ---------------------------------------------------------------- Stream Sync rows


def test_stream_sync_rows_are_where_kineto_puts_them(variant):
    for shape, offset in (("old", 0), ("new", formats.SYNC_TID_OFFSET)):
        d, _ = variant("sync", shape)
        with open(os.path.join(d, "rank0_trace.json")) as fh:
            doc = json.load(fh)
        syncs = [e for e in doc["traceEvents"] if e.get("name") == "Stream Sync"]
        assert syncs and all(e["tid"] == e["args"]["stream"] + offset for e in syncs)
        names = [e for e in doc["traceEvents"] if e.get("name") == "thread_name"
                 and e["args"]["name"].endswith("(sync)")]
        assert bool(names) == (shape == "new")


# ---------------------------------------------------------------- WARNING / ERROR members


def test_old_log_members_are_not_json_and_are_tolerated(variant, tmp_path):
    d, _ = variant("log", "old")
    path = os.path.join(d, "rank0_trace.json")
    with open(path) as fh, pytest.raises(ValueError):
        json.load(fh)
    rank = extract_one(path)
    assert rank.meta["trace"]["ERROR"] == ["CUPTI_ERROR_NOT_INITIALIZED: cuptiActivityFlushAll [] {}"]
    assert "ACTIVITIES_LOG_FILE" in rank.meta["trace"]["WARNING"]["unparsed"]
    assert rank.meta["trace"]["traceName"]   # the members after them are read
    # the fuse rewriter reads the same document
    out = tmp_path / "fused.json"
    r = subprocess.run([sys.executable, "-m", "streamtrace.cli", "fuse", "--trace_dir", d, "--world_size",
                        str(WORLD), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    with open(out) as fh:
        fused = json.load(fh)
    assert len([e for e in fused["traceEvents"] if e.get("cat") == "kernel"]) > 0


@pytest.mark.parametrize("members, warning", [
    # valid JSON over several lines, one with a ']' and ',' on its first line: read as JSON
    ('"WARNING": [["a"],\n  ["b"]],\n', [["a"], ["b"]]),
    ('"WARNING": [\n  "a",\n  "b"\n],\n', ["a", "b"]),
    # two unescaped lines whose quotes pair up across them: the first swallows the second, nothing fails
    ('"WARNING": ["x "y"],\n  "ERROR": ["z "w"],\n', None),
])
def test_log_members_valid_or_not(tmp_path, members, warning):
    p = tmp_path / "rank0_trace.json"
    p.write_text('{"traceEvents": [\n  {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1}'
                 f'\n  ],\n  {members}  "traceName": "t.json"\n}}\n')
    rank = extract_one(p)
    assert len(rank.events) == 1 and rank.meta["trace"]["traceName"] == "t.json"
    if warning is not None:
        assert rank.meta["trace"]["WARNING"] == warning
        with open(p) as fh:
            json.load(fh)


# ---------------------------------------------------------------- user labels


@pytest.mark.parametrize("blocking", [False, True])   # two ways of reading the ranks
def test_user_labels_are_carried_into_nccl_long(variant, run_dir, blocking):
    for shape in formats.SHAPES:
        d, info = variant("labels", shape)
        long = generate_collective_report(trace_dir=d, world_size=WORLD, write_files=False,
                                          blocking_analysis=blocking)["nccl_long"]
        assert list(long.columns)[-1] == "user_label"
        truth = truth_of(run_dir)
        want = {}
        for c in truth["collectives"]:
            for r, p in c["per_rank"].items():
                want[(int(r), round(float(p["ts_us"]), 3))] = info["labels"][f"{c['pg_name']}/{c['trace_seq']}"]
        got = {(int(r), round(float(t), 3)): lab for r, t, lab in zip(long["rank"], long["ts_raw"], long["user_label"])}
        assert got == want


def test_without_labels_there_is_no_label_column(base_sheets):
    assert "user_label" not in base_sheets["nccl_long"].columns


# ---------------------------------------------------------------- custom collective kernels


def test_custom_kernels_launched_by_c10d_are_found_by_their_args(variant, run_dir):
    """A vendor kernel that c10d launched carries the collective's args (Kineto copies them from the
    record_param_comms op): it is a collective with or without a pattern, and only its name differs."""
    d_new, info = variant("custom", "new")
    old = sheets_of(variant("custom", "old")[0])
    for kw in ({}, {"custom_collective_patterns": [tuple(p) for p in info["custom_patterns"]]}):
        new = sheets_of(d_new, **kw)
        assert (new["nccl_long"]["kernel_name"].str.startswith("void vendorcomm::")).all()
        instances_by_truth(new, truth_of(run_dir))
        # without a pattern data_quality says how they were found (linked_kernels)
        assert_same_sheets(old, new, drop=("kernel_name", "signature"),   # both hold the kernel name
                           skip=() if kw else ("data_quality",))
        if not kw:
            assert set(new["data_quality"]["category"]) == {"linked_kernels"}


def test_custom_pattern_names_the_collective_when_the_kernel_has_no_args(tmp_path):
    for rank in (0, 1):
        events = [coll_kernel("1000.000", "40.000", coll=None, corr=5, name="my_fused_allreduce_kernel"),
                  coll_kernel("2000.000", "40.000", coll=None, corr=6, name="my_fused_allreduce_kernel")]
        write_trace(tmp_path / f"rank{rank}_trace.json", events, rank=rank, world_size=2)
    assert generate_collective_report(trace_dir=str(tmp_path), world_size=2, write_files=False)["nccl_long"].empty
    s = generate_collective_report(trace_dir=str(tmp_path), world_size=2, write_files=False,
                                   custom_collective_patterns=[(r"fused_allreduce", "allreduce")])
    long = s["nccl_long"]
    assert len(long) == 4 and set(long["Collective name"]) == {"allreduce"}
    assert long["instance"].nunique() == 2


def test_custom_pattern_on_the_command_line(variant, tmp_path):
    d, info = variant("custom", "new")
    args = ["collective-report", "--trace_dir", d, "--world_size", str(WORLD), "--output_csvs_dir", str(tmp_path / "o")]
    for pattern, name in info["custom_patterns"]:
        args += ["--custom_collective_pattern", f"{pattern}={name}"]
    r = CliRunner().invoke(cli_main, args)
    assert r.exit_code == 0, r.output
    long = pd.read_csv(tmp_path / "o" / "nccl_long.csv")
    assert len(long) > 0 and long["kernel_name"].str.startswith("void vendorcomm::").all()


@pytest.mark.parametrize("bad", ["no_equals_sign", "([=allreduce", "x=not_a_collective"])
def test_bad_custom_pattern_is_a_usage_error(variant, tmp_path, bad):
    d, _ = variant("custom", "new")
    r = CliRunner().invoke(cli_main, ["collective-report", "--trace_dir", d, "--world_size", str(WORLD),
                                      "--output_csvs_dir", str(tmp_path / "o"), "--custom_collective_pattern", bad])
    assert r.exit_code == 2
    assert "Traceback" not in r.output and "--custom_collective_pattern" in r.output
    assert not (tmp_path / "o").exists()


def test_bad_custom_pattern_in_the_api_is_a_streamtrace_error(run_dir):
    with pytest.raises(StreamtraceError, match="custom collective pattern"):
        generate_collective_report(trace_dir=run_dir, world_size=WORLD, write_files=False,
                                   custom_collective_patterns=[("([", "allreduce")])


def test_generator_writes_a_variant(tmp_path):
    gen = os.path.join(os.path.dirname(generate_fixture.__file__), "generate_fixture.py")
    r = subprocess.run([sys.executable, gen, "--out", str(tmp_path), "--ranks", "2", "--steps", "1",
                        "--format_variant", "seq:new"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "formats.json") as fh:
        assert json.load(fh) == {"shape": "new", "variant": "seq"}
    with open(tmp_path / "rank0_trace.json") as fh:
        doc = json.load(fh)
    assert any("Comms Id" in e.get("args", {}) for e in doc["traceEvents"] if e.get("cat") == "kernel")
    bad = subprocess.run([sys.executable, gen, "--out", str(tmp_path / "x"), "--format_variant", "nope"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--format_variant" in bad.stderr


def test_custom_pattern_in_the_align_stage(tmp_path):
    """extract | align --custom_collective_pattern | report, through real pipes, finds the same
    collectives as collective-report with the pattern."""
    for rank in (0, 1):
        events = [coll_kernel(f"{1000 + 1000 * k}.000", "40.000", coll=None, corr=5 + k,
                              name="my_fused_allreduce_kernel") for k in range(3)]
        write_trace(tmp_path / f"rank{rank}_trace.json", events, rank=rank, world_size=2)
    st = [sys.executable, "-m", "streamtrace.cli"]
    ex = subprocess.Popen(st + ["extract", "--trace_dir", str(tmp_path), "--world_size", "2"], stdout=subprocess.PIPE)
    al = subprocess.Popen(st + ["align", "--custom_collective_pattern", "fused_allreduce=allreduce"],
                          stdin=ex.stdout, stdout=subprocess.PIPE)
    ex.stdout.close()
    rp = subprocess.run(st + ["report", "--output_csvs_dir", str(tmp_path / "o")], stdin=al.stdout,
                        capture_output=True, text=True)
    al.stdout.close()
    assert ex.wait() == 0 and al.wait() == 0 and rp.returncode == 0, rp.stderr
    long = pd.read_csv(tmp_path / "o" / "nccl_long.csv")
    assert len(long) == 6 and set(long["Collective name"]) == {"allreduce"} and long["instance"].nunique() == 3
    bad = CliRunner().invoke(cli_main, ["align", "--custom_collective_pattern", "x=nope", "-o", str(tmp_path / "a.st")])
    assert bad.exit_code == 2 and not (tmp_path / "a.st").exists()

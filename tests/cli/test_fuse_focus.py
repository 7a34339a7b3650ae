"""``streamtrace fuse --focus`` and ``--format pftrace`` through real
processes: the window chosen (worst collective, collective:ID, step:N,
time:T0:T1) against the generator's truth, printed and stored in both
formats' metadata, composed with --ranks; its edge cases are one line and
exit 1 with nothing written."""
import json
import os
import shutil
import subprocess
import sys

import pytest

import generate_fixture as gen
from pftrace_reference import decode, pftrace_slices

TIMEOUT = 300


def _streamtrace():
    exe = shutil.which("streamtrace", path=os.path.dirname(sys.executable))
    return [exe] if exe else [sys.executable, "-m", "streamtrace.cli"]


def fuse_cli(*args):
    return subprocess.run(_streamtrace() + ["fuse", *map(str, args)], capture_output=True, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("focus")
    truth = gen.generate(str(d), ranks=4, format="json", seed=5, straggler_rank=2, straggler_us=300)
    return [os.path.join(str(d), truth["files"][str(r)]) for r in range(4)], truth


def truth_waits(truth):
    """Per collective: (waiting ns on the true clocks, [first written start, last written end])."""
    out = []
    for c in truth["collectives"]:
        pr = c["per_rank"].values()
        starts = [p["true_start_ns"] for p in pr]
        out.append((sum(max(starts) - s for s in starts),
                    [min(p["written_start_ns"] for p in pr), max(p["written_end_ns"] for p in pr)]))
    return out


def test_worst_is_the_collective_with_most_waiting(tmp_path, run):
    paths, truth = run
    out = tmp_path / "worst.pftrace"
    proc = fuse_cli(*paths, "--focus", "worst", "-o", out, "-j", "2")
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr.decode()
    assert "focus worst: collective " in err and " us" in err
    view = decode(str(out))
    focus = view["meta"]["focus"]
    waits = truth_waits(truth)
    chosen = [w for w, span in waits if span == focus["instance_ns"]]
    assert chosen, "the window's instance is one of the run's collectives"
    assert chosen[0] == max(w for w, _ in waits)
    lo, hi = focus["window_ns"]
    assert lo < focus["instance_ns"][0] and hi > focus["instance_ns"][1]   # a margin on each side
    assert focus["window_us"] in err
    # the focus window is drawn as a slice, and every event kept meets it
    assert [view["focus"]["ts"], view["focus"]["ts"] + view["focus"]["dur"]] == [lo, hi]
    sl = pftrace_slices(view)
    assert sl and all(s["ts"] <= hi and s["ts"] + s["dur"] >= lo for s in sl)
    assert {s["rank"] for s in sl} == set(range(4))



@pytest.mark.parametrize("suffix", [".pftrace.gz", ".json"])
def test_worst_holds_the_collectives_kernel_and_launch_on_every_rank(tmp_path, run, suffix):
    """Not only some events in the window: the worst instance itself, its NCCL
    kernel (time and duration as written) and the CPU launch of it, on each rank."""
    paths, truth = run
    out = tmp_path / ("worst" + suffix)
    proc = fuse_cli(*paths, "--focus", "worst", "-o", out, "-j", "2")
    assert proc.returncode == 0, proc.stderr
    if suffix == ".json":
        with open(out) as f:
            doc = json.load(f)
        focus = doc["streamtrace"]["focus"]
        slices = [dict(rank=e["args"]["rank"], name=e["name"], ts=round(float(e["ts"]) * 1000),
                       dur=round(float(e["dur"]) * 1000)) for e in doc["traceEvents"] if e.get("ph") == "X"]
    else:
        view = decode(str(out))
        focus = view["meta"]["focus"]
        slices = pftrace_slices(view)
    coll = next(c for c in truth["collectives"]
                if [min(p["written_start_ns"] for p in c["per_rank"].values()),
                    max(p["written_end_ns"] for p in c["per_rank"].values())] == focus["instance_ns"])
    assert len(coll["per_rank"]) == 4
    for r, p in coll["per_rank"].items():
        kernel = [s for s in slices if s["rank"] == int(r) and s["name"] == coll["kernel_name"]
                  and s["ts"] == p["written_start_ns"] and s["dur"] == p["written_end_ns"] - p["written_start_ns"]]
        assert len(kernel) == 1, (r, coll["kernel_name"], p)
        launch = round(float(p["launch_ts_us"]) * 1000)
        assert [s for s in slices if s["rank"] == int(r) and s["ts"] == launch and s["name"] != coll["kernel_name"]], r


def test_focus_equals_the_same_window_in_json(tmp_path, run):
    paths, _ = run
    a, b = tmp_path / "focus.json", tmp_path / "window.json"
    proc = fuse_cli(*paths, "--focus", "collective:0_3", "-o", a)
    assert proc.returncode == 0, proc.stderr
    with open(a) as f:
        doc = json.load(f)
    focus = doc["streamtrace"]["focus"]
    assert focus["collective_id"] == "0_3" and doc["streamtrace"]["options"]["window_ns"] == focus["window_ns"]
    assert fuse_cli(*paths, "--window", focus["window_us"], "-o", b).returncode == 0
    with open(b) as f:
        same = json.load(f)
    assert doc["traceEvents"] == same["traceEvents"]


def test_step_window_and_ranks(tmp_path, run):
    paths, truth = run
    out = tmp_path / "step.pftrace.gz"
    proc = fuse_cli(*paths, "--focus", "step:13", "--ranks", "1,3", "-o", out)
    assert proc.returncode == 0, proc.stderr
    view = decode(str(out))
    step = next(s for s in truth["profiler_steps"] if s["number"] == 13)["per_rank"]
    want = [min(step[r]["written_start_ns"] for r in ("1", "3")), max(step[r]["written_end_ns"] for r in ("1", "3"))]
    assert view["meta"]["focus"]["window_ns"] == want
    assert {s["rank"] for s in pftrace_slices(view)} == {1, 3}


def test_time_window_to_stdout_as_pftrace(tmp_path, run):
    paths, truth = run
    step = next(s for s in truth["profiler_steps"] if s["number"] == 12)["per_rank"]["0"]
    t0 = step["written_start_ns"] / 1000
    proc = fuse_cli(*paths, "--focus", f"time:{t0}:{t0 + 500}", "--format", "pftrace", "-o", "-", "-q")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b""
    out = tmp_path / "stdout.pftrace"
    out.write_bytes(proc.stdout)
    view = decode(str(out))
    assert view["slices"] and view["meta"]["focus"]["label"] == f"time {t0}:{t0 + 500}"


@pytest.mark.parametrize("args, message", [
    (["--focus", "time:1:2"], "no event in the window 1.000:2.000 us"),                   # before the traces
    (["--focus", "time:9000000000000:9000000000001"], "no event in the window"),          # beyond them
    (["--focus", "step:999"], "no ProfilerStep#999 (the traces hold steps"),
    (["--focus", "collective:nope"], "no collective 'nope'"),
    (["--focus", "sideways"], "expected worst, collective:ID, step:N or time:T0:T1"),
    (["--focus", "worst", "--window", "1:2"], "--focus and --window both choose the window"),
    (["--format", "pftrace"], "the name says json, --format says pftrace"),
])
def test_focus_edge_cases_are_one_line(tmp_path, run, args, message):
    paths, _ = run
    out = tmp_path / "out.json"
    proc = fuse_cli(*paths, *args, "-o", out)
    assert proc.returncode == 1
    lines = [ln for ln in proc.stderr.decode().splitlines() if ln.startswith("Error")]
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not out.exists()


def test_mark_blockers_track_per_rank_in_both_formats(tmp_path, run):
    """Each late arrival of the collective_blockers sheet is a slice on its rank's
    'RANK r - blockers' track, ending where that rank's collective kernel starts."""
    from streamtrace.chain import correlated_tables

    paths, _ = run
    js, pf = tmp_path / "marks.json", tmp_path / "marks.pftrace"
    assert fuse_cli(*paths, "--mark", "blockers", "-o", js, "-j", "2").returncode == 0
    proc = fuse_cli(*paths, "--mark", "blockers", "-o", pf, "-j", "2")
    assert proc.returncode == 0, proc.stderr
    tables = correlated_tables(paths, jobs=1)
    late = tables["correlate.collective_blockers"]
    late = late[late["delta_us"] > 0]
    coll = tables["align.collectives"]
    start = {(str(c), int(r)): int(t) for c, r, t in zip(coll["collective_id"], coll["rank"], coll["ts_ns"])}
    want = sorted((f"RANK {int(r)} - blockers", str(c), start[(str(c), int(r))])
                  for c, r in zip(late["collective_id"], late["late_rank"]))
    assert want
    with open(js) as f:
        doc = json.load(f)
    marks = [e for e in doc["traceEvents"] if e.get("cat") == "streamtrace.blockers"]
    got = sorted((e["pid"], e["args"]["collective_id"], round((e["ts"] + e["dur"]) * 1000)) for e in marks)
    assert got == want
    view = decode(str(pf))
    sl = [s for s in pftrace_slices(view) if s["cat"] == "streamtrace.blockers"]
    assert sorted((s["track"][0], s["args"]["collective_id"], s["ts"] + s["dur"]) for s in sl) == want
    assert all(s["name"].startswith("late ") and "dominant_cause" in s["args"] for s in sl)


def test_collective_window_on_the_shifted_timeline(tmp_path):
    """With --align_clocks each rank is shifted: the window is the instance's
    span on the fused timeline (its written times plus each rank's shift)."""
    d = tmp_path / "skewed"
    truth = gen.generate(str(d), ranks=4, format="json", seed=7, clock_offsets_us=[0, 120, -75.5, 40])
    paths = [str(d / truth["files"][str(r)]) for r in range(4)]
    out = tmp_path / "c.json"
    proc = fuse_cli(*paths, "--align_clocks", "--focus", "collective:0_4", "-o", out)
    assert proc.returncode == 0, proc.stderr
    with open(out) as f:
        meta = json.load(f)["streamtrace"]
    shift = {int(r): v["ts_shift_ns"] for r, v in meta["inputs"].items()}
    assert any(shift.values())
    inst = [c for c in truth["collectives"] if c["pg_name"] == "0"][4]["per_rank"]
    want = [min(p["written_start_ns"] + shift[int(r)] for r, p in inst.items()),
            max(p["written_end_ns"] + shift[int(r)] for r, p in inst.items())]
    assert meta["focus"]["instance_ns"] == want


def test_worst_without_collectives_is_one_line(tmp_path):
    p = tmp_path / "r0.json"
    p.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7,
                                              "ts": 10, "dur": 5}]}))
    out = tmp_path / "out.pftrace"
    proc = fuse_cli(p, "--focus", "worst", "-o", out)
    assert proc.returncode == 1
    lines = [ln for ln in proc.stderr.decode().splitlines() if ln.startswith("Error")]
    assert len(lines) == 1 and "no collective the align stage matched" in lines[0], proc.stderr
    assert not out.exists()

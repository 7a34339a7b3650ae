"""``streamtrace fuse --critical_path`` (``--mark critical_path``) through real
processes: the ``critical path`` track holds exactly the critical_path
sheet's segments (names, times on the fused timeline) of a run with a known
straggler, in JSON and in a .pftrace decoded with Perfetto's descriptors;
composed with --focus and --ranks; a trace the analysis cannot run on is one
line, exit 1, nothing written."""
import json
import os
import shutil
import subprocess
import sys

import pytest

import generate_fixture as gen
from pftrace_reference import decode, track_path

TIMEOUT = 300
STRAGGLER = 2


def _streamtrace():
    exe = shutil.which("streamtrace", path=os.path.dirname(sys.executable))
    return [exe] if exe else [sys.executable, "-m", "streamtrace.cli"]


def fuse_cli(*args):
    return subprocess.run(_streamtrace() + ["fuse", *map(str, args)], capture_output=True, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("critical")
    truth = gen.generate(str(d), ranks=4, format="json", seed=5, straggler_rank=STRAGGLER, straggler_us=300)
    return [os.path.join(str(d), truth["files"][str(r)]) for r in range(4)]


def expected(paths, shift, align_clocks=None):
    """(step, name, start ns, end ns) of every critical_path segment on the fused
    timeline: each rank's analysis clock taken back to its own ns through its
    steps (critical.steps against align.steps), then moved by fuse's shift."""
    from streamtrace import critical
    from streamtrace.chain import correlated_tables

    tables = correlated_tables(paths, jobs=1, critical=True, align_clocks=align_clocks)
    path = critical.compute(tables)["critical_path"]
    steps = tables["critical.steps"]
    origin = steps.groupby("step")["start"].min()
    own = tables["align.steps"].set_index(["rank", "step"])["start_ns"]
    to_own = {int(r): int(s) - int(own[(int(r), int(st))]) for st, r, s in zip(steps["step"], steps["rank"],
                                                                               steps["start"])}
    out = []
    for r in path.itertuples():
        d = shift[int(r.rank)] - to_own[int(r.rank)] + int(origin[r.step])
        out.append((int(r.step), f"{r.category}: {r.detail}", d + round(r.start_us * 1000),
                    d + round(r.end_us * 1000)))
    return sorted(out), path


def json_track(out):
    with open(out) as f:
        doc = json.load(f)
    shift = {int(r): v["ts_shift_ns"] for r, v in doc["streamtrace"]["inputs"].items()}
    ev = [e for e in doc["traceEvents"] if e.get("pid") == "critical path" and e.get("ph") == "X"]
    segs = sorted((e["args"]["step"], e["name"], round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000))
                  for e in ev if e["cat"] == "streamtrace.critical_path")
    return doc, shift, segs, [e for e in ev if e["cat"] == "streamtrace.critical_step"]


def test_json_track_holds_the_critical_path(tmp_path, run):
    out = tmp_path / "cp.json"
    proc = fuse_cli(*run, "--critical_path", "-o", out, "-j", "2")
    assert proc.returncode == 0, proc.stderr
    doc, shift, got, steps = json_track(out)
    want, path = expected(run, shift)
    assert got == want and len(got) == len(path)
    # the straggler is on the path: the others waited for it
    late = path[path["category"] == "late rank wait"]
    assert len(late) and set(late["waited_for"].astype(int)) == {STRAGGLER}
    # one slice per step spans its segments; the track is named and sorted first
    assert sorted(s["args"]["step"] for s in steps) == sorted(set(path["step"]))
    for s in steps:
        mine = [g for g in got if g[0] == s["args"]["step"]]
        assert round(s["ts"] * 1000) == min(g[2] for g in mine)
        assert round((s["ts"] + s["dur"]) * 1000) == max(g[3] for g in mine)
    meta = [e for e in doc["traceEvents"] if e.get("pid") == "critical path" and e.get("ph") == "M"]
    assert {"name": "critical path"} in [m["args"] for m in meta if m["name"] == "process_name"]
    # the --mark spelling is the same track
    again = tmp_path / "mark.json"
    assert fuse_cli(*run, "--mark", "critical_path", "-o", again).returncode == 0
    assert json_track(again)[2] == got


def test_pftrace_has_the_same_slices(tmp_path, run):
    js, pf = tmp_path / "cp.json", tmp_path / "cp.pftrace.gz"
    assert fuse_cli(*run, "--critical_path", "-o", js).returncode == 0
    proc = fuse_cli(*run, "--critical_path", "--mark", "blockers", "-o", pf, "-j", "2")
    assert proc.returncode == 0, proc.stderr
    _, _, want, steps = json_track(js)
    view = decode(str(pf))
    sl = [s for s in view["slices"] if s["cat"] == "streamtrace.critical_path"]
    assert all(track_path(view["tracks"], s["track"]) == ("critical path", "critical path") for s in sl)
    got = sorted((s["args"]["step"], s["name"], s["ts"], s["ts"] + s["dur"]) for s in sl)
    assert got == want
    assert {s["args"]["on_rank"] for s in sl} >= {STRAGGLER}
    assert len([s for s in view["slices"] if s["cat"] == "streamtrace.critical_step"]) == len(steps)
    assert any(s["cat"] == "streamtrace.blockers" for s in view["slices"])   # both marks, one analysis


def test_focus_and_ranks(tmp_path, run):
    """--focus step:13 keeps the segments meeting that step's window; --ranks
    marks the path of the ranks fused (the analysis runs on them alone)."""
    out = tmp_path / "focus.json"
    proc = fuse_cli(*run, "--critical_path", "--focus", "step:13", "-o", out)
    assert proc.returncode == 0, proc.stderr
    doc, shift, got, steps = json_track(out)
    lo, hi = doc["streamtrace"]["focus"]["window_ns"]
    want, _ = expected(run, shift)
    assert got == [w for w in want if w[3] >= lo and w[2] <= hi]
    assert {g[0] for g in got} == {13}
    assert [s["args"]["step"] for s in steps] == [13]

    out = tmp_path / "ranks.json"
    proc = fuse_cli(*run, "--critical_path", "--ranks", "0,1", "-o", out)
    assert proc.returncode == 0, proc.stderr
    _, shift, got, _ = json_track(out)
    want, path = expected(run[:2], shift)
    assert got == want and set(path["rank"]) <= {0, 1}
    assert not any(name.startswith("late rank wait: rank 2") for _, name, _, _ in got)


def test_align_clocks_on_a_skewed_run(tmp_path):
    """With --align_clocks the fused timeline is the analysis' clock: every
    segment in place, none clipped."""
    d = tmp_path / "skewed"
    truth = gen.generate(str(d), ranks=4, format="json", seed=7, clock_offsets_us=[0, 120, -75.5, 40],
                         straggler_rank=1, straggler_us=300)
    paths = [str(d / truth["files"][str(r)]) for r in range(4)]
    out = tmp_path / "skew.json"
    proc = fuse_cli(*paths, "--critical_path", "--align_clocks", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert b"clipped" not in proc.stderr
    _, shift, got, _ = json_track(out)
    assert len(set(shift.values())) > 1
    assert got == expected(paths, shift, align_clocks=True)[0]


def test_no_collectives_is_one_line(tmp_path):
    p = tmp_path / "r0.json"
    p.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7,
                                              "ts": 10, "dur": 5}]}))
    for out in (tmp_path / "out.json", tmp_path / "out.pftrace"):
        proc = fuse_cli(p, "--critical_path", "-o", out)
        assert proc.returncode == 1
        lines = [ln for ln in proc.stderr.decode().splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("Error") and str(p) in lines[0], proc.stderr
        assert "no GPU collective or send/recv" in lines[0] and "nothing written" in lines[0]
        assert not out.exists()
        assert not [f for f in os.listdir(tmp_path) if f.startswith("out")]   # no temporary file left


def test_unknown_mark_is_refused(tmp_path, run):
    out = tmp_path / "out.json"
    proc = fuse_cli(*run, "--mark", "critical-path", "-o", out)
    assert proc.returncode != 0 and b"critical_path" in proc.stderr
    assert not out.exists()


def test_clocks_the_fuse_does_not_apply_clip_and_warn(tmp_path):
    """Without --align_clocks the fused timeline keeps clock offsets the
    analysis applied: a segment moved before the end of the one before it
    (on another rank) is clipped to start there, its end kept in its rank's
    place; one warning says how many and what to do."""
    d = tmp_path / "skewed"
    truth = gen.generate(str(d), ranks=4, format="json", seed=5, clock_offsets_us=[0, 120, 75.5, 40],
                         straggler_rank=STRAGGLER, straggler_us=300)
    paths = [str(d / truth["files"][str(r)]) for r in range(4)]
    out = tmp_path / "skew.json"
    proc = fuse_cli(*paths, "--critical_path", "-o", out)
    assert proc.returncode == 0, proc.stderr
    warned = [ln for ln in proc.stderr.decode().splitlines() if "clipped" in ln]
    assert len(warned) == 1 and "--align_clocks" in warned[0], proc.stderr
    doc, shift, got, _ = json_track(out)
    want, _ = expected(paths, shift)
    assert [g[:2] for g in got] == [w[:2] for w in want]
    # in path order, each segment ends where its rank has it (or, wholly before the end of the one before, there)
    ev = [e for e in doc["traceEvents"] if e.get("cat") == "streamtrace.critical_path"]
    by_step = {}
    for e in ev:
        by_step.setdefault(e["args"]["step"], []).append(e)
    clipped = 0
    for segs in by_step.values():
        segs.sort(key=lambda e: e["args"]["order"])
        for a, b in zip(segs, segs[1:]):
            a_end = round((a["ts"] + a["dur"]) * 1000)
            assert round(b["ts"] * 1000) >= a_end   # never overlapping
            own = [w for w in want if w[0] == b["args"]["step"] and w[1] == b["name"]
                   and abs(w[3] - w[2] - b["args"]["dur_us"] * 1000) <= 1]
            assert own and round((b["ts"] + b["dur"]) * 1000) in {max(w[3], a_end) for w in own}
            clipped += round(b["dur"] * 1000) < round(b["args"]["dur_us"] * 1000)
    assert clipped == int(warned[0].split("critical_path: ")[1].split()[0])

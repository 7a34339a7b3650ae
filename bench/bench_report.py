#!/usr/bin/env python3
"""Collective-report benchmarks (issue #3): prints wall and CPU times and peak memory.

Cases (sizes scale with --scale; 1.0 is the issue's done-when size):

``big``    4 ranks x ~500 MB plain JSON (new layout): ``collective-report``
           end to end (xlsx, default -j and -j 1; with and without the
           correlate stage's blocking sheets), plus extract alone for
           reference.  Targets: <= 3 s, <= 256 MB.
``dense``  4 ranks, >= 25,000 collective instances and nothing else: each
           collective with its CPU side (c10d op, record_param_comms, nccl:*
           annotation, runtime calls, python frames), each step's sync, no
           generic compute ops (fixture ``fill_ops=0``; ~120 MB per rank).
           ``collective-report`` end to end (CSVs and xlsx; default -j and
           -j 1), extract alone, ``align | report`` on an extracted stream,
           and the in-process matching + report computation.  Target: report
           in <= 2 s.
``dense_compute``  the same collectives with 24 generic compute ops per step
           between them (fixture ``fill_ops=3``, the generator's minimum
           otherwise; ~290 MB per rank, 2.4x the bytes): the same steps, to
           show what the added bytes cost.
``gz``     8 ranks x ~1 GB (uncompressed) .json.gz, ``collective-report -j 2``.
           Targets: <= 15 s, <= 1 GB.
``p2p``    what point-to-point matching adds to ``collective-report``
           (target: <= 10 % on the ``big`` set): in one process, the time
           in its code (the per-rank halves and stage work, the cross-rank
           matching and tables) over the whole report, on the ``big`` set
           (no send/recv: the one check per rank) and on a 1F1B pipeline
           set (fixtures/pipeline.py, 4 stages).

Traces are generated once per size into --workdir (fixtures/generate_fixture.py)
and reused.  Memory is reported twice: the peak RSS of the largest single
process (``ru_maxrss`` via wait4) and the peak of the summed RSS of the whole
process tree (sampled from /proc every 50 ms; parallel workers add up).

    python bench/bench_report.py --scale 0.1            # quick
    python bench/bench_report.py                        # full size (needs ~12 GB of disk)
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "fixtures"))
from measure import machine_speed  # noqa: E402 - bench/ is on sys.path when run as a script
BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")


# ---------------------------------------------------------------- measuring


def _tree_rss(root):
    """Summed RSS (bytes) of ``root`` and its descendants."""
    parents = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            parents[int(pid)] = (int(fields[1]), int(fields[21]))  # ppid, rss pages
        except (OSError, IndexError, ValueError):
            continue
    page = os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [root]
    children = {}
    for pid, (ppid, _) in parents.items():
        children.setdefault(ppid, []).append(pid)
    while todo:
        pid = todo.pop()
        if pid in parents:
            total += parents[pid][1] * page
        todo += children.get(pid, [])
    return total


REPEAT = 1


def run(cmd, shell=False):
    """Run a command REPEAT times; return (min wall s, max single-process RSS
    MB, max peak tree RSS MB, min CPU s).  The minimum wall time is the least
    disturbed by other load on the machine; CPU time (user + sys of the whole
    process tree) moves less with load than wall time does."""
    results = [_run_once(cmd, shell) for _ in range(REPEAT)]
    LAST_WALLS[:] = [r[0] for r in results]
    return (min(r[0] for r in results), max(r[1] for r in results), max(r[2] for r in results),
            min(r[3] for r in results))


LAST_WALLS = []  # every wall time of the last run(), printed by row()


def _run_once(cmd, shell=False):
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, shell=shell, executable="/bin/bash" if shell else None,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss(p.pid))
            done.wait(0.05)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    done.set()
    th.join()
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode(errors="replace")
    if p.returncode != 0:
        raise SystemExit(f"command failed ({p.returncode}): {cmd}\n{err}")
    return wall, usage.ru_maxrss / 1024, peak[0] / 2**20, usage.ru_utime + usage.ru_stime


def du(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if ".json" in f)


def generate(workdir, name, **options):
    """Generate (or reuse) a fixture set in a subprocess (so this process stays
    small: a child's ru_maxrss includes its parent's size at fork).
    Returns (dir, number of collective instances)."""
    d = os.path.join(workdir, name)
    stamp = os.path.join(d, ".options.json")
    if os.path.exists(stamp):
        with open(stamp) as f:
            saved = json.load(f)
        if saved.get("options") == options:
            return d, saved["collectives"]
    shutil.rmtree(d, ignore_errors=True)
    t0 = time.perf_counter()
    args = [sys.executable, os.path.join(ROOT, "fixtures", "generate_fixture.py"), "--out", d]
    for k, v in options.items():
        args += [f"--{k}", str(v)]
    res = subprocess.run(args, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"fixture generation failed: {res.stderr}")
    count = subprocess.run([sys.executable, "-c", "import json,sys; print(len(json.load(open(sys.argv[1]))"
                            "['collectives']))", os.path.join(d, "truth.json")],
                           capture_output=True, text=True, check=True)
    n = int(count.stdout)
    print(f"  (generated {name} in {time.perf_counter() - t0:.1f} s)", flush=True)
    with open(stamp, "w") as f:
        json.dump({"options": options, "collectives": n}, f)
    return d, n


def row(label, wall, rss, tree, cpu, note=""):
    if len(LAST_WALLS) > 1:
        note = (note + "  " if note else "") + "runs: " + ", ".join(f"{w:.2f}" for w in LAST_WALLS)
    print(f"  {label:<48} {wall:7.2f} s  {cpu:7.2f} s  {rss:7.0f} MB  {tree:7.0f} MB  {note}", flush=True)


def header(title):
    print(f"\n{title}\n  {'step':<48} {'wall':>9}  {'CPU':>9}  {'max RSS':>10}  {'tree RSS':>10}", flush=True)


# ---------------------------------------------------------------- cases


def case_big(workdir, scale, out):
    mb = max(1.0, 500 * scale)
    d, n = generate(workdir, f"big-{mb:g}", ranks=4, target_mb=mb, jobs=2)
    size = du(d)
    header(f"big: 4 ranks x {size / 4e6:.0f} MB JSON = {size / 1e9:.2f} GB, "
           f"{n} collective instances (targets: <= 3 s, <= 256 MB)")
    w, r, t, c = run(f"'{BIN}' extract --trace_dir '{d}' --world_size 4 | cat > /dev/null", shell=True)
    row("extract alone (| cat > /dev/null)", w, r, t, c, f"{size / w / 1e6:.0f} MB/s")
    x = os.path.join(out, "big.xlsx")
    base = [BIN, "collective-report", "--trace_dir", d, "--world_size", "4", "--output_xlsx_path", x, "-q"]
    for label, extra in (("collective-report (xlsx; default -j)", []), ("collective-report -j 1 (xlsx)", ["-j", "1"]),
                         ("  --blocking_analysis (default -j)", ["--blocking_analysis"]),
                         ("  --blocking_analysis -j 1", ["--blocking_analysis", "-j", "1"])):
        w, r, t, c = run(base + extra)
        row(label, w, r, t, c, f"{size / w / 1e6:.0f} MB/s")


def case_dense(workdir, scale, out):
    _dense(workdir, scale, out, "dense", fill_ops=0, note="target: report <= 2 s")


def case_dense_compute(workdir, scale, out):
    _dense(workdir, scale, out, "dense_compute", fill_ops=3, note="24 compute ops per step: the bytes' cost")


def _dense(workdir, scale, out, label, fill_ops, note):
    target = max(100, int(25_000 * scale))
    per_step = 7  # broadcast, all_to_allv, allgather, reducescatter, 3 allreduce (tp=1)
    steps = -(-target // per_step)
    d, n = generate(workdir, f"dense{fill_ops}-{steps}", ranks=4, steps=steps, fill_ops=fill_ops, jobs=2)
    size = du(d)
    header(f"{label}: 4 ranks, {n} collective instances ({4 * n} kernel rows), {size / 1e6:.0f} MB JSON "
           f"({note})")
    csv = os.path.join(out, "dense-csv")
    base = [BIN, "collective-report", "--trace_dir", d, "--world_size", "4", "-q"]
    w, r, t, c = run(base + ["--output_csvs_dir", csv])
    row("collective-report end to end (CSVs)", w, r, t, c)
    w, r, t, c = run(base + ["--output_csvs_dir", csv, "-j", "1"])
    row("  same, -j 1", w, r, t, c)
    w, r, t, c = run(base + ["--output_xlsx_path", os.path.join(out, "dense.xlsx")])
    row("collective-report end to end (xlsx)", w, r, t, c)
    w, r, t, c = run(base + ["--output_csvs_dir", csv, "--blocking_analysis"])
    row("  same (CSVs), --blocking_analysis", w, r, t, c)
    stev = os.path.join(out, "dense.stev")
    w, r, t, c = run([BIN, "extract", "--trace_dir", d, "--world_size", "4", "-o", stev])
    row("extract alone (-o stream)", w, r, t, c)
    w, r, t, c = run(f"'{BIN}' align '{stev}' | '{BIN}' report --output_csvs_dir '{csv}2' -q", shell=True)
    row("align | report on the stream (CSVs)", w, r, t, c)
    # in-process: the cross-rank matching and the report computation alone
    code = f"""
import time, pickle
from streamtrace.chain import collect_tables_from_traces
from streamtrace.report.sheets import build_report
from streamtrace.align.stage import finish_rank, match_ranks
from streamtrace.stream.format import iter_frames
from streamtrace.align.stage import RankCollector
cols = {{}}
for f in iter_frames({stev!r}):
    if f.kind in (2, 3, 5, 1):
        cols.setdefault(f.rank, RankCollector(f.rank)).add(f)
t0 = time.perf_counter(); results = [finish_rank(c) for c in cols.values()]; t1 = time.perf_counter()
tables = match_ranks(results); t2 = time.perf_counter()
sheets = build_report(tables); t3 = time.perf_counter()
print(f"{{t1 - t0:.3f}} {{t2 - t1:.3f}} {{t3 - t2:.3f}} {{len(tables['align.collectives'])}}")
"""
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
            for _ in range(REPEAT)]
    fin, match, rep = (min(float(r[i]) for r in runs) for i in range(3))
    rows = runs[0][3]
    print(f"  in-process: finish ranks {float(fin):.2f} s, match_ranks {float(match):.2f} s, "
          f"build_report {float(rep):.2f} s ({rows} kernel rows)", flush=True)


def case_gz(workdir, scale, out):
    mb = max(1.0, 1000 * scale)
    d, n = generate(workdir, f"gz-{mb:g}", ranks=8, target_mb=mb, format="json.gz", jobs=2, compress_level=1)
    size = du(d)
    header(f"gz: 8 ranks x ~{mb:g} MB JSON, {size / 1e9:.2f} GB gzip on disk, {n} collective instances "
           "(targets with -j 2: <= 15 s, <= 1 GB)")
    x = os.path.join(out, "gz.xlsx")
    base = [BIN, "collective-report", "--trace_dir", d, "--world_size", "8", "--output_xlsx_path", x, "-q", "-j", "2"]
    w, r, t, c = run(base)
    row("collective-report -j 2 (xlsx)", w, r, t, c, f"{8 * mb / w:.0f} MB JSON/s")
    w, r, t, c = run(base + ["--blocking_analysis"])
    row("  same, --blocking_analysis", w, r, t, c, f"{8 * mb / w:.0f} MB JSON/s")


_P2P_SHARE = """
import sys, time
import streamtrace.align.describe as describe, streamtrace.align.match as match
from streamtrace.chain import generate_collective_report
spent = [0.0]
def timed(fn):
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent[0] += time.perf_counter() - t0
    return wrapper
describe.rank_p2p, match.p2p_tables = timed(describe.rank_p2p), timed(match.p2p_tables)
t0 = time.perf_counter()
sheets = generate_collective_report(trace_dir=sys.argv[1], world_size=4, output_csvs_dir=sys.argv[2], jobs=1)
print(f"{spent[0]:.3f} {time.perf_counter() - t0:.3f} {len(sheets.get('p2p', ()))}")
"""


def _p2p_share(d, out):
    """(seconds in point-to-point code, seconds of the report, matched pairs), best of REPEAT (-j 1)."""
    runs = [subprocess.run([sys.executable, "-c", _P2P_SHARE, d, out], capture_output=True, text=True,
                           check=True).stdout.split() for _ in range(REPEAT)]
    best = min(runs, key=lambda r: float(r[1]))
    return float(best[0]), float(best[1]), int(best[2])


def case_p2p(workdir, scale, out):
    header("p2p: time in point-to-point matching within collective-report -j 1 (target: <= 10 %)")
    mb = max(1.0, 500 * scale)
    d, _ = generate(workdir, f"big-{mb:g}", ranks=4, target_mb=mb, jobs=2)
    p2p, total, pairs = _p2p_share(d, os.path.join(out, "p2p-big"))
    print(f"  big set (4 x {mb:g} MB, no send/recv): {p2p:.3f} s of {total:.2f} s = {100 * p2p / total:.1f} %",
          flush=True)
    d = os.path.join(workdir, f"pipeline-{scale:g}")
    if not os.path.exists(os.path.join(d, "truth.json")):
        from pipeline import generate_pipeline
        generate_pipeline(d, stages=4, microbatches=max(8, int(256 * scale)), steps=4)
    p2p, total, pairs = _p2p_share(d, os.path.join(out, "p2p-pipeline"))
    print(f"  pipeline set ({du(d) / 1e6:.0f} MB, {pairs} matched pairs): {p2p:.3f} s of {total:.2f} s = "
          f"{100 * p2p / total:.1f} %", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="size factor (1.0 = the issue's sizes)")
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "streamtrace-bench"),
                    help="where generated traces are kept between runs")
    ap.add_argument("--cases", default="big,dense,dense_compute,gz,p2p",
                    help="comma-separated subset of big,dense,dense_compute,gz,p2p")
    ap.add_argument("--repeat", type=int, default=1, help="runs per measurement (the minimum wall time is shown)")
    args = ap.parse_args()
    global REPEAT
    REPEAT = max(1, args.repeat)
    os.makedirs(args.workdir, exist_ok=True)
    print(f"streamtrace collective-report benchmark, scale {args.scale:g}, {os.cpu_count()} CPUs, "
          f"python {sys.version.split()[0]}, best of {REPEAT}, load average {os.getloadavg()[0]:.2f}")
    print("  " + machine_speed())
    out = tempfile.mkdtemp(prefix="bench-out-", dir=args.workdir)
    try:
        for case in args.cases.split(","):
            {"big": case_big, "dense": case_dense, "dense_compute": case_dense_compute,
             "gz": case_gz, "p2p": case_p2p}[case.strip()](args.workdir, args.scale, out)
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The event stream (issue #25): its size, the stages through files and
pipes against the one-shot report, each stage's peak RSS, and extraction
speed against format v2, all measured in one run on the same inputs.

    python bench/bench_stream.py --mb 50            # 4 x 50 MB: quick
    python bench/bench_stream.py --mb 512           # the issue's 4 x 512 MB set (~2 GB in /tmp)

Cases on a synthetic set of --ranks traces of --mb MB of plain JSON each
(fixtures/generate_fixture.py, generated into --workdir and reused):

* stream size against the JSON, here and on every real set in
  ../shared/traces/real (one row per set; JSON bytes uncompressed);
* ``extract -o FILE`` against extract to os.devnull (round by round:
  median and range), and against ``extract --no_summaries`` (what the
  per-rank summaries cost: align's and correlate's per-rank work, done once
  in extract), the three in alternating rounds;
* v3 extraction without summaries (MB of JSON per second) against v2's: the v2 commit
  (--v2, default the last commit writing v2) is checked out into a temporary
  worktree and its C core built there (scripts/compare_outputs.py's
  build_tree), then both run the same way, ``python -m streamtrace.cli``
  with their tree first on PYTHONPATH, alternately, best of --repeat;
* ``extract | align | correlate | report`` through pipes and the same four
  stages through files, against one ``collective-report
  --blocking_analysis`` (CSVs in every case): run in alternating rounds,
  each round's ratio taken against that round's one-shot (median and range
  printed), as the machine's speed drifts within minutes; with each one's
  CPU against the one-shot's, and extract's share of the files path;
* in the same rounds, the floor under each staged ratio: ``extract |
  report`` and ``extract -o FILE`` then ``report FILE``, which leave out
  ``align`` and ``correlate`` (``report`` aligns the stream itself and
  writes no blocking sheets), so no implementation of those two stages
  can bring the staged path below them;
* one rank's map in this process: the one-shot's against ``extract``'s
  (every event packed and written, with and without the summaries), which
  says what the stream itself costs per rank;
* ``dump --what summary`` on the extracted stream;
* the fixed cost: the four stages through files and the one-shot on a tiny
  set (processes starting, importing, writing), and the files ratio without
  the difference (what the stages' own work costs against the one-shot's).

Peak RSS is each process's own (wait4's ru_maxrss); CPU is its user and
system seconds with its children's (a pipeline's: all four processes').
The CPU ratios say why the staged path costs what it does: on a machine of
few cores its wall time follows its CPU.  Ratios are what to read: the
machine is shared and its speed drifts (the machine-speed line says how
fast it ran).
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from measure import machine_speed  # noqa: E402 - bench/ is on sys.path when run as a script

REAL = os.path.normpath(os.path.join(ROOT, "..", "shared", "traces", "real"))
PY = sys.executable
#: the last commit writing stream format v2 (the next, af902d2, made it v3)
LAST_V2 = "7b3a78d"


def timed(argv, env=None, stdin=None, stdout=None):
    """(seconds, peak RSS MB, CPU seconds) of one process (the CPU with its
    children's: a pipeline's under bash); raises when it fails."""
    t0 = time.perf_counter()
    # cwd: `python -m` puts it first on sys.path, before PYTHONPATH (the tree being measured)
    proc = subprocess.Popen(argv, env=env, stdin=stdin, stdout=stdout or subprocess.DEVNULL, stderr=subprocess.PIPE,
                            cwd=tempfile.gettempdir())
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    err = proc.stderr.read().decode()
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{err[-2000:]}")
    return seconds, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def fastest(runs):
    """The fastest of ``runs`` (the least disturbed by other load) with its
    CPU seconds; the largest RSS seen."""
    first = min(runs, key=lambda r: r[0])
    return first[0], max(r[1] for r in runs), first[2]


def best(n, fn):
    """The fastest of ``n`` runs of ``fn``, as ``fastest``."""
    return fastest([fn() for _ in range(n)])


ONE_SHOT = "collective-report --blocking_analysis (one process)"
PIPES = "extract | align | correlate | report (pipes)"
FILES = "the four stages through files, one after another"
#: ``report`` aligns a stream that has not been through ``align`` itself, and
#: skips the blocking analysis of one that has not been through
#: ``correlate``: so these two do less than the staged path must, and more
#: cheaply than any ``align`` and ``correlate`` could (no processes of their
#: own).  A staged ratio cannot fall below theirs.
PIPES_FLOOR = "extract | report (the pipes' floor)"
FILES_FLOOR = "extract -o FILE, then report FILE (the files' floor)"


def one_after_another(results):
    """The ``timed`` results of processes run in turn as one: times and CPU
    added, the largest peak RSS."""
    return sum(r[0] for r in results), max(r[1] for r in results), sum(r[2] for r in results)


def alternately(rounds, cases):
    """``{label: [result of each round]}``: every case once a round, in turn,
    so that each round's ratios compare runs made under the same load (the
    machine's speed drifts within minutes); each round starts one case
    later, so that no case always follows the same one."""
    labels = list(cases)
    out = {label: [] for label in labels}
    for k in range(rounds):
        for label in labels[k % len(labels):] + labels[:k % len(labels)]:
            out[label].append(cases[label]())
    return out


def st(tree):
    return [PY, "-m", "streamtrace.cli"], dict(os.environ, PYTHONPATH=tree)


def generate(workdir, ranks, mb):
    d = os.path.join(workdir, f"set{ranks}x{mb}")
    if not os.path.exists(os.path.join(d, "truth.json")):
        shutil.rmtree(d, ignore_errors=True)
        subprocess.run([PY, os.path.join(ROOT, "fixtures", "generate_fixture.py"), "--out", d, "--ranks", str(ranks),
                        "--target_mb", str(mb), "--format", "json", "--jobs", "2"], check=True,
                       stdout=subprocess.DEVNULL)
    return d


def json_bytes(paths):
    """Uncompressed bytes of trace files (.json, .json.gz, .json.zst)."""
    total = 0
    for p in paths:
        if p.endswith(".gz"):
            import gzip
            with gzip.open(p, "rb") as f:
                while chunk := f.read(1 << 22):
                    total += len(chunk)
        elif p.endswith(".zst"):
            import zstandard
            with zstandard.ZstdDecompressor().stream_reader(open(p, "rb")) as f:
                while chunk := f.read(1 << 22):
                    total += len(chunk)
        else:
            total += os.path.getsize(p)
    return total


def real_sets():
    """{set name: [trace paths]} of ../shared/traces/real (a set is a folder holding traces)."""
    sets = {}
    for root, _, files in os.walk(REAL):
        traces = sorted(os.path.join(root, f) for f in files if ".json" in f)
        if traces:
            sets[os.path.relpath(root, REAL)] = traces
    return dict(sorted(sets.items()))


def size_table(tmp):
    print("\nstream size against the JSON, real sets (every file of a set extracted):")
    print(f"  {'set':<40} {'JSON MB':>9} {'stream MB':>10} {'JSON/stream':>12}")
    worst = None
    cmd, env = st(ROOT)
    for name, traces in real_sets().items():
        out = os.path.join(tmp, "real.stev")
        size = 0
        for t in traces:   # a file at a time (a stream per rank, as extract -j makes them): no rank naming needed
            subprocess.run([*cmd, "extract", t, "-q", "-o", out], env=env, check=True, cwd=tmp)
            size += os.path.getsize(out)
        j = json_bytes(traces)
        ratio = j / size
        worst = ratio if worst is None else min(worst, ratio)
        print(f"  {name:<40} {j / 1e6:9.2f} {size / 1e6:10.3f} {ratio:11.1f}x")
    if worst is not None:
        print(f"  least compressible real set: JSON/stream {worst:.1f}x (target >= 4x; every set >= 8x)")


def staged_and_one_shot(cmd, ws, stev, aligned, correlated, csvs):
    """(the four stages' commands through files, the one-shot's command) on
    the traces ``ws`` names, both writing CSVs to ``csvs``."""
    stages = [[*cmd, "extract", *ws, "-q", "-o", stev], [*cmd, "align", stev, "-q", "-o", aligned],
              [*cmd, "correlate", aligned, "-q", "-o", correlated],
              [*cmd, "report", correlated, "-q", "--output_csvs_dir", csvs]]
    return stages, [*cmd, "collective-report", *ws, "-q", "--blocking_analysis", "--output_csvs_dir", csvs]


def spread(ratios):
    """(median, lowest, highest) of ``ratios``."""
    r = sorted(ratios)
    return statistics.median(r), r[0], r[-1]


def fixed_costs(workdir, ranks, repeat):
    """(the four stages through files, the one-shot) in seconds on a tiny set of
    ``ranks`` traces: what each process costs before its input does (start-up,
    imports, writing), which a staged run pays four times and the one-shot once."""
    tiny = os.path.join(workdir, f"tiny{ranks}")
    if not os.path.exists(os.path.join(tiny, "truth.json")):
        subprocess.run([PY, os.path.join(ROOT, "fixtures", "generate_fixture.py"), "--out", tiny, "--ranks",
                        str(ranks), "--steps", "1"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cmd, env = st(ROOT)
    ws = ["--trace_dir", tiny, "--world_size", str(ranks)]
    tmp = tempfile.mkdtemp(prefix="bench-stream-tiny-", dir=workdir)
    try:
        stev, aligned, correlated, csvs = (os.path.join(tmp, n) for n in ("t.stev", "t.a.stev", "t.c.stev", "csvs"))
        stages, one_shot = staged_and_one_shot(cmd, ws, stev, aligned, correlated, csvs)
        files = sum(best(repeat, lambda argv=argv: timed(argv, env))[0] for argv in stages)
        one = best(repeat, lambda: timed(one_shot, env))[0]
        return files, one
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def rank_maps(trace, repeat, tmp):
    """{case: (seconds, CPU seconds)}, the fastest of ``repeat`` alternating
    rounds, of one rank's map in this process (imports paid already): the
    one-shot's (flows dropped, the summaries made) and ``extract``'s (every
    event packed and written, with and without the summaries)."""
    sys.path.insert(0, ROOT)
    from streamtrace import chain
    from streamtrace.extract import _extract_to_file
    from streamtrace.io.ranks import RankInput

    inp, out = RankInput(trace), os.path.join(tmp, "rank.stev")

    def measured(fn):
        def run():
            cpu = time.process_time()
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0, time.process_time() - cpu
        return run

    runs = alternately(repeat, {
        "the one-shot's map": measured(lambda: chain._summarize_rank_for_blocking((inp, None), None, False)),
        "extract's map": measured(lambda: _extract_to_file((inp, None, False, False, chain.summarized, out))),
        "extract's map, --no_summaries": measured(lambda: _extract_to_file((inp, None, False, False, None, out))),
    })
    os.unlink(out)
    return {label: min(r) for label, r in runs.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--mb", type=int, default=512, help="MB of JSON per rank")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of each timed case (the fastest is shown): rounds, where cases alternate")
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "streamtrace-bench"))
    ap.add_argument("--v2", default=LAST_V2, help=f"a commit writing format v2 (default: {LAST_V2}, the last)")
    ap.add_argument("--no_v2", action="store_true", help="skip the v2 comparison")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    traces = generate(args.workdir, args.ranks, args.mb)
    trace_files = sorted(os.path.join(traces, f) for f in os.listdir(traces) if f.endswith(".json"))
    jbytes = json_bytes(trace_files)
    tmp = tempfile.mkdtemp(prefix="bench-stream-", dir=args.workdir)
    print(f"set: {args.ranks} x {args.mb} MB ({jbytes / 1e6:.0f} MB of JSON) in {traces}; {machine_speed()}",
          flush=True)
    cmd, env = st(ROOT)
    ws = ["--trace_dir", traces, "--world_size", str(args.ranks)]
    stev, aligned, correlated = (os.path.join(tmp, n) for n in ("run.stev", "run.a.stev", "run.c.stev"))
    rows = {}

    def show(label, result):
        rows[label] = result
        print(f"  {label:<52} {result[0]:8.2f} s  peak RSS {result[1]:7.0f} MB  CPU {result[2]:6.2f} s", flush=True)

    try:
        print("\nextract:")
        timed([*cmd, "extract", *ws, "-q", "-o", os.devnull], env)   # untimed: the first run reads the traces cold
        events_only = os.path.join(tmp, "events.stev")   # the stream's format alone, without the per-rank summaries
        extracts = alternately(args.repeat, {
            "extract -o os.devnull": lambda: timed([*cmd, "extract", *ws, "-q", "-o", os.devnull], env),
            "extract -o FILE": lambda: timed([*cmd, "extract", *ws, "-q", "-o", stev], env),
            "extract --no_summaries -o FILE":
                lambda: timed([*cmd, "extract", *ws, "-q", "--no_summaries", "-o", events_only], env),
        })
        for label, runs in extracts.items():
            show(label, fastest(runs))
        size = os.path.getsize(stev)
        events_size = os.path.getsize(events_only)
        os.unlink(events_only)
        if not args.no_v2:
            sys.path.insert(0, os.path.join(ROOT, "scripts"))
            from compare_outputs import build_tree

            base = args.v2
            tree = build_tree(base, tmp)
            try:
                v2cmd, v2env = st(tree)
                v2file, v3file = os.path.join(tmp, "v2.stev"), os.path.join(tmp, "v3.stev")
                v2s, v3s = alternately(args.repeat, {
                    "v2": lambda: timed([*v2cmd, "extract", *ws, "-q", "-o", v2file], v2env),
                    # like for like: the format's encoding, not the summaries' collecting
                    "v3": lambda: timed([*cmd, "extract", *ws, "-q", "--no_summaries", "-o", v3file], env),
                }).values()
                v2size = os.path.getsize(v2file)
                read = "import sys; from streamtrace import read_stream; read_stream(sys.argv[1])"
                show("v2 read_stream (Python API)", best(args.repeat, lambda: timed([PY, "-c", read, v2file], v2env)))
                show("v3 read_stream (Python API)", best(args.repeat, lambda: timed([PY, "-c", read, v3file], env)))
                os.unlink(v2file)
                os.unlink(v3file)
                show(f"v2 extract -o FILE ({base[:10]})", fastest(v2s))
                show("v3 extract --no_summaries -o FILE (alternating with v2)", fastest(v3s))
            finally:
                subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", tree], capture_output=True)

        print("\nstages through files, each alone:")
        show("align FILE -o FILE", best(args.repeat, lambda: timed([*cmd, "align", stev, "-q", "-o", aligned], env)))
        show("correlate FILE -o FILE",
             best(args.repeat, lambda: timed([*cmd, "correlate", aligned, "-q", "-o", correlated], env)))
        csvs = os.path.join(tmp, "csvs")
        show("report FILE --output_csvs_dir",
             best(args.repeat, lambda: timed([*cmd, "report", correlated, "-q", "--output_csvs_dir", csvs], env)))
        show("dump FILE --what summary", best(args.repeat, lambda: timed([*cmd, "dump", stev, "--what", "summary"],
                                                                          env)))
        line = " ".join(cmd)
        extract_out = f"{line} extract {' '.join(ws)} -q"
        pipe = f"{extract_out} | {line} align -q | {line} correlate -q | {line} report -q --output_csvs_dir {csvs}"
        floor_csvs = os.path.join(tmp, "floor-csvs")
        pipe_floor = f"{extract_out} | {line} report -q --output_csvs_dir {floor_csvs}"
        stages, one_shot = staged_and_one_shot(cmd, ws, stev, aligned, correlated, csvs)
        files_floor = [stages[0], [*cmd, "report", stev, "-q", "--output_csvs_dir", floor_csvs]]   # extract, report
        file_runs = []   # each round's four processes through files: extract's share is the staged path's floor

        def through_files():
            file_runs.append([timed(argv, env) for argv in stages])
            return one_after_another(file_runs[-1])

        cases = {
            ONE_SHOT: lambda: timed(one_shot, env),
            PIPES: lambda: timed(["bash", "-o", "pipefail", "-c", pipe], env),
            FILES: through_files,
            PIPES_FLOOR: lambda: timed(["bash", "-o", "pipefail", "-c", pipe_floor], env),
            FILES_FLOOR: lambda: one_after_another([timed(argv, env) for argv in files_floor]),
        }
        print(f"\nthe staged path and the one-shot, alternately ({args.repeat} rounds; fastest of each):")
        by_case = alternately(args.repeat, cases)
        for label, runs in by_case.items():
            show(label, fastest(runs))

        def per_round(label, index=0):
            """``label``'s time (or CPU) over the one-shot's, round by round: ``spread``."""
            return spread(a[index] / b[index] for a, b in zip(by_case[label], by_case[ONE_SHOT]))

        one = rows[ONE_SHOT][0]
        print("\nratios (same run; the staged ones round by round, median and range):")
        print(f"  JSON / stream size                          {jbytes / size:8.1f}x   (target >= 8x)  "
              f"stream {size / 1e6:.1f} MB")
        print(f"  JSON / stream size without summaries        {jbytes / events_size:8.1f}x   "
              f"stream {events_size / 1e6:.1f} MB")
        print(f"  extract / extract --no_summaries            "
              f"{rows['extract -o FILE'][0] / rows['extract --no_summaries -o FILE'][0]:8.2f}x  "
              "(the per-rank work align and correlate no longer do)")
        if not args.no_v2:
            print(f"  JSON / v2 stream size                       {jbytes / v2size:8.1f}x")
            v2t = rows[next(k for k in rows if k.startswith("v2 extract"))][0]
            v3t = rows["v3 extract --no_summaries -o FILE (alternating with v2)"][0]
            print(f"  v3 / v2 extraction MB/s                     {v2t / v3t:8.2f}   (target >= 0.90)")
            print(f"  v3 / v2 read_stream time                    "
                  f"{rows['v3 read_stream (Python API)'][0] / rows['v2 read_stream (Python API)'][0]:8.2f}x")
        med, lo, hi = spread(a[0] / b[0] for a, b in zip(extracts["extract -o FILE"], extracts["extract -o os.devnull"]))
        print(f"  extract -o FILE / -o os.devnull             {med:8.2f}x  ({lo:.2f}-{hi:.2f})  (target <= 1.15x)")
        for label, name, target in ((PIPES, "pipes / one-shot", "<= 1.3x"),
                                    (FILES, "four stages through files / one-shot", "<= 1.6x")):
            med, lo, hi = per_round(label)
            cmed, clo, chi = per_round(label, 2)
            print(f"  {name:<44}{med:8.2f}x  ({lo:.2f}-{hi:.2f})  (target {target})")
            cpu_name = "  its CPU / the one-shot's"
            print(f"  {cpu_name:<44}{cmed:8.2f}x  ({clo:.2f}-{chi:.2f})")
        for label, name, path in ((PIPES_FLOOR, "extract | report / one-shot", "pipes"),
                                  (FILES_FLOOR, "extract -o FILE, report FILE / one-shot", "files")):
            med, lo, hi = per_round(label)
            print(f"  {name:<44}{med:8.2f}x  ({lo:.2f}-{hi:.2f}; no align or correlate: the floor under the {path})")
        med, lo, hi = spread(f[0][0] / o[0] for f, o in zip(file_runs, by_case[ONE_SHOT]))
        print(f"  extract -o FILE alone / one-shot            {med:8.2f}x  "
              f"({lo:.2f}-{hi:.2f}; extract does the one-shot's per-rank work and packs the stream)")
        print(f"  one-shot CPU / time                         {rows[ONE_SHOT][2] / one:8.2f}   "
              f"(cores it keeps busy, of {os.cpu_count()})")
        files = rows[FILES][0]
        print(f"  dump --what summary                         {rows['dump FILE --what summary'][0]:8.2f} s, "
              f"{rows['dump FILE --what summary'][1]:.0f} MB (target <= 1 s, <= 100 MB)")
        tiny_files, tiny_one = fixed_costs(args.workdir, args.ranks, args.repeat)
        print(f"  fixed cost, a {args.ranks}-rank set of ~1 MB: four stages through files {tiny_files:.2f} s, "
              f"one-shot {tiny_one:.2f} s:")
        print(f"    their difference is {(tiny_files - tiny_one) / one:.2f}x of this set's one-shot; "
              f"files / one-shot without it {(files - (tiny_files - tiny_one)) / one:.2f}x")
        size_table(tmp)
        # last: this process then holds what the map imported and allocated,
        # which a child forked later would count in its peak RSS
        print(f"\none rank's map in one process ({os.path.basename(trace_files[0])}, fastest of "
              f"{args.repeat} alternating rounds):")
        for label, (seconds, cpu) in rank_maps(trace_files[0], args.repeat, tmp).items():
            print(f"  {label:<52} {seconds:8.2f} s  CPU {cpu:6.2f} s", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

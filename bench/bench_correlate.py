"""Cost of align + correlate on top of extraction (issue: correlate adds <= 20 %).

    python bench/bench_correlate.py [--ranks 4] [--mb 500]
    python bench/bench_correlate.py --bounded --base main [--scale 1]   # issue #26: bounded memory

Generates RANKS traces of about MB each (reused when present), then measures,
each in a fresh process: (1) extract alone, every rank, every event kept (as
``streamtrace extract`` does), frames consumed and dropped; (2) the collective
report's map and reduce (extract | align, align's events only); (3) extract |
align | correlate as ``collective-report --blocking_analysis`` and
``blockers`` run it: each rank read once into what align and correlate keep,
then the cross-rank reduce (flow events left out in the tokenizer: the stages
read none); (4) that lighter extraction alone, for reference.  Every case
reads ``-j`` ranks at once through the same executor.
Prints wall and CPU times (user + sys, all threads), peak RSS and the
overhead ratios: of the fastest runs, and the median over rounds of each
round's own ratio (the cases run one after another in every round, so a
round's ratio compares runs made under the same load: this machine's speed
drifts by tens of percent within minutes).  Every other round runs the
cases in reverse order, so a drift within a round favours no case.  It also
splits the chain's median time into the extraction (until the extractor
hands over its last frame) and the tail after it (the last rank's finish,
matching and the analyses).
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from measure import machine_speed  # bench/ is on sys.path when run as a script

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def generate(ranks, mb):
    out = os.path.join(HERE, "out", f"corr_{ranks}x{mb}")
    if not os.path.exists(os.path.join(out, "truth.json")):
        subprocess.run([sys.executable, os.path.join(ROOT, "fixtures", "generate_fixture.py"), "--out", out,
                        "--ranks", str(ranks), "--target_mb", str(mb), "--jobs", "2",
                        "--slow_kernel_rank", "1", "--slow_kernel_factor", "3"],
                       check=True, stdout=subprocess.DEVNULL)
    return out


def child(mode, directory, ranks, jobs):
    from streamtrace import chain
    from streamtrace.io.ranks import resolve_inputs
    from streamtrace.parallel.executor import local_executor

    inputs = resolve_inputs(trace_dir=directory, world_size=ranks)
    t0 = time.perf_counter()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = usage.ru_utime + usage.ru_stime
    handed = [t0]
    extract_mod = sys.modules["streamtrace.extract"]   # (the package's 'extract' attribute is the function)
    extract_rank = extract_mod.extract_rank

    def timed(*args, **kwargs):   # when the last frame was extracted: the rest is the chain's tail
        for frame in extract_rank(*args, **kwargs):
            handed[0] = time.perf_counter()
            yield frame

    extract_mod.extract_rank = timed
    n = 0
    if mode in ("extract", "lean"):   # extraction alone, in the chain's own per-rank map
        def consume(inp):
            frames = timed(inp.path, inp.rank, ranks, False, inp.position, drop_flows=mode == "lean",
                           batch_events=chain.PIPELINE_BATCH_EVENTS, map_window=chain.PIPELINE_MAP_WINDOW)
            return sum(1 for _ in chain.prefetched(frames, depth=chain.RANK_PREFETCH_FRAMES))

        with local_executor(jobs, len(inputs)) as ex:
            n = sum(ex.map(consume, inputs))
    elif mode == "align":   # what collective-report runs: align's lean extraction, its map and reduce
        n = len(chain.RankReading(inputs, ranks, jobs).tables()["align.collectives"])
    else:   # collective-report --blocking_analysis and blockers: extract -> align -> correlate, map and reduce
        n = len(chain._correlated_tables(inputs, ranks, jobs, None, None, False, None))
    usage = resource.getrusage(resource.RUSAGE_SELF)   # every thread of the process
    end = time.perf_counter()
    print(json.dumps({"seconds": end - t0, "frames": n, "tail_seconds": end - handed[0],
                      "cpu_seconds": usage.ru_utime + usage.ru_stime - cpu0,
                      "peak_rss_mb": usage.ru_maxrss / 1024}))


def measure(mode, directory, ranks, jobs):
    proc = subprocess.run([sys.executable, __file__, "--child", mode, directory, str(ranks), str(jobs)],
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_cli(tree, argv):
    """(wall seconds, peak RSS MB) of one streamtrace command run from ``tree`` (its own process)."""
    env = dict(os.environ, PYTHONPATH=tree)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "streamtrace.cli"] + argv, cwd=tree, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status):
        sys.exit(f"{' '.join(argv)} failed on {tree}: {proc.stderr.read().decode()[-500:]}")
    return wall, usage.ru_maxrss / 1024


def bounded(args):
    """Issue #26's bounded blocking analysis: ``collective-report
    --blocking_analysis`` on 8 ranks x 1 GB .json.gz (bench_report's gz set)
    on ``--base`` and on this tree, rounds alternating, time ratio as the
    median of the rounds' own ratios; and on 4 x 512 MB (this benchmark's
    set) its peak RSS against the plain report's."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from bench_report import generate as generate_set
    from compare_outputs import two_trees

    mb = max(1.0, 1000 * args.scale)
    gz, _ = generate_set(args.workdir, f"gz-{mb:g}", ranks=8, target_mb=mb, format="json.gz", jobs=2,
                         compress_level=1)
    small = generate(4, max(10, int(512 * args.scale)))
    with two_trees(args.base, None, "streamtrace-bounded-") as (work, base, this):
        def report(tree, d, n, *extra):
            return run_cli(tree, ["collective-report", "--trace_dir", d, "--world_size", str(n), "-q", "-j", "2",
                                  "--output_csvs_dir", os.path.join(work, "csv")] + list(extra))

        runs = {"base": [], "this": [], "plain": [], "small": [], "small_plain": []}
        for k in range(args.rounds):
            order = [("base", base), ("this", this)]
            for label, tree in (order if k % 2 == 0 else order[::-1]):
                runs[label].append(report(tree, gz, 8, "--blocking_analysis"))
            runs["plain"].append(report(this, gz, 8))
            runs["small"].append(report(this, small, 4, "--blocking_analysis"))
            runs["small_plain"].append(report(this, small, 4))
    median = statistics.median
    ratio = median(t / b for (t, _), (b, _) in zip(runs["this"], runs["base"]))
    peak = {k: max(m for _, m in v) for k, v in runs.items()}
    wall = {k: median(w for w, _ in v) for k, v in runs.items()}
    print(f"bounded blocking analysis, {args.rounds} rounds, base {args.base} vs this tree; {machine_speed()}")
    print(f"  8 x {mb:g} MB .json.gz, collective-report -j 2 --blocking_analysis: base {wall['base']:.1f} s "
          f"{peak['base']:.0f} MB; this {wall['this']:.1f} s {peak['this']:.0f} MB (time ratio {ratio:.2f}, "
          f"median of the rounds'); plain report {wall['plain']:.1f} s {peak['plain']:.0f} MB")
    print(f"  4 x {max(10, int(512 * args.scale))} MB .json: --blocking_analysis {wall['small']:.1f} s "
          f"{peak['small']:.0f} MB; plain report {wall['small_plain']:.1f} s {peak['small_plain']:.0f} MB "
          f"(peak ratio {peak['small'] / peak['small_plain']:.2f})")
    print("  targets: peak <= 400 MB on 8 x 1 GB with time ratio <= 1.00; on 4 x 512 MB peak ratio <= 1.5")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    if "--bounded" in sys.argv:
        ap = argparse.ArgumentParser(description=bounded.__doc__.splitlines()[0])
        ap.add_argument("--bounded", action="store_true")
        ap.add_argument("--base", required=True, help="the commit to compare against (a worktree is built)")
        ap.add_argument("--scale", type=float, default=1.0, help="of the sizes (make bench's BENCH_SCALE)")
        ap.add_argument("--rounds", type=int, default=3)
        ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "streamtrace-bench"),
                        help="where bench_report keeps its generated sets (shared with it)")
        return bounded(ap.parse_args())
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--mb", type=int, default=500)
    ap.add_argument("-j", "--jobs", type=int, default=2, help="ranks read at once (the commands' default: the CPUs)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of each case, alternating; the fastest is shown (least disturbed by other load)")
    args = ap.parse_args()
    directory = generate(args.ranks, args.mb)
    total_mb = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory)
                   if f.endswith(".json")) / 1e6
    runs = {"extract": [], "align": [], "chain": [], "lean": []}
    for k in range(max(1, args.repeat)):
        for mode in (list(runs) if k % 2 == 0 else list(runs)[::-1]):
            runs[mode].append(measure(mode, directory, args.ranks, args.jobs))
    best = {mode: min(ms, key=lambda m: m["seconds"]) for mode, ms in runs.items()}
    seconds = {mode: ", ".join(f"{m['seconds']:.2f}" for m in ms) for mode, ms in runs.items()}
    print(f"  (best of {max(1, args.repeat)}; all runs: extract {seconds['extract']} s; "
          f"extract | align {seconds['align']} s; chain {seconds['chain']} s; "
          f"extract without flows {seconds['lean']} s)")
    print(f"{args.ranks} ranks x ~{args.mb} MB ({total_mb:.0f} MB of JSON), -j {args.jobs}; {machine_speed()}")
    for label, mode in (("extract only               ", "extract"), ("extract | align            ", "align"),
                        ("extract | align | correlate", "chain"), ("extract without flows      ", "lean")):
        m = best[mode]
        print(f"  {label}   {m['seconds']:7.2f} s  {total_mb / m['seconds']:6.0f} MB/s  "
              f"CPU {m['cpu_seconds']:6.2f} s  peak RSS {m['peak_rss_mb']:6.0f} MB")

    def middle(values):   # the median (the upper one of an even count)
        values = sorted(values)
        return values[len(values) // 2]

    def added(mode, key="seconds", base="extract"):
        fastest = 100 * (best[mode][key] / best[base][key] - 1)
        return fastest, middle(100 * (c[key] / e[key] - 1) for c, e in zip(runs[mode], runs[base]))

    # where the chain's time goes, medians over the rounds: the extractor's
    # own time (its last frame handed over) and the tail after it
    ext, chain = middle(m["seconds"] for m in runs["extract"]), runs["chain"]
    tail = middle(m["tail_seconds"] for m in chain)
    until = middle(m["seconds"] - m["tail_seconds"] for m in chain)
    whole = middle(m["seconds"] for m in chain)
    print(f"  medians: extract alone {ext:.2f} s; the chain {whole:.2f} s (+{100 * (whole / ext - 1):.1f} %) = its "
          f"extraction until the last frame {until:.2f} s (+{100 * (until / ext - 1):.1f} %) + the tail after it "
          f"{tail:.2f} s (+{100 * tail / ext:.1f} %)")
    for label, mode in (("align", "align"), ("align + correlate", "chain")):
        fastest, median = added(mode)
        print(f"  {label} add {fastest:.1f} % to extraction, fastest runs; {median:.1f} % median of the "
              f"rounds' own ratios; {added(mode, 'cpu_seconds')[0]:.1f} % in CPU time"
              + (" (target <= 20 %)" if mode == "chain" else ""))
    fastest, median = added("chain", base="lean")
    print(f"  align + correlate add {fastest:.1f} % to the extraction without flows they run on, fastest runs; "
          f"{median:.1f} % median of the rounds' own ratios")
    # correlate's own share: what the chain adds over extract | align, as a part of extraction
    fastest = 100 * (best["chain"]["seconds"] - best["align"]["seconds"]) / best["extract"]["seconds"]
    median = middle(100 * (c["seconds"] - a["seconds"]) / e["seconds"]
                    for c, a, e in zip(runs["chain"], runs["align"], runs["extract"]))
    print(f"  correlate alone (the chain over extract | align) adds {fastest:.1f} % of extraction, fastest runs; "
          f"{median:.1f} % median of the rounds")

if __name__ == "__main__":
    main()

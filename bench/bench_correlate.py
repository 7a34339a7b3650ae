"""Cost of align + correlate on top of extraction (issue: correlate adds <= 20 %).

    python bench/bench_correlate.py [--ranks 4] [--mb 500]

Generates RANKS traces of about MB each (reused when present), then measures,
each in a fresh process: (1) extract alone, every rank, every event kept (as
``streamtrace extract`` does), frames consumed and dropped; (2) extract |
align; (3) extract | align | correlate in one process, through
``chain.stage_frames`` as ``collective-report --blocking_analysis`` and
``blockers`` run them (flow events left out in the tokenizer: the stages read
none); (4) that lighter extraction alone, for reference.
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
import subprocess
import sys
import threading
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


class ThreadCpu:
    """CPU seconds (user + sys, from /proc) of this process's threads by
    name, sampled every 0.1 s (a thread that ends keeps its last sample):
    the extractor's thread and the main thread, which runs the stages."""

    def __init__(self):
        self.by_tid, self._names, self._stop = {}, {}, threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self._thread.start()

    def _sample(self):
        for t in threading.enumerate():
            if t.native_id:
                self._names[t.native_id] = t.name
        tick = os.sysconf("SC_CLK_TCK")
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:   # the thread just ended
                continue
            self.by_tid[int(tid)] = (int(fields[11]) + int(fields[12])) / tick

    def _run(self):
        while not self._stop.wait(0.1):
            self._sample()

    def stop(self):
        """``{thread name: CPU seconds}``, summed over threads of one name."""
        self._stop.set()
        self._thread.join()
        self._sample()
        out = {}
        for tid, cpu in self.by_tid.items():
            name = self._names.get(tid, "?")
            out[name] = out.get(name, 0.0) + cpu
        return out


def child(mode, directory, ranks):
    from streamtrace.chain import stage_frames, trace_frames
    from streamtrace.io.ranks import resolve_inputs

    inputs = resolve_inputs(trace_dir=directory, world_size=ranks)
    threads = ThreadCpu() if os.path.isdir("/proc/self/task") else None
    t0 = time.perf_counter()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = usage.ru_utime + usage.ru_stime
    handed = [t0]

    def timed(frames):   # when the extractor handed over its last frame: the rest is the chain's tail
        for frame in frames:
            handed[0] = time.perf_counter()
            yield frame

    if mode == "extract":
        frames = trace_frames(inputs, world_size=ranks)
    else:   # what the in-process chains extract (flows left out); "lean": that alone
        frames = stage_frames(inputs, world_size=ranks)
    frames = timed(frames)
    if mode in ("align", "chain"):
        from streamtrace.align.stage import align_frames

        frames = align_frames(frames)
    if mode == "chain":
        from streamtrace.correlate.stage import correlate_frames

        frames = correlate_frames(frames)
    n = sum(1 for _ in frames)
    usage = resource.getrusage(resource.RUSAGE_SELF)   # every thread of the process
    end = time.perf_counter()
    by_name = threads.stop() if threads is not None else {}
    print(json.dumps({"seconds": end - t0, "frames": n, "tail_seconds": end - handed[0],
                      "cpu_seconds": usage.ru_utime + usage.ru_stime - cpu0,
                      "extractor_cpu": by_name.get("streamtrace-extract"), "main_cpu": by_name.get("MainThread"),
                      "peak_rss_mb": usage.ru_maxrss / 1024}))


def measure(mode, directory, ranks):
    proc = subprocess.run([sys.executable, __file__, "--child", mode, directory, str(ranks)],
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--mb", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of each case, alternating; the fastest is shown (least disturbed by other load)")
    args = ap.parse_args()
    directory = generate(args.ranks, args.mb)
    total_mb = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory)
                   if f.endswith(".json")) / 1e6
    runs = {"extract": [], "align": [], "chain": [], "lean": []}
    for k in range(max(1, args.repeat)):
        for mode in (list(runs) if k % 2 == 0 else list(runs)[::-1]):
            runs[mode].append(measure(mode, directory, args.ranks))
    best = {mode: min(ms, key=lambda m: m["seconds"]) for mode, ms in runs.items()}
    seconds = {mode: ", ".join(f"{m['seconds']:.2f}" for m in ms) for mode, ms in runs.items()}
    print(f"  (best of {max(1, args.repeat)}; all runs: extract {seconds['extract']} s; "
          f"extract | align {seconds['align']} s; chain {seconds['chain']} s; "
          f"extract without flows {seconds['lean']} s)")
    print(f"{args.ranks} ranks x ~{args.mb} MB ({total_mb:.0f} MB of JSON); {machine_speed()}")
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
    if all(m.get("extractor_cpu") is not None for ms in runs.values() for m in ms):
        cpu = {mode: (middle(m["extractor_cpu"] for m in ms), middle(m["main_cpu"] for m in ms))
               for mode, ms in runs.items()}
        print("  CPU by thread, medians: the extractor's thread " + " / ".join(f"{cpu[m][0]:.2f}" for m in runs)
              + " s and the main thread (the stages) " + " / ".join(f"{cpu[m][1]:.2f}" for m in runs)
              + " s, for extract / extract | align / the chain / extract without flows (the chains' extraction is "
              "the last one's: a longer wall time at the same extractor CPU is waiting, not work)")
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

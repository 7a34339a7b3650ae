"""The critical path and what-if replays against the blocking analysis, in one run.

    python bench/bench_whatif.py [--ranks 4] [--mb 500] [--repeat 3]

Generates a straggler run of RANKS traces of about MB each under
/tmp/streamtrace-bench (reused when present), then times, each in its own
process (so each peak RSS is that command's alone), `streamtrace whatif`
(the graph, the critical path and every suggested scenario's replay) and
`streamtrace collective-report --blocking_analysis` on the same traces; the
fastest of --repeat runs is shown, with the ratios (issue #42's bar: whatif
at most 1.3x the time and 1.5x the peak RSS).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = sys.executable
BIN = os.path.join(os.path.dirname(PY), "streamtrace")


def generate(ranks, mb):
    d = os.path.join(tempfile.gettempdir(), "streamtrace-bench", f"whatif{ranks}x{mb}")
    if not os.path.exists(os.path.join(d, "truth.json")):
        subprocess.run([PY, os.path.join(ROOT, "fixtures", "generate_fixture.py"), "--out", d, "--ranks", str(ranks),
                        "--target_mb", str(mb), "--straggler_rank", "1", "--jobs", "2"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return d


def measure(args):
    """(seconds, peak RSS in MB) of one command in its own process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(args)} failed")
    return seconds, usage.ru_maxrss / 1024


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--mb", type=int, default=500)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    d = generate(a.ranks, a.mb)
    out = tempfile.mkdtemp(prefix="streamtrace-bench-whatif-")
    try:
        cases = {
            "collective-report --blocking_analysis": [BIN, "collective-report", "--trace_dir", d, "--world_size",
                                                      str(a.ranks), "--blocking_analysis", "--output_csvs_dir",
                                                      os.path.join(out, "report"), "-q"],
            "whatif": [BIN, "whatif", d, "--output_csvs_dir", os.path.join(out, "whatif"), "-q"],
        }
        best = {}
        for _ in range(a.repeat):   # interleaved, so both see the same machine load
            for name, args in cases.items():
                for sub in ("report", "whatif"):
                    shutil.rmtree(os.path.join(out, sub), ignore_errors=True)
                s, rss = measure(args)
                t, r = best.get(name, (float("inf"), float("inf")))
                best[name] = (min(t, s), min(r, rss))
    finally:
        shutil.rmtree(out, ignore_errors=True)
    base_t, base_rss = best["collective-report --blocking_analysis"]
    print(f"{a.ranks} x {a.mb} MB (fastest of {a.repeat}):")
    for name, (t, rss) in best.items():
        print(f"  {name:40s} {t:7.2f} s  {rss:7.0f} MB   {t / base_t:4.2f}x time  {rss / base_rss:4.2f}x RSS")


if __name__ == "__main__":
    main()

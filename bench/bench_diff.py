"""Cost of ``streamtrace diff`` (issue #43): diffing two RANKS x MB trace sets
against one ``collective-report --blocking_analysis`` of one set (target
<= 2.2x), and diffing the two sets' extracted streams (target <= 0.5x).

    python bench/bench_diff.py [--ranks 4] [--mb 500] [--repeat 3]

Generates the two sets (a baseline and a run with a straggler; reused when
present) and extracts each once to a stream (not timed: a CI job keeps its
baseline as a stream), then times, each as the command in a fresh process:
(1) collective-report --blocking_analysis of the baseline (CSVs), (2) diff
of the two trace sets, (3) diff of the two streams, and (4) that with
--no-critical_path.  Each round runs the cases one after another (every
other round in reverse order, so a drift within a round favours no case);
the ratios are the median over rounds of each round's own ratio (with
their range), and each case's peak RSS is its process's own.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")


def generate(ranks, mb, name, *extra):
    out = os.path.join(HERE, "out", f"diff_{name}_{ranks}x{mb}")
    if not os.path.exists(os.path.join(out, "truth.json")):
        subprocess.run([sys.executable, os.path.join(ROOT, "fixtures", "generate_fixture.py"), "--out", out,
                        "--ranks", str(ranks), "--target_mb", str(mb), "--jobs", "2", *extra],
                       check=True, stdout=subprocess.DEVNULL)
    return out


def stream(directory, ranks):
    path = directory + ".stev"
    if not os.path.exists(path):
        subprocess.run([BIN, "extract", "--trace_dir", directory, "--world_size", str(ranks), "-o", path, "-q"],
                       check=True)
    return path


def timed(args):
    """(wall seconds, peak RSS in MB) of the command in a fresh process."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([BIN, *args], stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)   # the child's own rusage: its peak RSS
        wall = time.perf_counter() - t0
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        if code not in (0, 3):
            err.seek(0)
            raise SystemExit(f"{' '.join(args)}: exit {code}: {err.read().decode(errors='replace').strip()}")
    return wall, usage.ru_maxrss / 1024


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--mb", type=int, default=500)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    base = generate(a.ranks, a.mb, "base")
    cand = generate(a.ranks, a.mb, "straggler", "--straggler_rank", "1")
    base_stream, cand_stream = stream(base, a.ranks), stream(cand, a.ranks)
    with tempfile.TemporaryDirectory(prefix="streamtrace-bench-diff-") as tmp:
        cases = {
            "report": ["collective-report", "--trace_dir", base, "--world_size", str(a.ranks),
                       "--blocking_analysis", "--output_csvs_dir", os.path.join(tmp, "csvs"), "-q"],
            "diff_traces": ["diff", "--baseline_dir", base, "--baseline_world_size", str(a.ranks),
                            "--candidate_dir", cand, "--candidate_world_size", str(a.ranks), "-q"],
            "diff_streams": ["diff", base_stream, cand_stream, "-q"],
            "diff_streams_no_critical": ["diff", base_stream, cand_stream, "--no-critical_path", "-q"],
        }
        times = {k: [] for k in cases}
        rss = {k: [] for k in cases}
        for r in range(a.repeat):
            order = list(cases) if r % 2 == 0 else list(cases)[::-1]
            for k in order:
                wall, peak = timed(cases[k])
                times[k].append(wall)
                rss[k].append(peak)
    per_round = {k: [t / rep for t, rep in zip(times[k], times["report"])] for k in cases}
    ratios = {k: statistics.median(v) for k, v in per_round.items()}
    out = {"ranks": a.ranks, "mb": a.mb, "repeat": a.repeat,
           "median_s": {k: round(statistics.median(v), 3) for k, v in times.items()},
           "range_s": {k: [round(min(v), 3), round(max(v), 3)] for k, v in times.items()},
           "ratio_to_report": {k: round(v, 3) for k, v in ratios.items()},
           "ratio_range": {k: [round(min(v), 3), round(max(v), 3)] for k, v in per_round.items()},
           "peak_rss_mb": {k: round(max(v)) for k, v in rss.items()},
           "targets": {"diff_traces": 2.2, "diff_streams": 0.5}}
    print(json.dumps(out, indent=1))
    for k, target in out["targets"].items():
        verdict = "ok" if ratios[k] <= target else "OVER"
        print(f"{k}: {ratios[k]:.2f}x one collective-report --blocking_analysis (target <= {target}x): {verdict}")


if __name__ == "__main__":
    main()

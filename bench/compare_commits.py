"""The main commands timed on two versions of streamtrace, interleaved in one run.

    python bench/compare_commits.py --base 0190a8f                 # base commit vs the working tree
    python bench/compare_commits.py --base A --other B --mb 200 --rounds 5

Each version is checked out into a temporary worktree with its C core built
there (as scripts/compare_outputs.py does).  One synthetic run of 4 ranks x
MB is generated once; then every round runs each case on both versions, in
alternating order, each in a fresh process (``/usr/bin/time``-style peak RSS
from ``wait4``).  Prints per case the median wall time of each version, the
median of the rounds' own ratios (other / base: this machine's speed drifts,
so only runs of the same round are compared) and peak RSS.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

from compare_outputs import two_trees  # noqa: E402

CASES = {
    "extract": "extract --trace_dir {d} --world_size 4 -o {o}/run.stev",
    "collective-report": "collective-report --trace_dir {d} --world_size 4 --output_csvs_dir {o}/cr",
    "blocking": "collective-report --trace_dir {d} --world_size 4 --blocking_analysis --output_csvs_dir {o}/crb",
    "blockers": "blockers {d}",
    "fuse": "fuse --trace_dir {d} --world_size 4 -o {o}/fused.json.gz",
}


def run(tree, command, out):
    """(wall seconds, peak RSS MB) of one command on ``tree``."""
    os.makedirs(out, exist_ok=True)
    argv = [sys.executable, "-m", "streamtrace.cli"] + command.split()
    env = dict(os.environ, PYTHONPATH=tree)
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        sys.exit(f"{command} failed on {tree}: {proc.stderr.read().decode()[-500:]}")
    shutil.rmtree(out, ignore_errors=True)
    return wall, usage.ru_maxrss / 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True)
    ap.add_argument("--other", default=None, help="default: the working tree")
    ap.add_argument("--mb", type=int, default=100, help="MB per rank trace (4 ranks)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--case", action="append", choices=sorted(CASES), help="only these cases (repeatable)")
    args = ap.parse_args()
    with two_trees(args.base, args.other, "streamtrace-bench-") as (work, base, other):
        data = os.path.join(HERE, "out", f"compare_4x{args.mb}")
        if not os.path.exists(os.path.join(data, "truth.json")):
            subprocess.run([sys.executable, os.path.join(ROOT, "fixtures", "generate_fixture.py"), "--out", data,
                            "--ranks", "4", "--target_mb", str(args.mb), "--slow_kernel_rank", "2", "--jobs", "2"],
                           check=True, capture_output=True)
        cases = args.case or list(CASES)
        results = {c: {"base": [], "other": []} for c in cases}
        for k in range(args.rounds):
            order = [("base", base), ("other", other)]
            for case in cases:
                for label, tree in (order if k % 2 == 0 else order[::-1]):
                    results[case][label].append(run(tree, CASES[case].format(d=data, o=os.path.join(work, label)),
                                                    os.path.join(work, label)))
    print(f"4 ranks x ~{args.mb} MB, {args.rounds} rounds, base {args.base} vs {args.other or 'working tree'}")
    print(f"{'case':<20}{'base s':>9}{'other s':>9}{'ratio':>8}{'base MB':>9}{'other MB':>9}")
    for case in cases:
        b, o = results[case]["base"], results[case]["other"]
        ratio = statistics.median(ow / bw for (bw, _), (ow, _) in zip(b, o))
        print(f"{case:<20}{statistics.median(w for w, _ in b):9.2f}{statistics.median(w for w, _ in o):9.2f}"
              f"{ratio:8.2f}{max(m for _, m in b):9.0f}{max(m for _, m in o):9.0f}")

if __name__ == "__main__":
    main()

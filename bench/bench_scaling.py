"""Rank scaling of the collective report: local threads and a 2-worker Dask LocalCluster.

    python bench/bench_scaling.py [--ranks 64,256,1024,4096] [--mb 1] [--repeat 1]

For each rank count, a synthetic job of that many ranks (fixtures/
generate_fixture.py, about MB per rank; its groups' rank and split lists
written as PyTorch writes them for large groups) is generated once into
bench/out, then ``streamtrace collective-report --output_csvs_dir`` runs on it
in a fresh process: with local threads (the default, -j 2), and with
``--scheduler local -j 2`` (a LocalCluster of two worker processes, started
and stopped inside the timed run), and against a running cluster
(``--scheduler tcp://...``: the same LocalCluster, started once by this
script before the timed runs and warmed up by one untimed run, as a cluster
a team keeps up is; ``--no_running`` skips it).  Prints, per case, the wall time, the time
per rank, the CPU time (user + sys: the command's process and, for the
cluster, its workers and the scheduler), the client's peak RSS (the
command's own process; the workers' largest peak beside it for the cluster)
and the ratios the issue asks for:
the largest job's time over the job a quarter of its size (linear in the
trace bytes: <= 4.5 for 4x the ranks), and the cluster over the local run
(<= 1.3 on this 2-core machine), the cluster's start and stop included and
not; then the client's peak RSS for the same
job (--bytes_ranks) at 4x the bytes per rank, which must not grow (it grows
with the ranks: the report's rows are ranks x collectives).  The cases of one size run one after the
other, alternating their order between repeats, so that both see the same
load; the ratios use each case's fastest run.
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CASES = {"threads": [], "cluster": ["--scheduler", "local"]}
RUNNING = "running"   # the case against a cluster already up: its address is passed to the child


def generate(ranks, mb):
    out = os.path.join(HERE, "out", f"scaling_{ranks}x{mb:g}")
    if not os.path.exists(os.path.join(out, "truth.json")):
        subprocess.run([sys.executable, os.path.join(ROOT, "fixtures", "generate_fixture.py"), "--out", out,
                        "--ranks", str(ranks), "--target_mb", str(mb), "--steps", "2", "--no_all2allv",
                        "--jobs", "2", "--straggler_rank", str(ranks // 3)],
                       check=True, stdout=subprocess.DEVNULL)
    return out


def child(case, directory, ranks, address=None):
    """One timed run of the command, in this (fresh) process."""
    from streamtrace.cli import main

    extra = ["--scheduler", address] if case == RUNNING else CASES[case]

    out = tempfile.mkdtemp(prefix="streamtrace-scaling-")
    try:
        t0 = time.perf_counter()
        try:
            main(["collective-report", "--trace_dir", directory, "--world_size", str(ranks), "--output_csvs_dir",
                  os.path.join(out, "csvs"), "-q", "-j", "2", *extra])
        except SystemExit as exc:
            if exc.code:
                raise
        seconds = time.perf_counter() - t0
    finally:
        shutil.rmtree(out, ignore_errors=True)
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    print(json.dumps({"seconds": seconds,
                      "cpu_s": own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime,
                      "client_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "workers_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))


def measure(case, directory, ranks, address=None):
    extra = [address] if address else []
    proc = subprocess.run([sys.executable, __file__, "--child", case, directory, str(ranks), *extra],
                          capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{case} on {directory} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="64,256,1024,4096", help="comma-separated rank counts")
    ap.add_argument("--mb", type=float, default=1.0, help="MB of JSON per rank (default 1)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--bytes_ranks", type=int, default=256,
                    help="rank count of the bytes check: the same job at --mb and 4x --mb per rank (0: skip)")
    ap.add_argument("--no_running", action="store_true", help="skip the runs against a cluster already up")
    ap.add_argument("--child", nargs="+", metavar="ARG", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        case, directory, ranks, *address = args.child
        child(case, directory, int(ranks), *address)
        return
    sizes = [int(x) for x in args.ranks.split(",")]
    cluster = None if args.no_running else running_cluster(generate(sizes[0], args.mb), sizes[0])
    try:
        best = run_sizes(args, sizes, cluster)
    finally:
        if cluster is not None:
            cluster.close()
    ratios(args, sizes, best)


def running_cluster(directory, ranks):
    """A LocalCluster as ``--scheduler local -j 2`` starts one, kept up for
    the runs against a running cluster, warmed up by one untimed run (its
    workers' imports: a cluster a team keeps up has made them)."""
    import logging

    import distributed

    # silence_logs: its workers' complaints while it is shut down are not the benchmark's output
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                       host="127.0.0.1", silence_logs=logging.CRITICAL)
    measure(RUNNING, directory, ranks, cluster.scheduler_address)
    return cluster


def run_sizes(args, sizes, cluster):
    cases = list(CASES) + ([] if cluster is None else [RUNNING])
    best = {}
    for ranks in sizes:
        directory = generate(ranks, args.mb)
        mb_total = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory)
                       if f.endswith(".json") and f != "truth.json") / 1e6
        for r in range(args.repeat):
            order = cases if r % 2 == 0 else cases[::-1]
            for case in order:
                m = measure(case, directory, ranks, cluster.scheduler_address if case == RUNNING else None)
                print(f"{ranks:5d} ranks ({mb_total:,.0f} MB) {case:8s} {m['seconds']:8.2f} s "
                      f"{1000 * m['seconds'] / ranks:7.2f} ms/rank  {'client CPU' if case == RUNNING else 'CPU'} "
                      f"{m['cpu_s']:7.1f} s  "
                      f"client peak RSS {m['client_rss_mb']:6.0f} MB"
                      + (f"  workers' peak {m['workers_rss_mb']:.0f} MB" if case == "cluster" else ""),
                      flush=True)
                key = (ranks, case)
                if key not in best or m["seconds"] < best[key]["seconds"]:
                    best[key] = m
    return best


def ratios(args, sizes, best):
    print("ratios (fastest runs):")
    for ranks in sizes:
        for case, what in (("cluster", "cluster started for the run"), (RUNNING, "cluster already running")):
            if (ranks, "threads") in best and (ranks, case) in best:
                ratio = best[ranks, case]["seconds"] / best[ranks, "threads"]["seconds"]
                # a running cluster's CPU is its workers' (not this script's children): not comparable
                cpu = (f", CPU {best[ranks, case]['cpu_s'] / best[ranks, 'threads']['cpu_s']:.2f}"
                       if case == "cluster" else "")
                print(f"  {ranks:5d} ranks: {what} / threads time {ratio:.2f} (target <= 1.3){cpu}")
    for small, large in zip(sizes, sizes[1:]):
        for case in CASES:
            t = best[large, case]["seconds"] / best[small, case]["seconds"]
            rss = best[large, case]["client_rss_mb"] / best[small, case]["client_rss_mb"]
            print(f"  {case:8s} {large} / {small} ranks ({large / small:g}x the bytes): time {t:.2f}"
                  f"{' (target <= 4.5)' if large == 4 * small else ''}, client peak RSS {rss:.2f}")
    if args.bytes_ranks:
        # the client's RSS against the bytes per rank alone: the same ranks, 4x the bytes each
        n = args.bytes_ranks
        peak = {mb: {case: measure(case, generate(n, mb), n)["client_rss_mb"] for case in CASES}
                for mb in (args.mb, 4 * args.mb)}
        for case in CASES:
            print(f"  {case:8s} {n} ranks, {4 * args.mb:g} vs {args.mb:g} MB a rank: client peak RSS "
                  f"{peak[4 * args.mb][case]:.0f} vs {peak[args.mb][case]:.0f} MB "
                  f"({peak[4 * args.mb][case] / peak[args.mb][case]:.2f}; target: no growth)")


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    main()

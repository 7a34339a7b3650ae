"""Benchmark `streamtrace fuse`: wall time and peak RSS on generated multi-rank traces.

    python bench/bench_fuse.py [--mb 500] [--ranks 4] [--in_format json] [--out merged.json.gz] [-j 2]

Generates ``--ranks`` traces of about ``--mb`` MB of JSON each (one run of
fixtures/generate_fixture.py, reused from bench/out/ when present), then runs
the CLI in a fresh process and reports its wall time and peak RSS (the
process's own ru_maxrss: fuse runs ranks in threads, in one process), plus
throughput in MB/s of input JSON.  Target (issue #5): 4 ranks x ~500 MB to
.json.gz in <= 15 s with <= 128 MB peak RSS on a 2-core machine; at other
sizes the time budget is scaled to the input size.  ``--verify`` checks that
the output decompresses as one gzip member and counts its bytes.
``--pftrace`` also fuses to ``.pftrace.gz`` and with ``--focus worst`` and
prints issue #45's ratios against the ``.json.gz`` run.
Prints figures only; tests never time anything.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(HERE, "out")
PY = sys.executable
TARGET_S, TARGET_MB_IN, TARGET_RSS_MB = 15.0, 2000.0, 128.0


def generate(mb, ranks, fmt):
    """bench/out/fuse_{ranks}x{mb}_{fmt}/rank*_trace.json*, generated once."""
    d = os.path.join(OUT, f"fuse_{ranks}x{mb}_{fmt.replace('.', '')}")
    if not os.path.exists(os.path.join(d, "truth.json")):
        tmp = d + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        cmd = [PY, os.path.join(ROOT, "fixtures", "generate_fixture.py"), "--out", tmp, "--ranks", str(ranks),
               "--target_mb", str(mb), "--format", fmt, "--jobs", "2", "--compress_level", "1",
               "--clock_offsets", "random"]
        print("generating:", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        shutil.rmtree(d, ignore_errors=True)
        os.replace(tmp, d)
    return d


def run_case(cmd, env=None):
    """Run cmd; return (seconds, peak RSS in MB of the process, return code, stderr)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return seconds, usage.ru_maxrss / 1024, proc.returncode, err.decode("utf-8", "replace")


def verify_gzip(path):
    """(one member?, uncompressed bytes) by streaming the file through zlib."""
    import zlib

    d = zlib.decompressobj(31)
    total = 0
    with open(path, "rb") as f:
        while True:
            block = f.read(1 << 22)
            if not block:
                break
            total += len(d.decompress(block))
    total += len(d.flush())
    return d.eof and not d.unused_data, total


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=500, help="MB of JSON per rank (default 500)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--in_format", choices=["json", "json.gz", "json.zst"], default="json",
                    help="format of the generated inputs")
    ap.add_argument("--out", default=None, help="output file (default bench/out/merged.json.gz)")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--flags", default="", help="extra fuse flags, e.g. '--align_clocks'")
    ap.add_argument("--verify", action="store_true", help="check the gzip output (one member) afterwards")
    ap.add_argument("--keep_output", action="store_true")
    ap.add_argument("--pftrace", action="store_true",
                    help="also fuse to .pftrace.gz and with --focus worst, and report the issue #45 ratios")
    ap.add_argument("--rounds", type=int, default=1, help="with --pftrace: alternating rounds (default 1)")
    ap.add_argument("--no_python_encoder", action="store_true",
                    help="with --pftrace: leave out the Python reference encoder's case (about 10x slower)")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    d = generate(args.mb, args.ranks, args.in_format)
    names = sorted(n for n in os.listdir(d) if n.startswith("rank"))
    in_bytes = sum(os.path.getsize(os.path.join(d, n)) for n in names)
    truth = json.load(open(os.path.join(d, "truth.json")))
    json_bytes = in_bytes
    if args.in_format != "json":
        json_bytes = args.ranks * args.mb * 1e6  # the generator's target, in JSON bytes
    out = args.out or os.path.join(OUT, "merged.json.gz")
    exe = shutil.which("streamtrace", path=os.path.dirname(PY))
    base = [exe] if exe else [PY, "-m", "streamtrace.cli"]
    cmd = base + ["fuse", "--trace_dir", d, "--world_size", str(args.ranks), "-o", out, "-j", str(args.jobs),
                  "-q"] + args.flags.split()
    print(f"\ninputs: {args.ranks} ranks, {in_bytes / 1e6:.0f} MB on disk ({args.in_format}), "
          f"~{json_bytes / 1e6:.0f} MB of JSON, {sum(sum(c.values()) for c in truth['event_counts'].values()):,} events")
    print("command:", " ".join(cmd), flush=True)
    seconds, rss, rc, err = run_case(cmd)
    if rc != 0:
        raise SystemExit(f"fuse failed ({rc}):\n{err}")
    out_mb = os.path.getsize(out) / 1e6
    budget = TARGET_S * json_bytes / (TARGET_MB_IN * 1e6)
    print(f"\n  fuse -> {os.path.basename(out):<20} {seconds:7.2f} s  {json_bytes / 1e6 / seconds:7.0f} MB/s of JSON"
          f"  peak RSS {rss:6.1f} MB  output {out_mb:8.1f} MB")
    print(f"  target: <= {budget:.1f} s (15 s per 2000 MB of JSON) -> {'met' if seconds <= budget else 'NOT met'}; "
          f"<= {TARGET_RSS_MB:.0f} MB RSS -> {'met' if rss <= TARGET_RSS_MB else 'NOT met'}")
    print(f"  machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} "
          f"(other work on the machine slows the run)")
    if args.verify and out.endswith(".gz"):
        t0 = time.perf_counter()
        one, size = verify_gzip(out)
        print(f"  verify: one gzip member: {one}; {size / 1e6:.0f} MB of JSON ({time.perf_counter() - t0:.1f} s)")
    if args.pftrace:
        pftrace_ratios(base, d, args, seconds, out)
    if not args.keep_output and not args.out:
        os.unlink(out)


def pftrace_ratios(base, d, args, json_seconds, json_out):
    """Issue #45's targets against the .json.gz fuse: .pftrace.gz <= 1.2x its
    time, <= 128 MB RSS, <= 0.5x its size; --focus worst <= 0.5x the whole
    fuse's time.  --rounds alternates the cases round by round (the JSON fuse,
    the C encoder, the Python encoder) so a load change on the machine hits
    them all; each case's median time and its highest peak RSS are reported."""
    cases = [("json", "round.json.gz", [], None),
             ("pftrace (C encoder)", "merged.pftrace.gz", [], "c"),
             ("pftrace (Python encoder)", "merged.pftrace.gz", [], "python"),
             ("pftrace --focus worst (C)", "worst.pftrace.gz", ["--focus", "worst"], "c")]
    if args.no_python_encoder:
        cases = [c for c in cases if c[3] != "python"]
    runs = {name: [] for name, *_ in cases}
    for r in range(args.rounds):
        for name, file, extra, encoder in cases:
            out = os.path.join(OUT, file)
            cmd = base + ["fuse", "--trace_dir", d, "--world_size", str(args.ranks), "-o", out, "-j",
                          str(args.jobs), "-q"] + extra + args.flags.split()
            if r == 0:
                print("command:", " ".join(cmd), f"(STREAMTRACE_PFTRACE_ENCODER={encoder})" if encoder else "",
                      flush=True)
            env = dict(os.environ, STREAMTRACE_PFTRACE_ENCODER=encoder) if encoder else None
            seconds, rss, rc, err = run_case(cmd, env=env)
            if rc != 0:
                raise SystemExit(f"fuse failed ({rc}):\n{err}")
            runs[name].append((seconds, rss, os.path.getsize(out)))
            print(f"  round {r + 1}: {name:<26} {seconds:7.2f} s  peak RSS {rss:6.1f} MB  "
                  f"output {runs[name][-1][2] / 1e6:8.1f} MB", flush=True)
            if not args.keep_output:
                os.unlink(out)

    def med(name):
        ts = sorted(x[0] for x in runs[name])
        return ts[len(ts) // 2], max(x[1] for x in runs[name]), runs[name][-1][2]

    def ratio(name, base):
        """The median and range of the rounds' own time ratios (each round's case against its baseline)."""
        rs = sorted(a[0] / b[0] for a, b in zip(runs[name], runs[base]))
        return rs[len(rs) // 2], rs[0], rs[-1]
    _, _, sj = med("json")
    for name in ("pftrace (C encoder)", "pftrace (Python encoder)"):
        if not runs.get(name):
            continue
        _, rss, size = med(name)
        r, lo, hi = ratio(name, "json")
        print(f"  {name} / .json.gz: time {r:.2f}x (rounds {lo:.2f}-{hi:.2f}; target <= 1.2: "
              f"{'met' if r <= 1.2 else 'NOT met'}), size {size / sj:.2f}x (target <= 0.5: "
              f"{'met' if size / sj <= 0.5 else 'NOT met'}), RSS {rss:.0f} MB (target <= 128: "
              f"{'met' if rss <= TARGET_RSS_MB else 'NOT met'})")
    r, lo, hi = ratio("pftrace --focus worst (C)", "pftrace (C encoder)")
    print(f"  --focus worst / whole .pftrace.gz fuse (C): time {r:.2f}x (rounds {lo:.2f}-{hi:.2f}; target <= 0.5: "
          f"{'met' if r <= 0.5 else 'NOT met'}), peak RSS {med('pftrace --focus worst (C)')[1]:.0f} MB")
    print(f"  medians of {args.rounds} alternating round(s); load average {os.getloadavg()[0]:.2f}")

if __name__ == "__main__":
    main()

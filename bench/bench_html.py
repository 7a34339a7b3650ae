"""Size and drawing time of the HTML report of large runs (issue #27).

For each trace directory: ``collective-report --output_html_path`` (timed),
the page's size, and the time headless chromium takes to draw it -- the
page writes ``performance.now()`` (ms since navigation: parsing plotly.js
included) on <body> once every chart is drawn; the median of --repeat loads.

    python bench/bench_html.py DIR:WORLD_SIZE [DIR:WORLD_SIZE ...] [--repeat 5]

The sets of the issue: the bench's dense set (4 ranks, 25,004 instances:
fixtures/generate_fixture.py --ranks 4 --steps 3572 --fill_ops 0) and a
1,024-rank job (--ranks 1024 --steps 1 --fill_ops 0).
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")


def draw_ms(page):
    profile = tempfile.mkdtemp(prefix="streamtrace-bench-chromium-")
    try:
        res = subprocess.run(
            [shutil.which("chromium") or "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
             "--window-size=1400,1000", "--dump-dom", "file://" + os.path.abspath(page)],
            capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    m = re.search(r'data-render-ms="(\d+)"', res.stdout)
    errors = re.search(r'data-errors="([^"]*)"', res.stdout)
    if not m or errors is None or errors.group(1) != "[]":
        raise SystemExit(f"{page}: the page did not draw cleanly: {errors.group(1) if errors else res.stderr[-500:]}")
    return int(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sets", nargs="+", metavar="DIR:WORLD_SIZE")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=tempfile.gettempdir())
    args = ap.parse_args()
    print(f"{'set':<28} {'report + page (s)':>18} {'page (MB)':>10} {'draw median (ms)':>17}  draws (ms)")
    for spec in args.sets:
        d, world = spec.rsplit(":", 1)
        page = os.path.join(args.out, f"bench-{os.path.basename(os.path.normpath(d))}.html")
        t0 = time.perf_counter()
        subprocess.run([BIN, "collective-report", "--trace_dir", d, "--world_size", world, "--output_html_path",
                        page, "-q"], check=True)
        wall = time.perf_counter() - t0
        draws = [draw_ms(page) for _ in range(args.repeat)]
        print(f"{os.path.basename(os.path.normpath(d)):<28} {wall:>18.2f} {os.path.getsize(page) / 1e6:>10.2f} "
              f"{statistics.median(draws):>17.0f}  {' '.join(map(str, draws))}", flush=True)


if __name__ == "__main__":
    main()

"""Size and drawing time of the HTML report of large runs (issue #27).

For each trace directory: ``collective-report --output_html_path`` (timed),
the page's size, and how long headless chromium takes to draw it, measured
inside the page: the report's render script writes ``performance.now()``
(milliseconds since the navigation started: parsing the page and plotly.js,
each chart's JSON and Plotly.newPlot) on <body> once every chart's newPlot
promise has resolved -- each chart drawn, its plotly_afterplot fired.  The
DOM is read back with ``--dump-dom``, which waits for the page's load
event: the promises resolve before it, and a page whose number is missing
counts as not drawn.  Also printed: the CPU time of chromium's processes
over the blank page's, which the machine's load changes far less than the
wall-clock figures.

Two baselines are loaded in the same rounds, the same way: a blank page (a
script that records the same number at once) and a page holding only
plotly.js, whose parsing every report pays.  Loads are interleaved round by
round (blank, plotly.js, each page), so all see the same machine; the
1-minute load average is recorded before each load.

    python bench/bench_html.py DIR:WORLD_SIZE [DIR:WORLD_SIZE ...] [--repeat 5]
    python bench/bench_html.py --page report.html [--page ...]

The sets of the issue: the bench's dense set (4 ranks, 25,004 instances:
fixtures/generate_fixture.py --ranks 4 --steps 3572 --fill_ops 0) and a
1,024-rank job (--ranks 1024 --steps 1 --fill_ops 0).  The goal: under 10 MB
and drawn in under 3 s.
"""
import argparse
import html
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")
GOAL_MS = 3000

_RECORD = ("<script>document.body.dataset.errors = '[]'; document.body.dataset.renderMs = "
           "performance.now().toFixed(0); document.body.dataset.rendered = 'yes';</script>")


def baselines(directory):
    """(name, path) of the two baseline pages, written into ``directory``."""
    from plotly.offline import get_plotlyjs

    blank = os.path.join(directory, "bench-baseline-blank.html")
    with open(blank, "w", encoding="utf-8") as f:
        f.write(f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"></head><body>{_RECORD}</body></html>")
    plotly_only = os.path.join(directory, "bench-baseline-plotlyjs.html")
    with open(plotly_only, "w", encoding="utf-8") as f:
        f.write(f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><script>{get_plotlyjs()}</script></head>"
                f"<body>{_RECORD}</body></html>")
    return [("blank page", blank), ("plotly.js alone", plotly_only)]


def draw_ms(page, nice=None):
    """(ms from navigation start to every chart drawn, as the page measured
    it; {chart: ms of its synchronous part}; CPU seconds of chromium's
    processes) of one load in a fresh headless chromium (under ``nice -n
    NICE`` when given)."""
    profile = tempfile.mkdtemp(prefix="streamtrace-bench-chromium-")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        res = subprocess.run(
            (["nice", "-n", str(nice)] if nice is not None else [])
            + [shutil.which("chromium") or "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
             "--window-size=1400,1000", "--dump-dom", "file://" + os.path.abspath(page)],
            capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)   # chromium and the processes it waited for
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    body = re.search(r"<body[^>]*>", res.stdout)
    attrs = dict(re.findall(r'\s(data-[\w-]+)="([^"]*)"', body.group(0))) if body else {}
    if attrs.get("data-rendered") != "yes" or attrs.get("data-errors") != "[]":
        raise SystemExit(f"{page}: the page did not draw cleanly: "
                         f"{html.unescape(attrs.get('data-errors', '')) or res.stderr[-500:]}")
    charts = json.loads(html.unescape(attrs["data-chart-ms"])) if "data-chart-ms" in attrs else {}
    return int(attrs["data-render-ms"]), charts, cpu


def make_page(spec, out):
    d, world = spec.rsplit(":", 1)
    page = os.path.join(out, f"bench-{os.path.basename(os.path.normpath(d))}.html")
    t0 = time.perf_counter()
    subprocess.run([BIN, "collective-report", "--trace_dir", d, "--world_size", world, "--output_html_path",
                    page, "-q"], check=True)
    return page, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sets", nargs="*", metavar="DIR:WORLD_SIZE")
    ap.add_argument("--page", action="append", default=[], help="an existing page to load as well (repeatable)")
    ap.add_argument("--repeat", type=int, default=5, help="loads of each page (default 5)")
    ap.add_argument("--out", default=tempfile.gettempdir(), help="where the pages are written")
    ap.add_argument("--nice", type=int, default=None,
                    help="run chromium under nice -n NICE (negative, as root: a share of a loaded machine's CPUs "
                         "closer to an idle one's; say so with the figures)")
    args = ap.parse_args()
    if not args.sets and not args.page:
        ap.error("give at least one DIR:WORLD_SIZE or --page")
    pages = baselines(args.out)
    made = {}
    for spec in args.sets:
        page, wall = make_page(spec, args.out)
        made[page] = wall
        pages.append((os.path.basename(os.path.normpath(spec.rsplit(":", 1)[0])), page))
    pages += [(os.path.basename(p), p) for p in args.page]
    print(f"{os.cpu_count()} CPUs; load average at the start {os.getloadavg()[0]:.2f}"
          + (f"; chromium under nice -n {args.nice}" if args.nice is not None else ""), flush=True)
    draws = {page: [] for _, page in pages}
    loads = {page: [] for _, page in pages}
    cpus = {page: [] for _, page in pages}
    charts = {}
    for _ in range(args.repeat):   # round by round: every page under the same load
        for _, page in pages:
            loads[page].append(os.getloadavg()[0])
            ms, per_chart, cpu = draw_ms(page, args.nice)
            draws[page].append(ms)
            cpus[page].append(cpu)
            charts.setdefault(page, per_chart)
    plotly_ms = statistics.median(draws[pages[1][1]])
    blank_cpu = statistics.median(cpus[pages[0][1]])
    print(f"{'page':<24} {'report (s)':>10} {'size (MB)':>9} {'drawn, median (ms)':>18} {'min':>6} "
          f"{'over plotly.js':>14} {'< 3 s':>6} {'CPU over blank (s)':>18}  {'load avg':>11}  loads (ms)")
    for name, page in pages:
        med = statistics.median(draws[page])
        report = f"{made[page]:.2f}" if page in made else ""
        over = f"{med - plotly_ms:+.0f}" if page != pages[1][1] else ""
        print(f"{name:<24} {report:>10} {os.path.getsize(page) / 1e6:>9.2f} {med:>18.0f} {min(draws[page]):>6} "
              f"{over:>14} {'yes' if med < GOAL_MS else 'NO':>6} "
              f"{statistics.median(cpus[page]) - blank_cpu:>18.2f}  {min(loads[page]):>5.2f}-{max(loads[page]):<5.2f}"
              f"  {' '.join(map(str, draws[page]))}")
    for name, page in pages[2:]:
        print(f"  {name}: each chart's synchronous part (ms, first load): {charts[page]}")


if __name__ == "__main__":
    main()

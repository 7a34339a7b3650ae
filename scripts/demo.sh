#!/usr/bin/env bash
# make demo: the whole chain on generated example traces with known answers.
set -euo pipefail
ST=.venv/bin/streamtrace
PY=.venv/bin/python
OUT=demo
rm -rf "$OUT" && mkdir -p "$OUT"

echo "== 1. generating two 8-rank runs of synthetic Kineto traces (known answers in truth.json)"
echo "      $OUT/traces: rank 3 starts its steps 300 us late (the straggler)"
echo "      $OUT/slow:   rank 5 runs a gemm 3x slower right before each step's first all-reduce"
$PY fixtures/generate_fixture.py --out "$OUT/traces" --ranks 8 --format json.gz --straggler_rank 3 --straggler_us 300 > /dev/null
$PY fixtures/generate_fixture.py --out "$OUT/slow" --ranks 8 --format json.gz --slow_kernel_rank 5 --slow_kernel_factor 3 > /dev/null

echo
echo "== 2. extract | dump: what each rank's trace holds"
$ST extract --trace_dir "$OUT/traces" --world_size 8 -q | $ST dump --what summary --format table

echo
echo "== 3. extract | align | correlate | report, through real pipes"
$ST extract --trace_dir "$OUT/traces" --world_size 8 -q \
    | $ST align \
    | $ST correlate -o "$OUT/analysed.stev"
$ST report "$OUT/analysed.stev" --output_xlsx_path "$OUT/report.xlsx" --output_csvs_dir "$OUT/csvs" \
    --output_html_path "$OUT/report.html" -q

echo
echo "== 4. straggler summary (sheet straggler_summary)"
$PY - "$OUT/csvs/straggler_summary.csv" <<'PY'
import sys
import pandas as pd
print(pd.read_csv(sys.argv[1]).to_string(index=False))
PY

echo
echo "== 5. streamtrace blockers: which kernels blocked the collectives"
echo "-- $OUT/traces (straggler):"
$ST blockers "$OUT/analysed.stev" --top 3
echo "-- $OUT/slow (slow kernel), straight from the trace files:"
$ST blockers "$OUT"/slow/rank*_trace.json.gz --top 3

echo
echo "== 6. fuse: every rank on one Perfetto timeline"
$ST fuse --trace_dir "$OUT/traces" --world_size 8 -o "$OUT/merged.json.gz" -q
echo "wrote $OUT/merged.json.gz (open it in https://ui.perfetto.dev)"
$ST fuse --trace_dir "$OUT/traces" --world_size 8 --focus worst --mark blockers -o "$OUT/worst.pftrace"
echo "wrote $OUT/worst.pftrace: Perfetto's own format, the collective with the most waiting and its blockers"

echo
echo "== 7. pictures: the HTML report of the straggler run (charts; opens offline in any browser)"
echo "$(cd "$OUT" && pwd)/report.html"

echo
echo "== 8. streamtrace diff: what changed from the straggler run to the slow-kernel run, as a CI gate"
echo "      (exit 3 when a --fail_if condition breaks; docs/diff.md)"
status=0
$ST diff "$OUT/analysed.stev" "$OUT/slow" --fail_if step_time:+5% --fail_if kernel_time:+50% \
    --output_html_path "$OUT/diff.html" -q || status=$?
echo "exit status $status; both runs' charts side by side: $(cd "$OUT" && pwd)/diff.html"
[ "$status" -eq 0 ] || [ "$status" -eq 3 ]

echo
echo "== 9. streamtrace whatif: what bounds each step of the straggler run, and what each fix would save"
echo "      (the critical path across ranks replayed with one change per scenario; docs/critical-path.md)"
$ST whatif "$OUT/analysed.stev" --output_csvs_dir "$OUT/whatif" -q
echo "sheets whatif, critical_path, critical_path_summary in $(cd "$OUT" && pwd)/whatif"

#!/usr/bin/env bash
# make demo: the longest chain that exists, on generated example traces.
set -euo pipefail
ST=.venv/bin/streamtrace
PY=.venv/bin/python
OUT=demo
rm -rf "$OUT" && mkdir -p "$OUT"

echo "== generating 8 ranks of synthetic Kineto traces (straggler: rank 3) into $OUT/traces"
$PY fixtures/generate_fixture.py --out "$OUT/traces" --ranks 8 --format json.gz \
    --straggler_rank 3 --straggler_us 300 > /dev/null

echo "== streamtrace extract --trace_dir $OUT/traces --world_size 8 | streamtrace dump --what summary"
$ST extract --trace_dir "$OUT/traces" --world_size 8 -q | $ST dump --what summary --format table

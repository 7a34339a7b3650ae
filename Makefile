# streamtrace — every target sets itself up on a fresh machine (python3, gcc, zlib headers).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
ST     := $(VENV)/bin/streamtrace
STAMP  := $(VENV)/.installed
BUILD  := csrc/build
SHARED_REAL := ../shared/traces/real
CSRC   := $(wildcard csrc/*.c csrc/*.h)
DEMO   := demo

# C warnings are errors in every build made through this Makefile (and in CI).
export STREAMTRACE_WERROR := 1

.PHONY: install demo test pytest sanitize bench fixtures docs clean system-tools

# The package byte-compiled, as a regular pip install leaves it: the install
# is editable, and with PYTHONDONTWRITEBYTECODE set (as on this kind of
# machine) every command would compile its modules again (~0.15 s a run).
# Stale files are harmless: Python checks them against the sources.
PYC = $(PY) -m compileall -q streamtrace

$(STAMP): pyproject.toml setup.py streamtrace/_build.py $(CSRC)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,html]'
	@$(PYC)
	@touch $@

install: $(STAMP)

# ---------------------------------------------------------------- demo
demo: $(STAMP)
	@$(PYC)
	@bash scripts/demo.sh

# ---------------------------------------------------------------- tests
test: pytest sanitize

pytest: $(STAMP) system-tools
	$(PY) -m pytest -q

# The HTML report's tests draw its pages in Debian's headless chromium and the
# workbook's convert it with LibreOffice: installed here when missing (as root,
# as on CI; the tests fail, not skip, on CI without them).
system-tools:
	@if ! command -v chromium >/dev/null || ! command -v soffice >/dev/null; then \
	    if [ "$$(id -u)" = 0 ]; then \
	        apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	            chromium libreoffice-calc-nogui; \
	    else \
	        echo "make test needs chromium and libreoffice-calc-nogui: apt-get install them as root"; exit 1; \
	    fi; \
	fi

# The C core under AddressSanitizer + UBSan: the hostile corpus (full sizes),
# the real traces, random chunkings, random interval sweeps and report row writes.
SANITIZE_FLAGS := -std=c99 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all \
                  -fno-omit-frame-pointer -Wall -Wextra -Werror
$(BUILD)/st_driver_asan: $(CSRC)
	@mkdir -p $(BUILD)
	$(CC) $(SANITIZE_FLAGS) -Icsrc csrc/st_driver.c csrc/st_tokenizer.c csrc/st_inflate.c csrc/st_select.c \
	    csrc/st_sweep.c csrc/st_cells.c csrc/st_scan.c -lz -lm -o $@

$(BUILD)/st_fuse_driver_asan: $(CSRC)
	@mkdir -p $(BUILD)
	$(CC) $(SANITIZE_FLAGS) -Icsrc csrc/st_fuse_driver.c csrc/st_fuse.c csrc/st_inflate.c -lz -lm -o $@

sanitize: $(BUILD)/st_driver_asan $(BUILD)/st_fuse_driver_asan $(STAMP)
	$(PY) fixtures/hostile.py $(BUILD)/hostile --big
	ASAN_OPTIONS=detect_leaks=1 $(BUILD)/st_driver_asan -w 500
	ASAN_OPTIONS=detect_leaks=1 $(BUILD)/st_driver_asan -s 1 -c 4096 $(BUILD)/hostile/* > $(BUILD)/sanitize-hostile.log
	@if [ -d $(SHARED_REAL) ]; then \
	    find $(SHARED_REAL) -name '*.json*' | sort | xargs env ASAN_OPTIONS=detect_leaks=1 \
	        $(BUILD)/st_driver_asan -s 2 -c 1048576 > $(BUILD)/sanitize-real.log && \
	    if grep -E ": (error|inflate error)" $(BUILD)/sanitize-real.log; then exit 1; fi && \
	    echo "sanitize: $$(wc -l < $(BUILD)/sanitize-real.log) real traces clean"; \
	else echo "sanitize: $(SHARED_REAL) absent, real traces skipped"; fi
	@echo "sanitize: $$(wc -l < $(BUILD)/sanitize-hostile.log) hostile inputs clean"
	ASAN_OPTIONS=detect_leaks=1 $(BUILD)/st_fuse_driver_asan -c 4093 -m 30 $(BUILD)/hostile/* > $(BUILD)/sanitize-fuse.log
	@if [ -d $(SHARED_REAL) ]; then \
	    find $(SHARED_REAL) -name '*.json*' | sort | xargs env ASAN_OPTIONS=detect_leaks=1 \
	        $(BUILD)/st_fuse_driver_asan -c 1048576 -b 5000 -m 10 >> $(BUILD)/sanitize-fuse.log; fi
	@echo "sanitize: fuse rewriter clean on $$(wc -l < $(BUILD)/sanitize-fuse.log) runs"

# ---------------------------------------------------------------- bench
# Full sizes of the issues: 1 GB extract traces, 4 x 500 MB and 8 x 1 GB .gz
# report sets, 4 x 500 MB correlate and fuse sets, a 4 x 512 MB stream set (generated once into
# bench/out and /tmp/streamtrace-bench: about 12 GB of disk, 10-20 minutes).
# `make bench BENCH_SCALE=0.1` runs every benchmark at a tenth of the size.
BENCH_SCALE ?= 1
BENCH_MB = $(shell $(PYTHON) -c "print(max(10, int(500 * $(BENCH_SCALE))))")
# rank scaling (bench_scaling.py): 64 and 256 ranks of 1 MB by default; the
# issue's sizes are BENCH_SCALING_RANKS=64,256,1024,4096 (5.4 GB, ~30 minutes)
BENCH_SCALING_RANKS ?= 64,256
bench: $(STAMP)
	@$(PYC)
	$(PY) bench/run.py --mb $(shell $(PYTHON) -c "print(max(20, int(1000 * $(BENCH_SCALE))))") \
	    --small_mb $(shell $(PYTHON) -c "print(max(10, int(100 * $(BENCH_SCALE))))")
	$(PY) bench/bench_report.py --scale $(BENCH_SCALE) --repeat 3
	$(PY) bench/bench_correlate.py --ranks 4 --mb $(BENCH_MB) --repeat 9
	$(PY) bench/bench_correlate.py --bounded --base 7b3a78d --scale $(BENCH_SCALE)
	$(PY) bench/bench_fuse.py --ranks 4 --mb $(BENCH_MB) -j 2
	$(PY) bench/bench_scaling.py --ranks $(BENCH_SCALING_RANKS) --mb 1
	$(PY) bench/bench_remote.py --mb $(shell $(PYTHON) -c "print(max(10, int(100 * $(BENCH_SCALE))))")
	$(PY) bench/bench_stream.py --ranks 4 --mb $(shell $(PYTHON) -c "print(max(10, int(512 * $(BENCH_SCALE))))") --repeat 3
	$(PY) bench/bench_diff.py --ranks 4 --mb $(BENCH_MB) --repeat 3

# docs/cli.md from the commands' --help (a test fails when it is stale)
docs: $(STAMP)
	$(PY) scripts/cli_docs.py

fixtures: $(STAMP)
	$(PY) fixtures/generate_fixture.py --out fixtures/out/example --ranks 8 --straggler_rank 3 --straggler_us 300
	$(PY) fixtures/generate_fixture.py --sample fixtures/sample_trace.json

clean:
	rm -rf $(VENV) build $(BUILD) *.egg-info streamtrace/_core*.so streamtrace/_core.c \
	    fixtures/out fixtures/sample_trace.json bench/out $(DEMO) .pytest_cache .hypothesis

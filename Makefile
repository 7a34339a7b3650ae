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

.PHONY: install demo test pytest sanitize bench fixtures clean

$(STAMP): pyproject.toml setup.py streamtrace/_build.py $(CSRC)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	@touch $@

install: $(STAMP)

# ---------------------------------------------------------------- demo
demo: $(STAMP)
	@bash scripts/demo.sh

# ---------------------------------------------------------------- tests
test: pytest sanitize

pytest: $(STAMP)
	$(PY) -m pytest -q

# The C core under AddressSanitizer + UBSan: the hostile corpus (full sizes),
# the real traces, random chunkings, and random interval sweeps.
SANITIZE_FLAGS := -std=c99 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all \
                  -fno-omit-frame-pointer -Wall -Wextra -Werror
$(BUILD)/st_driver_asan: $(CSRC)
	@mkdir -p $(BUILD)
	$(CC) $(SANITIZE_FLAGS) -Icsrc csrc/st_driver.c csrc/st_tokenizer.c csrc/st_inflate.c \
	    csrc/st_sweep.c -lz -lm -o $@

sanitize: $(BUILD)/st_driver_asan $(STAMP)
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

# ---------------------------------------------------------------- bench
bench: $(STAMP)
	$(PY) bench/run.py

fixtures: $(STAMP)
	$(PY) fixtures/generate_fixture.py --out fixtures/out/example --ranks 8 --straggler_rank 3 --straggler_us 300
	$(PY) fixtures/generate_fixture.py --sample fixtures/sample_trace.json

clean:
	rm -rf $(VENV) build $(BUILD) *.egg-info streamtrace/_core*.so streamtrace/_core.c \
	    fixtures/out fixtures/sample_trace.json bench/out $(DEMO) .pytest_cache .hypothesis

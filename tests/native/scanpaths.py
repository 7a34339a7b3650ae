"""Fixtures of the native tests: the C scanner's paths (csrc/st_scan.h).

Imported by the test modules that use them (`from scanpaths import scan_path`):
a conftest.py here would shadow tests/conftest.py's `from conftest import`."""
import pytest

from streamtrace import _native

#: every scanner path this machine can run ("off": the tokenizer's own SSE2/byte loops)
SCAN_PATHS = _native.simd_paths()


def _force(monkeypatch, name):
    monkeypatch.setenv("STREAMTRACE_SIMD", name)   # in this process and the commands it starts
    _native.apply_simd()


@pytest.fixture(params=SCAN_PATHS)
def scan_path(request, monkeypatch):
    """Run a test once per scanner path this machine has, forced with
    STREAMTRACE_SIMD (each Tokenizer applies it): the records must not
    depend on the path."""
    _force(monkeypatch, request.param)
    yield request.param
    _native.apply_simd("")


#: the paths other than the one chosen when nothing is forced: tests that
#: already run on that one (once per reading backend) run on these too
FORCED_PATHS = [p for p in SCAN_PATHS if p != SCAN_PATHS[-1]]


@pytest.fixture(params=FORCED_PATHS)
def forced_scan_path(request, monkeypatch):
    _force(monkeypatch, request.param)
    yield request.param
    _native.apply_simd("")

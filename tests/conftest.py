import logging
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHARED_REAL = os.path.normpath(os.path.join(ROOT, "..", "shared", "traces", "real"))
sys.path.insert(0, os.path.join(ROOT, "fixtures"))
sys.path.insert(0, HERE)

# extract writes per-rank summaries for traces of 1 MiB or more only; the
# tests' traces are smaller, and the staged path they test is the one a
# real run takes (summaries read, events not collected again): every trace
# summarized here, in this process and the commands it starts.  Tests of
# the threshold and of streams without summaries set their own.
os.environ["STREAMTRACE_SUMMARIES_MIN_BYTES"] = "0"


def real_traces():
    """Every real trace file, or [] when ../shared is absent."""
    if not os.path.isdir(SHARED_REAL):
        return []
    out = []
    for root, _, files in os.walk(SHARED_REAL):
        out += [os.path.join(root, f) for f in files if ".json" in f]
    return sorted(out)


def real_id(path):
    return os.path.relpath(path, SHARED_REAL)


needs_real = pytest.mark.skipif(not os.path.isdir(SHARED_REAL), reason="../shared/traces/real is absent")


@pytest.fixture(scope="session")
def real_dir():
    if not os.path.isdir(SHARED_REAL):
        pytest.skip("../shared/traces/real is absent")
    return SHARED_REAL


#: the streamtrace logger as no command has set it up yet: saved here, at
#: collection, because a module-scoped fixture that runs a command (e.g.
#: test_html_report's) runs before a test's own fixtures could save it
_LOGGER_AT_START = (list(logging.getLogger("streamtrace").handlers), logging.getLogger("streamtrace").level,
                    logging.getLogger("streamtrace").propagate)


@pytest.fixture(autouse=True)
def _streamtrace_logger_restored():
    """Commands run in-process (CliRunner) set up the streamtrace logger for a
    terminal (its own handler, no propagation, -q: errors only); put it back
    as it was before any command after each test so later tests' caplog sees
    warnings again."""
    yield
    log = logging.getLogger("streamtrace")
    log.handlers[:], log.level, log.propagate = list(_LOGGER_AT_START[0]), _LOGGER_AT_START[1], _LOGGER_AT_START[2]


#: every way the C tokenizer is fed a file: gzip inflated by the C core's zlib
#: or by ISA-L, read and decompressed ahead in a thread or on one thread
READING_BACKENDS = [(gz, ahead) for gz in ("zlib", "isal") for ahead in ("1", "0")]


@pytest.fixture(params=READING_BACKENDS, ids=lambda b: f"{b[0]}-read_ahead{b[1]}")
def reading_backend(request, monkeypatch):
    """Run a test once per reading backend (STREAMTRACE_GZIP x STREAMTRACE_READ_AHEAD):
    the tokenizer's records must not depend on how its bytes arrived."""
    gzip_backend, read_ahead = request.param
    monkeypatch.setenv("STREAMTRACE_GZIP", gzip_backend)
    monkeypatch.setenv("STREAMTRACE_READ_AHEAD", read_ahead)
    return request.param

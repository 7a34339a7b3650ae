"""Progress that says how far (issue #41 item 8): a bar on a terminal (a real
pseudo-terminal here), plain lines with the totals in a log, nothing with -q."""
import fcntl
import functools
import http.server
import io
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import threading
import time

import pytest
from tqdm import tqdm

import generate_fixture
from streamtrace.progress import Progress

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")
RANKS = 4
DEADLINE = 240   # seconds a command may take on a loaded machine


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("progress")
    generate_fixture.generate(str(d), ranks=RANKS, steps=3, seed=5, format="json.gz")
    return d


def _report_args(run_dir, out, *extra):
    return [BIN, "collective-report", "--trace_dir", str(run_dir), "--world_size", str(RANKS),
            "--output_csvs_dir", str(out), "-j", "1", *extra]


def _stored_mib(run_dir):
    """The traces' size as stored (gzip), as the lines print it."""
    total = sum(os.path.getsize(run_dir / f"rank{r}_trace.json.gz") for r in range(RANKS))
    assert total < 10 << 20
    return f"{total / (1 << 20):.1f}"


def _logged(args):
    """Run a command with a progress line at every update into a pipe (a log):
    (the finished process, its progress lines)."""
    env = dict(os.environ, STREAMTRACE_PROGRESS_SECONDS="0")
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=DEADLINE)
    assert proc.returncode == 0, proc.stderr
    return proc, [line.strip() for line in proc.stderr.splitlines() if " MiB read, " in line]


def _in_pty(args, env=None, columns=None):
    """Run ``args`` with stdin, stdout and stderr on a new pseudo-terminal:
    (exit status, everything it wrote)."""
    pid, fd = pty.fork()
    if pid == 0:   # the child: exec at once
        try:
            os.execve(args[0], args, env if env is not None else os.environ)
        finally:
            os._exit(127)
    if columns:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    out = b""
    end = time.monotonic() + DEADLINE
    try:
        while time.monotonic() < end:
            ready, _, _ = select.select([fd], [], [], 1)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 65536)
            except OSError:   # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(fd)
    while True:   # the terminal closes as the child exits: wait for its status, bounded
        waited, status = os.waitpid(pid, os.WNOHANG)
        if waited:
            break
        if time.monotonic() > end:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail(f"no end within {DEADLINE} s: {out[-2000:]!r}")
        time.sleep(0.05)
    return os.waitstatus_to_exitcode(status), out.decode("utf-8", "replace")


@pytest.mark.parametrize("columns", [None, 100], ids=["no-size", "100-columns"])
def test_a_terminal_shows_a_bar_with_percent_ranks_and_phase_that_reaches_100(run_dir, tmp_path, columns):
    status, out = _in_pty(_report_args(run_dir, tmp_path / "csvs"), columns=columns)
    assert status == 0, out
    frames = [f for f in re.split(r"[\r\n]+", out) if "%|" in f]
    assert frames, out
    assert frames[0].startswith("reading:"), frames[0]
    percents = [int(re.search(r"(\d+)%\|", f).group(1)) for f in frames]
    assert percents == sorted(percents) and percents[-1] == 100, frames
    assert f"0 of {RANKS} ranks" in out or f"1 of {RANKS} ranks" in out
    last = frames[-1]
    assert last.startswith("writing sheets: 100%|") and f"{RANKS} of {RANKS} ranks" in last, last
    assert re.search(r"<\d\d:\d\d, [0-9.]+[kMG]?B/s", last), last   # time left and rate
    # the bar's total is the inputs' size as stored (gzip), not the JSON inside
    stored = sum(os.path.getsize(run_dir / f"rank{r}_trace.json.gz") for r in range(RANKS))
    assert f"/{tqdm.format_sizeof(stored, divisor=1024)} [" in last, last
    # the messages after it start on a line of their own
    assert "\nwrote " in out.replace("\r\n", "\n")


def test_a_log_gets_plain_lines_with_the_totals(run_dir, tmp_path):
    proc, lines = _logged(_report_args(run_dir, tmp_path / "csvs"))
    assert "\r" not in proc.stderr and "%|" not in proc.stderr
    assert lines, proc.stderr
    total = _stored_mib(run_dir)
    for line in lines:
        assert re.fullmatch(rf"(reading|matching|writing sheets): [0-9.]+ of {total} MiB read, "
                            rf"\d of {RANKS} ranks, [0-9,]+ events", line), line
    assert lines[0].startswith("reading: ")
    assert lines[-1].startswith(f"writing sheets: {total} of {total} MiB read, {RANKS} of {RANKS} ranks"), lines


def test_extract_logs_its_ranks_too(run_dir, tmp_path):
    proc, lines = _logged([BIN, "extract", "--trace_dir", str(run_dir), "--world_size", str(RANKS),
                           "-o", str(tmp_path / "run.stev")])
    total = _stored_mib(run_dir)
    assert lines and lines[-1].startswith(f"reading: {total} of {total} MiB read, {RANKS} of {RANKS} ranks"), \
        proc.stderr


def test_a_short_run_in_a_log_prints_no_progress_line(run_dir, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "STREAMTRACE_PROGRESS_SECONDS"}
    proc = subprocess.run(_report_args(run_dir, tmp_path / "csvs"), capture_output=True, text=True, env=env,
                          timeout=DEADLINE)
    assert proc.returncode == 0, proc.stderr
    assert " MiB read" not in proc.stderr   # one line every 10 s: none for a run this short


def test_quiet_prints_nothing_on_a_terminal_or_in_a_log(run_dir, tmp_path):
    status, out = _in_pty(_report_args(run_dir, tmp_path / "a", "-q"), columns=100)
    assert status == 0, out
    assert "%|" not in out and "\r" not in out.replace("\r\n", "\n"), out   # "wrote ..." alone
    env = dict(os.environ, STREAMTRACE_PROGRESS_SECONDS="0")
    proc = subprocess.run(_report_args(run_dir, tmp_path / "b", "-q"), capture_output=True, text=True, env=env,
                          timeout=DEADLINE)
    assert proc.returncode == 0 and " MiB read" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("wrote ") and len(proc.stderr.splitlines()) == 1   # -q keeps what it wrote


def test_a_bad_progress_interval_is_one_line(run_dir, tmp_path):
    env = dict(os.environ, STREAMTRACE_PROGRESS_SECONDS="soon")
    proc = subprocess.run(_report_args(run_dir, tmp_path / "csvs"), capture_output=True, text=True, env=env,
                          timeout=DEADLINE)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "Error: STREAMTRACE_PROGRESS_SECONDS='soon': expected seconds >= 0"
    assert not (tmp_path / "csvs").exists()


def test_fuse_logs_each_pass_over_the_inputs(run_dir, tmp_path):
    proc, lines = _logged([BIN, "fuse", "--trace_dir", str(run_dir), "--world_size", str(RANKS),
                           "-o", str(tmp_path / "fused.json.gz")])
    total = _stored_mib(run_dir)
    assert any(line.startswith("scanning: ") for line in lines), proc.stderr
    assert lines[-1] == f"writing: {total} of {total} MiB read, {RANKS} ranks", proc.stderr


@pytest.fixture
def http_dir(run_dir):
    """run_dir served over HTTP on 127.0.0.1 (Content-Length on HEAD and GET)
    for the test's length: its base URL."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(run_dir))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_urls_have_their_total_before_they_are_read(run_dir, http_dir):
    urls = [f"{http_dir}/rank{r}_trace.json.gz" for r in range(RANKS)]
    progress = Progress(stream=io.StringIO(), tty=False)
    progress.ranks(urls)
    progress.sizing.join(30)
    assert not progress.sizing.is_alive()
    total = _stored_mib(run_dir)
    assert progress.text() == f"reading: 0.0 of {total} MiB read, 0 of {RANKS} ranks, 0 events"


def test_extract_from_urls_logs_the_bytes_fetched_of_their_size(run_dir, http_dir, tmp_path):
    urls = [f"{http_dir}/rank{r}_trace.json.gz" for r in range(RANKS)]
    proc, lines = _logged([BIN, "extract", *urls, "-j", "1", "-o", str(tmp_path / "run.stev")])
    total = _stored_mib(run_dir)
    assert lines and lines[-1].startswith(f"reading: {total} of {total} MiB read, {RANKS} of {RANKS} ranks"), \
        proc.stderr

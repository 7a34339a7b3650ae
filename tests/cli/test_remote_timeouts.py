"""Remote reads that never finish, through real processes against servers on
127.0.0.1 started by each test: one that accepts connections and never
answers (also as an S3 endpoint), one that answers HEAD and sends part of a body then stalls, and one
that serves files only to requests carrying a token in their query.

A stall must end in one line naming the URL (without its credentials) and the
timeout, exit 1 and no output, within STREAMTRACE_NET_TIMEOUT_S; SIGTERM
during a stall must end the process within 2 s (exit 143, one line); a URL
pattern with a query must find the files the server holds."""
import http.server
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest

import generate_fixture

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")
#: the timeout the stall tests run with (STREAMTRACE_NET_TIMEOUT_S)
SHORT = 2
#: what a command may take beyond its timeout: the interpreter's start and
#: imports on a loaded machine
SLACK = 12
SECRETS = ("alice", "hunter2", "t0k3n")


class StallServer:
    """A TCP server on 127.0.0.1 that speaks just enough HTTP/1.1 to stall.

    ``silent``: every connection is accepted and nothing is ever read or sent.
    ``body``: HEAD gets the headers of a ``size``-byte object; GET gets a 206
    for the range asked, ``sent`` bytes of its body, then nothing more.
    ``stalled`` is set once a request is being stalled; ``gets`` counts GETs."""

    def __init__(self, mode, size=1 << 20, sent=4096):
        self.mode, self.size, self.sent = mode, size, sent
        self.stalled, self._stop = threading.Event(), threading.Event()
        self.gets = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self.port = self._sock.getsockname()[1]
        self._conns, self._threads = [], []
        self._accepter = threading.Thread(target=self._accept, daemon=True)
        self._accepter.start()

    def url(self, path, secrets=False):
        auth, query = ("alice:hunter2@", "?token=t0k3n") if secrets else ("", "")
        return f"http://{auth}127.0.0.1:{self.port}{path}{query}"

    def _accept(self):
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self._conns.append(conn)
            if self.mode == "silent":
                self.stalled.set()
                continue
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn):
        conn.settimeout(0.1)
        data = b""
        while not self._stop.is_set():
            while b"\r\n\r\n" not in data:
                try:
                    chunk = conn.recv(4096)
                except socket.timeout:
                    if self._stop.is_set():
                        return
                    continue
                except OSError:
                    return
                if not chunk:
                    return
                data += chunk
            head, _, data = data.partition(b"\r\n\r\n")
            method = head.split(b" ", 1)[0]
            if method == b"HEAD":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nAccept-Ranges: bytes\r\n"
                             b"Content-Type: application/json\r\n\r\n" % self.size)
                continue
            self.gets += 1
            start, end = 0, self.size - 1
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"range: bytes="):
                    a, _, b = line.split(b"=", 1)[1].partition(b"-")
                    start, end = int(a), min(int(b) if b else self.size - 1, self.size - 1)
            conn.sendall(b"HTTP/1.1 206 Partial Content\r\nContent-Length: %d\r\nContent-Range: bytes %d-%d/%d\r\n"
                         b"Content-Type: application/json\r\n\r\n" % (end - start + 1, start, end, self.size))
            conn.sendall((b'{"traceEvents": [' + b" " * self.size)[:self.sent])
            self.stalled.set()
            self._stop.wait(120)
            return

    def close(self):
        self._stop.set()
        self._sock.close()
        self._accepter.join(10)
        for conn in self._conns:
            with_closed(conn)
        for t in self._threads:
            t.join(10)


def with_closed(conn):
    try:
        conn.close()
    except OSError:
        pass


@pytest.fixture
def silent():
    server = StallServer("silent")
    yield server
    server.close()


@pytest.fixture
def stalls_in_body():
    server = StallServer("body")
    yield server
    server.close()


def s3_env(server):
    """The environment of an S3 client whose endpoint is ``server``."""
    return {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.port}", "AWS_ACCESS_KEY_ID": "k",
            "AWS_SECRET_ACCESS_KEY": "s", "AWS_DEFAULT_REGION": "us-east-1"}


def run(*args, timeout_s=SHORT, cwd=None, env=None):
    """The command with STREAMTRACE_NET_TIMEOUT_S=timeout_s: (process, seconds it took)."""
    env = {**os.environ, **(env or {}), "STREAMTRACE_NET_TIMEOUT_S": str(timeout_s)}
    start = time.monotonic()
    proc = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd,
                          stdin=subprocess.DEVNULL, timeout=timeout_s + 120)
    return proc, time.monotonic() - start


def one_line(stderr, *fragments):
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    for fragment in fragments:
        assert fragment in lines[0], stderr
    assert "Traceback" not in stderr
    for secret in SECRETS:
        assert secret not in stderr, stderr
    return lines[0]


def assert_timed_out(proc, elapsed, url, timeout_s=SHORT):
    assert proc.returncode == 1, proc.stderr
    line = one_line(proc.stderr, url, f"timed out after {timeout_s} s", "STREAMTRACE_NET_TIMEOUT_S")
    assert timeout_s <= elapsed < timeout_s + SLACK, (elapsed, line)
    return line


# ------------------------------------------------------------------ a stall ends in one line, exit 1

def test_server_that_never_answers(silent, tmp_path):
    proc, elapsed = run("extract", silent.url("/run/rank0_trace.json", secrets=True), "-o", tmp_path / "x.stev")
    assert_timed_out(proc, elapsed, silent.url("/run/rank0_trace.json"))
    assert os.listdir(tmp_path) == []


def test_server_that_never_accepts(tmp_path):
    """A listening socket whose backlog is full: the connection is never made."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=0)
    port = listener.getsockname()[1]
    waiting = []
    try:
        for _ in range(4):   # fill the backlog: the kernel drops further connection attempts
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(("127.0.0.1", port))
            waiting.append(c)
        url = f"http://127.0.0.1:{port}/run/rank0_trace.json"
        env = {"STREAMTRACE_NET_CONNECT_TIMEOUT_S": "1"}
        proc, elapsed = run("extract", url, "-o", tmp_path / "x.stev", timeout_s=60, env=env)
    finally:
        for c in waiting:
            c.close()
        listener.close()
    assert proc.returncode == 1, proc.stderr
    one_line(proc.stderr, url, "no connection within 1 s", "STREAMTRACE_NET_CONNECT_TIMEOUT_S")
    assert elapsed < 2 + SLACK, elapsed
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("how", ["paths", "--trace_pattern", "--trace_dir"])
def test_s3_endpoint_that_never_answers(silent, tmp_path, how):
    """s3fs and botocore retry a timed-out request: the deadline counts the retries."""
    args = {"paths": ["s3://traces/run/rank0_trace.json"],
            "--trace_pattern": ["--trace_pattern", "s3://traces/run/rank*_trace.json", "--world_size", 2],
            "--trace_dir": ["--trace_dir", "s3://traces/run", "--world_size", 2]}[how]
    proc, elapsed = run("collective-report", *args, "--output_csvs_dir", tmp_path / "csv", env=s3_env(silent))
    assert_timed_out(proc, elapsed, "s3://traces/run")
    assert os.listdir(tmp_path) == []


def test_server_that_stalls_in_a_body(stalls_in_body, tmp_path):
    proc, elapsed = run("extract", stalls_in_body.url("/run/rank0_trace.json", secrets=True),
                        "-o", tmp_path / "x.stev")
    line = assert_timed_out(proc, elapsed, stalls_in_body.url("/run/rank0_trace.json"))
    assert "the read at byte 0" in line
    assert os.listdir(tmp_path) == []


def test_stream_input_that_stalls(stalls_in_body, tmp_path):
    """align reads an event stream through another reader (the stream's frames)."""
    proc, elapsed = run("align", stalls_in_body.url("/run/run.stev"), "-o", tmp_path / "a.stev")
    assert_timed_out(proc, elapsed, stalls_in_body.url("/run/run.stev"))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("command", ["collective-report", "fuse"])
def test_pattern_whose_listing_stalls(silent, tmp_path, command):
    out = ["--output_csvs_dir", tmp_path / "csv"] if command == "collective-report" else ["-o", tmp_path / "f.json"]
    proc, elapsed = run(command, "--trace_pattern", silent.url("/run/rank*_trace.json", secrets=True),
                        "--world_size", 2, *out)
    line = assert_timed_out(proc, elapsed, silent.url("/run/rank*_trace.json"))
    assert "cannot list it" in line
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("how", ["--trace_dir", "--trace_glob"])
def test_other_listings_that_stall(silent, tmp_path, how):
    where = silent.url("/run") if how == "--trace_dir" else silent.url("/run/rank*_trace.json")
    proc, elapsed = run("collective-report", how, where, "--world_size", 2, "--output_csvs_dir", tmp_path / "csv")
    assert_timed_out(proc, elapsed, where)
    assert os.listdir(tmp_path) == []


def test_directory_argument_that_stalls(silent, tmp_path):
    """blockers asks whether a URL is a directory first: that request is bounded too."""
    proc, elapsed = run("blockers", silent.url("/run/"), cwd=tmp_path)
    assert_timed_out(proc, elapsed, silent.url("/run/"))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("command", ["collective-report", "fuse"])
def test_stalled_body_is_read_once(stalls_in_body, tmp_path, command):
    """fuse peeks at a trace's metadata before its scan: a stall there is
    reported, not taken for an unreadable file and waited for again."""
    out = ["--output_csvs_dir", tmp_path / "csv"] if command == "collective-report" else ["-o", tmp_path / "f.json"]
    proc, elapsed = run(command, stalls_in_body.url("/run/rank0_trace.json"), *out)
    assert_timed_out(proc, elapsed, stalls_in_body.url("/run/rank0_trace.json"))
    assert stalls_in_body.gets == 1
    assert os.listdir(tmp_path) == []


def test_bad_timeout_value(silent, tmp_path):
    env = {**os.environ, "STREAMTRACE_NET_TIMEOUT_S": "soon"}
    proc = subprocess.run([BIN, "extract", silent.url("/run/rank0_trace.json"), "-o", tmp_path / "x.stev"],
                          capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=120)
    assert proc.returncode == 1
    one_line(proc.stderr, "STREAMTRACE_NET_TIMEOUT_S", "'soon'")
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------ SIGTERM during a stall

@pytest.mark.parametrize("mode, command", [("silent", "extract"), ("body", "extract"), ("s3", "extract"),
                                           ("body", "collective-report"), ("body", "fuse"),
                                           ("silent", "collective-report --trace_pattern")])
def test_sigterm_during_a_stalled_read(mode, command, tmp_path):
    """The default timeout (30 s): SIGTERM a second into the stall ends the
    process within 2 s, exit 143, one line."""
    server = StallServer("silent" if mode == "s3" else mode)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMTRACE_NET_")}
    url = server.url("/run/rank0_trace.json")
    if mode == "s3":
        env.update(s3_env(server))
        url = "s3://traces/run/rank0_trace.json"
    args = {"extract": [url, "-o", tmp_path / "x.stev"],
            "collective-report": [url, url.replace("rank0", "rank1"), "--output_csvs_dir", tmp_path / "csv"],
            "fuse": [url, url.replace("rank0", "rank1"), "-o", tmp_path / "f.json"],
            "collective-report --trace_pattern": [server.url("/run/rank*_trace.json"), "--world_size", 2,
                                                  "--output_csvs_dir", tmp_path / "csv"]}[command]
    proc = subprocess.Popen([BIN, *command.split(), *map(str, args)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        assert server.stalled.wait(60), "the command never reached the server"
        time.sleep(1)
        assert proc.poll() is None, proc.communicate()
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.close()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert one_line(err, "interrupted by SIGTERM")
    assert took < 2, took
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------ a pattern with a query (a token)

class _TokenHandler(http.server.SimpleHTTPRequestHandler):
    """Files and directory listings, only for requests whose query holds token=t0k3n (403 otherwise)."""

    def log_message(self, *args):
        pass

    def _allowed(self):
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        self.server.requests.append(self.path)
        if query.get("token") != ["t0k3n"]:
            self.send_error(403)
            return False
        return True

    def do_GET(self):
        if self._allowed():
            super().do_GET()

    def do_HEAD(self):
        if self._allowed():
            super().do_HEAD()


@pytest.fixture(scope="module")
def token_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("token_root")
    generate_fixture.generate(str(root / "run"), ranks=2, steps=1, fill_ops=4, seed=7)
    os.unlink(root / "run" / "truth.json")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             lambda *a, **k: _TokenHandler(*a, directory=str(root), **k))
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server, str(root / "run")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("how", ["--trace_pattern", "--trace_glob", "--trace_dir"])
def test_pattern_with_a_query_finds_the_files(token_server, tmp_path, how):
    base, server, local = token_server
    where = {"--trace_pattern": f"{base}/run/rank*_trace.json?token=t0k3n",
             "--trace_glob": f"{base}/run/rank*_trace.json?token=t0k3n",
             "--trace_dir": f"{base}/run?token=t0k3n"}[how]
    del server.requests[:]
    remote, _ = run("collective-report", how, where, "--world_size", 2, "--output_csvs_dir", tmp_path / "r",
                    timeout_s=30)
    assert remote.returncode == 0, remote.stderr
    assert "t0k3n" not in remote.stderr
    assert server.requests and all("token=t0k3n" in r for r in server.requests), server.requests
    local_run, _ = run("collective-report", "--trace_dir", local, "--world_size", 2, "--output_csvs_dir",
                       tmp_path / "l")
    assert local_run.returncode == 0, local_run.stderr
    names = sorted(os.listdir(tmp_path / "l"))
    assert names == sorted(os.listdir(tmp_path / "r"))
    for name in names:
        assert (tmp_path / "l" / name).read_bytes() == (tmp_path / "r" / name).read_bytes(), name

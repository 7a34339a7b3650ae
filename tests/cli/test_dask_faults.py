"""``--scheduler`` faults (issue #40): a service that is not a Dask scheduler,
a protocol streamtrace does not speak, a scheduler whose workers are all
gone, a scheduler killed mid-run, a stop signal during each of these waits.
Each ends in one line naming the address, exit 1 (or 143 for SIGTERM),
within its documented timeout, with nothing written.

Real processes only: the command, ``python -m http.server``, plain socket
servers on 127.0.0.1, and a real ``dask scheduler`` and workers.  The run
a fault interrupts is held mid-work by a FIFO in place of rank 3's trace:
a worker opening it for reading is the sign that the run is under way.

``distributed`` is imported unconditionally: a missing one fails these
tests rather than skipping them."""
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import distributed  # noqa: F401 - a missing extra fails here, not as a skip
import pytest

import generate_fixture
from test_dask import Cluster, _readers, free_port

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")
DASK = os.path.join(os.path.dirname(sys.executable), "dask")
RANKS = 4
#: the command's start-up (imports) on a loaded machine, beyond the timeout under test
SLACK = 10


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("dask_faults_job")
    truth = generate_fixture.generate(str(d), ranks=RANKS, steps=2, tp=2, seed=5)
    return [str(d / truth["files"][str(r)]) for r in range(RANKS)]


def report(paths, out, scheduler):
    return [BIN, "collective-report", *paths, "--output_csvs_dir", str(out), "-q", "--scheduler", scheduler]


def run(argv, env=None, timeout=120):
    """The command's exit code, stderr lines and seconds taken."""
    start = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    return proc.returncode, proc.stderr.strip().splitlines(), time.monotonic() - start


def one_line(lines, *words):
    assert len(lines) == 1, lines
    for word in words:
        assert word in lines[0], lines
    assert "Traceback" not in lines[0]
    return lines[0]


class Server:
    """A TCP server on 127.0.0.1 that accepts and sends ``reply`` (maybe
    nothing), then holds each connection open until closed."""

    def __init__(self, reply=b""):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.address = f"tcp://127.0.0.1:{self.sock.getsockname()[1]}"
        self.reply, self.conns, self.closed = reply, [], False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        self.sock.settimeout(0.1)   # a blocked accept would outlive close()
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.conns.append(conn)
            if self.reply:
                conn.sendall(self.reply)

    def close(self):
        self.closed = True
        self.thread.join(10)
        self.sock.close()
        for conn in self.conns:
            conn.close()


@pytest.fixture
def http_server(tmp_path):
    """``python -m http.server`` on a free port: it waits for the client to speak."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"tcp://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


def test_an_http_server_on_the_scheduler_port_is_one_line_within_the_connect_timeout(job, tmp_path, http_server):
    code, lines, took = run(report(job, tmp_path / "out", http_server))
    assert code == 1
    one_line(lines, http_server, "does not answer as a Dask scheduler", "5 s")
    assert 5 <= took < 5 + SLACK
    assert not os.path.exists(tmp_path / "out")
    # the timeout is the environment's: a shorter one is kept to
    code, lines, took = run(report(job, tmp_path / "out", http_server), env={"STREAMTRACE_DASK_CONNECT_TIMEOUT": "1.5"})
    assert code == 1
    one_line(lines, http_server, "does not answer as a Dask scheduler", "1.5 s")
    assert 1.5 <= took < 1.5 + SLACK


@pytest.mark.parametrize("reply", [b"HTTP/1.0 400 Bad Request\r\nServer: x\r\n\r\n", b"SSH-2.0-OpenSSH_9.6\r\n",
                                   b"\x01\x00\x00\x00\x00\x00\x00\x00" + b"\x00" * 64],
                         ids=["http", "ssh", "dask_framing_not_a_greeting"])
def test_a_server_that_answers_otherwise_is_one_line_at_once(job, tmp_path, reply):
    server = Server(reply)
    try:
        code, lines, took = run(report(job, tmp_path / "out", server.address))
    finally:
        server.close()
    assert code == 1
    line = one_line(lines, server.address, "does not answer as a Dask scheduler")
    assert "allocate" not in line and "EiB" not in line
    assert took < 5   # at the reply, not at the timeout
    assert not os.path.exists(tmp_path / "out")


def test_a_silent_server_is_one_line_within_the_connect_timeout(job, tmp_path):
    server = Server()
    try:
        code, lines, took = run([BIN, "blockers", *job, "--scheduler", server.address],
                                env={"STREAMTRACE_DASK_CONNECT_TIMEOUT": "2"})
    finally:
        server.close()
    assert code == 1
    one_line(lines, server.address, "does not answer as a Dask scheduler", "STREAMTRACE_DASK_CONNECT_TIMEOUT")
    assert 2 <= took < 2 + SLACK


@pytest.mark.parametrize("scheme,words", [("tls", ["tls://", "distributed.comm.tls"]),
                                          ("ucx", ["ucx://", "not supported"]),
                                          ("inproc", ["inproc://", "not supported"])])
def test_a_protocol_without_its_setup_is_one_line_at_once(job, tmp_path, scheme, words):
    address = f"{scheme}://127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    env["DASK_CONFIG"] = str(tmp_path)   # no TLS configured in a dask config file either
    start = time.monotonic()
    proc = subprocess.run(report(job, tmp_path / "out", address), capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 1
    one_line(proc.stderr.strip().splitlines(), address, *words)
    assert time.monotonic() - start < SLACK
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("scheduler", ["", " "])
def test_an_empty_scheduler_is_refused(job, tmp_path, scheduler):
    code, lines, _ = run(report(job, tmp_path / "out", scheduler))
    assert code == 1
    one_line(lines, "--scheduler", "empty scheduler address")
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("value", ["soon", "0", "-1", "inf", "nan"])
def test_a_bad_timeout_setting_is_one_line(job, tmp_path, value):
    server = Server()
    try:
        code, lines, _ = run(report(job, tmp_path / "out", server.address),
                             env={"STREAMTRACE_DASK_CONNECT_TIMEOUT": value})
    finally:
        server.close()
    assert code == 1
    assert lines == [f"Error: STREAMTRACE_DASK_CONNECT_TIMEOUT={value!r}: not a number of seconds > 0"]


def _scheduler_alone(directory):
    port = free_port()
    proc = subprocess.Popen([DASK, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                            cwd=directory, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    address = f"tcp://127.0.0.1:{port}"
    with distributed.Client(address, timeout=60, set_as_default=False):
        pass   # it is up
    return proc, address


def test_a_scheduler_without_workers_is_one_line_after_the_no_worker_timeout(job, tmp_path):
    proc, address = _scheduler_alone(tmp_path)
    try:
        code, lines, took = run(report(job, tmp_path / "out", address),
                                env={"STREAMTRACE_DASK_NO_WORKER_TIMEOUT": "3"})
    finally:
        proc.kill()
        proc.wait()
    assert code == 1
    one_line(lines, address, "no running Dask worker for 3 s", "STREAMTRACE_DASK_NO_WORKER_TIMEOUT")
    assert 3 <= took < 3 + SLACK
    assert not os.path.exists(tmp_path / "out")


class HeldRun:
    """The report on ``cluster`` with rank 3 a FIFO: started, and held until a
    worker has opened the FIFO (the run under way)."""

    def __init__(self, job, tmp_path, cluster, env=None):
        self.fifo = str(tmp_path / "rank3_trace.json")
        os.mkfifo(self.fifo)
        self.out = tmp_path / "out"
        self.proc = subprocess.Popen(report([*job[:3], self.fifo], self.out, cluster.address),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        self.timer = threading.Timer(240, self.proc.kill)   # a hung run fails, not hangs
        self.timer.start()
        # the writer's open returns once a worker has opened the FIFO to read it
        self.writer = open(self.fifo, "wb")
        self.reader = None
        for _ in range(200):
            readers = _readers([w.pid for w in cluster.workers], self.fifo)
            if readers:
                self.reader = readers[0]
                break
            time.sleep(0.05)
        assert self.reader

    def result(self):
        """exit code, stderr lines, seconds from now to its end."""
        start = time.monotonic()
        try:
            _, err = self.proc.communicate(timeout=120)
        finally:
            self.timer.cancel()
            self.writer.close()
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode, err.strip().splitlines(), time.monotonic() - start


def test_all_workers_killed_mid_run_is_one_line_after_the_no_worker_timeout(job, tmp_path):
    cluster = Cluster(tmp_path, nanny=False)
    try:
        held = HeldRun(job, tmp_path, cluster, env={"STREAMTRACE_DASK_NO_WORKER_TIMEOUT": "3"})
        for worker in cluster.workers:
            worker.kill()
            worker.wait()
        code, lines, took = held.result()
    finally:
        cluster.close()
    assert code == 1
    one_line(lines, cluster.address, "no running Dask worker for 3 s")
    assert took < 3 + SLACK
    assert not os.path.exists(held.out)


def test_the_scheduler_killed_mid_run_is_one_line(job, tmp_path):
    cluster = Cluster(tmp_path, nanny=False)
    try:
        held = HeldRun(job, tmp_path, cluster)
        cluster.scheduler.kill()
        cluster.scheduler.wait()
        code, lines, took = held.result()
    finally:
        cluster.close()
    assert code == 1
    line = one_line(lines, cluster.address)
    assert "lost the connection to the scheduler" in line or "cancelled" in line, line
    assert took < 5 + SLACK
    assert not os.path.exists(held.out)


def _sigterm_ends_it_within_2_s(proc, wait_first):
    time.sleep(wait_first)
    assert proc.poll() is None, proc.communicate()
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    took = time.monotonic() - start
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines() == ["interrupted by SIGTERM"]
    assert took < 2, took


def test_sigterm_while_waiting_for_a_greeting_ends_it_within_2_s(job, tmp_path):
    server = Server()
    try:
        proc = subprocess.Popen(report(job, tmp_path / "out", server.address), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "STREAMTRACE_DASK_CONNECT_TIMEOUT": "60"})
        # connected: waiting for the greeting
        for _ in range(400):
            if server.conns:
                break
            time.sleep(0.05)
        assert server.conns
        _sigterm_ends_it_within_2_s(proc, 0.5)
    finally:
        server.close()
    assert not os.path.exists(tmp_path / "out")


def test_sigterm_while_waiting_for_a_worker_ends_it_within_2_s(job, tmp_path):
    sched, address = _scheduler_alone(tmp_path)
    try:
        proc = subprocess.Popen(report(job, tmp_path / "out", address), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "STREAMTRACE_DASK_NO_WORKER_TIMEOUT": "60"})
        with distributed.Client(address, timeout=60, set_as_default=False) as client:
            for _ in range(1200):   # its tasks at the scheduler: waiting for a worker
                if client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)):
                    break
                time.sleep(0.05)
            else:
                pytest.fail("the command's tasks never reached the scheduler")
        _sigterm_ends_it_within_2_s(proc, 0.5)
    finally:
        sched.kill()
        sched.wait()
    assert not os.path.exists(tmp_path / "out")


def test_sigterm_while_a_worker_runs_ends_it_within_2_s(job, tmp_path):
    cluster = Cluster(tmp_path, nanny=False)
    try:
        held = HeldRun(job, tmp_path, cluster)
        _sigterm_ends_it_within_2_s(held.proc, 0)
        held.timer.cancel()
        held.writer.close()
    finally:
        cluster.close()
    assert not os.path.exists(held.out)


def test_a_scheduler_that_stops_answering_mid_run_is_one_line(job, tmp_path):
    cluster = Cluster(tmp_path, nanny=False)
    try:
        held = HeldRun(job, tmp_path, cluster, env={"STREAMTRACE_DASK_NO_WORKER_TIMEOUT": "3",
                                                    "STREAMTRACE_DASK_CONNECT_TIMEOUT": "1"})
        os.kill(cluster.scheduler.pid, signal.SIGSTOP)
        try:
            code, lines, took = held.result()
        finally:
            os.kill(cluster.scheduler.pid, signal.SIGCONT)
    finally:
        cluster.close()
    assert code == 1
    one_line(lines, cluster.address, "has not answered for 3 s")
    assert took < 3 + 1 + SLACK
    assert not os.path.exists(held.out)


@pytest.fixture
def tls_cluster(tmp_path):
    """A ``dask scheduler`` and a worker speaking tls:// with a temporary
    certificate (cryptography: a dependency of moto, in the test extra), and
    the environment that gives a client the same certificate."""
    from distributed.security import Security

    creds = Security.temporary()
    files = {}
    for name, pem in (("ca", creds.tls_ca_file), ("cert", creds.tls_client_cert), ("key", creds.tls_client_key)):
        files[name] = str(tmp_path / f"{name}.pem")
        with open(files[name], "w") as f:
            f.write(pem)
    tls = ["--tls-ca-file", files["ca"], "--tls-cert", files["cert"], "--tls-key", files["key"]]
    env = {**os.environ, "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": files["ca"],
           "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": files["cert"],
           "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": files["key"]}
    port = free_port()
    address = f"tls://127.0.0.1:{port}"
    procs = [subprocess.Popen([DASK, "scheduler", "--protocol", "tls", "--host", "127.0.0.1", "--port", str(port),
                               "--no-dashboard", *tls], cwd=tmp_path, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)]
    procs.append(subprocess.Popen([DASK, "worker", address, "--host", "127.0.0.1", "--nthreads", "1", "--no-nanny",
                                   "--no-dashboard", "--local-directory", str(tmp_path), *tls], cwd=tmp_path,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
    try:
        security = Security(tls_ca_file=files["ca"], tls_client_cert=files["cert"], tls_client_key=files["key"])
        with distributed.Client(address, timeout=60, security=security, set_as_default=False) as client:
            client.wait_for_workers(1, timeout=120)
        yield address, env
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_tls_scheduler_with_a_configured_certificate_runs(job, tmp_path, tls_cluster):
    address, env = tls_cluster
    local = subprocess.run([BIN, "blockers", *job, "-q"], capture_output=True, text=True, timeout=120)
    assert local.returncode == 0, local.stderr
    remote = subprocess.run([BIN, "blockers", *job, "-q", "--scheduler", address], capture_output=True, text=True,
                            timeout=120, env=env)
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout == local.stdout
    # tls:// at a plain tcp:// port: one line at once; tcp:// at the tls:// one: no greeting in time
    server = Server(b"\x2a\x00\x00\x00\x00\x00\x00\x00")
    try:
        wrong = f"tls://{server.address[len('tcp://'):]}"
        code, lines, took = run([BIN, "blockers", *job, "--scheduler", wrong], env=env)
    finally:
        server.close()
    assert code == 1
    one_line(lines, wrong, "does not answer as a Dask scheduler")
    assert took < SLACK
    plain = "tcp://" + address[len("tls://"):]
    code, lines, took = run([BIN, "blockers", *job, "--scheduler", plain], env={"STREAMTRACE_DASK_CONNECT_TIMEOUT": "1"})
    assert code == 1
    one_line(lines, plain, "does not answer as a Dask scheduler", "1 s")
    assert 1 <= took < 1 + SLACK

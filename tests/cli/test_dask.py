"""The rank-parallel commands on a Dask cluster (``--scheduler``,
``executor=``): a real ``dask scheduler`` and two ``dask worker`` processes
started here on 127.0.0.1, and a LocalCluster of worker processes.  Every
output equals the local run's byte for byte; failures are one line, exit 1,
nothing written at the output.

``distributed`` is imported unconditionally: it is in the test extra, and a
missing one fails these tests rather than skipping them."""
import contextlib
import filecmp
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib

import distributed
import pytest
import zstandard
from click.testing import CliRunner

import generate_fixture
from streamtrace.chain import generate_collective_report
from streamtrace.cli import main
from streamtrace.errors import TraceError
from streamtrace.fuse import fuse
from streamtrace.io.ranks import resolve_inputs
from streamtrace.parallel.dask import DaskExecutor, items_per_task

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")
DASK = os.path.join(os.path.dirname(sys.executable), "dask")
RANKS = 4


def invoke(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def run(*args, env=None):
    """The command in a subprocess (the real entry point, pipes and exit code)."""
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A ``dask scheduler`` and ``workers`` ``dask worker`` processes on
    127.0.0.1, one thread each (``nanny`` False: a killed worker stays dead)."""

    def __init__(self, directory, workers=2, nanny=True, env=None):
        self.env = {**os.environ, **(env or {})}
        port = free_port()
        self.address = f"tcp://127.0.0.1:{port}"
        self.procs = []
        common = ["--no-dashboard"]
        self.scheduler = self._start([DASK, "scheduler", "--host", "127.0.0.1", "--port", str(port), *common],
                                     directory)
        self.workers = [self._start([DASK, "worker", self.address, "--host", "127.0.0.1", "--nthreads", "1",
                                     "--name", f"w{i}", "--local-directory", str(directory), *common,
                                     *([] if nanny else ["--no-nanny"])], directory)
                        for i in range(workers)]
        with distributed.Client(self.address, timeout=60, set_as_default=False) as client:
            client.wait_for_workers(workers, timeout=120)

    def _start(self, argv, directory):
        proc = subprocess.Popen(argv, cwd=directory, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True, env=self.env)
        self.procs.append(proc)
        return proc

    def close(self):
        # killed: nothing of theirs needs keeping, and a worker's graceful
        # close waits for a scheduler that is closing too
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("dask_job")
    truth = generate_fixture.generate(str(d), ranks=RANKS, steps=2, tp=2, slow_kernel_rank=2, seed=5)
    return str(d), truth


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("dask_cluster"))
    yield c
    c.close()


def same_files(a, b):
    names = sorted(os.listdir(a))
    assert names == sorted(os.listdir(b)) and names
    _, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    assert not mismatch and not errors, mismatch


def report_args(job, out, *extra):
    return ["collective-report", "--trace_dir", job[0], "--world_size", RANKS, "--output_csvs_dir", out, "-q", *extra]


@pytest.mark.parametrize("blocking", [False, True], ids=["report", "blocking_analysis"])
def test_collective_report_on_a_scheduler_equals_the_local_run(job, cluster, tmp_path, blocking):
    extra = ["--blocking_analysis"] if blocking else []
    local = invoke(*report_args(job, tmp_path / "local", *extra))
    assert local.exit_code == 0, local.output
    remote = invoke(*report_args(job, tmp_path / "remote", "--scheduler", cluster.address, *extra))
    assert remote.exit_code == 0, remote.output
    same_files(tmp_path / "local", tmp_path / "remote")
    # the real command, the address from Dask's own environment variable
    proc = run(*report_args(job, tmp_path / "auto", "--scheduler", "auto", *extra),
               env={"DASK_SCHEDULER_ADDRESS": cluster.address})
    assert proc.returncode == 0, proc.stderr
    same_files(tmp_path / "local", tmp_path / "auto")


def test_blockers_on_a_scheduler_equals_the_local_run(job, cluster):
    d, truth = job
    local = invoke("blockers", d, "-q")
    assert local.exit_code == 0, local.output
    assert local.output.splitlines()[1].startswith(f"Straggler: rank {truth['slow_kernel']['rank']} ")
    remote = invoke("blockers", d, "-q", "--scheduler", cluster.address)
    assert remote.exit_code == 0, remote.output
    assert remote.output == local.output
    proc = run("blockers", d, "-q", "--scheduler", cluster.address)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == local.output


def test_extract_on_a_scheduler_equals_the_local_run(job, cluster, tmp_path):
    d, _ = job
    local = invoke("extract", "--trace_dir", d, "--world_size", RANKS, "-o", tmp_path / "local.stev", "-q")
    assert local.exit_code == 0, local.output
    remote = invoke("extract", "--trace_dir", d, "--world_size", RANKS, "-o", tmp_path / "remote.stev", "-q",
                    "--scheduler", cluster.address)
    assert remote.exit_code == 0, remote.output
    assert filecmp.cmp(tmp_path / "local.stev", tmp_path / "remote.stev", shallow=False)
    # into a pipe, read by the next stage
    piped = subprocess.run(["bash", "-c", f"set -o pipefail; '{BIN}' extract --trace_dir '{d}' --world_size {RANKS} "
                                          f"--scheduler {cluster.address} -q | cat > '{tmp_path / 'piped.stev'}'"],
                           capture_output=True, text=True, timeout=300)
    assert piped.returncode == 0, piped.stderr
    assert filecmp.cmp(tmp_path / "local.stev", tmp_path / "piped.stev", shallow=False)


def _fused_text(path):
    """A fused file's JSON text, decompressed (gzip: one member), its run time zeroed."""
    data = open(path, "rb").read()
    if str(path).endswith(".gz"):
        z = zlib.decompressobj(31)
        data = z.decompress(data)
        assert z.eof and not z.unused_data   # one gzip member
    elif str(path).endswith(".zst"):
        data = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True).read()
    text = data.decode()
    json.loads(text)
    return re.sub(r'"seconds":[0-9.e+-]+', '"seconds":0', text)


@pytest.mark.parametrize("suffix", [".json", ".json.gz", ".json.zst"])
def test_fuse_on_a_scheduler_equals_the_local_run(job, cluster, tmp_path, suffix):
    d, _ = job
    args = ["fuse", "--trace_dir", d, "--world_size", RANKS, "-q", "--cat", "kernel,cpu_op,gpu_user_annotation"]
    local = invoke(*args, "-o", tmp_path / f"local{suffix}")
    assert local.exit_code == 0, local.output
    remote = invoke(*args, "-o", tmp_path / f"remote{suffix}", "--scheduler", cluster.address)
    assert remote.exit_code == 0, remote.output
    assert _fused_text(tmp_path / f"remote{suffix}") == _fused_text(tmp_path / f"local{suffix}")


def test_python_api_takes_a_distributed_client(job, cluster, tmp_path):
    d, _ = job
    local = generate_collective_report(trace_dir=d, world_size=RANKS, blocking_analysis=True)
    fuse(resolve_inputs(trace_dir=d, world_size=RANKS), str(tmp_path / "local.json"), time_base=True)
    with distributed.Client(cluster.address, set_as_default=False) as client:
        remote = generate_collective_report(trace_dir=d, world_size=RANKS, blocking_analysis=True, executor=client)
        fuse(resolve_inputs(trace_dir=d, world_size=RANKS), str(tmp_path / "remote.json"), time_base=True,
             executor=client)
        assert client.status == "running"   # the caller's client: left open
    assert _fused_text(tmp_path / "remote.json") == _fused_text(tmp_path / "local.json")
    assert list(local) == list(remote)
    for name in local:
        assert local[name].equals(remote[name]), name


def test_map_runs_many_items_per_task_in_item_order_and_raises_the_first_failure(cluster):
    with distributed.Client(cluster.address, set_as_default=False) as client:
        executor = DaskExecutor(client)
        items = [str(i) for i in range(200)]
        assert items_per_task(len(items), executor.workers) > 1
        assert list(executor.map(int, items, finish=abs)) == list(range(200))
        items[37], items[150] = "first bad", "second bad"
        with pytest.raises(ValueError, match="first bad"):
            list(executor.map(int, items))
        # a result per task, one task per item: for results the size of a rank's events
        assert list(executor.map(int, items[:30], fetch_ahead=1)) == list(range(30))


def test_local_cluster_of_worker_processes_equals_the_local_run(job, tmp_path):
    local = invoke(*report_args(job, tmp_path / "local", "--blocking_analysis"))
    assert local.exit_code == 0, local.output
    proc = run(*report_args(job, tmp_path / "cluster", "--blocking_analysis", "--scheduler", "local", "-j", 2))
    assert proc.returncode == 0, proc.stderr
    same_files(tmp_path / "local", tmp_path / "cluster")


def _truncated_copy(job, tmp_path):
    """The job's traces with rank 1 cut short (a TraceError under --strict)."""
    d = tmp_path / "cut"
    shutil.copytree(job[0], d)
    path = d / job[1]["files"]["1"]
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return d, str(path)


def test_a_workers_error_comes_back_as_the_same_one_line(job, cluster, tmp_path):
    d, cut = _truncated_copy(job, tmp_path)
    args = ["collective-report", "--trace_dir", d, "--world_size", RANKS, "--strict", "-q"]
    local = run(*args, "--output_csvs_dir", tmp_path / "local")
    remote = run(*args, "--output_csvs_dir", tmp_path / "remote", "--scheduler", cluster.address)
    assert local.returncode == remote.returncode == 1
    assert remote.stderr == local.stderr and len(remote.stderr.splitlines()) == 1
    assert cut in remote.stderr and "Traceback" not in remote.stderr
    assert not os.path.exists(tmp_path / "remote")
    # the API raises the worker's exception as itself
    with distributed.Client(cluster.address, set_as_default=False) as client:
        with pytest.raises(TraceError) as err:
            generate_collective_report(trace_dir=str(d), world_size=RANKS, strict=True, executor=client)
    assert err.value.path == cut


def test_scheduler_unreachable_is_one_line_and_writes_nothing(job, tmp_path):
    address = f"tcp://127.0.0.1:{free_port()}"   # nothing listens there
    for args, out in ((report_args(job, tmp_path / "csvs"), tmp_path / "csvs"),
                      (["extract", "--trace_dir", job[0], "--world_size", RANKS, "-o", tmp_path / "x.stev"],
                       tmp_path / "x.stev")):
        proc = run(*args, "--scheduler", address)
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and address in lines[0] and "Dask scheduler" in lines[0], proc.stderr
        assert not os.path.exists(out)
        assert not [f for f in os.listdir(tmp_path) if f.startswith(".")], os.listdir(tmp_path)
    res = invoke("blockers", job[0], "--html", tmp_path / "b.html", "--scheduler", address)
    assert res.exit_code == 1 and address in res.output and len(res.output.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "b.html")
    # no event-loop thread of a failed Client left in this process (it could no longer fork safely)
    assert [t.name for t in threading.enumerate()] == [threading.main_thread().name]


def test_scheduler_auto_without_a_configured_address_is_one_line(job, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    env["DASK_CONFIG"] = str(tmp_path)   # no config files either
    proc = subprocess.run([BIN, "blockers", job[0], "--scheduler", "auto"], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "Error: --scheduler auto: no scheduler configured (set DASK_SCHEDULER_ADDRESS, or scheduler-address "
        "in a dask config file)"]


def _readers(pids, path):
    """The pids among ``pids`` that have ``path`` open."""
    found = []
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == path:
                        found.append(pid)
                        break
    return found


@pytest.mark.parametrize("retries", [3, 0], ids=["rescheduled", "given_up"])
def test_a_worker_killed_mid_run(job, tmp_path, retries):
    """Rank 3's trace is a FIFO: the worker that takes it blocks reading it
    and is killed there.  Dask runs the rank again on the other worker (which
    this test then feeds the trace): the output is the local run's.  With no
    retries allowed (the scheduler's ``allowed-failures``), one line naming
    the scheduler, exit 1, and no output."""
    d, truth = job
    paths = [os.path.join(d, truth["files"][str(r)]) for r in range(RANKS)]
    local = invoke("collective-report", *paths, "--output_csvs_dir", tmp_path / "local", "-q", "--blocking_analysis")
    assert local.exit_code == 0, local.output
    fifo = str(tmp_path / "rank3_trace.json")
    os.mkfifo(fifo)
    cluster = Cluster(tmp_path, nanny=False, env={"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": str(retries)})
    try:
        proc = subprocess.Popen([BIN, "collective-report", *paths[:3], fifo, "--output_csvs_dir",
                                 tmp_path / "remote", "-q", "--blocking_analysis", "--scheduler", cluster.address],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        timer = threading.Timer(240, proc.kill)   # a hung run fails, not hangs
        timer.start()
        try:
            with open(fifo, "wb"):   # returns once a worker has opened the FIFO to read it
                readers = []
                for _ in range(100):
                    readers = _readers([w.pid for w in cluster.workers], fifo)
                    if readers:
                        break
                    time.sleep(0.05)
                assert len(readers) == 1
                (killed,) = [w for w in cluster.workers if w.pid == readers[0]]
                os.kill(killed.pid, signal.SIGKILL)
                killed.wait()   # gone, and with it its end of the FIFO
            if retries:
                with open(fifo, "wb") as f:   # the rank run again, on the other worker
                    assert _readers([w.pid for w in cluster.workers if w is not killed], fifo)
                    with open(paths[3], "rb") as src:
                        shutil.copyfileobj(src, f)
            out, err = proc.communicate()
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        cluster.close()
    if retries:
        assert proc.returncode == 0, err
        same_files(tmp_path / "local", tmp_path / "remote")
    else:
        assert proc.returncode == 1
        lines = err.strip().splitlines()
        assert len(lines) == 1 and cluster.address in lines[0] and "died" in lines[0], err
        assert not os.path.exists(tmp_path / "remote")

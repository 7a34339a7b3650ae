"""Resource bounds (issue #24): memory that does not grow with a name's
length, worker counts capped by the work, spills capped by a budget, and
absurd numeric flags refused at once.  Measured in real subprocesses."""
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from streamtrace.cli import main

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")


def invoke(*args, **kwargs):
    return CliRunner().invoke(main, [str(a) for a in args], **kwargs)


def _peak_rss_mb(argv, env=None, address_space=2 << 30):
    """Run ``argv`` from a small Python parent that reports the child's peak
    RSS (ru_maxrss of its only child) in MB; the child's address space is
    capped so a regression fails with an error instead of filling the machine."""
    script = (
        "import resource, subprocess, sys\n"
        f"lim = {address_space}\n"
        "def cap():\n"
        "    resource.setrlimit(resource.RLIMIT_AS, (lim, lim))\n"
        "p = subprocess.run(sys.argv[1:], preexec_fn=cap, capture_output=True)\n"
        "sys.stderr.buffer.write(p.stderr)\n"
        "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)\n")
    proc = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, env=env,
                          timeout=300)
    code, rss = proc.stdout.split()
    return int(code), int(rss), proc.stderr


def test_dump_summary_memory_does_not_grow_with_the_longest_name(tmp_path):
    """20,000 kernels and one kernel name of 50,000 characters: the summary's
    NCCL count once took kernels x longest name x 4 bytes (~4 GB)."""
    n, long_name = 20_000, "k" * 49_990 + "_ncclRing"
    events = [{"ph": "X", "cat": "kernel", "name": long_name if i == 0 else f"kern{i % 7}",
               "pid": 0, "tid": 7, "ts": i * 10, "dur": 5} for i in range(n)]
    events[1]["name"] = "ncclDevKernel_AllReduce"
    trace = tmp_path / "rank0_trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    stream = tmp_path / "s.stev"
    assert invoke("extract", trace, "-o", stream, "-q").exit_code == 0
    code, rss, err = _peak_rss_mb([BIN, "dump", str(stream), "--what", "summary", "--format", "csv"])
    assert code == 0, err
    assert rss < 500, rss
    res = invoke("dump", stream, "--what", "summary", "--format", "csv")
    row = res.output.splitlines()[1].split(",")
    header = res.output.splitlines()[0].split(",")
    got = dict(zip(header, row))
    assert got["kernels"] == str(n) and got["nccl_kernels"] == "2"


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    import generate_fixture

    d = tmp_path_factory.mktemp("small_run")
    truth = generate_fixture.generate(str(d), ranks=4, steps=2, seed=3)
    return str(d), truth


@pytest.mark.parametrize("flag,value,exit_code,message", [
    ("--window", "1e400:1e500", 1, "out of range"),
    ("--window", "-1e400:", 1, "out of range"),
    ("--window", ":1e999999999", 1, "out of range"),
    ("--ranks", "0-1000000000", 2, "at most"),
    ("--ranks", "0-99999999999999999999999", 2, "at most"),
])
def test_fuse_absurd_window_or_ranks_fail_at_once_in_one_line(small_run, tmp_path, flag, value, exit_code, message):
    """Once a traceback after 28 s and 2.3 GB (--ranks) or an overflow (--window)."""
    d, _ = small_run
    out = tmp_path / "fused.json"
    code, rss, err = _peak_rss_mb([BIN, "fuse", "--trace_dir", d, "--world_size", "4", flag, value,
                                   "-o", str(out)], address_space=1 << 30)
    assert code == exit_code, err
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in err, err
    if exit_code == 1:
        assert len(err.strip().splitlines()) == 1, err
    assert rss < 300, rss
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".streamtrace")]
    res = invoke("fuse", "--trace_dir", d, "--world_size", 4, flag, value, "-o", out)
    assert res.exit_code == exit_code and message in res.output


def _children(pid):
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry))
    return out


def test_extract_jobs_are_capped_by_ranks_and_cpus(small_run, tmp_path):
    """``extract -j 40`` on 4 ranks once forked 40 processes.  Observed by
    counting the children while the last rank (a FIFO) is being read: the
    pool is complete by then."""
    import errno
    import signal
    import time

    from streamtrace.parallel.cpus import available_cpus

    d, truth = small_run
    run = tmp_path / "run"
    run.mkdir()
    for r in range(3):
        os.symlink(os.path.join(d, truth["files"][str(r)]), run / f"rank{r}_trace.json")
    fifo = run / "rank3_trace.json"
    os.mkfifo(fifo)
    proc = subprocess.Popen([BIN, "extract", *[str(run / f"rank{r}_trace.json") for r in range(4)], "-j", "40",
                             "-q", "-o", str(tmp_path / "x.stev")], stderr=subprocess.PIPE, process_group=0)
    deadline = time.monotonic() + 60
    while True:   # opening the write end succeeds once a worker has opened the FIFO to read it
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:
            assert exc.errno == errno.ENXIO and proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.02)
    try:
        workers = _children(proc.pid)
        assert len(workers) <= min(4, available_cpus()), workers
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        os.close(fd)


def test_worker_count():
    from streamtrace.parallel.executor import worker_count
    from streamtrace.parallel.cpus import available_cpus

    cpus = available_cpus()
    assert worker_count(100_000, 4) == min(4, cpus)
    assert worker_count(2, 1) == 1
    assert worker_count(1, 50) == 1
    assert worker_count(100_000, 10_000) == cpus


@pytest.fixture(scope="module")
def bomb(tmp_path_factory):
    import hostile

    d = tmp_path_factory.mktemp("bomb")
    path = d / "rank0_trace.json.gz"
    path.write_bytes(hostile.x_event_bomb(600_000))   # > 2 runs of 2^18 intervals
    return path


def test_fuse_spill_stops_at_its_limit_naming_the_folder(bomb, tmp_path):
    spill = tmp_path / "spill"
    spill.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, TMPDIR=str(spill), STREAMTRACE_SPILL_LIMIT="1M")
    proc = subprocess.run([BIN, "fuse", str(bomb), "-o", str(out / "f.json"), "-q"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and str(spill) in proc.stderr, proc.stderr
    assert "STREAMTRACE_SPILL_LIMIT" in proc.stderr
    assert os.listdir(spill) == [] and os.listdir(out) == []
    # a bad limit is one line too
    env["STREAMTRACE_SPILL_LIMIT"] = "lots"
    proc = subprocess.run([BIN, "fuse", str(bomb), "-o", str(out / "f.json")], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 1 and "STREAMTRACE_SPILL_LIMIT" in proc.stderr and "Traceback" not in proc.stderr
    # within a generous limit it fuses
    env["STREAMTRACE_SPILL_LIMIT"] = "1G"
    proc = subprocess.run([BIN, "fuse", str(bomb), "-o", str(out / "f.json"), "-q"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert os.listdir(spill) == []


def test_fuse_spill_refuses_a_folder_without_room(bomb, tmp_path, monkeypatch):
    """A full spill folder is found before the run is written, and named."""
    import shutil
    import sys
    import tempfile
    from collections import namedtuple

    from streamtrace.errors import StreamtraceError
    from streamtrace.fuse import fuse


    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setenv("TMPDIR", str(spill))
    monkeypatch.setattr(tempfile, "tempdir", None)   # TMPDIR is read again
    usage = namedtuple("usage", "total used free")
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda p: usage(100 << 20, 90 << 20, 10 << 20) if str(p) == str(spill) else real(p))
    with pytest.raises(StreamtraceError) as err:
        fuse([str(bomb)], str(tmp_path / "f.json"))
    assert str(spill) in str(err.value) and "free" in str(err.value)
    assert os.listdir(spill) == [] and not (tmp_path / "f.json").exists()


def test_fuse_refuses_a_plain_output_that_cannot_fit(bomb, tmp_path, monkeypatch):
    """600,000 kept events need at least 24 MB: a target folder with 1 MiB
    free is refused after the scan, before anything is written."""
    import shutil
    from collections import namedtuple

    from streamtrace.errors import StreamtraceError
    from streamtrace.fuse import fuse

    out = tmp_path / "out"
    out.mkdir()
    usage = namedtuple("usage", "total used free")
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda p: usage(100 << 20, 99 << 20, 1 << 20) if str(p) == str(out) else real(p))
    with pytest.raises(StreamtraceError) as err:
        fuse([str(bomb)], str(out / "f.json"))
    assert str(out) in str(err.value) and "free" in str(err.value)
    assert os.listdir(out) == []

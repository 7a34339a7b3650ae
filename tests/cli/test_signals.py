"""SIGTERM, SIGINT and SIGHUP (issue #24): every command ends its workers,
removes its temporary files, leaves no partial output, exits 128 + signum
with one line, and a pipeline it feeds ends too.

Real processes only.  No test assumes a speed: one rank's trace is a FIFO
that the test opens for writing, which succeeds only once the command (or
its worker) has opened it for reading -- the sign of progress -- and then
it gets the head of a trace and is held open, so the command waits there,
mid-work, until the signal comes.  Every wait has a bounded timeout.
"""
import errno
import os
import signal
import subprocess
import sys
import time

import pytest

import generate_fixture

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")
DEADLINE = 60   # seconds for any one wait; a hang fails the test, it never blocks the suite
HEAD = b'{"schemaVersion": 1, "distributedInfo": {"rank": 1, "world_size": 2}, "traceEvents": [\n'


@pytest.fixture(scope="module")
def real_rank(tmp_path_factory):
    """rank 0 of a generated run: a complete trace."""
    d = tmp_path_factory.mktemp("signal_run")
    truth = generate_fixture.generate(str(d), ranks=2, steps=2, seed=4)
    return str(d / truth["files"]["0"])


@pytest.fixture
def run_dir(tmp_path, real_rank):
    """rank0 a real trace, rank1 a FIFO; TMPDIR and an output folder of
    their own, so whatever is left behind is seen."""
    d = tmp_path / "run"
    d.mkdir()
    os.symlink(real_rank, d / "rank0_trace.json")
    os.mkfifo(d / "rank1_trace.json")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    return d, tmp, out


def _feed_fifo_when_opened(fifo, procs):
    """Wait (bounded) until a reader has opened ``fifo``, write a trace's
    head into it and return the write end, held open (the reader then waits
    for more)."""
    end = time.monotonic() + DEADLINE
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO:   # ENXIO: no reader yet
                raise
        for p in procs:
            assert p.poll() is None, f"ended before reading its input: {p.args} {p.stderr.read() if p.stderr else ''}"
        assert time.monotonic() < end, "the command never opened its input"
        time.sleep(0.02)
    os.write(fd, HEAD)
    return fd


def _group_members(pgid):
    """Live (not zombie) processes of process group ``pgid``, read from /proc."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        state, group = fields[0], int(fields[2])
        if group == pgid and state != "Z":
            out.append(int(pid))
    return out


def _wait_group_gone(pgid):
    end = time.monotonic() + DEADLINE
    while _group_members(pgid):
        assert time.monotonic() < end, f"processes of the group survive: {_group_members(pgid)}"
        time.sleep(0.05)


def _inputs(d):
    """The run's two traces by path (--trace_dir takes regular files only)."""
    return [str(d / "rank0_trace.json"), str(d / "rank1_trace.json")]


def _kill_group(pgid):
    """Whatever a failed test left running in its group: killed, never left behind."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _env(tmp):
    return dict(os.environ, TMPDIR=str(tmp))


def _start(argv, tmp, **kwargs):
    return subprocess.Popen(argv, stderr=subprocess.PIPE, env=_env(tmp), **kwargs)


def _check_clean(tmp, out):
    assert os.listdir(tmp) == [], os.listdir(tmp)
    assert os.listdir(out) == [], os.listdir(out)


def _check_interrupted(proc, signum):
    proc.wait(timeout=DEADLINE)
    err = proc.stderr.read().decode()
    assert proc.returncode == 128 + signum, (proc.returncode, err)
    assert err.strip().splitlines()[-1] == f"interrupted by {signal.Signals(signum).name}", err
    assert "Traceback" not in err, err


def _send(proc, signum):
    """SIGINT as a terminal sends it (the whole foreground group), the
    others to the process alone (as timeout, kill and systemd do)."""
    if signum == signal.SIGINT:
        os.killpg(proc.pid, signum)
    else:
        os.kill(proc.pid, signum)


SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]


def _interrupt_while_reading(proc, d, signum):
    """Signal ``proc`` once it is reading rank 1's trace (a FIFO that gets
    the start of a trace and is held open), then check that it ended as a
    signalled command must and that no process of its group is left."""
    fd = None
    try:
        fd = _feed_fifo_when_opened(d / "rank1_trace.json", [proc])
        _send(proc, signum)
        _check_interrupted(proc, signum)
        _wait_group_gone(proc.pid)
    finally:
        if fd is not None:
            os.close(fd)
        _kill_group(proc.pid)


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_signal_to_parallel_extract_into_a_file(run_dir, signum):
    d, tmp, out = run_dir
    proc = _start([BIN, "extract", *_inputs(d), "-j", "2", "-q",
                   "-o", str(out / "run.stev")], tmp, process_group=0)
    _interrupt_while_reading(proc, d, signum)
    _check_clean(tmp, out)


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_signal_to_extract_ends_the_pipeline_it_feeds(run_dir, signum):
    """``extract -j 2 | align -o FILE``: extract is signalled; align sees its
    input end early, says so in one line, and neither leaves anything."""
    d, tmp, out = run_dir
    extract = _start([BIN, "extract", *_inputs(d), "-j", "2", "-q"], tmp,
                     stdout=subprocess.PIPE, process_group=0)
    fd = None
    try:
        align = _start([BIN, "align", "-q", "-o", str(out / "aligned.stev")], tmp, stdin=extract.stdout,
                       process_group=extract.pid)
        extract.stdout.close()   # only align holds the read end
        fd = _feed_fifo_when_opened(d / "rank1_trace.json", [extract, align])
        _send(extract, signum)
        _check_interrupted(extract, signum)
        align.wait(timeout=DEADLINE)
        err = align.stderr.read().decode()
        if signum == signal.SIGINT:   # the group's Ctrl-C reached align too
            assert align.returncode in (1, 128 + signum), err
        else:
            assert align.returncode == 1 and len(err.strip().splitlines()) == 1, err
        assert "Traceback" not in err
        _wait_group_gone(extract.pid)
    finally:
        if fd is not None:
            os.close(fd)
        _kill_group(extract.pid)
    _check_clean(tmp, out)


COMMANDS = {
    "collective-report": ["collective-report", "--output_csvs_dir", "{out}/csvs", "-j", "2"],
    "collective-report-xlsx": ["collective-report", "--output_xlsx_path", "{out}/r.xlsx"],
    "fuse": ["fuse", "-o", "{out}/fused.json.gz", "-j", "2"],
    "blockers": ["blockers", "-j", "2"],
}


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_signal_to_a_trace_reading_command(run_dir, command, signum):
    d, tmp, out = run_dir
    args = [a.format(out=out) for a in COMMANDS[command]]
    proc = _start([BIN, args[0], *_inputs(d), *args[1:], "-q"], tmp, stdout=subprocess.DEVNULL,
                  process_group=0)
    _interrupt_while_reading(proc, d, signum)
    _check_clean(tmp, out)


def test_extract_workers_die_with_a_killed_parent(run_dir):
    """SIGKILL leaves no handler to run: the workers must still end (they
    die with their parent), and a reader of the pipe sees its end."""
    d, tmp, out = run_dir
    extract = _start([BIN, "extract", *_inputs(d), "-j", "2", "-q"], tmp,
                     stdout=subprocess.PIPE, process_group=0)
    try:
        fd = _feed_fifo_when_opened(d / "rank1_trace.json", [extract])
        os.kill(extract.pid, signal.SIGKILL)
        extract.wait(timeout=DEADLINE)
        _wait_group_gone(extract.pid)
        # nobody holds the pipe's write end any more: reading it ends
        extract.stdout.read()
        os.close(fd)
    finally:
        _kill_group(extract.pid)
        extract.stdout.close()


FINALIZER_GETS_THE_SIGNAL = """
import os, signal, sys, time
from streamtrace import cli

class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.{name})
        for _ in range(100000):   # the Python handler runs here, inside __del__
            pass

def main():
    Finalized()   # freed at once: the signal's Interrupted is raised in its __del__
    time.sleep(40)
    print("carried on")

cli.main = main
cli.run()
"""


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_a_stop_signal_that_lands_in_a_finalizer_still_stops_the_command(signum):
    """Python drops an exception raised in a finalizer (it only reports it):
    a stop signal whose handler ran inside one was lost, and the command
    carried on -- under load a report then waited on a blocked reader until
    the clean-up watchdog ended it, 15 s later.  The signal is now delivered
    again where the finalizer returns, and the command stops at once."""
    script = FINALIZER_GETS_THE_SIGNAL.format(name=signal.Signals(signum).name)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=DEADLINE)
    assert time.monotonic() - t0 < 10, proc.stderr   # not the watchdog's 15 s
    assert proc.returncode == 128 + signum, proc.stderr
    assert proc.stderr.strip() == f"interrupted by {signal.Signals(signum).name}"
    assert "carried on" not in proc.stdout

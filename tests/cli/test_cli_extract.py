"""extract and dump through the CLI: CliRunner, and real processes joined by a pipe."""
import csv
import io
import json
import os
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from conftest import needs_real
from streamtrace import read_stream
from streamtrace.cli import main

SAMPLE = (b'{"schemaVersion": 1, "distributedInfo": {"rank": 1, "world_size": 2}, "traceEvents": [\n'
          b'{"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce", "pid": 0, "tid": 7, "ts": 10.5, "dur": 2,'
          b' "args": {"correlation": 5, "grid": [1, 2, 3], "block": [4, 5, 6], "Collective name": "allreduce"}},\n'
          b'{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 9, "tid": 9, "ts": 1, "dur": 3}\n'
          b'], "baseTimeNanoseconds": 1000}')


@pytest.fixture
def traces(tmp_path):
    for r in (0, 1):
        (tmp_path / f"rank{r}_trace.json").write_bytes(SAMPLE.replace(b'"rank": 1', b'"rank": %d' % r))
    return tmp_path


def run(*args, input=None):
    return CliRunner().invoke(main, list(map(str, args)), input=input, catch_exceptions=False)


def test_extract_dir_to_file_then_dump(traces, tmp_path):
    out = tmp_path / "run.stev"
    result = run("extract", "--trace_dir", traces, "--world_size", 2, "-o", out, "-q")
    assert result.exit_code == 0, result.output
    ranks = read_stream(str(out))
    assert sorted(ranks) == [0, 1]
    assert all(len(r.events) == 2 and len(r.kernels) == 1 and len(r.comms) == 1 for r in ranks.values())
    result = run("dump", out, "--what", "kernels", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(result.output)))
    assert [r["rank"] for r in rows] == ["0", "1"] and rows[0]["grid_y"] == "2" and rows[0]["block_z"] == "6"
    result = run("dump", out, "--what", "events", "--rank", 1)
    events = [json.loads(line) for line in result.output.splitlines()]
    assert [e["name"] for e in events] == ["ncclKernel_AllReduce", "aten::mm"]
    assert events[0]["ts"] == 10500 and events[0]["rank"] == 1


def test_dash_aliases_and_pattern(traces, tmp_path):
    out = tmp_path / "p.stev"
    result = run("extract", "--trace-pattern", traces / "rank*_trace.json", "--world-size", 2, "-o", out)
    assert result.exit_code == 0, result.output
    assert sorted(read_stream(str(out))) == [0, 1]


def test_glob_and_rank_regex(traces, tmp_path):
    os.rename(traces / "rank0_trace.json", traces / "worker0_step.pt.trace.json")
    os.rename(traces / "rank1_trace.json", traces / "worker1_step.pt.trace.json")
    out = tmp_path / "g.stev"
    result = run("extract", "--trace_glob", f"{traces}/*.json", "--rank_regex", r"worker(?P<rank>\d+)", "-o", out)
    assert result.exit_code == 0, result.output
    assert sorted(read_stream(str(out))) == [0, 1]


def test_rank_disagreement_warns(traces, tmp_path):
    out = tmp_path / "w.stev"
    result = run("extract", traces / "rank0_trace.json", "--rank", 5, "-o", out)
    assert result.exit_code == 0
    assert "distributedInfo.rank is 0" in result.output
    assert list(read_stream(str(out))) == [5]


def test_missing_rank_is_one_line_error(traces, tmp_path):
    os.remove(traces / "rank1_trace.json")
    out = tmp_path / "m.stev"
    result = run("extract", "--trace_dir", traces, "--world_size", 2, "-o", out)
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "Missing ranks [1]" in result.output
    assert not out.exists()
    result = run("extract", "--trace_dir", traces, "--world_size", 2, "--allow_missing_ranks", "-o", out)
    assert result.exit_code == 0 and list(read_stream(str(out))) == [0]


def test_bad_input_leaves_no_output(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"traceEvents": [{"ph": "X"} {"ph": "X"}]}')
    out = tmp_path / "o.stev"
    result = run("extract", bad, "-o", out)
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: {bad} at byte 29:") and result.output.count("\n") == 1
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".streamtrace")]


def test_bad_input_in_a_parallel_worker_is_one_line(traces, tmp_path):
    """-j: the worker process's TraceError crosses back to the parent intact."""
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"traceEvents": [{"ph": "X"} {"ph": "X"}]}')
    out = tmp_path / "o.stev"
    result = run("extract", "-j", 2, traces / "rank0_trace.json", bad, "-o", out)
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: {bad} at byte 29:") and result.output.count("\n") == 1
    assert not out.exists()


def test_usage_errors_exit_2(traces):
    assert run("extract", "--trace_dir", traces, "--world_size", 0).exit_code == 2
    assert run("extract", "--no-such-flag").exit_code == 2
    result = run("extract", "--trace_dir", traces, "--trace_pattern", "x*")
    assert result.exit_code == 1 and "exactly one of" in result.output
    assert run("extract", "--trace_pattern", "nostar", "--world_size", 1).exit_code == 1


def test_dump_rejects_non_stream(traces):
    result = run("dump", traces / "rank0_trace.json")
    assert result.exit_code == 1 and "not a streamtrace event stream" in result.output
    assert "extract" in result.output


def test_incomplete_stream_is_detected(traces, tmp_path):
    out = tmp_path / "x.stev"
    run("extract", traces / "rank0_trace.json", "-o", out)
    data = out.read_bytes()
    (tmp_path / "cut.stev").write_bytes(data[:-40])
    result = run("dump", tmp_path / "cut.stev")
    assert result.exit_code == 1 and ("truncated" in result.output or "incomplete" in result.output)


def test_concatenated_streams(traces, tmp_path):
    a, b = tmp_path / "a.stev", tmp_path / "b.stev"
    run("extract", traces / "rank0_trace.json", "-o", a)
    run("extract", traces / "rank1_trace.json", "-o", b)
    both = tmp_path / "ab.stev"
    both.write_bytes(a.read_bytes() + b.read_bytes())
    assert sorted(read_stream(str(both))) == [0, 1]


def _streamtrace():
    exe = shutil.which("streamtrace", path=os.path.dirname(sys.executable))
    return [exe] if exe else [sys.executable, "-m", "streamtrace.cli"]


def test_real_shell_pipe(traces):
    cmd = " ".join(_streamtrace()) + f" extract --trace_dir {traces} --world_size 2 -j 2 | " + \
        " ".join(_streamtrace()) + " dump --what collectives --format csv"
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert [(r["rank"], r["collective_name"]) for r in rows] == [("0", "allreduce"), ("1", "allreduce")]


def test_pipe_from_stdin(traces):
    data = (traces / "rank0_trace.json").read_bytes()
    proc = subprocess.run(_streamtrace() + ["extract", "-", "--rank", "3"], input=data, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert list(read_stream(proc.stdout)) == [3]


@needs_real
def test_real_set_through_pipe(real_dir):
    cmd = (" ".join(_streamtrace()) + f" extract --trace_glob '{real_dir}/param-dlrm/*.json.gz' "
           "--rank_regex 'worker(?P<rank>\\d+)' --world_size 8 -q | " + " ".join(_streamtrace()) + " dump --what meta")
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    metas = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [m["rank"] for m in metas] == list(range(8))
    assert all(m["trace"]["distributedInfo"]["rank"] == m["rank"] for m in metas)


def test_the_command_exits_fast_with_its_exit_code_and_every_byte_written(traces, tmp_path):
    """The ``streamtrace`` entry point ends with os._exit after the command:
    the exit codes are click's (0, 1 with a one-line error, 2 for usage) and
    everything written to stdout (a pipe here) arrives."""
    import generate_fixture

    generate_fixture.generate(str(tmp_path / "fx"), ranks=2, steps=2, fill_ops=40, seed=1)
    stev = tmp_path / "r.stev"
    assert run("extract", "--trace_dir", tmp_path / "fx", "--world_size", 2, "-o", stev, "-q").exit_code == 0
    version = subprocess.run(_streamtrace() + ["--version"], capture_output=True, text=True, timeout=60)
    assert (version.returncode, version.stdout.strip()) == (0, "streamtrace, version 0.1.0")
    missing = subprocess.run(_streamtrace() + ["extract", str(tmp_path / "nope.json"), "-o", str(tmp_path / "x")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and missing.stderr.strip().count("\n") == 0, missing.stderr
    assert "nope.json" in missing.stderr and not (tmp_path / "x").exists()
    usage = subprocess.run(_streamtrace() + ["extract", "--no-such-flag"], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2
    dumped = subprocess.run(_streamtrace() + ["dump", str(stev), "--what", "events", "--format", "csv"],
                            capture_output=True, text=True, timeout=60)
    assert dumped.returncode == 0, dumped.stderr
    assert dumped.stdout == run("dump", stev, "--what", "events", "--format", "csv").output
    assert len(dumped.stdout) > 1 << 16   # past a pipe's buffer

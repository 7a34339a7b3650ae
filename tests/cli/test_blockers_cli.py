"""``streamtrace blockers``: the short answer recovers the injected truth, is
the same whatever stage its input is at (traces, their directory, a stream
after extract, align or correlate, stdin), and bad input fails in one line."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import generate_fixture
from streamtrace.cli import main

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")


@pytest.fixture(scope="module")
def slow_run(tmp_path_factory):
    """A slow compute kernel on rank 2 (3x its duration elsewhere), with the
    streams of every stage made from its traces."""
    d = tmp_path_factory.mktemp("blockers")
    truth = generate_fixture.generate(str(d), ranks=4, steps=3, slow_kernel_rank=2, slow_kernel_factor=3.0, seed=5)
    streams = tmp_path_factory.mktemp("blockers_streams")
    stages = {"extracted": ["extract", "--trace_dir", str(d), "--world_size", "4"], "aligned": ["align"],
              "correlated": ["correlate"]}
    previous = None
    for name, args in stages.items():
        out = streams / f"{name}.stev"
        res = invoke(*args, *([previous] if previous else []), "-o", out, "-q")
        assert res.exit_code == 0, res.output
        previous = out
    traces = [str(d / truth["files"][str(r)]) for r in range(4)]
    return truth, str(d), traces, {name: str(streams / f"{name}.stev") for name in stages}


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_blockers_names_the_injected_slow_kernel_and_its_rank(slow_run):
    truth, _, traces, _ = slow_run
    sk = truth["slow_kernel"]
    res = invoke("blockers", *traces, "-q")
    assert res.exit_code == 0, res.output
    confidence, *lines = res.output.splitlines()
    assert confidence.startswith("Confidence: high (4 of 4 ranks; ")   # a clean run: no caveat lines
    assert lines[0].startswith(f"Straggler: rank {sk['rank']} ")
    assert lines[1].startswith("Dominant cause of waiting: GPU backlog")
    assert lines[2] == "Top blocking kernels:"
    top = lines[3]
    grid, block = ("[" + ",".join(map(str, sk[k])) + "]" for k in ("grid", "block"))
    assert f"{sk['kernel_name']} grid {grid} block {block}" in top and f"rank {sk['rank']}," in top
    excess = float(re.search(r"excess ([0-9.]+) us", top).group(1))
    assert excess == pytest.approx(np.mean([i["excess_us"] for i in sk["instances"]]), rel=0.05)
    # the three lateness parts named on the cause line add up to the total it gives
    total = float(re.search(r"\(([0-9.]+) of ([0-9.]+) us", lines[1]).group(2))
    parts = [float(x) for x in re.findall(r"([0-9.]+) us", lines[1].split(")", 1)[1])]
    assert sum(parts) + float(re.search(r"\(([0-9.]+) of", lines[1]).group(1)) == pytest.approx(total, abs=0.2)
    assert any(line.startswith("Top contention pairs") for line in lines)


def test_blockers_says_the_same_at_every_stage_of_its_input(slow_run):
    _, directory, traces, streams = slow_run
    want = invoke("blockers", *traces, "--top", 3, "-q")
    assert want.exit_code == 0, want.output
    for inputs in ([directory], [streams["extracted"]], [streams["aligned"]], [streams["correlated"]]):
        got = invoke("blockers", *inputs, "--top", 3, "-q")
        assert got.exit_code == 0, got.output
        assert got.output == want.output, inputs
    # through a real pipe: the stream on stdin
    piped = subprocess.run(["bash", "-c", f"set -o pipefail; '{BIN}' extract --trace_dir '{directory}' "
                                          f"--world_size 4 | '{BIN}' align | '{BIN}' blockers --top 3 -q"],
                           capture_output=True, text=True, timeout=180)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == want.output


def test_blockers_refuses_bad_input_in_one_line(slow_run, tmp_path):
    _, directory, traces, streams = slow_run
    junk = tmp_path / "notes.json"
    junk.write_text('{"hello": "world"}')
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = (([str(junk)], "notes.json"),
             ([streams["aligned"], traces[0]], "either event streams or trace files"),
             ([directory, traces[0]], "must be the only input"),
             ([str(empty)], "no trace files"),
             ([str(tmp_path / "nope.json")], "nope.json"))
    for inputs, message in cases:
        proc = subprocess.run([BIN, "blockers", *inputs], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1, (inputs, proc.stderr)
        assert proc.stderr.strip().count("\n") == 0 and message in proc.stderr, (inputs, proc.stderr)
        assert proc.stdout == ""
    res = invoke("blockers", traces[0], "--top", 0)
    assert res.exit_code == 2 and "--top" in res.output


def test_blockers_on_stdin_leaves_no_spool_file(slow_run, tmp_path):
    """stdin is spooled to a temporary file so it can be read twice; that
    file goes away when the command ends, whether it succeeded or failed."""
    _, _, _, streams = slow_run
    spool_dir = tmp_path / "tmp"
    spool_dir.mkdir()
    env = dict(os.environ, TMPDIR=str(spool_dir))
    with open(streams["aligned"], "rb") as stdin:
        proc = subprocess.run([BIN, "blockers", "-q"], stdin=stdin, capture_output=True, env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1].startswith(b"Straggler: rank 2 ")
    assert os.listdir(spool_dir) == []
    # a stream cut short on stdin: an error, and still nothing left behind
    cut = tmp_path / "cut.stev"
    cut.write_bytes(open(streams["aligned"], "rb").read()[:5000])
    with open(cut, "rb") as stdin:
        proc = subprocess.run([BIN, "blockers", "-q"], stdin=stdin, capture_output=True, env=env, timeout=180)
    assert proc.returncode == 1 and proc.stderr.count(b"\n") == 1, proc.stderr
    assert os.listdir(spool_dir) == []

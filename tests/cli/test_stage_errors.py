"""The stream-reading commands (align, correlate, report, dump) on bad input:
a trace where a stream is expected, a stream cut short, a missing file, a
directory, empty stdin.  Each gives one line naming the input and the
problem, exits 1 and leaves no output file behind; in a real shell pipe too."""
import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

import generate_fixture
from streamtrace.cli import main

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")

# each command with the output it would write, as a path under the test's directory
COMMANDS = {"align": ("-o", "out.stev"), "correlate": ("-o", "out.stev"), "report": ("-o", "out.xlsx"),
            "dump": ()}


@pytest.fixture(scope="module")
def run_set(tmp_path_factory):
    """Two ranks' traces, and their aligned stream whole and cut short."""
    d = tmp_path_factory.mktemp("stage_errors")
    generate_fixture.generate(str(d / "traces"), ranks=2, steps=2, seed=3)
    aligned = d / "aligned.stev"
    res = CliRunner().invoke(main, ["extract", "--trace_dir", str(d / "traces"), "--world_size", "2", "-q",
                                    "-o", str(d / "extracted.stev")])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["align", str(d / "extracted.stev"), "-q", "-o", str(aligned)])
    assert res.exit_code == 0, res.output
    data = aligned.read_bytes()
    (d / "cut_inside.stev").write_bytes(data[:len(data) - 100])   # inside the last frames
    (d / "no_end.stev").write_bytes(data[:len(data) // 2])
    (d / "a_directory").mkdir()
    return d


BAD = {  # input name -> what the one line must say after the name (a problem in the bytes names their offset)
    "traces/rank0_trace.json": " at byte 0: not a streamtrace event stream",
    "cut_inside.stev": r" at byte \d+: truncated stream",
    "missing.stev": ": cannot open: No such file or directory",
    "a_directory": ": cannot open: Is a directory",
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("name", list(BAD))
def test_bad_stream_is_one_line_and_leaves_no_output(run_set, tmp_path, command, name):
    out = [str(tmp_path / a) if a.startswith("out") else a for a in COMMANDS[command]]
    res = CliRunner().invoke(main, [command, str(run_set / name), *out])
    assert res.exit_code == 1
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and re.match(f"Error: {re.escape(str(run_set / name))}{BAD[name]}", lines[0]), lines
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("command", list(COMMANDS))
def test_empty_stdin_and_a_stream_without_its_end(run_set, tmp_path, command):
    out = [str(tmp_path / a) if a.startswith("out") else a for a in COMMANDS[command]]
    res = CliRunner().invoke(main, [command, *out], input=b"")
    assert res.exit_code == 1
    assert res.output.strip() == "Error: <stdin>: empty input: expected a streamtrace event stream"
    res = CliRunner().invoke(main, [command, str(run_set / "no_end.stev"), *out])
    assert res.exit_code == 1 and len(res.output.strip().splitlines()) == 1
    assert res.output.startswith(f"Error: {run_set / 'no_end.stev'} at byte ")
    assert "truncated" in res.output or "incomplete stream" in res.output
    assert os.listdir(tmp_path) == []


def test_the_good_stream_passes(run_set, tmp_path):
    """The same commands on the whole stream succeed (the failures above are the input's)."""
    for command, out in COMMANDS.items():
        args = [str(tmp_path / a) if a.startswith("out") else a for a in out]
        res = CliRunner().invoke(main, [command, str(run_set / "aligned.stev"), "-q" if out else "--what=meta", *args])
        assert res.exit_code == 0, (command, res.output)
    assert sorted(os.listdir(tmp_path)) == ["out.stev", "out.xlsx"]


@pytest.mark.skipif(not os.path.exists(BIN), reason="the streamtrace script is not installed beside this python")
def test_a_pipe_cut_short_fails_downstream_without_output(run_set, tmp_path):
    """extract | (first bytes only) | align | correlate -o: the cut is seen,
    every later stage fails, and correlate's output file is never made."""
    out = tmp_path / "analysed.stev"
    cmd = (f"{BIN} extract --trace_dir {run_set / 'traces'} --world_size 2 -q | head -c 20000 | "
           f"{BIN} align -q | {BIN} correlate -q -o {out}")
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    assert errors and errors[0].startswith("Error: <stdin>") and "Traceback" not in proc.stderr
    assert not out.exists() and os.listdir(tmp_path) == []


@pytest.mark.parametrize("command", ["align", "correlate", "report"])
def test_an_output_that_cannot_be_written_is_one_line(run_set, tmp_path, command):
    """A directory where the output file should go, and (where the machine has
    one) a directory nobody may create files in: refused in one line."""
    target = tmp_path / "taken"
    target.mkdir()
    res = CliRunner().invoke(main, [command, str(run_set / "aligned.stev"), "-q", "-o", str(target)])
    # report's -o is declared a file, so click refuses it as a usage error (exit 2):
    last = res.output.strip().splitlines()[-1]
    assert (res.exit_code, len(res.output.strip().splitlines())) in ((1, 1), (2, 4))   # usage, hint, blank, error
    assert str(target) in last and "is a directory" in last
    assert os.listdir(target) == [] and os.listdir(tmp_path) == ["taken"]
    if os.path.isdir("/proc/self"):   # /proc takes no new files, even from root
        res = CliRunner().invoke(main, [command, str(run_set / "aligned.stev"), "-q", "-o", "/proc/streamtrace.out"])
        assert res.exit_code == 1
        assert res.output.strip().splitlines() == [res.output.strip()]
        assert res.output.startswith("Error: /proc/streamtrace.out: cannot write in its directory: ")


@pytest.mark.skipif(not (os.path.exists(BIN) and os.path.exists("/dev/full")), reason="needs the script and /dev/full")
@pytest.mark.parametrize("command", [["align", "-q"], ["correlate", "-q"], ["dump", "--what", "events"]])
def test_a_full_disk_is_one_line(run_set, command):
    with open("/dev/full", "wb") as full:
        proc = subprocess.run([BIN, *command, str(run_set / "aligned.stev")], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "Error: No space left on device"

"""--allow_missing_ranks when no rank's trace exists at all (issue #40 item
11): one line naming the pattern, exit 1, nothing written -- never an empty
report that looks like a run without collectives."""
import os
import subprocess
import sys

import pytest

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")


def _run(*args, cwd=None):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize("command", ["collective-report", "extract"])
def test_pattern_matching_no_file_is_refused(tmp_path, command):
    (tmp_path / "traces").mkdir()
    pattern = tmp_path / "traces" / "rank*_trace.json"
    out = tmp_path / "out"
    flag = ["--output_csvs_dir", out] if command == "collective-report" else ["-o", out]
    proc = _run(command, "--trace_pattern", pattern, "--world_size", 4, "--allow_missing_ranks", *flag)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(pattern) in lines[0] and "no trace" in lines[0], proc.stderr
    assert not out.exists()


def test_glob_whose_ranks_are_all_outside_the_world_is_refused(tmp_path):
    """Files exist, but none is a rank below --world_size: the message says
    so (not that the rank regex failed)."""
    for r in (4, 5):
        (tmp_path / f"rank{r}_trace.json").write_text('{"traceEvents": []}')
    out = tmp_path / "out"
    proc = _run("collective-report", "--trace_glob", tmp_path / "rank*_trace.json", "--world_size", 2,
                "--allow_missing_ranks", "--output_csvs_dir", out)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no trace" in lines[0] and "world size 2" in lines[0], proc.stderr
    assert not out.exists()

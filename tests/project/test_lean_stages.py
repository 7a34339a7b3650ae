"""Import boundary of the stream stages (issue #44 item 4): a stage that
builds no sheet does not import pandas.  Each command runs in a fresh
interpreter through the CLI's entry point; the child reports which heavy
modules it loaded, and a command known to need pandas shows the check can fail."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

HEAVY = ("pandas", "openpyxl", "plotly", "matplotlib", "distributed", "fsspec")
CHILD = (
    "import json, sys\n"
    "from streamtrace.cli import main\n"
    "try:\n"
    "    main(sys.argv[2:], prog_name='streamtrace')\n"
    "except SystemExit as e:\n"
    "    code = e.code\n"
    f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
    "open(sys.argv[1], 'w').write(json.dumps({'code': code, 'heavy': heavy}))\n"
)


@pytest.fixture()
def empty_stream(tmp_path):
    path = tmp_path / "empty.stev"
    subprocess.run([sys.executable, "-c", "import sys\nfrom streamtrace.stream.format import StreamWriter\n"
                    f"StreamWriter(open({str(path)!r}, 'wb')).close()"], check=True, cwd=ROOT, timeout=120)
    return path


def loaded(tmp_path, *args):
    report = tmp_path / "loaded.json"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(report), *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    got = json.loads(report.read_text())
    assert got["code"] in (0, None), proc.stderr
    return got["heavy"]


@pytest.mark.parametrize("what,fmt", [("meta", "jsonl"), ("meta", "csv"), ("summary", "jsonl")])
def test_dump_of_plain_parts_imports_no_pandas(empty_stream, tmp_path, what, fmt):
    assert loaded(tmp_path, "dump", empty_stream, "--what", what, "--format", fmt) == []


def test_the_check_sees_pandas_when_a_command_imports_it(empty_stream, tmp_path):
    assert "pandas" in loaded(tmp_path, "dump", empty_stream, "--what", "meta", "--format", "table")


@pytest.mark.xfail(strict=True, reason="issue #44 item 4 not done: align and correlate still build their "
                                       "TABLE frames as pandas DataFrames")
@pytest.mark.parametrize("stage", ["align", "correlate"])
def test_stream_stages_import_no_pandas(empty_stream, tmp_path, stage):
    assert loaded(tmp_path, stage, empty_stream, "-o", tmp_path / "out.stev") == []

"""`streamtrace whatif` through real processes: the confidence first, then
the top scenarios in words; --scenario, the sheets it writes, inputs as
blockers takes them (traces, a directory, a stream, discovery flags), bad
input as one line; blockers' biggest what-if win."""
import csv
import os
import subprocess
import sys
import zipfile

import pytest

from generate_fixture import generate_counterfactual

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")
STRAGGLER = 2


def _run(*args, **kw):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=180, **kw)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("whatif")
    generate_counterfactual(str(d), ranks=4, steps=3, straggler_rank=STRAGGLER)
    return d


def test_confidence_first_then_the_straggler_in_words(run_dir):
    proc = _run("whatif", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("Confidence: high")
    assert lines[1].startswith("Critical path of 3 steps")
    top = lines[3]
    assert top.strip().startswith(f"rank {STRAGGLER}'s") and "of the" in top and "step:" in top, top
    assert "ms" in top and "%" in top


def test_one_scenario_and_its_sheets(run_dir, tmp_path):
    out = tmp_path / "csvs"
    proc = _run("whatif", str(run_dir), "--scenario", f"rank:{STRAGGLER}", "--output_csvs_dir", str(out))
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(out)) == ["critical_path.csv", "critical_path_summary.csv", "whatif.csv"]
    with open(out / "whatif.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["scenario"] for r in rows] == [f"rank:{STRAGGLER}"] * 3
    for r in rows:
        measured, estimated, saving = (float(r[c]) for c in ("measured_step_us", "estimated_step_us", "saving_us"))
        assert saving == pytest.approx(measured - estimated)
        assert 800 < saving < 1200   # the 1 ms straggler delay per step
    text = [line for line in proc.stdout.splitlines() if "rank:" in line]
    assert len(text) == 1


def test_workbook(run_dir, tmp_path):
    book = tmp_path / "w.xlsx"
    proc = _run("whatif", str(run_dir), "--output_xlsx_path", str(book))
    assert proc.returncode == 0, proc.stderr
    with zipfile.ZipFile(book) as z:
        workbook = z.read("xl/workbook.xml").decode()
    for name in ("whatif", "critical_path", "critical_path_summary"):
        assert f'name="{name}"' in workbook


def test_discovery_flags_and_a_stream_give_the_same_answer(run_dir, tmp_path):
    direct = _run("whatif", str(run_dir))
    found = _run("whatif", "--trace_dir", str(run_dir), "--world_size", "4")
    assert found.returncode == 0, found.stderr
    assert found.stdout == direct.stdout
    stream = tmp_path / "run.stev"
    ex = _run("extract", "--trace_dir", str(run_dir), "--world_size", "4", "-o", str(stream))
    assert ex.returncode == 0, ex.stderr
    streamed = _run("whatif", str(stream))
    assert streamed.returncode == 0, streamed.stderr
    assert streamed.stdout == direct.stdout


@pytest.mark.parametrize("args,words", [
    (["--scenario", "rank:x"], "--scenario 'rank:x': not a scenario"),
    (["--scenario", "kernel:150:foo"], "not a scenario"),
])
def test_a_bad_scenario_is_one_line(run_dir, args, words):
    proc = _run("whatif", str(run_dir), *args)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and words in proc.stderr


def test_a_missing_input_is_one_line(tmp_path):
    proc = _run("whatif", str(tmp_path / "absent"))
    assert proc.returncode == 1
    assert len(proc.stderr.strip().splitlines()) == 1 and "absent" in proc.stderr


def test_blockers_says_the_biggest_what_if_win(run_dir):
    proc = _run("blockers", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    win = [line for line in proc.stdout.splitlines() if line.startswith("Biggest what-if win:")]
    assert len(win) == 1 and f"rank {STRAGGLER}'s" in win[0]


def test_blockers_on_the_clean_run_claims_no_win_worth_naming(run_dir):
    """Without the straggler nothing costs more than a few us: blockers'
    what-if line, if any, says so in numbers (under 1 % of the step)."""
    proc = _run("blockers", str(run_dir / "counterfactual"))
    assert proc.returncode == 0, proc.stderr
    win = [line for line in proc.stdout.splitlines() if line.startswith("Biggest what-if win:")]
    assert not win or win[0].startswith("Biggest what-if win: none worth naming"), win


def test_on_a_dask_scheduler_equals_the_local_run(run_dir, tmp_path):
    """The graph is made in the reduce from the ranks' summaries: on a real
    scheduler and worker on 127.0.0.1 the answer is the local one."""
    from test_dask import Cluster   # distributed imported unconditionally: never a silent skip

    cluster = Cluster(tmp_path, workers=1)
    try:
        remote = _run("whatif", str(run_dir), "-q", "--scheduler", cluster.address)
    finally:
        cluster.close()
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout == _run("whatif", str(run_dir), "-q").stdout

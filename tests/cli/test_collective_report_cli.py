"""The align / report / collective-report commands: TraceLens flags, outputs,
errors, and the real shell pipeline against the one-shot command."""
import filecmp
import os
import shutil
import subprocess
import sys

import openpyxl
import pandas as pd
import pytest
from click.testing import CliRunner

import generate_fixture
from streamtrace.cli import main
from synthtrace import coll_kernel, write_trace

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")


@pytest.fixture(scope="session")
def fx_cli(tmp_path_factory):
    d = tmp_path_factory.mktemp("fx_cli")
    truth = generate_fixture.generate(str(d), ranks=4, steps=2, fill_ops=12, tp=2, straggler_rank=1, seed=21)
    return str(d), truth


@pytest.fixture(scope="session")
def fx_tb(tmp_path_factory):
    """tensorboard-style names (worker<r>_step_12.<ms>.pt.trace.json.gz), old layout, gzip."""
    d = tmp_path_factory.mktemp("fx_tb")
    truth = generate_fixture.generate(str(d), ranks=4, steps=2, fill_ops=12, layout="old", name_style="tb",
                                      format="json.gz", seed=22)
    return str(d), truth


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def read_csvs(d):
    return {f[:-4]: pd.read_csv(os.path.join(d, f)) for f in sorted(os.listdir(d))}


def test_collective_report_tracelens_flags(tmp_path, fx_cli):
    d, truth = fx_cli
    out = tmp_path / "csv"
    res = invoke("collective-report", "--trace_dir", d, "--world_size", 4, "--output_csvs_dir", out,
                 "--agg_metrics", "mean", "max", "--all2allv_heatmap", "--gpus_per_node", 2)
    assert res.exit_code == 0, res.output
    sheets = read_csvs(out)
    assert {"nccl_summary_implicit_sync", "nccl_long", "nccl_all2allv_heatmap", "straggler_summary",
            "data_quality"} <= set(sheets)
    cols = list(sheets["nccl_summary_implicit_sync"].columns)
    assert "comm_latency_mean" in cols and "comm_latency_max" in cols and "comm_latency_median" not in cols
    assert sheets["straggler_summary"]["rank"].iloc[0] == truth["straggler_summary"]["straggler_rank"]
    assert set(sheets["nccl_long"]["node_id"]) == {0, 1}
    assert "wrote" in res.output
    assert not os.path.exists(os.path.join(d, "nccl_analysis_report.xlsx"))  # CSVs only: no default xlsx


def test_agg_metrics_spellings(tmp_path, fx_cli):
    d, _ = fx_cli
    for i, args in enumerate((["--agg_metrics", "min,max"], ["--agg_metrics", "min", "--agg-metrics", "max"])):
        out = tmp_path / f"csv{i}"
        res = invoke("collective-report", "--trace-dir", d, "--world-size", 4, "--output-csvs-dir", out, *args)
        assert res.exit_code == 0, res.output
        cols = list(pd.read_csv(out / "nccl_summary_implicit_sync.csv").columns)
        assert "comm_latency_min" in cols and "comm_latency_max" in cols and "comm_latency_mean" not in cols


def test_default_output_next_to_traces(tmp_path, fx_cli):
    d = tmp_path / "run"
    shutil.copytree(fx_cli[0], d)
    res = invoke("collective-report", "--trace_dir", d, "--world_size", 4, "-q")
    assert res.exit_code == 0, res.output
    wb = openpyxl.load_workbook(d / "nccl_analysis_report.xlsx", read_only=True)
    assert wb.sheetnames[:2] == ["nccl_summary_implicit_sync", "nccl_summary_long"]
    os.unlink(d / "nccl_analysis_report.xlsx")
    res = invoke("collective-report", "--trace_pattern", d / "rank*_trace.json", "--world_size", 4,
                 "--no-detailed_analysis")
    assert res.exit_code == 0, res.output
    wb = openpyxl.load_workbook(d / "nccl_analysis_report.xlsx", read_only=True)
    assert "nccl_long" not in wb.sheetnames and "nccl_implicit_sync" not in wb.sheetnames


def test_trace_glob_with_rank_regex_tensorboard_names(tmp_path, fx_tb):
    d, truth = fx_tb
    out = tmp_path / "r.xlsx"
    res = invoke("collective-report", "--trace_glob", os.path.join(d, "*.pt.trace.json.gz"),
                 "--rank_regex", r"worker(?P<rank>\d+)", "--world_size", 4, "--output_xlsx_path", out)
    assert res.exit_code == 0, res.output
    long = pd.read_excel(out, sheet_name="nccl_long")
    assert sorted(set(long["rank"])) == [0, 1, 2, 3]
    assert long["collective_id"].nunique() == len(truth["collectives"])
    # the default regex does not match these names
    res = invoke("collective-report", "--trace_glob", os.path.join(d, "*.pt.trace.json.gz"), "--world_size", 4,
                 "--output_xlsx_path", tmp_path / "x.xlsx")
    assert res.exit_code == 1 and "none matched --rank_regex" in res.output
    assert not os.path.exists(tmp_path / "x.xlsx")


def test_multiprocessing_flags_give_identical_output(tmp_path, fx_cli):
    d, _ = fx_cli
    a, b = tmp_path / "a", tmp_path / "b"
    c = tmp_path / "c"
    assert invoke("collective-report", "--trace_dir", d, "--world_size", 4, "--output_csvs_dir", a,
                  "-j", 1).exit_code == 0
    res = invoke("collective-report", "--trace_dir", d, "--world_size", 4, "--output_csvs_dir", b,
                 "--use_multiprocessing", "--max_workers", 2)
    assert res.exit_code == 0, res.output
    assert invoke("collective-report", "--trace_dir", d, "--world_size", 4, "--output_csvs_dir", c).exit_code == 0
    assert filecmp.dircmp(a, b).diff_files == []
    assert filecmp.dircmp(a, c).diff_files == []


def test_errors_are_one_line_and_leave_no_output(tmp_path, fx_cli):
    d = tmp_path / "run"
    shutil.copytree(fx_cli[0], d)
    res = invoke("collective-report", "--trace_dir", d, "--world_size", 4, "--gpus_per_node", 0)
    assert res.exit_code == 2
    (d / "rank2_trace.json").write_text('{"traceEvents": [{"ph": "X", "name": ')
    (d / "rank3_trace.json").write_bytes(b"\x00\x01garbage")
    out = tmp_path / "out.xlsx"
    res = invoke("collective-report", "--trace_dir", d, "--world_size", 4, "--output_xlsx_path", out)
    assert res.exit_code == 1
    line = res.output.strip().splitlines()[-1]
    assert line.startswith("Error: ") and "rank3_trace.json" in line and "Traceback" not in res.output
    assert not out.exists() and os.listdir(tmp_path) == ["run"]
    res = invoke("collective-report", "--trace_dir", d, "--world_size", 5, "--output_xlsx_path", out)
    assert res.exit_code == 1 and "Missing ranks" in res.output


def test_strict_mismatch_aborts_without_output(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    write_trace(d / "rank0_trace.json", [coll_kernel("100.0", "20.0", group_size=2)], rank=0, world_size=2)
    write_trace(d / "rank1_trace.json", [coll_kernel("101.0", "19.0", group_size=2, dtype="BFloat16", device=1)],
                rank=1, world_size=2)
    out = tmp_path / "csv"
    res = invoke("collective-report", "--trace_dir", d, "--world_size", 2, "--output_csvs_dir", out, "--strict")
    assert res.exit_code == 1 and "Metadata mismatch in 'dtype'" in res.output and not out.exists()
    res = invoke("collective-report", "--trace_dir", d, "--world_size", 2, "--output_csvs_dir", out)
    assert res.exit_code == 0
    assert bool(pd.read_csv(out / "nccl_implicit_sync.csv")["metadata_mismatch"].iloc[0])


def test_zero_collectives_cli(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    for r in range(2):
        write_trace(d / f"rank{r}_trace.json", [], rank=r, world_size=2)
    res = CliRunner().invoke(main, ["collective-report", "--trace_dir", str(d), "--world_size", "2"])
    assert res.exit_code == 0 and "no collective kernels" in res.output
    assert os.path.exists(d / "nccl_analysis_report.xlsx")


def test_report_command_on_files(tmp_path, fx_cli):
    d, _ = fx_cli
    raw = tmp_path / "raw.stev"
    assert invoke("extract", "--trace_dir", d, "--world_size", 4, "-o", raw).exit_code == 0
    aligned = tmp_path / "aligned.stev"
    assert invoke("align", raw, "-o", aligned).exit_code == 0
    one = tmp_path / "one"
    res = invoke("report", aligned, "--output_csvs_dir", one, "-o", tmp_path / "r.xlsx")
    assert res.exit_code == 0, res.output
    assert os.path.exists(tmp_path / "r.xlsx")
    two = tmp_path / "two"
    res = invoke("report", raw, "--output_csvs_dir", two)  # not aligned yet: report aligns it
    assert res.exit_code == 0, res.output
    assert filecmp.dircmp(one, two).diff_files == []
    res = invoke("report", tmp_path / "r.xlsx")
    assert res.exit_code == 1 and "not a streamtrace event stream" in res.output


def _same_dirs(a, b):
    names = sorted(os.listdir(a))
    assert names == sorted(os.listdir(b)) and "nccl_long.csv" in names
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes(), n


def test_shell_pipeline_equals_one_shot(tmp_path, fx_cli):
    d, _ = fx_cli

    def sh(cmd):
        return subprocess.run(["bash", "-c", "set -o pipefail; " + cmd], capture_output=True, text=True, timeout=180)

    # the full chain (with correlate's blocking sheets) against the one-shot with --blocking_analysis
    pipe, one = tmp_path / "pipe", tmp_path / "one"
    r = sh(f"'{BIN}' extract --trace_dir '{d}' --world_size 4 | '{BIN}' align | '{BIN}' correlate "
           f"| '{BIN}' report --output_csvs_dir '{pipe}' --all2allv_heatmap -q")
    assert r.returncode == 0, r.stderr
    r = subprocess.run([BIN, "collective-report", "--trace_dir", d, "--world_size", "4", "--output_csvs_dir",
                        str(one), "--all2allv_heatmap", "--blocking_analysis", "-q"],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    _same_dirs(one, pipe)
    # extract | align | report against the one-shot default (no correlate stage)
    pipe2, one2 = tmp_path / "pipe2", tmp_path / "one2"
    r = sh(f"'{BIN}' extract --trace_dir '{d}' --world_size 4 | '{BIN}' align "
           f"| '{BIN}' report --output_csvs_dir '{pipe2}' --all2allv_heatmap -q")
    assert r.returncode == 0, r.stderr
    r = subprocess.run([BIN, "collective-report", "--trace_dir", d, "--world_size", "4", "--output_csvs_dir",
                        str(one2), "--all2allv_heatmap", "-q"],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    _same_dirs(one2, pipe2)
    # a failing stage fails the pipeline, and report writes nothing
    bad = tmp_path / "bad"
    r = sh(f"printf 'junk' | '{BIN}' align | '{BIN}' report --output_csvs_dir '{bad}'")
    assert r.returncode == 1 and not bad.exists()
    assert "not a streamtrace event stream" in r.stderr


def test_help_lists_tracelens_flags():
    res = invoke("collective-report", "--help")
    for flag in ("--trace_dir", "--trace_pattern", "--trace_glob", "--rank_regex", "--world_size",
                 "--output_xlsx_path", "--output_csvs_dir", "--detailed_analysis", "--agg_metrics",
                 "--gpus_per_node", "--all2allv_heatmap", "--use_multiprocessing", "--max_workers",
                 "--align_clocks", "--allow_missing_ranks", "--strict", "-j"):
        assert flag in res.output, flag

"""streamtrace.tracelens and the collective-report command against TraceLens's
documented behaviour (issue #30): a TraceLens user changes one import and
gets the same sheets, columns, numbers, files, labels and exceptions.

Expected values come from the fixture generator's truth.json (A5 formulas
applied to the times it wrote) and from TraceLens's documented API (its
signatures, defaults, messages and exception classes), never from what the
code under test prints."""
import glob
import gzip
import inspect
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import generate_fixture
import streamtrace
from conftest import ROOT, SHARED_REAL, needs_real
from streamtrace import tracelens
from streamtrace.cli import main as cli_main
from streamtrace.errors import StreamtraceError
from test_report import (A2AV, IMPLICIT, LONG, STRAGGLER, SUMMARY_LONG, check_implicit_against_truth,
                         check_straggler_against_truth, summary_implicit_columns)

#: TraceLens's generate_collective_report parameters, in its order, with its defaults
TRACELENS_PARAMS = [
    ("trace_dir", None), ("trace_pattern", None), ("trace_glob", None), ("world_size", None),
    ("output_xlsx_path", None), ("output_csvs_dir", None), ("detailed_analysis", True),
    ("agg_metrics", ["mean", "median", "min", "max"]), ("strict_world_size_check", True),
    ("use_multiprocessing", False), ("max_workers", None), ("rank_regex", r"rank[\[\-_/]?(?P<rank>\d+)"),
    ("gpus_per_node", None), ("all2allv_heatmap", False)]
#: TraceLens's sheets and their first columns (spec A4/A5; streamtrace may add columns after them)
TRACELENS_SHEETS = {"nccl_long": LONG, "nccl_summary_long": SUMMARY_LONG, "nccl_implicit_sync": IMPLICIT,
                    "nccl_all2allv": A2AV, "straggler_summary": STRAGGLER}


def invoke(*args):
    return CliRunner().invoke(cli_main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="session")
def fx_nodes(tmp_path_factory):
    """Two nodes of 4 GPUs whose clocks disagree by ~600 us (node 1 ahead)."""
    d = tmp_path_factory.mktemp("fx_nodes")
    truth = generate_fixture.generate(str(d), ranks=8, steps=2, fill_ops=12, gpus_per_node=4,
                                      clock_offsets_us="0,40,-25,15,650,700,610,680", straggler_rank=2, seed=31)
    return str(d), truth


@pytest.fixture(scope="session")
def fx_small(tmp_path_factory):
    d = tmp_path_factory.mktemp("fx_small")
    truth = generate_fixture.generate(str(d), ranks=4, steps=2, fill_ops=12, seed=32)
    return str(d), truth


def category_rows(sheets, category):
    dq = sheets["data_quality"]
    return dq[dq["category"] == category]


# ---------------------------------------------------------------- item 1: clocks


def test_multi_node_columns_are_tracelens_times_and_the_offsets_are_loud(fx_nodes):
    d, truth = fx_nodes
    assert len({r // 4 for r in range(8)}) == 2
    sheets = tracelens.generate_collective_report(trace_dir=d, world_size=8)
    # skew, waits, earliest arrival, straggler: on the times as written, as TraceLens computes them
    check_implicit_against_truth(sheets, truth)
    check_straggler_against_truth(sheets, truth)
    assert not sheets["clock_alignment"]["applied"].any()
    warn = category_rows(sheets, "clock_offsets_change_results")
    assert len(warn) == 1 and warn["severity"].iloc[0] == "warning"
    assert "--align_clocks" in warn["message"].iloc[0]
    assert sheets["clock_alignment"]["note"].str.contains("CHANGE THE ANSWERS").all()
    # the top-level function and the command give the same numbers by default
    top = streamtrace.generate_collective_report(trace_dir=d, world_size=8)
    pd.testing.assert_frame_equal(top["nccl_implicit_sync"], sheets["nccl_implicit_sync"])


def test_multi_node_command_default_and_aligned_view(tmp_path, fx_nodes):
    d, truth = fx_nodes
    res = invoke("collective-report", "--trace_dir", d, "--world_size", 8, "--output_csvs_dir", tmp_path / "a")
    assert res.exit_code == 0, res.output
    assert "CLOCKS DISAGREE" in res.output and "--align_clocks" in res.output  # said on stderr too
    imp = pd.read_csv(tmp_path / "a" / "nccl_implicit_sync.csv")
    expected = [c["expected"] for c in truth["collectives"] if c["implicit_sync"]]
    assert sorted(imp["skew in start time"]) == pytest.approx(sorted(e["skew_start"] for e in expected), abs=1e-6)
    assert sorted(imp["earliest arrival rank"]) == sorted(e["earliest_arrival_rank"] for e in expected)
    # the aligned view is one flag away: offsets applied, waits on true times
    res = invoke("collective-report", "--trace_dir", d, "--world_size", 8, "--output_csvs_dir", tmp_path / "b",
                 "--align_clocks")
    assert res.exit_code == 0, res.output
    clocks = pd.read_csv(tmp_path / "b" / "clock_alignment.csv")
    assert clocks["applied"].all()
    dq = pd.read_csv(tmp_path / "b" / "data_quality.csv")
    assert "clock_offsets_change_results" not in set(dq["category"])
    # (the TraceLens API has no alignment; streamtrace's function has it)
    sheets = streamtrace.generate_collective_report(trace_dir=d, world_size=8, align_clocks=True)
    check_implicit_against_truth(sheets, truth, true_times=True, tol=5.0)


def test_no_warning_when_clocks_agree(fx_small):
    d, truth = fx_small
    assert not any(truth["clock_offsets_ns"].values())
    sheets = tracelens.generate_collective_report(trace_dir=d, world_size=4)
    assert category_rows(sheets, "clock_offsets_change_results").empty
    assert not sheets["clock_alignment"]["note"].str.contains("CHANGE THE ANSWERS").any()


# ---------------------------------------------------------------- item 2: no file nobody asked for


@pytest.mark.parametrize("fn", [tracelens.generate_collective_report, streamtrace.generate_collective_report],
                         ids=["tracelens", "streamtrace"])
def test_function_without_output_path_writes_nothing(tmp_path, fx_small, fn):
    d = tmp_path / "run"
    shutil.copytree(fx_small[0], d)
    before = sorted(os.listdir(d))
    sheets = fn(trace_dir=str(d), world_size=4)
    assert "nccl_implicit_sync" in sheets
    assert sorted(os.listdir(d)) == before and os.listdir(tmp_path) == ["run"]


def test_command_still_writes_the_default_workbook(tmp_path, fx_small):
    d = tmp_path / "run"
    shutil.copytree(fx_small[0], d)
    res = invoke("collective-report", "--trace_dir", d, "--world_size", 4, "-q")
    assert res.exit_code == 0, res.output
    assert (d / "nccl_analysis_report.xlsx").is_file()


# ---------------------------------------------------------------- item 3: fused labels


def fused_labels(events):
    return {e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}


def test_fused_process_labels_are_tracelens_form(tmp_path, fx_small):
    d, truth = fx_small
    paths = [os.path.join(d, truth["files"][str(r)]) for r in range(4)]
    events = tracelens.TraceFuse(paths).merge()
    labels = fused_labels(events)
    assert {f"RANK {r} - CPU" for r in range(4)} | {f"RANK {r} - GPU" for r in range(4)} <= labels
    # the device stays visible, in the process_labels record
    devices = {e["args"]["labels"] for e in events if e.get("name") == "process_labels"}
    assert {f"GPU {truth['devices'][str(r)]}" for r in range(4)} <= devices
    out = tracelens.TraceFuse({0: paths[0], 2: paths[2]}).merge_and_save(str(tmp_path / "m.json"))
    assert out == str(tmp_path / "m.json") + ".gz"
    with gzip.open(out, "rt") as f:
        doc = json.load(f)
    assert {"RANK 0 - GPU", "RANK 2 - GPU", "RANK 0 - CPU", "RANK 2 - CPU"} <= fused_labels(doc["traceEvents"])


@needs_real
def test_fused_labels_on_a_real_pair():
    paths = sorted(glob.glob(os.path.join(SHARED_REAL, "param-dlrm", "*.json.gz")))[:2]
    assert len(paths) == 2
    fuser = tracelens.TraceFuse(paths)
    events = fuser.merge()
    assert {"RANK 0 - CPU", "RANK 0 - GPU", "RANK 1 - CPU", "RANK 1 - GPU"} <= fused_labels(events)
    by_rank = [[e for e in events if e.get("args", {}).get("rank") == r] for r in (0, 1)]
    pids = [{e["pid"] for e in evs if isinstance(e.get("pid"), int)} for evs in by_rank]
    assert pids[0] and pids[1] and pids[0].isdisjoint(pids[1])


# ---------------------------------------------------------------- item 4: error classes


def _errors_cases(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "rank0_trace.json").write_text('{"traceEvents": []}')
    (d / "trace_rank_0.json").write_text('{"traceEvents": []}')
    (d / "bad.json").write_text("{}")
    return d, [
        (dict(trace_dir=str(d), world_size=None), ValueError, "world_size must be provided"),
        (dict(trace_dir=str(d), trace_glob=str(d / "*.json"), world_size=1), ValueError, "exactly one"),
        (dict(world_size=1), ValueError, "exactly one"),
        (dict(trace_pattern=str(d / "rank_trace.json"), world_size=1), ValueError, r"exactly one '\*'"),
        (dict(trace_pattern=str(d / "trace_rank_*.json"), world_size=2), FileNotFoundError,
         "Expected trace file not found"),
        (dict(trace_dir=str(d), world_size=2), FileNotFoundError, "Expected trace file not found"),
        (dict(trace_glob=str(d / "nothing_*.json"), world_size=1), FileNotFoundError, "No files matched"),
        (dict(trace_glob=str(d / "bad*.json"), world_size=1), ValueError, "none matched"),
        (dict(trace_glob=str(d / "trace_rank_*.json"), world_size=2, strict_world_size_check=False),
         FileNotFoundError, "Missing ranks"),
        (dict(trace_dir=str(d), world_size=1, gpus_per_node=0, strict_world_size_check=False), ValueError,
         "gpus_per_node"),
    ]


def test_tracelens_exceptions(tmp_path):
    d, cases = _errors_cases(tmp_path)
    for kwargs, exc, match in cases:
        with pytest.raises(exc, match=match) as info:
            tracelens.generate_collective_report(**kwargs)
        assert isinstance(info.value, StreamtraceError), kwargs
    assert sorted(os.listdir(d)) == ["bad.json", "rank0_trace.json", "trace_rank_0.json"]  # nothing written


def test_streamtrace_exceptions_are_the_builtins_too(tmp_path):
    """The top-level function raises the same built-in classes where it
    checks the same things (it still reads a directory without world_size)."""
    d, cases = _errors_cases(tmp_path)
    for kwargs, exc, match in cases:
        if kwargs.get("world_size", 1) is None:
            continue
        if "trace_glob" in kwargs and kwargs.get("strict_world_size_check") is False:
            continue  # streamtrace: analyses the ranks present
        with pytest.raises(exc, match=match):
            streamtrace.generate_collective_report(**kwargs)


def test_directory_without_rank_files_is_not_scanned(tmp_path, fx_small):
    """TraceLens wants rank{i}_trace.json in trace_dir; other traces there
    (a temp folder's, say) are not read in their place."""
    d, truth = fx_small
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(os.path.join(d, truth["files"]["0"]), other / "some_trace.json")
    with pytest.raises(FileNotFoundError, match="Expected trace file not found"):
        tracelens.generate_collective_report(trace_dir=str(other), world_size=1)
    with pytest.raises(FileNotFoundError, match="Expected trace file not found"):
        tracelens.generate_collective_report(trace_dir=str(other), world_size=1, strict_world_size_check=False)


def test_glob_resolution_helper(tmp_path):
    for r in (1, 0):
        (tmp_path / f"trace_rank_{r}.json").write_text("{}")
    paths = tracelens._resolve_trace_files_glob(str(tmp_path / "trace_rank_*.json"), 2)
    assert paths == [str(tmp_path / "trace_rank_0.json"), str(tmp_path / "trace_rank_1.json")]
    with pytest.raises(FileNotFoundError, match="Missing ranks"):
        tracelens._resolve_trace_files_glob(str(tmp_path / "trace_rank_*.json"), 3)


def test_tracefuse_missing_first_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        tracelens.TraceFuse([str(tmp_path / "rank0_trace.json")])


def test_corrupt_trace_is_a_value_error(tmp_path):
    (tmp_path / "rank0_trace.json").write_text('{"traceEvents": [{"ph": "X", "name": ')
    (tmp_path / "rank1_trace.json").write_bytes(b"\x00\x01 not json")
    with pytest.raises(ValueError, match="rank1_trace.json"):
        tracelens.generate_collective_report(trace_dir=str(tmp_path), world_size=2)


def test_command_requires_world_size(tmp_path, fx_small):
    d = tmp_path / "run"
    shutil.copytree(fx_small[0], d)
    for mode in (["--trace_dir", d], ["--trace_pattern", d / "rank*_trace.json"],
                 ["--trace_glob", d / "rank*_trace.json"]):
        res = invoke("collective-report", *mode, "--output_csvs_dir", tmp_path / "out")
        assert res.exit_code == 2 and "--world_size is required" in res.output, res.output
        assert "Traceback" not in res.output
    assert not (tmp_path / "out").exists() and not (d / "nccl_analysis_report.xlsx").exists()
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "streamtrace"), "collective-report",
                           "--trace_dir", str(d)], capture_output=True, text=True)
    assert proc.returncode == 2 and "--world_size is required" in proc.stderr and "Traceback" not in proc.stderr


# ---------------------------------------------------------------- item 5: positional order


@pytest.mark.parametrize("fn", [tracelens.generate_collective_report, streamtrace.generate_collective_report],
                         ids=["tracelens", "streamtrace"])
def test_parameters_in_tracelens_order(fn):
    params = list(inspect.signature(fn).parameters.values())[:len(TRACELENS_PARAMS)]
    assert [p.name for p in params] == [n for n, _ in TRACELENS_PARAMS]
    if fn is tracelens.generate_collective_report:
        assert len(inspect.signature(fn).parameters) == len(TRACELENS_PARAMS)
        assert [p.default for p in params] == [v for _, v in TRACELENS_PARAMS]
    later = list(inspect.signature(fn).parameters.values())[len(TRACELENS_PARAMS):]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in later)


@pytest.mark.parametrize("fn", [tracelens.generate_collective_report, streamtrace.generate_collective_report],
                         ids=["tracelens", "streamtrace"])
def test_positional_call_writes_workbook_and_csvs(tmp_path, fx_small, fn):
    d = fx_small[0]
    xlsx, csvs = tmp_path / "report.xlsx", tmp_path / "csvs"
    sheets = fn(d, None, None, 4, str(xlsx), str(csvs), True, ["mean", "max"])
    assert xlsx.is_file() and (csvs / "nccl_implicit_sync.csv").is_file()
    assert not (tmp_path / "csvs.xlsx").exists()
    assert list(sheets["nccl_summary_implicit_sync"].columns) == summary_implicit_columns(["mean", "max"])


# ---------------------------------------------------------------- item 6: public names, agg callables


def test_find_trace_files_and_infer_world_size(tmp_path):
    for name in ("rank1_trace.json", "rank0_trace.json", "other.json", "rank2_trace.json.gz"):
        (tmp_path / name).write_text("{}")
    found = tracelens.find_trace_files(str(tmp_path))
    assert found == [str(tmp_path / "rank0_trace.json"), str(tmp_path / "rank1_trace.json")]
    assert tracelens.find_trace_files(str(tmp_path), "*.gz") == [str(tmp_path / "rank2_trace.json.gz")]
    assert tracelens.find_trace_files(str(tmp_path / "none")) == []
    assert tracelens.infer_world_size(found) == 2 and tracelens.infer_world_size([]) == 0


def test_find_trace_files_prints_tracelens_messages_to_stdout(tmp_path, capsys):
    # TraceLens's own tests check stdout for "No trace files found"; a script
    # migrated from TraceLens sees the same lines.
    assert tracelens.find_trace_files(str(tmp_path)) == []
    out = capsys.readouterr().out
    assert out == f"No trace files found matching pattern 'rank*_trace.json' in {tmp_path}\n"
    (tmp_path / "rank0_trace.json").write_text("{}")
    (tmp_path / "rank1_trace.json").write_text("{}")
    assert len(tracelens.find_trace_files(str(tmp_path))) == 2
    assert capsys.readouterr().out == f"Found 2 trace files in {tmp_path}\n"


def test_default_rank_regex():
    import re

    assert tracelens.DEFAULT_RANK_REGEX == TRACELENS_PARAMS[11][1]
    for name, rank in (("rank3.json", 3), ("trace_rank_12.json", 12), ("rank-4", 4), ("x_rank[5].json", 5),
                       ("run/rank/6/t.json", 6)):
        assert int(re.search(tracelens.DEFAULT_RANK_REGEX, name).group("rank")) == rank


def test_tracefuse_attributes(fx_small):
    d, truth = fx_small
    p0, p1 = (os.path.join(d, truth["files"][str(r)]) for r in (0, 1))
    assert tracelens.TraceFuse([p0, p1]).rank2filepath == {0: p0, 1: p1}
    given = {3: p0, 7: p1}
    fuser = tracelens.TraceFuse(given, use_multiprocessing=True, max_workers=2)
    assert fuser.rank2filepath == given and fuser.use_multiprocessing and fuser.max_workers == 2
    assert tracelens.TraceFuse([p0]).max_workers == (os.cpu_count() or 8)
    assert streamtrace.TraceFuse([p0, p1]).rank2filepath == {0: p0, 1: p1}
    assert set(inspect.signature(tracelens.TraceFuse.merge).parameters) == {"self", "filter_fn", "include_pyfunc"}
    assert list(inspect.signature(tracelens.TraceFuse.merge_and_save).parameters) == [
        "self", "output_file", "filter_fn", "include_pyfunc"]


@pytest.mark.parametrize("fn", [tracelens.generate_collective_report, streamtrace.generate_collective_report],
                         ids=["tracelens", "streamtrace"])
def test_agg_metrics_callables(fx_small, fn):
    d = fx_small[0]
    by_name = fn(trace_dir=d, world_size=4, agg_metrics=["max", "median"])
    by_fn = fn(trace_dir=d, world_size=4, agg_metrics=[np.max, np.median])
    for sheet in ("nccl_summary_implicit_sync", "nccl_summary_all2allv"):
        pd.testing.assert_frame_equal(by_fn[sheet], by_name[sheet])
    assert "comm_latency_max" in by_fn["nccl_summary_implicit_sync"].columns
    with pytest.raises(ValueError, match="agg_metrics"):
        fn(trace_dir=d, world_size=4, agg_metrics=["maximum"])


# ---------------------------------------------------------------- the command line: main


def test_main_writes_the_default_workbook(tmp_path, fx_small):
    d = tmp_path / "run"
    shutil.copytree(fx_small[0], d)
    tracelens.main(["--trace_dir", str(d), "--world_size", "4"])
    assert (d / "nccl_analysis_report.xlsx").is_file()
    tracelens.main(["--trace_glob", str(d / "rank*_trace.json"), "--world_size", "4",
                    "--output_csvs_dir", str(tmp_path / "csv"), "--agg_metrics", "mean", "max"])
    assert (tmp_path / "csv" / "straggler_summary.csv").is_file()


def test_main_in_a_process_bad_input_is_one_line(tmp_path, fx_small):
    d = tmp_path / "run"
    shutil.copytree(fx_small[0], d)
    run = [sys.executable, "-m", "streamtrace.tracelens"]
    proc = subprocess.run(run + ["--trace_dir", str(d)], capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.strip() == "Error: world_size must be provided (--world_size)"
    proc = subprocess.run(run + ["--trace_dir", str(d), "--world_size", "5"], capture_output=True, text=True)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1
    assert "Expected trace file not found" in proc.stderr and "Traceback" not in proc.stderr
    assert not (d / "nccl_analysis_report.xlsx").exists()
    proc = subprocess.run(run + ["--world_size", "4"], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    proc = subprocess.run(run + ["--trace_pattern", str(d / "rank*_trace.json"), "--world_size", "4"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (d / "nccl_analysis_report.xlsx").is_file()


# ---------------------------------------------------------------- a TraceLens-style script

SCRIPT = textwrap.dedent("""
    import sys
    import pandas as pd
    from streamtrace.tracelens import (DEFAULT_RANK_REGEX, TraceFuse, find_trace_files, generate_collective_report,
                                       infer_world_size)

    trace_glob, rank_regex, out = sys.argv[1], sys.argv[2] or DEFAULT_RANK_REGEX, sys.argv[3]
    files = find_trace_files(sys.argv[4], sys.argv[5])
    world_size = infer_world_size(files)
    try:
        generate_collective_report(trace_dir="/nonexistent", world_size=None)
    except ValueError as exc:
        print("caught:", exc)
    dfs = generate_collective_report(trace_glob=trace_glob, world_size=world_size, rank_regex=rank_regex,
                                     output_csvs_dir=out + "/csvs", gpus_per_node=8)
    for name, df in dfs.items():
        print("sheet", name, len(df))
    path = TraceFuse(files[:2]).merge_and_save(out + "/merged_trace.json")
    print("fused", path)
""")


def _run_script(tmp_path, trace_glob, rank_regex, directory, pattern):
    script = tmp_path / "tl_script.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run([sys.executable, str(script), trace_glob, rank_regex, str(out), directory, pattern],
                          capture_output=True, text=True, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "caught: world_size must be provided" in proc.stdout
    return out, proc.stdout


def _check_tracelens_sheets(csv_dir, cli_dir):
    for name, first in TRACELENS_SHEETS.items():
        path = os.path.join(csv_dir, f"{name}.csv")
        if not os.path.exists(path):
            assert name == "nccl_all2allv"  # only written when there are all_to_allv instances
            continue
        cols = list(pd.read_csv(path, nrows=0).columns)
        assert cols[:len(first)] == first, name
    # the same files as the command gives with TraceLens's flags
    for f in sorted(os.listdir(cli_dir)):
        with open(os.path.join(csv_dir, f), "rb") as a, open(os.path.join(cli_dir, f), "rb") as b:
            assert a.read() == b.read(), f


def test_tracelens_style_script_on_fixture(tmp_path, fx_nodes):
    d, _ = fx_nodes
    out, stdout = _run_script(tmp_path, os.path.join(d, "rank*_trace.json"), "", d, "rank*_trace.json")
    res = invoke("collective-report", "--trace_glob", os.path.join(d, "rank*_trace.json"), "--world_size", 8,
                 "--gpus_per_node", 8, "--output_csvs_dir", tmp_path / "cli", "-q")
    assert res.exit_code == 0, res.output
    _check_tracelens_sheets(out / "csvs", tmp_path / "cli")
    with gzip.open(out / "merged_trace.json.gz", "rt") as f:
        labels = fused_labels(json.load(f)["traceEvents"])
    assert {"RANK 0 - CPU", "RANK 0 - GPU", "RANK 1 - CPU", "RANK 1 - GPU"} <= labels


@needs_real
def test_tracelens_style_script_on_real_set(tmp_path):
    d = os.path.join(SHARED_REAL, "param-dlrm")
    regex = r"worker(?P<rank>\d+)"
    out, stdout = _run_script(tmp_path, os.path.join(d, "*.json.gz"), regex, d, "*.json.gz")
    res = invoke("collective-report", "--trace_glob", os.path.join(d, "*.json.gz"), "--rank_regex", regex,
                 "--world_size", 8, "--gpus_per_node", 8, "--output_csvs_dir", tmp_path / "cli", "-q")
    assert res.exit_code == 0, res.output
    _check_tracelens_sheets(out / "csvs", tmp_path / "cli")
    assert "sheet nccl_implicit_sync" in stdout and "sheet straggler_summary" in stdout


# ---------------------------------------------------------------- issue #40 item 13: argument checks


@pytest.mark.parametrize("world_size", [0, -1])
def test_world_size_below_one_is_a_value_error_naming_it(fx_small, world_size):
    """The directory holds rank0_trace.json: the message is about world_size,
    not a "file not found" for a file that exists."""
    d, _ = fx_small
    with pytest.raises(ValueError, match="world_size") as info:
        tracelens.generate_collective_report(trace_dir=d, world_size=world_size)
    assert not isinstance(info.value, FileNotFoundError)
    assert "not found" not in str(info.value)
    proc = subprocess.run([sys.executable, "-m", "streamtrace.tracelens", "--trace_dir", d,
                           "--world_size", str(world_size), "--output_csvs_dir", os.path.join(d, "never")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "world_size" in proc.stderr and "not found" not in proc.stderr
    assert not os.path.exists(os.path.join(d, "never"))


@pytest.mark.parametrize("max_workers", [0, -2])
def test_tracefuse_max_workers_below_one_is_a_value_error(fx_small, max_workers):
    d, truth = fx_small
    with pytest.raises(ValueError, match="max_workers"):
        tracelens.TraceFuse([os.path.join(d, truth["files"]["0"])], use_multiprocessing=True,
                            max_workers=max_workers)
    with pytest.raises(ValueError, match="max_workers"):
        tracelens.generate_collective_report(trace_dir=d, world_size=4, use_multiprocessing=True,
                                             max_workers=max_workers)


def test_tracefuse_negative_rank_is_a_value_error_naming_it(fx_small):
    d, truth = fx_small
    with pytest.raises(ValueError, match="-1"):
        tracelens.TraceFuse({-1: os.path.join(d, truth["files"]["0"])})


def test_merge_and_save_none_writes_nothing(tmp_path, fx_small, monkeypatch):
    """TraceLens's merge_and_save(None) fails on None + '.gz' (its code; no
    documented behaviour): here a ValueError naming output_file, and no
    ./None.gz."""
    d, truth = fx_small
    monkeypatch.chdir(tmp_path)
    fuse = tracelens.TraceFuse([os.path.join(d, truth["files"]["0"])])
    with pytest.raises(ValueError, match="output_file"):
        fuse.merge_and_save(None)
    with pytest.raises(ValueError, match="output_file"):
        fuse.merge_and_save("")
    assert os.listdir(tmp_path) == []

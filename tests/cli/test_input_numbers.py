"""Numbers and patterns from the user or the file names that used to give a
traceback or run for minutes: out-of-range ranks, absurd world sizes, and
user regular expressions with catastrophic backtracking.  Each is one line
and exit 1 (exit 2 for a bad flag), or handled in time proportional to the
input."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

import generate_fixture
from streamtrace import StreamtraceError
from streamtrace.cli import main
from streamtrace.io.ranks import MAX_WORLD_SIZE, resolve_inputs
from streamtrace.stream.format import MAX_RANK

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("numbers")
    truth = generate_fixture.generate(str(d / "t"), ranks=2, steps=1, seed=11)
    return d / "t", truth


def _one_line(res, code):
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert res.exit_code == code, res.output
    lines = [line for line in res.output.strip().splitlines() if line.startswith("Error")]
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    return lines[0]


@pytest.mark.parametrize("value", [str(2**32), str(MAX_RANK + 1), str(10**30)])
def test_rank_flag_out_of_range_is_a_usage_error(traces, tmp_path, value):
    t, _ = traces
    res = CliRunner().invoke(main, ["extract", str(t / "rank0_trace.json"), "--rank", value,
                                    "-o", str(tmp_path / "x.stev")])
    line = _one_line(res, 2)
    assert "--rank" in line and value in line
    assert os.listdir(tmp_path) == []


def test_rank_flag_at_the_limit_works(traces, tmp_path):
    t, _ = traces
    res = CliRunner().invoke(main, ["extract", str(t / "rank0_trace.json"), "--rank", str(MAX_RANK),
                                    "-q", "-o", str(tmp_path / "x.stev")])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["dump", str(tmp_path / "x.stev"), "--what", "meta"])
    assert res.exit_code == 0 and f'"rank": {MAX_RANK}' in res.output


@pytest.mark.parametrize("flags", [["--trace_dir", "{d}"], ["--trace_glob", "{d}/*.json"],
                                   ["--trace_dir", "{d}", "--world_size", "2", "--allow_missing_ranks"]])
def test_rank_in_a_file_name_out_of_range(traces, tmp_path, flags):
    t, _ = traces
    d = tmp_path / "in"
    d.mkdir()
    shutil.copy(t / "rank0_trace.json", d / "rank0_trace.json")
    shutil.copy(t / "rank1_trace.json", d / "rank99999999999999999999_trace.json")
    out = tmp_path / "out"
    out.mkdir()
    res = CliRunner().invoke(main, ["extract", *[f.format(d=d) for f in flags], "-q", "-o", str(out / "x.stev")])
    if "--world_size" in flags:   # ranks >= world_size are not looked for: rank 1 is missing, rank 0 extracted
        assert res.exit_code == 0, res.output
        return
    line = _one_line(res, 1)
    assert str(d / "rank99999999999999999999_trace.json") in line and "out of range" in line
    assert os.listdir(out) == []


def test_rank_in_distributed_info_out_of_range(traces, tmp_path):
    """distributedInfo.rank beyond any valid rank: a warning, the position is used."""
    t, _ = traces
    text = (t / "rank1_trace.json").read_text()
    text, n = re.subn(r'"rank": 1\b', '"rank": 99999999999999', text)
    assert n
    (tmp_path / "a.json").write_text(text)
    res = CliRunner().invoke(main, ["extract", str(tmp_path / "a.json"), "-o", str(tmp_path / "x.stev")])
    assert res.exit_code == 0, res.output
    assert "distributedInfo.rank 99999999999999 is not a valid rank" in res.output


@pytest.mark.parametrize("command,out", [("extract", "-o"), ("collective-report", "--output_xlsx_path"),
                                         ("fuse", "-o")])
def test_absurd_world_size_is_a_usage_error(traces, tmp_path, command, out):
    t, _ = traces
    res = CliRunner().invoke(main, [command, "--trace_dir", str(t), "--world_size", str(10**7),
                                    "--allow_missing_ranks", out, str(tmp_path / "x.out")])
    line = _one_line(res, 2)
    assert "--world_size" in line and str(MAX_WORLD_SIZE) in line
    assert os.listdir(tmp_path) == []


def test_missing_ranks_cost_what_the_present_ranks_cost(traces, tmp_path, monkeypatch):
    """The largest world size with two ranks present: the files are found by
    listing the directory once, not by asking for every rank's file."""
    t, _ = traces
    calls = []
    real_isfile = os.path.isfile
    monkeypatch.setattr(os.path, "isfile", lambda p: calls.append(p) or real_isfile(p))
    for kwargs in ({"trace_dir": str(t)}, {"trace_pattern": str(t / "rank*_trace.json")},
                   {"trace_glob": str(t / "*.json")}):
        calls.clear()
        inputs = resolve_inputs(world_size=MAX_WORLD_SIZE, allow_missing_ranks=True, **kwargs)
        assert [(os.path.basename(i.path), i.rank) for i in inputs] == [("rank0_trace.json", 0),
                                                                        ("rank1_trace.json", 1)]
        assert len(calls) < 20, (kwargs, len(calls))
    with pytest.raises(StreamtraceError) as err:
        resolve_inputs(trace_dir=str(t), world_size=MAX_WORLD_SIZE)
    message = str(err.value)
    assert f"Missing {MAX_WORLD_SIZE - 2} ranks" in message and "[2, 3, 4," in message and len(message) < 400


def test_missing_ranks_through_the_pipeline(traces, tmp_path):
    """extract | align with the largest world size: align's data_quality says
    how many ranks are absent (counted, not listed)."""
    t, _ = traces
    proc = subprocess.run(f"{BIN} extract --trace_dir {t} --world_size {MAX_WORLD_SIZE} --allow_missing_ranks -q "
                          f"| {BIN} align -q -o {tmp_path / 'a.stev'}", shell=True, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    from streamtrace.stream.format import read_tables

    quality = read_tables(str(tmp_path / "a.stev"))["align.quality"]
    row = quality[quality["category"] == "missing_ranks"].iloc[0]
    assert int(row["count"]) == MAX_WORLD_SIZE - 2


# ---------------------------------------------------------------- absurd message sizes

@pytest.mark.parametrize("nelems", [2**62, 2**63 - 1])
def test_absurd_message_sizes_are_flagged_not_wrapped(traces, tmp_path, nelems):
    """Every rank with `In msg nelems` = 2^62 (or 2^63-1): bytes would overflow
    int64 (a traceback in report, wrapped sizes in align). The sizes are
    treated as unknown and data_quality says so; the rest of the report stands."""
    t, truth = traces
    d = tmp_path / "t"
    d.mkdir()
    for r in range(2):
        text = (t / f"rank{r}_trace.json").read_text()
        text, n = re.subn(r'"In msg nelems": \d+', f'"In msg nelems": {nelems}', text)
        assert n
        (d / f"rank{r}_trace.json").write_text(text)
    res = CliRunner().invoke(main, ["collective-report", "--trace_dir", str(d), "--world_size", "2", "-q",
                                    "--output_csvs_dir", str(tmp_path / "csv")])
    assert res.exit_code == 0, res.output
    quality = (tmp_path / "csv" / "data_quality.csv").read_text()
    assert "implausible_size" in quality
    # through the stages too, and the aligned sizes are unknown, never wrapped
    proc = subprocess.run(f"{BIN} extract --trace_dir {d} -q | {BIN} align -q -o {tmp_path / 'a.stev'} && "
                          f"{BIN} report {tmp_path / 'a.stev'} -q --output_csvs_dir {tmp_path / 'csv2'}",
                          shell=True, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    from streamtrace.stream.format import read_tables

    coll = read_tables(str(tmp_path / "a.stev"))["align.collectives"]
    assert coll["in_nelems"].isna().any() and (coll["in_nelems"].dropna() < 2**40).all()
    assert ((coll["in_bytes"].dropna() >= 0) & (coll["in_bytes"].dropna() <= 2**40)).all()
    assert coll.loc[coll["in_nelems"].isna(), "flags"].str.contains("size_unknown").all()
    for name in os.listdir(tmp_path / "csv2"):
        text = (tmp_path / "csv2" / name).read_text()
        assert str(nelems) not in text and str(nelems * 4) not in text, name


# ---------------------------------------------------------------- user regular expressions

CATASTROPHIC = r"(a|aa)+$"   # exponential backtracking on "aaa...ab" in re (and in regex)
LONG_A = "a" * 40 + "b"


@pytest.fixture
def small_budget(monkeypatch):
    """A user regex's time budget made small, so the refusal comes at once
    (the default is userregex.BUDGET_S)."""
    from streamtrace import userregex

    monkeypatch.setattr(userregex, "BUDGET_S", 0.2)


def test_rank_regex_with_catastrophic_backtracking_is_refused(traces, tmp_path, small_budget):
    t, _ = traces
    shutil.copy(t / "rank0_trace.json", tmp_path / f"{LONG_A}.json")
    res = CliRunner().invoke(main, ["extract", "--trace_glob", str(tmp_path / "*.json"), "--rank_regex", CATASTROPHIC,
                                    "-o", str(tmp_path / "x.stev")])
    line = _one_line(res, 1)
    assert f"--rank_regex {CATASTROPHIC!r}" in line and "backtrack" in line
    assert not (tmp_path / "x.stev").exists()


def test_fuse_name_with_catastrophic_backtracking_is_refused(traces, tmp_path, small_budget):
    t, _ = traces
    text = (t / "rank0_trace.json").read_text()
    text, n = re.subn(r'"name": "nccl:broadcast"', f'"name": "{LONG_A}"', text, count=1)
    assert n
    (tmp_path / "rank0_trace.json").write_text(text)
    res = CliRunner().invoke(main, ["fuse", str(tmp_path / "rank0_trace.json"), "--name", CATASTROPHIC,
                                    "-o", str(tmp_path / "x.json")])
    line = _one_line(res, 1)
    assert f"--name {CATASTROPHIC!r}" in line and "backtrack" in line
    assert not (tmp_path / "x.json").exists()


def test_user_regexes_keep_python_syntax(traces, tmp_path):
    """The regex engine takes what re takes: named groups, lookarounds, backreferences."""
    t, truth = traces
    for r in range(2):
        shutil.copy(t / f"rank{r}_trace.json", tmp_path / f"w{r}w-node{r}.json")
    res = CliRunner().invoke(main, ["extract", "--trace_glob", str(tmp_path / "*.json"), "-q",
                                    "--rank_regex", r"(?<=w)(?P<rank>\d)(?=w)w-node(?P=rank)",
                                    "-o", str(tmp_path / "x.stev")])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["dump", str(tmp_path / "x.stev"), "--what", "meta"])
    assert [json.loads(line)["rank"] for line in res.output.splitlines()] == [0, 1]
    res = CliRunner().invoke(main, ["extract", "--trace_glob", str(tmp_path / "*.json"), "--rank_regex", "(",
                                    "-o", str(tmp_path / "y.stev")])
    assert "--rank_regex '(' is not a valid regular expression" in _one_line(res, 1)

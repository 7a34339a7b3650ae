"""Data-quality findings for inputs whose numbers cannot be trusted as they
stand (issue 24, "Data quality"): each asserted against what was injected."""
import gzip
import io
import os
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

import generate_fixture
from streamtrace import extract, resolve_inputs
from streamtrace.align.stage import align_frames
from streamtrace.cli import main
from streamtrace.stream.format import Kind, iter_frames, read_stream
from synthtrace import coll_kernel, write_trace


def _align(paths=None, trace_dir=None, world_size=None, **kw):
    buf = io.BytesIO()
    if trace_dir is not None:
        extract(resolve_inputs(trace_dir=trace_dir, world_size=world_size), buf)
    else:
        extract(resolve_inputs(paths=paths), buf)
    buf.seek(0)
    return {f.table()[0]: f.table()[1] for f in align_frames(iter_frames(buf), **kw) if f.kind == Kind.TABLE}


def _findings(tables, category):
    q = tables["align.quality"]
    return q[q["category"] == category]


def test_negative_collective_durations_are_flagged(tmp_path):
    # rank 1 has two collectives of process group "0" with a negative duration
    negative = {1: {0, 2}}
    paths = []
    for r in range(2):
        events = [coll_kernel(f"{100 + 50 * i}.0", "-3.5" if i in negative.get(r, ()) else "10.0",
                              group_size=2, corr=i + 1, seq=i) for i in range(4)]
        paths.append(write_trace(tmp_path / f"rank{r}_trace.json", events, rank=r, world_size=2))
    tables = _align(paths)
    f = _findings(tables, "negative_duration")
    assert len(f) == 1, tables["align.quality"]
    row = f.iloc[0]
    assert row["severity"] == "error" and row["rank"] == 1 and row["count"] == len(negative[1])
    assert "0" in str(row["pg"]) and "negative" in row["message"]
    # the rows themselves are kept as recorded
    c = tables["align.collectives"]
    assert sorted(c.loc[c["dur_ns"] < 0, "rank"].tolist()) == [1, 1]


def test_no_negative_duration_finding_on_clean_traces(tmp_path):
    d = tmp_path / "fx"
    generate_fixture.generate(str(d), ranks=2, steps=1, fill_ops=0, seed=1)
    assert _findings(_align(trace_dir=str(d), world_size=2), "negative_duration").empty


@pytest.mark.parametrize("steps", [3, 1])
def test_implausible_clock_offset_is_an_error_naming_the_flag(tmp_path, steps):
    """Rank 1's clock is 26 hours ahead: 93,600 s, within one node (not aligned by default).
    Over one step the estimate rests on too few collectives for the clock rule
    (confidence.CLOCK_MIN_COLLECTIVES): the error says so instead of advising the flag."""
    d = tmp_path / "fx"
    truth = generate_fixture.generate(str(d), ranks=2, steps=steps, fill_ops=0, seed=2,
                                      clock_offsets_us=["0", "93600000000"])
    injected = truth["clock_offsets_ns"]["1"] - truth["clock_offsets_ns"]["0"]
    assert injected == 93_600 * 10**9
    tables = _align(trace_dir=str(d), world_size=2)
    clocks = tables["align.clocks"].set_index("rank")
    assert abs(clocks.loc[1, "offset_ns"] - injected) < 10_000 and not clocks["applied"].any()
    f = _findings(tables, "clock_offset")
    assert len(f) == 1
    row = f.iloc[0]
    assert row["severity"] == "error" and row["rank"] == 1
    assert "93600" in row["message"].replace(",", "")
    if steps == 1:
        assert "--align_clocks" not in row["message"] and "rest on as few as" in row["message"]
        assert "too few to apply them" in row["message"]
    else:
        assert "rerun with --align_clocks" in row["message"]
    # the main sheets keep the numbers as recorded (TraceLens semantics)
    assert (tables["align.collectives"]["clock_offset_ns"] == 0).all()
    # with the flag the offset is applied and there is nothing to report
    on = _align(trace_dir=str(d), world_size=2, align_clocks=True)
    assert _findings(on, "clock_offset").empty


def test_plausible_clock_offset_stays_an_info_note(tmp_path):
    d = tmp_path / "fx"
    generate_fixture.generate(str(d), ranks=2, steps=1, fill_ops=0, seed=2, clock_offsets_us=["0", "250"])
    f = _findings(_align(trace_dir=str(d), world_size=2), "clock_offset")
    assert f["severity"].tolist() == ["info"] and f["rank"].tolist() == [1]


# ---------------------------------------------------------------- extract: duplicate ranks


def _streamtrace():
    exe = shutil.which("streamtrace", path=os.path.dirname(sys.executable))
    return [exe] if exe else [sys.executable, "-m", "streamtrace.cli"]


def _two_traces_of_rank(tmp_path, rank):
    """Two files whose distributedInfo both say ``rank`` (file names without a rank)."""
    d = tmp_path / "run"
    d.mkdir()
    paths = [write_trace(d / name, [coll_kernel("100.0", "10.0", group_size=2)], rank=rank, world_size=2)
             for name in ("host-a.json", "host-b.json")]
    return d, [str(p) for p in paths]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_extract_refuses_a_rank_given_twice(tmp_path, jobs):
    d, paths = _two_traces_of_rank(tmp_path, rank=1)
    out = tmp_path / "out.stev"
    for args in (paths, ["--trace_dir", str(d)]):
        res = CliRunner().invoke(main, ["extract", *args, "-j", jobs, "-o", str(out)])
        assert res.exit_code == 1, res.output
        line = res.output.strip()
        assert "\n" not in line and "Traceback" not in line
        assert paths[0] in line and paths[1] in line and "rank 1" in line
        assert not out.exists()
    proc = subprocess.run(_streamtrace() + ["extract", *paths, "-j", jobs, "-o", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert paths[0] in proc.stderr and paths[1] in proc.stderr and "rank 1" in proc.stderr
    assert not out.exists()


def test_extract_keeps_distinct_ranks_from_distributed_info(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    for r, name in enumerate(("host-b.json", "host-a.json")):
        write_trace(d / name, [coll_kernel("100.0", "10.0", group_size=2)], rank=r, world_size=2)
    out = tmp_path / "out.stev"
    res = CliRunner().invoke(main, ["extract", "--trace_dir", str(d), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert sorted(read_stream(str(out))) == [0, 1]


# ---------------------------------------------------------------- --trace_dir: one rank in two formats


@pytest.mark.parametrize("world_size", [None, "2"])
def test_trace_dir_warns_when_a_rank_has_two_files(tmp_path, world_size):
    d = tmp_path / "run"
    d.mkdir()
    events = [coll_kernel("100.0", "10.0", group_size=2)]
    write_trace(d / "rank1_trace.json", events, rank=1, world_size=2)
    plain = write_trace(d / "rank0_trace.json", events, rank=0, world_size=2)
    with open(plain, "rb") as f, gzip.open(d / "rank0_trace.json.gz", "wb") as g:
        g.write(f.read())
    out = tmp_path / "out.stev"
    args = ["extract", "--trace_dir", str(d), "-o", str(out)] + (["--world_size", world_size] if world_size else [])
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    lines = [line for line in res.stderr.splitlines() if "rank0_trace.json.gz" in line]
    assert len(lines) == 1, res.stderr
    used = str(d / "rank0_trace.json")
    assert f"{used} " in lines[0] + " " and "using " + used in lines[0]
    assert read_stream(str(out))[0].meta["source"] == used


def test_trace_glob_warns_when_a_rank_has_two_files(tmp_path):
    events = [coll_kernel("100.0", "10.0", group_size=1)]
    first = write_trace(tmp_path / "rank0_trace.json", events, rank=0, world_size=1)
    write_trace(tmp_path / "rank0_trace.old.json", events, rank=0, world_size=1)
    out = tmp_path / "out.stev"
    res = CliRunner().invoke(main, ["extract", "--trace_glob", str(tmp_path / "rank*.json"), "-o", str(out)])
    assert res.exit_code == 0, res.output
    lines = [line for line in res.output.splitlines() if "rank0_trace.old.json" in line]
    assert len(lines) == 1 and lines[0].endswith(f"using {first}"), res.output


# ---------------------------------------------------------------- string ts reaches data_quality


def test_string_ts_is_a_data_quality_warning_naming_file_and_count(tmp_path):
    paths = []
    for r in range(2):
        events = [coll_kernel(f"{100 + 50 * i}.0", "10.0", group_size=2, corr=i + 1, seq=i) for i in range(4)]
        if r == 1:
            for e in events[:3]:
                e["ts"] = str(e["ts"])  # written as a JSON string: "ts": "100.0"
        paths.append(write_trace(tmp_path / f"rank{r}_trace.json", events, rank=r, world_size=2))
    q = _align(paths)["align.quality"]
    f = q[(q["category"] == "extract_warning") & q["message"].str.contains("string")]
    assert f["rank"].tolist() == [1]
    assert f.iloc[0]["message"].startswith(f"{paths[1]}: 3 ts/dur values were strings")

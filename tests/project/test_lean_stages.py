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


@pytest.mark.parametrize("stage", ["align", "correlate"])
def test_stream_stages_import_no_pandas(empty_stream, tmp_path, stage):
    assert loaded(tmp_path, stage, empty_stream, "-o", tmp_path / "out.stev") == []


def test_correlate_of_an_aligned_empty_stream_imports_no_pandas(empty_stream, tmp_path):
    aligned = tmp_path / "aligned.stev"
    assert loaded(tmp_path, "align", empty_stream, "-o", aligned) == []
    assert loaded(tmp_path, "correlate", aligned, "-o", tmp_path / "out.stev") == []


#: one rank, one compute kernel and its launch: nothing align can match
NO_COLLECTIVES = {
    "distributedInfo": {"rank": 0, "world_size": 2}, "baseTimeNanoseconds": 1000,
    "deviceProperties": [{"id": 0, "name": "GPU"}],
    "traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5,
         "args": {"External id": 3}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 11, "dur": 2,
         "args": {"External id": 3, "correlation": 9}},
        {"ph": "X", "cat": "kernel", "name": "ampere_sgemm", "pid": 0, "tid": 7, "ts": 14, "dur": 20,
         "args": {"External id": 3, "correlation": 9, "device": 0, "stream": 7}}]}


def test_align_of_ranks_without_collectives_imports_no_pandas(tmp_path):
    trace = tmp_path / "rank0.json"
    trace.write_text(json.dumps(NO_COLLECTIVES))
    stream = tmp_path / "run.stev"
    assert loaded(tmp_path, "extract", trace, "-o", stream) == []
    assert loaded(tmp_path, "align", stream, "-o", tmp_path / "aligned.stev") == []
    tables = _tables(tmp_path / "aligned.stev")
    assert [q["category"] for q in tables["align.quality"]] == ["missing_ranks", "no_collectives"]
    assert [r["rank"] for r in tables["align.ranks"]] == [0]


def test_align_with_collectives_loads_pandas(tmp_path):
    """The other side of the boundary: a rank with collective kernels is matched by pandas code."""
    subprocess.run([sys.executable, os.path.join(ROOT, "fixtures", "generate_fixture.py"), "--out", tmp_path / "in",
                    "--ranks", "2", "--steps", "1"], check=True, capture_output=True, timeout=300)
    stream = tmp_path / "run.stev"
    subprocess.run([sys.executable, "-m", "streamtrace.cli", "extract", "--trace_glob", str(tmp_path / "in" / "*.json"),
                    "--rank_regex", r"rank(?P<rank>\d+)", "-o", stream], check=True, cwd=ROOT, timeout=300)
    assert "pandas" in loaded(tmp_path, "align", stream, "-o", tmp_path / "aligned.stev")


def _tables(path):
    """{table name: rows as dicts} of a stream, and "END": the END frames' objects."""
    from streamtrace.stream.format import Kind, iter_frames

    out = {"END": []}
    for frame in iter_frames(str(path)):
        if frame.kind == Kind.TABLE:
            name, df = frame.table()
            out[name] = df.astype(object).where(df.notna(), None).to_dict("records")
        elif frame.kind == Kind.END:
            out["END"].append(frame.json())
    return out


def test_align_of_an_empty_stream_is_a_complete_stream_that_correlate_and_dump_read(empty_stream, tmp_path):
    st = [sys.executable, "-m", "streamtrace.cli"]
    run = dict(cwd=ROOT, capture_output=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    aligned = subprocess.run(st + ["align", str(empty_stream)], check=True, **run).stdout
    (tmp_path / "aligned.stev").write_bytes(aligned)
    tables = _tables(tmp_path / "aligned.stev")
    assert tables["END"] == [{"stage": "align", "ranks": 0, "collective_kernels": 0}]
    assert [q["category"] for q in tables["align.quality"]] == ["no_collectives"]
    correlated = subprocess.run(st + ["correlate"], input=aligned, check=True, **run).stdout
    (tmp_path / "correlated.stev").write_bytes(correlated)
    tables = _tables(tmp_path / "correlated.stev")
    assert tables["END"] == [{"stage": "correlate"}]
    assert tables["correlate.collective_blockers"] == [] and tables["correlate.correlate_quality"] == []
    for what in ("meta", "summary", "collectives"):
        proc = subprocess.run(st + ["dump", "--what", what], input=correlated, **run)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == b""
    report = subprocess.run(st + ["report", "--output_csvs_dir", str(tmp_path / "csv")], input=correlated, **run)
    assert report.returncode == 0, report.stderr


# ---------------------------------------------------------------------- the tables built without pandas


def test_columns_encode_as_the_same_dataframe_does():
    import numpy as np
    import pandas as pd

    from streamtrace.stream.format import Columns, encode_table

    def objects(values):
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out

    cols = {"i": np.array([1, -2, 3], dtype=np.int64), "f": np.array([0.5, np.nan, 2.0]),
            "b": np.array([True, False, True]), "u": np.array([1, 2, 3], dtype=np.uint32),
            "n": np.ma.MaskedArray(np.array([4, 0, 6], dtype=np.int64), mask=[False, True, False]),
            "t": objects(["a", None, "a"]), "t_nan": objects([float("nan"), "b", "c"]),
            "none": objects([None, None, None]), "j": objects([1, None, "x"]), "nested": objects([[1, 2], {"a": 1}, None]),
            "j_nan": objects([1.5, float("nan"), 2])}
    frame = pd.DataFrame({c: pd.arrays.IntegerArray(v.data, v.mask) if isinstance(v, np.ma.MaskedArray)
                          else pd.Series(v, dtype=v.dtype) for c, v in cols.items()})
    assert encode_table("x", Columns(cols)) == encode_table("x", frame)
    empty = {"i": np.zeros(0, dtype=np.int64), "t": objects([]), "f": np.zeros(0)}
    assert encode_table("e", Columns(empty)) == encode_table("e", pd.DataFrame(
        {c: pd.Series(v, dtype=v.dtype) for c, v in empty.items()}))
    with pytest.raises(ValueError):
        Columns({"a": np.zeros(1), "b": np.zeros(2)})


@pytest.mark.parametrize("aligned", [True, False])
def test_correlate_empty_sheets_are_what_the_analyses_give(aligned):
    """The sheets correlate writes without pandas for a stream with nothing
    to analyze, byte for byte those of the analyses on empty inputs."""
    from streamtrace.correlate.columns import empty_sheets
    from streamtrace.correlate.stage import _NO_ALIGN_TABLES, analyze_collected
    from streamtrace.align.tables import empty_collectives_columns
    from streamtrace.stream.format import encode_table

    tables = {"align.collectives": empty_collectives_columns().frame()} if aligned else {}
    pandas_made = analyze_collected({}, tables)
    lean = empty_sheets([] if aligned else [_NO_ALIGN_TABLES])
    assert list(lean) == list(pandas_made)
    for name in lean:
        assert encode_table(name, lean[name]) == encode_table(name, pandas_made[name]), name


def test_align_tables_without_collectives_are_the_dataframes_match_ranks_gives():
    """align_frames' Columns and match_ranks' DataFrames (collective-report)
    of ranks without collectives encode to the same bytes."""
    import numpy as np

    from streamtrace.align.describe import RankResult
    from streamtrace.align.match import match_ranks
    from streamtrace.align.tables import tables_without_collectives
    from streamtrace.stream.format import encode_table

    results = [RankResult(rank=r, meta={"source": f"rank{r}.json", "base_ns": 1000 * r, "gpus": 2, "world_size": 4,
                                        "trace_rank": r if r else None, "truncated_at_byte": float("nan"),
                                        "pg_config": None, "warnings": ["w"] if r else []},
                          rows={"event": np.zeros(0, dtype=np.int64)}, events=r) for r in (2, 0, 1)]
    for align_clocks in (None, False, True):
        lean = tables_without_collectives(results, align_clocks, None)
        frames = match_ranks(results, align_clocks=align_clocks)
        assert list(lean) == list(frames)
        assert lean["align.clocks"]["applied"].all() == (align_clocks is not False)   # 3 ranks on 2 nodes
        for name in lean:
            assert encode_table(name, lean[name]) == encode_table(name, frames[name]), name

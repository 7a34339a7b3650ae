"""TABLE frames (stream.encode_table / decode_table): every column kind
round-trips, and every spelling of a missing value in an object column comes
back as None."""
import sys

import numpy as np
import pandas as pd

from streamtrace.stream.format import decode_table, encode_table


def test_columns_of_every_kind_round_trip():
    df = pd.DataFrame({
        "i": np.array([1, -2, 3], dtype=np.int64),
        "f": [0.5, np.nan, 2.0],
        "b": [True, False, True],
        "n": pd.array([1, None, 3], dtype="Int64"),
        "s": ["a", "é", "c"],
        "nested": [[1, 2], {"k": "v"}, "x"],
    })
    name, back = decode_table(encode_table("align.collectives", df))
    assert name == "align.collectives" and list(back.columns) == list(df.columns)
    assert back["i"].tolist() == [1, -2, 3] and back["i"].dtype == np.int64
    assert back["f"].isna().tolist() == [False, True, False] and back["b"].tolist() == [True, False, True]
    assert back["n"].isna().tolist() == [False, True, False] and back["n"][2] == 3
    assert back["s"].tolist() == ["a", "é", "c"]
    assert back["nested"].tolist() == [[1, 2], {"k": "v"}, "x"]


def test_missing_values_in_object_columns_become_none():
    df = pd.DataFrame({"o": pd.Series(["x", None, np.nan, pd.NA, float("nan"), "y"], dtype=object)})
    _, back = decode_table(encode_table("t", df))
    assert back["o"].tolist() == ["x", None, None, None, None, "y"]


def test_empty_table():
    _, back = decode_table(encode_table("t", pd.DataFrame({"a": pd.Series([], dtype=object)})))
    assert len(back) == 0 and list(back.columns) == ["a"]


def test_text_columns_are_coded_and_come_back_shared():
    """A column of str and missing values travels as its distinct strings
    plus codes: equal values come back as one shared object, missing as
    None; columns with numbers or nested values stay JSON arrays."""
    import json
    import struct

    rows = ["pg0", None, "pg1", "pg0", float("nan"), 'é "q"', "pg1"] * 50
    df = pd.DataFrame({"t": pd.Series(rows, dtype=object), "m": pd.Series([1, "1"] * 175, dtype=object),
                       "s": pd.Series(["x", pd.NA] * 175, dtype="string")})
    payload = encode_table("t", df)
    (hlen,) = struct.unpack_from("<I", payload, 0)
    types = {c["name"]: c["type"] for c in json.loads(payload[4:4 + hlen])["columns"]}
    assert types == {"t": "text", "m": "json", "s": "text"}
    _, back = decode_table(payload)
    assert back["t"].tolist() == [None if isinstance(v, float) else v for v in rows]
    assert back["t"][0] is back["t"][3]   # one object per distinct string
    assert back["m"].tolist() == [1, "1"] * 175
    assert back["s"].tolist() == ["x", None] * 175


def test_corrupt_text_columns_are_refused():
    import pytest

    payload = bytearray(encode_table("t", pd.DataFrame({"t": ["a", "b"]})))
    payload[-1] = 0x7f   # the last code, far outside the two strings
    with pytest.raises(ValueError, match="outside its strings"):
        decode_table(bytes(payload))


def test_a_corrupt_table_frame_is_a_one_line_error_naming_the_stream(tmp_path):
    import subprocess

    from streamtrace.stream.format import Frame, Kind, StreamWriter, json_frame, table_frame

    payload = bytearray(table_frame("align.collectives", pd.DataFrame({"t": ["a", "b"]})).payload)
    payload[-1] = 0x7f
    path = tmp_path / "bad.stev"
    with open(path, "wb") as f:
        w = StreamWriter(f)
        w.write(Frame(Kind.TABLE, 0, bytes(payload)))
        w.write(json_frame(Kind.END, 0, {"stage": "test"}))
    proc = subprocess.run([sys.executable, "-m", "streamtrace.cli", "report", str(path), "--output_csvs_dir",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and str(path) in proc.stderr and "corrupt TABLE frame" in proc.stderr
    assert not (tmp_path / "out").exists()


def _same_frame(a, b):
    """Equal columns, dtypes and values, with the same Python types in object columns."""
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    for col in a.columns:
        if a[col].dtype == object:
            assert [type(v) for v in a[col]] == [type(v) for v in b[col]], col


def test_an_in_process_table_frame_reads_as_its_decoded_bytes():
    """A TABLE frame made in this process hands a reader in the same process
    the DataFrame its bytes decode to, column kinds and missing values
    included; its bytes are made when asked for, and are the same."""
    from streamtrace.stream.format import TableFrame, table_frame

    df = pd.DataFrame({
        "i": np.array([1, -2, 3], dtype=np.int64), "i32": np.array([1, 2, 3], dtype=np.int32),
        "f": [0.5, np.nan, 2.0], "b": [True, False, True], "n": pd.array([1, None, 3], dtype="Int64"),
        "n32": pd.array([None, 2, 3], dtype="Int32"), "s": ["a", None, np.nan],
        "st": pd.Series(["x", pd.NA, "y"], dtype="string"), "nested": [[1, 2], {"k": "v"}, (3, None)],
        "nums": pd.Series([np.int64(4), None, np.float64(2.5)], dtype=object), 7: ["seven", "7", "7"],
    }, index=[10, 11, 12])
    frame = table_frame("align.collectives", df)
    assert isinstance(frame, TableFrame) and frame._payload is None   # not encoded yet
    name, df_here = frame.table()
    name_there, df_there = decode_table(frame.payload)
    assert name == name_there == "align.collectives"
    _same_frame(df_here, df_there)
    assert frame.payload == encode_table("align.collectives", df)
    df_here.loc[0, "i"] = 99   # each read is the reader's own copy
    assert frame.table()[1].loc[0, "i"] == 1 and df["i"].iloc[0] == 1


def test_in_process_tables_of_a_whole_chain_read_as_their_bytes(tmp_path):
    """Every table align and correlate produce on the fixture reads, in
    process, exactly as its encoded bytes decode."""
    import subprocess

    from streamtrace.align.stage import align_frames
    from streamtrace.correlate.stage import correlate_frames
    from streamtrace.chain import trace_frames
    from streamtrace.io.ranks import resolve_inputs
    from streamtrace.stream.format import Kind

    subprocess.run([sys.executable, "fixtures/generate_fixture.py", "--out", str(tmp_path), "--ranks", "4",
                    "--target_mb", "1", "--slow_kernel_rank", "1"], check=True, capture_output=True)
    inputs = resolve_inputs(trace_dir=str(tmp_path), world_size=4)
    names = []
    for frame in correlate_frames(align_frames(trace_frames(inputs, world_size=4))):
        if frame.kind == Kind.TABLE:
            name, here = frame.table()
            _same_frame(here, decode_table(frame.payload)[1])
            names.append(name)
    assert "align.collectives" in names and "correlate.collective_blockers" in names


def test_a_table_frame_reads_only_the_columns_asked_for():
    """``table(columns)`` gives those columns (in the table's order) as the
    full decode has them, from the bytes and in process alike; ``table_name``
    reads the header alone."""
    from streamtrace.stream.format import Frame, Kind, table_frame

    df = pd.DataFrame({"a": [1, 2], "b": ["x", None], "c": [0.5, np.nan], "d": pd.array([None, 4], dtype="Int64")})
    here = table_frame("t.x", df)
    there = Frame(Kind.TABLE, 0, encode_table("t.x", df))
    for frame in (here, there):
        assert frame.table_name() == "t.x"
        name, part = frame.table({"d", "b", "absent"})
        assert name == "t.x" and list(part.columns) == ["b", "d"]
        _same_frame(part, decode_table(there.payload)[1][["b", "d"]])

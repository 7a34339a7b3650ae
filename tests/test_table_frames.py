"""TABLE frames (stream.encode_table / decode_table): every column kind
round-trips, and every spelling of a missing value in an object column comes
back as None."""
import sys

import numpy as np
import pandas as pd

from streamtrace.stream import decode_table, encode_table


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

    from streamtrace.stream import Frame, Kind, StreamWriter, json_frame, table_frame

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

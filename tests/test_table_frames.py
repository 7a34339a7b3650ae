"""TABLE frames (stream.encode_table / decode_table): every column kind
round-trips, and every spelling of a missing value in an object column comes
back as None."""
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

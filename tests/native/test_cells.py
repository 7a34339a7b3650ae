"""streamtrace.report.cells and the C row writer: cell texts equal Python's own formatting."""
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrace.report import cells as cells
from streamtrace._native import format_rows
from streamtrace.report.writers import _EMPTY, _sheet_xml, _str_cell

grid_floats = st.integers(-10**15, 10**15).map(lambda k: k / 1000.0)
any_floats = st.floats(allow_nan=True, allow_infinity=True)
PLAIN = cells.CellStyle(na="NA", true="T", false="F", text=lambda s: s, other=str)


def written(series, style=PLAIN):
    """The cells of one column as texts, through the C writer (a second
    column, so that the separator shows where each cell ends)."""
    col = cells.column_cells(pd.Series(series), style)
    marker = cells.Cells(None, np.zeros(len(series), dtype=np.int32), 0, ["|"])
    rows = b"".join(cells.table_rows([col, marker], style, sep="\t", row_close="\n")).decode()
    return [line[:-2] for line in rows.split("\n")[:-1]]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(grid_floats, any_floats, st.sampled_from([-0.0, 0.0, 1e12, -1e12, 999999999999.999,
                                                                    -0.001, 0.0005, 1e16])), max_size=200))
def test_floats_are_written_as_repr(values):
    a = np.array(values, dtype=np.float64)
    assert written(a) == ["NA" if math.isnan(v) else float.__repr__(v) for v in a.tolist()], values
    xml = cells.CellStyle(na="-", true="", false="", text=str, other=str, number_open="<", number_close=">",
                          nonfinite_na=True)
    assert written(a, xml) == ["-" if not math.isfinite(v) else f"<{float.__repr__(v)}>" for v in a.tolist()]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-2**63, 2**63 - 1), max_size=200))
def test_ints_are_written_as_str(values):
    a = np.array(values, dtype=np.int64)
    assert written(a) == [str(v) for v in values]
    big = np.array([v + 2**63 for v in values], dtype=np.uint64)   # past int64: as text
    assert written(big) == [str(v + 2**63) for v in values]


def test_other_columns():
    assert written(np.array([True, False])) == ["T", "F"]
    assert written(pd.array([1, None, -3], dtype="Int64")) == ["1", "NA", "-3"]
    assert written(pd.Series(["a", None, "a", "b"], dtype=object)) == ["a", "NA", "a", "b"]
    assert written(pd.Series(["x", None], dtype="string")) == ["x", "NA"]
    assert written(pd.Series([1, "1", 1.0, None, float("nan")], dtype=object)) == ["1", "1", "1.0", "NA", "NA"]
    assert cells.column_cells(pd.Series(pd.to_datetime(["2020-01-01"])), PLAIN) is None


def reference_rows(columns, first, n_rows, sep, row_open, row_close, num_open, num_close):
    out = []
    for r in range(first, n_rows):
        texts = []
        for values, codes, scale, table in columns:
            code = -1 if codes is None else int(codes[r])
            if code >= 0:
                texts.append(table[code])
                continue
            v = int(values[r])
            if scale == 0:
                text = str(v)
            else:
                whole, frac = divmod(abs(v), 1000)
                text = ("-" if v < 0 else "") + f"{whole}." + (f"{frac:03d}".rstrip("0") or "0")
            texts.append(num_open + text.encode() + num_close)
        out.append(row_open + sep.join(texts) + row_close)
    return b"".join(out)


@st.composite
def tables(draw):
    n_rows = draw(st.integers(0, 40))
    columns = []
    for _ in range(draw(st.integers(1, 5))):
        table = draw(st.lists(st.binary(max_size=12), max_size=4))
        numbers = draw(st.booleans()) or not table
        values = np.array(draw(st.lists(st.integers(-2**63, 2**63 - 1), min_size=n_rows, max_size=n_rows)),
                          dtype=np.int64) if numbers else None
        if table:
            low = -1 if numbers else 0
            codes = np.array(draw(st.lists(st.integers(low, len(table) - 1), min_size=n_rows, max_size=n_rows)),
                             dtype=np.int32)
        else:
            codes = None
        columns.append((values, codes, draw(st.sampled_from([0, 3])), table))
    first = draw(st.integers(0, n_rows))
    parts = [draw(st.binary(max_size=6)) for _ in range(5)]
    return columns, first, n_rows, parts, draw(st.sampled_from([8, 64, 1 << 16]))


@settings(max_examples=400, deadline=None)
@given(tables())
def test_format_rows_agrees_with_a_python_writer(case):
    columns, first, n_rows, (sep, row_open, row_close, num_open, num_close), size = case
    # skip to the first row by slicing: format_rows always starts at row 0
    sliced = [(None if v is None else v[first:], None if c is None else c[first:], s, t) for v, c, s, t in columns]
    got = b"".join(format_rows(sliced, n_rows - first, sep=sep, row_open=row_open, row_close=row_close,
                               num_open=num_open, num_close=num_close, buffer_size=size))
    assert got == reference_rows(columns, first, n_rows, sep, row_open, row_close, num_open, num_close)


def test_format_rows_refuses_bad_columns():
    with pytest.raises(ValueError, match="outside its column's table"):
        list(format_rows([(None, np.array([0, 2], dtype=np.int32), 0, [b"a", b"b"])], 2))
    with pytest.raises(ValueError, match="outside its column's table"):   # -1 with no numbers
        list(format_rows([(None, np.array([-1], dtype=np.int32), 0, [b"a"])], 1))
    with pytest.raises(ValueError, match="scale"):
        list(format_rows([(np.array([1]), None, 2, [])], 1))
    with pytest.raises(ValueError, match="rows"):
        list(format_rows([(np.array([1]), None, 0, [])], 2))


def reference_xml_cell(v):
    """The <c> element of one value, as the xlsx writer specifies it."""
    if v is None or v is pd.NA or (isinstance(v, float) and not math.isfinite(v)):
        return _EMPTY
    if isinstance(v, (bool, np.bool_)):
        return f'<c t="b"><v>{int(v)}</v></c>'
    if isinstance(v, (int, np.integer)):
        return f"<c><v>{int(v)}</v></c>"
    if isinstance(v, float):
        return f"<c><v>{v!r}</v></c>"
    return _str_cell(str(v))


def test_sheet_xml_cells(monkeypatch):
    import streamtrace.report.writers as report_mod

    monkeypatch.setattr(report_mod, "_CHUNK_ROWS", 7)
    rng = np.random.default_rng(3)
    n = 50
    df = pd.DataFrame({
        "f": np.concatenate([rng.integers(-10**9, 10**9, n - 5) / 1000.0, [np.nan, np.inf, -0.0, 0.1, 1e20]]),
        "i": rng.integers(-5, 5, n), "b": rng.integers(0, 2, n).astype(bool),
        "n": pd.array([None if k % 3 == 0 else k for k in range(n)], dtype="Int64"),
        "s": np.array(["a<b", " x", "&", "=f", None], dtype=object)[rng.integers(0, 5, n)],
        "m": pd.Series([[1, "2", 3.5, None, True][k % 5] for k in range(n)], dtype=object),
        "f32": rng.standard_normal(n).astype(np.float32)})
    xml = b"".join(_sheet_xml(df)).decode()
    body = xml[xml.index("</row>") + len("</row>"):xml.index("</sheetData>")]
    expected = "".join("<row>" + "".join(reference_xml_cell(v.item() if hasattr(v, "item") else v)
                                         for v in row) + "</row>"
                       for row in df.astype(object).itertuples(index=False))
    assert body == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=8), st.text(alphabet="ab ,\"\n\r\t&<>\x01=-", max_size=6)), max_size=20))
def test_batched_texts_equal_one_by_one(values):
    from streamtrace.report.writers import _csv_style, _str_cells

    assert _str_cells(values) == [_str_cell(v) for v in values]
    style = _csv_style()
    assert style.texts(values) == [style.text(v) for v in values]
    plain = [v for v in values if not any(c in v for c in ",\"\r\n&<>\x01")]   # the one-search path
    assert _str_cells(plain) == [_str_cell(v) for v in plain]
    assert style.texts(plain) == [style.text(v) for v in plain]

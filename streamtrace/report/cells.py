"""Report columns -> cells, fast, and exactly as pandas and Python format them.

The report writers (CSV and the fast xlsx engine) spend most of their time
turning ~100k-row sheets into text.  pandas' ``to_csv`` formats floats with
numpy's ``astype(str)`` and writes through the ``csv`` module, about 0.4 us a
cell.  Here a column becomes ``Cells``: its numbers as int64, which the C core
writes (``_native.format_rows``, without the GIL), and every other cell as a
code into a table of texts made once per distinct value:

* floats on the microsecond-with-ns-digits grid (every ts/dur/latency/skew of
  the report is ``int ns / 1000``) go to C as their thousandths k, written as
  k / 1000 with the fewest fraction digits: that is the shortest round-trip
  text, i.e. ``repr(x)`` (see ``_GRID_LIMIT``); every other float (and -0.0)
  is a table text made by ``repr``, which for float64 is what numpy's
  ``astype(str)`` gives;
* ints go to C as they are, booleans are two texts;
* text columns are formatted (quoted, escaped) once per distinct value.

``column_cells`` returns None for a column it does not know (the caller then
uses pandas), so exotic dtypes keep pandas' own formatting.
"""
import csv
import io
import re
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import numpy as np
import pandas as pd

from .._native import format_rows
from ..codes import str_codes

#: |x| below this: a float equal to k/1000 (k integer) has ulp < 1e-4, so its
#: shortest round-trip text is the decimal k/1000 itself (no shorter decimal
#: rounds to the same double), and repr uses positional notation (< 1e16)
_GRID_LIMIT = 1e12


@dataclass(frozen=True)
class CellStyle:
    """How one output format writes a cell."""
    na: str                     # a missing value: NaN, None, NA
    true: str
    false: str
    text: Callable              # a str value -> its cell (quoting, escaping)
    other: Callable             # any other object of a mixed column -> its cell
    number_open: str = ""       # around every number
    number_close: str = ""
    nonfinite_na: bool = False  # +-inf written as ``na`` (not as repr's "inf")
    texts: Optional[Callable] = None   # ``text`` of a list of str at once (faster), if given


class Cells(NamedTuple):
    """One column, ready for ``_native.format_rows``: per row either the
    number ``values[row]`` (``codes[row]`` -1) or ``table[codes[row]]``."""
    values: Optional[np.ndarray]   # int64, or None
    codes: Optional[np.ndarray]    # int32, or None: every row a number
    scale: int                     # 0: integers, 3: thousandths
    table: list                    # str


def column_cells(series, style):
    """The ``Cells`` of ``series`` in ``style``, or None for a dtype this
    module does not format."""
    dtype = series.dtype
    if isinstance(dtype, np.dtype):
        kind = dtype.kind
        if kind == "f" and dtype.itemsize == 8:
            return _float_cells(series.to_numpy(), style)
        if kind in "iu":
            values = series.to_numpy()
            if dtype == np.uint64 and len(values) and values.max() > np.iinfo(np.int64).max:
                return _texts_cells([str(v) for v in values.tolist()])
            return Cells(values.astype(np.int64, copy=False), None, 0, [])
        if kind == "b":
            return Cells(None, series.to_numpy().astype(np.int32), 0, [style.false, style.true])
        if kind != "O":
            return None
        values = series.to_numpy()
    elif isinstance(dtype, pd.Int64Dtype):
        missing = series.isna().to_numpy()
        return Cells(series.to_numpy(dtype=np.int64, na_value=0), np.where(missing, 0, -1).astype(np.int32), 0,
                     [style.na])
    elif isinstance(dtype, pd.StringDtype):
        values = series.to_numpy(dtype=object, na_value=None)
    else:
        return None
    return _object_cells(values, style)


def _float_cells(a, style):
    a = np.asarray(a, dtype=np.float64)
    if style.nonfinite_na:
        a = np.where(np.isfinite(a), a, np.nan)
    nan = np.isnan(a)
    with np.errstate(invalid="ignore", over="ignore"):
        k = np.rint(a * 1000.0)
        # -0.0 is on the grid, but its k (0) would be written "0.0": repr writes "-0.0"
        grid = ~nan & (np.abs(a) < _GRID_LIMIT) & (k / 1000.0 == a) & ~((a == 0) & np.signbit(a))
    values = np.where(grid, k, 0.0).astype(np.int64)
    codes = np.where(grid, -1, 0).astype(np.int32)   # 0: the table's na text
    table = [style.na]
    rest = np.flatnonzero(~grid & ~nan)
    if len(rest):
        # one text per distinct value (sizes in MB repeat, bandwidths do
        # not); distinct by bit pattern, which is all repr depends on
        _, first, inverse = np.unique(a[rest].view(np.int64), return_index=True, return_inverse=True)
        codes[rest] = 1 + inverse.astype(np.int32)
        texts = list(map(float.__repr__, a[rest[first]].tolist()))
        if style.number_open or style.number_close:
            texts = [style.number_open + t + style.number_close for t in texts]
        table += texts
    return Cells(values, codes, 3, table)


def _object_cells(values, style):
    coded = str_codes(values)
    if coded is not None:   # every value present is a str: each distinct one formatted once
        codes, uniques = coded
        codes = codes.astype(np.int32)
        codes[codes < 0] = len(uniques)
        texts = style.texts(uniques) if style.texts else [style.text(u) for u in uniques]
        return Cells(None, codes, 0, texts + [style.na])
    # mixed objects: each value on its own (1 and 1.0 must stay apart)
    missing = pd.isna(values).tolist()
    return _texts_cells([style.na if m else style.text(v) if isinstance(v, str) else style.other(v)
                         for v, m in zip(values.tolist(), missing)])


def _texts_cells(texts):
    return Cells(None, np.arange(len(texts), dtype=np.int32), 0, texts)


def table_rows(columns, style, sep, row_open="", row_close=""):
    """The rows of a list of ``Cells`` as text, in pieces (utf-8 bytes)."""
    return format_rows([(c.values, c.codes, c.scale, _encoded(c.table)) for c in columns],
                       len(columns[0].codes if columns[0].values is None else columns[0].values),
                       sep=sep.encode(), row_open=row_open.encode(), row_close=row_close.encode(),
                       num_open=style.number_open.encode(), num_close=style.number_close.encode())


def _encoded(texts):
    """The utf-8 bytes of each text: one encode of them all, split again at
    the NULs joining them (each text on its own if one holds a NUL)."""
    if len(texts) < 64:
        return [t.encode("utf-8") for t in texts]
    joined = "\0".join(texts)
    if joined.count("\0") != len(texts) - 1:
        return [t.encode("utf-8") for t in texts]
    return joined.encode("utf-8").split(b"\0")


def object_text(v):
    """What the csv module writes for a non-missing, non-str object (pandas
    passes objects through): str() of it, repr() of floats (numpy's too)."""
    if isinstance(v, float):
        return float.__repr__(float(v))
    return str(v)


class CsvQuoter:
    """A value as the ``csv`` module (QUOTE_MINIMAL, ``"\\n"`` line ends)
    writes it inside a row of several fields; only values holding a special
    character are handed to the module itself, so the rules are its own --
    but for a lone CR, which the module leaves bare (it quotes only its line
    end, "\\n") and at which spreadsheets and the module's reader start a new
    row: such a value is quoted too."""

    _SPECIAL = re.compile('[,"\r\n]')

    def __init__(self):
        self._buf = io.StringIO()
        self._writer = csv.writer(self._buf, lineterminator="\n")

    def many(self, values):
        """The quoted form of each str: one search over them all when none needs quotes."""
        if not self._SPECIAL.search("\0".join(values)):   # NUL: never special, so it adds no match
            return list(values)
        return [self(s) for s in values]

    def __call__(self, s):
        if not self._SPECIAL.search(s):
            return s
        self._buf.seek(0)
        self._buf.truncate()
        self._writer.writerow([s, ""])  # two fields: never the lone-empty-field special case
        out = self._buf.getvalue()[:-2]  # drop the empty second field's "," and the line end
        if not out.startswith('"'):   # a CR and nothing else special: no quote inside to double
            out = '"' + out + '"'
        return out


#: characters XML 1.0 does not allow in a document (dropped from cell text)
ILLEGAL_XML = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")


def xml_escape(s):
    """Cell text as XML character data (workbook cells and attributes)."""
    if ILLEGAL_XML.search(s):
        s = ILLEGAL_XML.sub("", s)
    if "&" in s:
        s = s.replace("&", "&amp;")
    if "<" in s:
        s = s.replace("<", "&lt;")
    if ">" in s:
        s = s.replace(">", "&gt;")
    if "\r" in s:   # as a reference: a bare CR is read back as LF (XML's line-end rule)
        s = s.replace("\r", "&#13;")
    return s

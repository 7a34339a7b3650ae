"""Column values -> text, fast, and exactly as pandas and Python format them.

The report writers (CSV and the fast xlsx engine) spend most of their time
turning ~100k-row sheets into text.  pandas' ``to_csv`` formats floats with
numpy's ``astype(str)`` and writes through the ``csv`` module, about 0.4 us a
cell; this module formats a whole column at once instead:

* floats on the microsecond-with-ns-digits grid (every ts/dur/latency/skew of
  the report is ``int ns / 1000``) are built from their integers (integer
  part, then one of 1000 fraction texts); the result is the shortest
  round-trip text, i.e. ``repr(x)`` (see ``float_texts``); all other floats go
  through ``repr``, which for float64 is what numpy's ``astype(str)`` gives;
* ints through ``str``, booleans ``True``/``False``;
* text columns are formatted and quoted once per distinct value.

``column_texts`` returns None for a column it does not know (the caller then
uses pandas), so exotic dtypes keep pandas' own formatting.
"""
import csv
import io
import re

import numpy as np
import pandas as pd

#: |x| below this: a float equal to k/1000 (k integer) has ulp < 1e-4, so its
#: shortest round-trip text is the decimal k/1000 itself (no shorter decimal
#: rounds to the same double), and repr uses positional notation (< 1e16)
_GRID_LIMIT = 1e12

#: ".0", ".001", ..., ".999": the fraction text of k/1000 by k % 1000 (trailing zeros stripped)
_FRAC = [".0"] + [("." + f"{i:03d}").rstrip("0") for i in range(1, 1000)]


def float_texts(values, na="", prefix="", suffix=""):
    """Text of each float64: ``prefix + repr(x) + suffix`` (repr = numpy's
    ``str``), ``na`` for NaN."""
    return by_distinct(np.asarray(values, dtype=np.float64), lambda u: _float_texts(u, na, prefix, suffix))


def _float_texts(a, na, prefix="", suffix=""):
    out = np.empty(len(a), dtype=object)
    nan = np.isnan(a)
    out[nan] = na
    rest = ~nan
    if rest.any():
        with np.errstate(invalid="ignore", over="ignore"):
            k = np.rint(a * 1000.0)
            grid = rest & (np.abs(a) < _GRID_LIMIT) & (k / 1000.0 == a)
        if grid.any():
            # integer part and fraction from the int k: one small f-string per
            # value (faster than repr, and than numpy's string functions)
            whole, frac = np.divmod(np.abs(k[grid]).astype(np.int64), 1000)
            neg = np.signbit(a[grid])  # signbit, so -0.0 is "-0.0" as repr writes it
            if neg.any():
                out[grid] = [f"{prefix}-{w}{_FRAC[f]}{suffix}" if n else f"{prefix}{w}{_FRAC[f]}{suffix}"
                             for w, f, n in zip(whole.tolist(), frac.tolist(), neg.tolist())]
            else:
                out[grid] = [f"{prefix}{w}{_FRAC[f]}{suffix}" for w, f in zip(whole.tolist(), frac.tolist())]
            rest &= ~grid
    if rest.any():
        out[rest] = [prefix + float.__repr__(v) + suffix for v in a[rest].tolist()]
    return out


def int_texts(values):
    def fmt(u):
        out = np.empty(len(u), dtype=object)
        out[:] = list(map(str, u.tolist()))
        return out

    return by_distinct(np.asarray(values), fmt)


def by_distinct(a, fmt):
    """``fmt`` (array -> texts) applied to the distinct values of ``a`` only,
    when there are few (sizes, ranks, group sizes, stream ids...)."""
    if len(a) < 64:
        return np.asarray(fmt(a), dtype=object)
    # floats by bit pattern: -0.0 and 0.0 stay apart, NaN is a value like any other
    key = a.view(np.int64) if a.dtype == np.float64 else a
    head = key[:256]
    if len(np.unique(head)) * 4 > len(head):  # mostly distinct (times, ids): hashing would not pay
        return np.asarray(fmt(a), dtype=object)
    codes, uniques = pd.factorize(key)
    if len(uniques) * 4 > len(a):
        return np.asarray(fmt(a), dtype=object)
    if key is not a:
        uniques = uniques.view(np.float64)
    return np.asarray(fmt(uniques), dtype=object)[codes]


def str_texts(values, text, na):
    """Per value of an object array: ``text(value)``, computed once per
    distinct value, and ``na`` where missing, when every value present is a
    str (one hashing pass); else None.  (str only equals str, so hashing
    merged nothing that must stay apart.)"""
    codes, uniques = pd.factorize(values, use_na_sentinel=True)   # -1: missing
    uniques = list(uniques)
    if not all(type(u) is str for u in uniques):
        return None
    return np.array([text(u) for u in uniques] + [na], dtype=object)[codes]   # code -1 picks na


def object_text(v):
    """What the csv module writes for a non-missing, non-str object (pandas
    passes objects through): str() of it, repr() of floats (numpy's too)."""
    if isinstance(v, float):
        return float.__repr__(float(v))
    return str(v)


def column_texts(series, text=lambda s: s, other=object_text, na=""):
    """Object array with the text of every value of ``series`` (``na`` for
    missing), or None for a dtype this module does not format.

    In object and string columns, ``text`` maps each str value to its
    written form (quoting, formula neutralisation; called once per distinct
    value) and ``other`` any other object.
    """
    dtype = series.dtype
    if isinstance(dtype, np.dtype):
        kind = dtype.kind
        if kind == "f" and dtype.itemsize == 8:
            return float_texts(series.to_numpy(), na)
        if kind in "iu":
            return int_texts(series.to_numpy())
        if kind == "b":
            return np.where(series.to_numpy(), "True", "False").astype(object)
        if kind != "O":
            return None
        values = series.to_numpy()
    elif isinstance(dtype, pd.Int64Dtype):
        mask = series.isna().to_numpy()
        out = int_texts(series.to_numpy(dtype=np.int64, na_value=0))
        out[mask] = na
        return out
    elif isinstance(dtype, pd.StringDtype):
        values = series.to_numpy(dtype=object, na_value=None)
    else:
        return None
    out = str_texts(values, text, na)
    if out is not None:
        return out
    mask = pd.isna(values)   # mixed objects: each value on its own (1 and 1.0 must stay apart)
    out = np.empty(len(values), dtype=object)
    out[mask] = na
    out[~mask] = [text(v) if isinstance(v, str) else other(v) for v in values[~mask].tolist()]
    return out


class CsvQuoter:
    """A value as the ``csv`` module (QUOTE_MINIMAL, ``"\\n"`` line ends)
    writes it inside a row of several fields; only values holding a special
    character are handed to the module itself, so the rules are its own."""

    _SPECIAL = re.compile('[,"\r\n]')

    def __init__(self):
        self._buf = io.StringIO()
        self._writer = csv.writer(self._buf, lineterminator="\n")

    def __call__(self, s):
        if not self._SPECIAL.search(s):
            return s
        self._buf.seek(0)
        self._buf.truncate()
        self._writer.writerow([s, ""])  # two fields: never the lone-empty-field special case
        return self._buf.getvalue()[:-2]  # drop the empty second field's "," and the line end

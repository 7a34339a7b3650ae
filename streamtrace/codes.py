"""Columns as integer codes: text handled once per distinct value.

The report's tables have ~100k rows but few distinct texts (process groups,
collective names, dtypes, flags).  ``Text`` keeps a text column as codes into
its distinct values, so maps, string building and comparisons run once per
distinct value and rows are handled as integers; the group helpers number
rows as pandas' groupby would, without building a grouper.
"""
import numpy as np
import pandas as pd

from ._native import factorize_rows

#: object arrays shorter than this go to pandas directly (the identity pass
#: pays from a few thousand rows)
_IDENTITY_MIN = 4096


def factorize(values, use_na_sentinel=True):
    """``pd.factorize(values, use_na_sentinel=...)`` of an array or Series:
    the same codes (int64) and uniques, faster for long object arrays, whose values
    are few distinct objects each shared by many rows.  Rows are grouped
    first by the identity of their objects -- a C hash pass over the object
    pointers, which are compared, never followed -- and then the distinct
    objects by pandas itself.  Rows holding one object are equal values, and
    each group meets pandas at its first row, in row order, so the codes,
    their order and the uniques (first objects) are exactly pandas'; equal
    values held by different objects still share a code."""
    if isinstance(values, pd.Series) and values.dtype == object:
        values = values.to_numpy()
    if not isinstance(values, np.ndarray) or values.dtype != object or len(values) < _IDENTITY_MIN:
        codes, uniques = pd.factorize(values, use_na_sentinel=use_na_sentinel)
        return codes.astype(np.int64, copy=False), uniques
    values = np.ascontiguousarray(values)
    groups, first = factorize_rows(np.frombuffer(memoryview(values), dtype=np.int64))
    codes, uniques = pd.factorize(values[first], use_na_sentinel=use_na_sentinel)
    return codes.astype(np.int64, copy=False)[groups], uniques


class Text:
    """A text column as integer codes into its distinct values (code -1:
    missing).  Maps, string building and comparisons run once per distinct
    value; rows are handled as integers; text objects are built only for
    the output (``objects``)."""

    def __init__(self, codes, uniques):
        self.codes = codes
        self.uniques = uniques

    @classmethod
    def of(cls, values):
        codes, uniques = factorize(np.asarray(values, dtype=object))
        return cls(codes, np.asarray(uniques, dtype=object))

    def missing(self):
        return self.codes < 0

    def table(self, fn, missing=None):
        """``fn`` of every distinct value, plus ``missing`` last (so that code -1 picks it)."""
        out = np.empty(len(self.uniques) + 1, dtype=object)
        for i, u in enumerate(self.uniques.tolist()):
            out[i] = fn(u)
        out[-1] = missing
        return out

    def lookup(self, fn, missing=None, dtype=object):
        """Per row: ``fn(value)``, ``missing`` where the value is missing (as ``dtype``)."""
        return self.table(fn, missing).astype(dtype)[self.codes]

    def take(self, idx):
        return Text(self.codes[idx], self.uniques)

    def assign(self, mask, value):
        """A copy with ``value`` in the rows of ``mask``."""
        codes = self.codes.copy()
        codes[mask] = len(self.uniques)
        uniques = np.empty(len(self.uniques) + 1, dtype=object)
        uniques[:-1] = self.uniques
        uniques[-1] = value
        return Text(codes, uniques)

    def at(self, i):
        """The value of row ``i`` (None if missing)."""
        c = self.codes[i]
        return None if c < 0 else self.uniques[c]

    def isin(self, values):
        return self.lookup(lambda u: u in values, False, bool)

    def objects(self):
        """Per row: the value, None where missing (the output form of text columns)."""
        return self.lookup(lambda u: u)

    def recode(self, fn, missing=None):
        """A Text of ``fn(value)`` (``missing`` for missing rows; None stays missing);
        values that become equal share a code."""
        codes, uniques = pd.factorize(self.table(fn, missing), use_na_sentinel=True)
        return Text(codes.astype(np.int64)[self.codes], np.asarray(uniques, dtype=object))

    def sort_rank(self):
        """Per code: its value's position in sorted order (as a sort by the text would order rows)."""
        out = np.empty(len(self.uniques), dtype=np.int64)
        out[sorted(range(len(self.uniques)), key=lambda c: self.uniques[c])] = np.arange(len(self.uniques))
        return out


def str_codes(values):
    """(codes, distinct values) of an object array whose present values are
    all str -- codes int64, -1 where missing (None, NaN, pd.NA) -- else None
    (numbers, nested values).  One hashing pass; str equals only str, so the
    hashing merged nothing that must stay apart."""
    try:
        codes, uniques = factorize(values)
    except TypeError:   # unhashable (nested) values
        return None
    uniques = uniques.tolist()
    if not all(type(u) is str for u in uniques):
        return None
    return codes, uniques


def group_ids(*keys):
    """Dense group ids of rows keyed by several arrays, numbered in order of
    first appearance (as ``groupby(keys, sort=False).ngroup()``); a missing
    value (None, NaN) is a key value like any other."""
    ids = np.zeros(len(keys[0]), dtype=np.int64)
    for key in keys:
        codes, uniques = factorize(key, use_na_sentinel=False)
        ids = pd.factorize(ids * len(uniques) + codes)[0].astype(np.int64)  # both < n: no overflow
    return ids


def dense_rank(*keys):
    """Per row: the rank of its key tuple among the distinct tuples in
    lexicographic order (as ``groupby(keys, sort=True).ngroup()``)."""
    order = np.lexsort(keys[::-1])   # lexsort sorts by its last key first
    new = np.zeros(len(order), dtype=bool)
    if len(order):
        new[0] = True
        for key in keys:
            k = key[order]
            new[1:] |= k[1:] != k[:-1]
    out = np.empty(len(order), dtype=np.int64)
    out[order] = np.cumsum(new) - 1
    return out


def occurrence(ids):
    """Per row: how many earlier rows have the same id (as ``groupby(...).cumcount()``)."""
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    run_start = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])
    counts = np.diff(np.r_[run_start, len(ids)])
    out = np.empty(len(ids), dtype=np.int64)
    out[order] = np.arange(len(ids)) - np.repeat(run_start, counts)
    return out


def joined_labels(checks, sep):
    """Per row: the names of ``checks`` (name, mask) that hold, joined by
    ``sep`` in check order ('' when none), as a Text: the text is built
    once per combination."""
    n = len(checks[0][1]) if checks else 0
    bits = np.zeros(n, dtype=np.int64)
    for j, (_, mask) in enumerate(checks):
        bits |= np.asarray(mask, dtype=bool).astype(np.int64) << j
    codes, combos = pd.factorize(bits)
    table = np.empty(len(combos), dtype=object)
    for i, b in enumerate(combos.tolist()):
        table[i] = sep.join(name for j, (name, _) in enumerate(checks) if b >> j & 1)
    return Text(codes.astype(np.int64), table)

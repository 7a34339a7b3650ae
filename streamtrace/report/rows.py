"""The rows every sheet reads: ``nccl_long`` (one row per collective kernel
per rank), its per-row ns arrays, the per-instance reductions over them, and
the value conversions and caches the sheets share."""
import math

import numpy as np
import pandas as pd
from pandas.api.types import infer_dtype

from .. import collectives as coll
from ..codes import Text, factorize, group_ids


def _us(ns):
    """int ns -> float us, correctly rounded (also beyond 2**53 ns, via whole + fraction)."""
    ns = np.asarray(ns, dtype=np.int64)
    small = np.abs(ns) < (1 << 53)
    out = ns / 1000.0
    if not small.all():
        big = ~small
        out[big] = (ns[big] // 1000).astype(np.float64) + (ns[big] % 1000) / 1000.0
    return out


def _float(series):
    """Nullable numbers -> float64 with NaN."""
    return pd.to_numeric(series, errors="coerce").astype(np.float64).to_numpy()


def _obj(series):
    """Object values with None for missing (as ``astype(object).where(notna, None)``, without its overhead)."""
    values = series.to_numpy(dtype=object)
    if infer_dtype(values, skipna=False) == "string":  # all text: nothing missing (a 4x cheaper scan than isna)
        return pd.Series(values, dtype=object, index=series.index)
    missing = pd.isna(values)
    if missing.any():
        values = values.copy()
        values[missing] = None
    return pd.Series(values, dtype=object, index=series.index)


def _obj_text(text):
    """A Text as an object Series, None for missing (a plain array would be inferred as pandas' str dtype)."""
    return pd.Series(text.objects(), dtype=object)


# ---------------------------------------------------------------------- nccl_long


#: nccl_long text columns kept as codes too (``ns["text"]``): the mismatch checks,
#: summary group-bys and node spans compare codes instead of strings
_CODED_TEXT = {"Process Group Name": "pg", "Process Group Ranks": "pg_ranks", "Collective name": "collective_name",
               "dtype": "dtype", "In split size": "in_split", "Out split size": "out_split"}


def _long_table(c, common_base):
    """(nccl_long without node columns, per-row ns arrays)."""
    text = {name: Text.of(c[col].to_numpy(dtype=object)) for name, col in _CODED_TEXT.items()}
    ts_disp = c["ts_aligned_ns"].to_numpy(dtype=np.int64) - common_base
    raw = c["base_ns"].to_numpy(dtype=np.int64) + c["ts_ns"].to_numpy(dtype=np.int64) - common_base
    dur = c["dur_ns"].to_numpy(dtype=np.int64)
    in_b, out_b = _float(c["in_bytes"]), _float(c["out_bytes"])
    long = pd.DataFrame({
        "collective_id": _obj(c["collective_id"]),
        "index_in_group": c["index_in_group"].to_numpy(dtype=np.int64),
        "rank": c["rank"].to_numpy(dtype=np.int64),
        "Process Group Name": _obj_text(text["Process Group Name"]),
        "Process Group Ranks": _obj_text(text["Process Group Ranks"]),
        "Collective name": _obj_text(text["Collective name"]),
        "Group size": c["group_size"].astype("Int64"),
        "dtype": _obj_text(text["dtype"]),
        "In msg nelems": c["in_nelems"].astype("Int64"),
        "In msg size (MB)": in_b / coll.MIB,
        "Out msg nelems": c["out_nelems"].astype("Int64"),
        "Out msg size (MB)": out_b / coll.MIB,
        "In split size": _obj_text(text["In split size"]),
        "Out split size": _obj_text(text["Out split size"]),
        "stream": c["stream"].astype("Int64"),
        "ts": _us(ts_disp),
        "dur": dur / 1000.0,
        "instance": c["instance"].to_numpy(dtype=np.int64),
        "kernel_name": _obj(c["kernel_name"]),
        "match_method": _obj(c["match_method"]),
        "ts_raw": _us(raw),
        "clock_offset_us": c["clock_offset_ns"].to_numpy(dtype=np.int64) / 1000.0,
        "flags": _obj(c["flags"]),
    }, copy=False)   # columns align.collectives also holds stay shared (copy-on-write), not copied into blocks
    # user labels of the launches (record_function names around them): a trailing column, only when a trace has
    # any, so that reports of unlabelled traces keep TraceLens's columns and streamtrace's as they were
    if "user_label" in c.columns and c["user_label"].notna().any():
        long["user_label"] = _obj(c["user_label"])
    ns = {"instance": long["instance"].to_numpy(), "rank": long["rank"].to_numpy(), "s": ts_disp, "dur": dur,
          "e": ts_disp + dur, "in_bytes": in_b, "out_bytes": out_b, "pg_name": c["pg_name"].to_numpy(dtype=object),
          "category": c["category"].to_numpy(dtype=object), "kind": c["kind"].to_numpy(dtype=object),
          "mismatch_fields": c["mismatch_fields"].to_numpy(dtype=object),
          "stream_mismatch": c["stream_mismatch"].to_numpy(dtype=bool),
          "participants": c["participants"].to_numpy(dtype=np.int64), "text": text}
    return long, ns


def _instance_stats(ns):
    """Per-instance reductions over the rows (rows sorted by instance, then rank)."""
    inst = ns["instance"]
    if not len(inst):
        return {"starts": np.empty(0, dtype=np.int64), "ids": np.empty(0, dtype=np.int64), "codes": {}}
    starts = np.flatnonzero(np.r_[True, inst[1:] != inst[:-1]])
    counts = np.diff(np.r_[starts, len(inst)])
    s, e, dur, rank = ns["s"], ns["e"], ns["dur"], ns["rank"]
    if len(starts) == len(inst):   # one row per instance (e.g. unmatched send/recv): the rows are the reductions
        st = {"starts": starts, "ids": inst, "count": counts, "max_s": s, "min_s": s, "max_e": e, "min_e": e,
              "min_dur": dur, "max_dur": dur, "sum_dur": dur}
        pos = starts
    else:
        st = {"starts": starts, "ids": inst[starts], "count": counts,
              "max_s": np.maximum.reduceat(s, starts), "min_s": np.minimum.reduceat(s, starts),
              "max_e": np.maximum.reduceat(e, starts), "min_e": np.minimum.reduceat(e, starts),
              "min_dur": np.minimum.reduceat(dur, starts), "max_dur": np.maximum.reduceat(dur, starts),
              "sum_dur": np.add.reduceat(dur, starts)}
        pos = np.repeat(np.arange(len(starts)), counts)  # instance position of each row
    st["codes"] = {name: t.codes for name, t in ns["text"].items()}  # _mismatch_by_instance's cache
    st["pos"] = pos
    # earliest arrival: smallest start, ties -> highest rank
    o = np.lexsort((-rank, s, pos))
    first = np.r_[True, pos[o][1:] != pos[o][:-1]]
    st["earliest_rank"] = rank[o][first]
    # last arrival (straggler): largest start, ties -> lowest rank; and the second-last start
    o = np.lexsort((rank, -s, pos))
    po = pos[o]
    first = np.flatnonzero(np.r_[True, po[1:] != po[:-1]])
    st["last_rank"] = rank[o][first]
    second = np.where(counts >= 2, s[o][np.minimum(first + 1, len(o) - 1)], np.iinfo(np.int64).min)
    st["second_s"] = second
    return st


def _mismatch_by_instance(df, cols, starts, codes_cache=None):
    """Per instance (rows grouped contiguously, ``starts`` = first row of each):
    the first column of ``cols`` whose values disagree across its rows, or ''.
    ``codes_cache`` (a dict) keeps each column's codes for the next call."""
    out = np.full(len(starts), "", dtype=object)
    if not len(starts):
        return out
    cache = {} if codes_cache is None else codes_cache
    for col in cols:
        codes = cache.get(col)
        if codes is None:  # equal values share a code; missing ones are all -1
            codes = cache[col] = factorize(df[col])[0]
        bad = (np.minimum.reduceat(codes, starts) != np.maximum.reduceat(codes, starts)) & (out == "")
        out[bad] = col
    return out


def _first_rows(long, st):
    """The first row of every instance (kept in ``st``: three sheets read it; none modifies it)."""
    if "first" not in st:
        starts = st["starts"]
        if len(starts) == len(long):   # one row per instance: the rows themselves (copy-on-write), not a copy
            st["first"] = long.reset_index(drop=True)
        else:
            st["first"] = long.iloc[starts].reset_index(drop=True)
    return st["first"]


def _instance_flags(flags, starts, counts):
    """Union of the row flags of each instance."""
    out = np.full(len(starts), "", dtype=object)
    flagged = np.flatnonzero(flags != "")
    if not len(flagged):
        return out
    inst_of_row = np.repeat(np.arange(len(starts)), counts)
    for i in np.unique(inst_of_row[flagged]).tolist():
        tokens = []
        for f in flags[starts[i]:starts[i] + counts[i]]:
            for t in (f.split(";") if f else ()):
                if t not in tokens:
                    tokens.append(t)
        out[i] = ";".join(tokens)
    return out


def _flag_array(long):
    return long["flags"].astype(object).fillna("").to_numpy(dtype=object)


def _flags_by_instance(long, st):
    """``_instance_flags`` of every instance, computed once per report (kept in ``st``)."""
    if "flags" not in st:
        st["flags"] = _instance_flags(_flag_array(long), st["starts"], st["count"])
    return st["flags"]


def _first_agg(series):
    v = series.dropna()
    return v.iloc[0] if len(v) else None


def _cached(fn, *columns):
    """``[fn(*values) for values in zip(*columns)]`` for numpy ``columns``,
    calling ``fn`` once per distinct tuple (a handful of kinds, group sizes
    and sizes per report), with the Python values of its first row.  Missing
    values (None, NaN) count as one value: every ``fn`` here treats them alike."""
    ids = group_ids(*columns)
    _, first = np.unique(ids, return_index=True)
    results = np.empty(len(first), dtype=object)
    for i, values in enumerate(zip(*[np.asarray(col)[first].tolist() for col in columns])):
        results[i] = fn(*values)
    return results[ids].tolist()


def _factor(kind, n):
    f = coll.bus_factor(kind if isinstance(kind, str) else None, None if math.isnan(n) else n)
    return np.nan if f is None else f

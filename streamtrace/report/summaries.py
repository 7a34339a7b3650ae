"""The other summaries: ``nccl_summary_long`` (per rank and collective
shape), Part B's ``nccl_summary_by_size`` and ``clock_alignment``."""
import math

import numpy as np
import pandas as pd

from .. import collectives as coll
from ..codes import dense_rank
from .all2allv import _OFFRANK_COLUMNS, _offrank_mb
from .columns import BY_SIZE_COLUMNS, CLOCK_SHEET_COLUMNS, SUMMARY_LONG_KEYS, SUMMARY_LONG_METRICS
from .nodes import _with_nodes
from .rows import _cached, _factor, _first_rows


def _sorted_codes(long, text, col):
    """Per row: the position of its ``col`` value among the column's sorted distinct values (-1: missing)."""
    if col in text:  # text: sort the distinct values only
        t = text[col]
        return np.append(t.sort_rank(), -1)[t.codes]  # code -1 (missing) picks the -1 at the end
    return pd.factorize(long[col], sort=True, use_na_sentinel=True)[0]


def _summary_long(long, nodes, text):
    """``long.groupby(SUMMARY_LONG_KEYS, sort=True, dropna=True)`` aggregated,
    grouped by one integer id built from the column codes (``text``: the
    coded text columns): the sums and means are pandas' own, over the same
    rows in the same order."""
    codes = [_sorted_codes(long, text, k) for k in SUMMARY_LONG_KEYS]
    keep = np.flatnonzero(np.logical_and.reduce([k >= 0 for k in codes])) if len(long) else np.empty(0, np.int64)
    if not len(keep):  # rows with a missing key are in no group (dropna)
        res = pd.DataFrame({c: [] for c in SUMMARY_LONG_KEYS + SUMMARY_LONG_METRICS})
    else:
        ids = dense_rank(*[k[keep] for k in codes])
        _, first = np.unique(ids, return_index=True)
        keys = long[SUMMARY_LONG_KEYS].iloc[keep[first]].reset_index(drop=True)
        for k in [k for k in SUMMARY_LONG_KEYS if k in text]:  # as groupby's own key columns: text as pandas' str
            keys[k] = keys[k].astype("str")
        g = long[["In msg size (MB)", "Out msg size (MB)", "dur"]].iloc[keep].groupby(ids, sort=True)
        res = g.agg(**{
            "In msg size (MB)_first": ("In msg size (MB)", "first"),
            "Out msg size (MB)_first": ("Out msg size (MB)", "first"),
            "dur_sum": ("dur", "sum"), "dur_mean": ("dur", "mean"), "dur_std": ("dur", "std"),
            "dur_min": ("dur", "min"), "dur_max": ("dur", "max"), "operation_count": ("dur", "size"),
        }).reset_index(drop=True)
        res = pd.concat([keys, res], axis=1)
        order = np.lexsort((np.arange(len(res)), -res["dur_sum"].to_numpy(dtype=np.float64)))
        res = res.iloc[order].reset_index(drop=True)
    return _with_nodes(res, nodes, rank_col=True, span_col=True)


def _by_size(long, ns, st):
    if not len(long):
        return pd.DataFrame({c: [] for c in BY_SIZE_COLUMNS})
    starts = st["starts"]
    first = _first_rows(long, st)
    cat = ns["category"][starts]
    kind = ns["kind"][starts]
    pos = st["pos"]
    in_b, out_b = ns["in_bytes"], ns["out_bytes"]
    a2av = cat == "alltoallv"
    # one row per instance: each row its own maximum
    max_in = in_b if len(starts) == len(pos) else pd.Series(in_b).groupby(pos).max().to_numpy()
    nbytes = np.where(cat == "allgather", out_b[starts], np.where(a2av, max_in, in_b[starts]))
    lat = st["min_dur"] / 1000.0
    gsize = first["Group size"].astype("Float64").to_numpy(dtype=np.float64, na_value=np.nan)
    factor = np.array(_cached(_factor, kind, gsize), dtype=np.float64)
    bus_bytes = nbytes * factor
    if a2av.any():
        rows = a2av[pos]
        off = _offrank_mb(long.loc[rows, _OFFRANK_COLUMNS], ns["rank"][rows]) * coll.MIB
        mx = pd.Series(off).groupby(pos[rows]).max()
        bus_bytes[mx.index.to_numpy()] = mx.to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        bw = np.where(lat > 0, bus_bytes / coll.GIB / (lat / 1e6), np.nan)
    df = pd.DataFrame({
        "Collective name": first["Collective name"].astype(object).where(first["Collective name"].notna(), "Unknown"),
        "Process Group Name": first["Process Group Name"].astype(object),
        "size_bucket": _cached(lambda b: coll.size_bucket(None if math.isnan(b) else b), nbytes),
        "bytes": nbytes, "lat": lat, "bw": bw, "bus_bytes": bus_bytes,
    })
    g = df.groupby(["Collective name", "Process Group Name", "size_bucket"], sort=False)
    res = g.agg(count=("lat", "size"), total_bytes=("bytes", "sum"), total_latency_us=("lat", "sum"),
                avg_latency_us=("lat", "mean"), p50_latency_us=("lat", lambda x: np.percentile(x, 50)),
                p99_latency_us=("lat", lambda x: np.percentile(x, 99)),
                **{"avg bus bw (GB/s)": ("bw", "mean")}).reset_index()
    tb = g["bus_bytes"].sum(min_count=1).to_numpy()
    tl = g["lat"].sum().to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        res["bus bw (GB/s)"] = np.where(tl > 0, tb / coll.GIB / (tl / 1e6), np.nan)
    res["total_bytes"] = pd.array([None if math.isnan(x) else int(x) for x in
                                   g["bytes"].sum(min_count=1).to_numpy(dtype=np.float64)], dtype="Int64")
    res["_b"] = res["size_bucket"].map(coll.SIZE_BUCKET_ORDER)
    res = res.sort_values(["Collective name", "Process Group Name", "_b"], kind="stable").drop(columns="_b")
    return res[BY_SIZE_COLUMNS].reset_index(drop=True)


def _clock_sheet(clocks, applied, story=()):
    note = ("applied: ts, skew and wait columns of this report are on aligned clocks" if applied else
            "estimated only, not applied (times are as recorded; use --align_clocks to apply)")
    if story:   # the offsets change the answers: say so on every row
        note = ("estimated only, not applied, and LARGE ENOUGH TO CHANGE THE ANSWERS (see data_quality): skew, "
                "wait and straggler columns use the clocks as recorded; use --align_clocks for the aligned view")
    if any(f["category"] == "clock_offsets_unreliable" for f in story):   # the clock rule: no advice to apply them
        note = ("estimated only, not applied: they rest on too few collectives to be trusted, yet would change the "
                "answers (see data_quality): skew, wait and straggler columns use the clocks as recorded and are "
                "not reliable")
    return pd.DataFrame({
        "rank": clocks["rank"].to_numpy(dtype=np.int64),
        "offset_us": clocks["offset_ns"].to_numpy(dtype=np.int64) / 1000.0,
        "residual_us": clocks["residual_ns"].to_numpy(dtype=np.float64) / 1000.0,
        "max_residual_us": clocks["max_residual_ns"].to_numpy(dtype=np.float64) / 1000.0,
        "collectives": clocks["collectives"].to_numpy(dtype=np.int64),
        "reference_rank": clocks["reference_rank"].to_numpy(dtype=np.int64),
        "applied": clocks["applied"].to_numpy(dtype=bool),
        "method": clocks["method"].astype(object).to_numpy(),
        "note": [note] * len(clocks),
    }, columns=CLOCK_SHEET_COLUMNS)

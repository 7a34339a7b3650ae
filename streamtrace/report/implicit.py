"""The implicit-sync sheets: ``nccl_implicit_sync`` (one row per synchronising
collective instance, with per-rank ts / dur / wait columns), its summary
``nccl_summary_implicit_sync`` and the per-rank ``straggler_summary``."""
import numpy as np
import pandas as pd

from .. import collectives as coll
from ..codes import factorize
from ..errors import MetadataMismatchError
from .columns import (IMPLICIT_CHECK, IMPLICIT_COLUMNS, IMPLICIT_EXTRA, STRAGGLER_COLUMNS, SUMMARY_IMPLICIT_KEYS,
                      SUMMARY_IMPLICIT_METRICS)
from .options import agg_label
from .rows import _cached, _factor, _first_agg, _first_rows, _flags_by_instance, _mismatch_by_instance


def _implicit_sync(long, ns, st, simplified, strict, findings):
    """(nccl_implicit_sync without node_span, mask of the rows that belong to it)."""
    cols = IMPLICIT_COLUMNS + IMPLICIT_EXTRA
    if not len(long):
        return pd.DataFrame({c: [] for c in cols}), np.zeros(0, dtype=bool)
    starts = st["starts"]
    first = _first_rows(long, st)
    cat = pd.Series(ns["category"][starts])
    include = cat.isin(coll.IMPLICIT_SYNC).to_numpy()
    if simplified:  # A3.2: unknown names are included in inference mode
        include = include | first["Collective name"].isna().to_numpy()
    rows = include[st["pos"]]
    if not include.any():
        return pd.DataFrame({c: [] for c in cols}), rows
    mism = _mismatch_by_instance(long, IMPLICIT_CHECK, starts, st["codes"])
    bad = include & (mism != "")
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        msg = (f"Metadata mismatch in '{mism[i]}' across the ranks of collective {first['collective_id'][i]}")
        if strict and not simplified:
            raise MetadataMismatchError(msg + " (--strict)")
        findings.append({"severity": "warning", "category": "metadata_mismatch", "rank": None, "pg": None,
                         "collective_id": first["collective_id"][i], "count": int(bad.sum()),
                         "message": f"{int(bad.sum())} implicit-sync instance(s) disagree on metadata; first: {msg}. "
                                    "Values shown are the lowest participating rank's"})
    sel = np.flatnonzero(include)
    n = len(sel)
    out = first.loc[sel, IMPLICIT_COLUMNS[:10]].reset_index(drop=True)
    catv = cat.to_numpy()[sel]
    in_mb = out["In msg size (MB)"].to_numpy(dtype=np.float64)
    out_mb = out["Out msg size (MB)"].to_numpy(dtype=np.float64)
    full = np.where(catv == "allgather", out_mb, in_mb)
    lat = st["min_dur"][sel] / 1000.0
    with np.errstate(divide="ignore", invalid="ignore"):
        algo = np.where(lat > 0, (full / 1024) / (lat / 1e6), np.nan)
    gsize = out["Group size"].astype("Float64").to_numpy(dtype=np.float64, na_value=np.nan)
    factor = np.array(_cached(_factor, catv, gsize), dtype=np.float64)
    # waits, per row
    rowpos = st["pos"]
    waits_ns = st["max_s"][rowpos] - ns["s"]
    sum_w = np.add.reduceat(waits_ns, starts) if len(starts) else np.empty(0)
    out["Full msg size (MB)"] = full
    out["comm_latency"] = lat
    out["skew in start time"] = (st["max_s"] - st["min_s"])[sel] / 1000.0
    out["earliest arrival rank"] = st["earliest_rank"][sel]
    out["avg_wait_time"] = sum_w[sel] / st["count"][sel] / 1000.0
    out["skew in end time"] = (st["max_e"] - st["min_e"])[sel] / 1000.0
    out["algo bw (GB/s)"] = algo
    out["bus bw (GB/s)"] = algo * factor
    # per-rank columns
    keep = rows
    ranks = np.unique(ns["rank"][keep])
    rpos = np.searchsorted(ranks, ns["rank"][keep])
    ipos = np.searchsorted(sel, rowpos[keep])
    mats = {}
    for name, values in (("ts", long["ts"].to_numpy()[keep]), ("dur", long["dur"].to_numpy()[keep]),
                         ("wait_time", waits_ns[keep] / 1000.0)):
        m = np.full((n, len(ranks)), np.nan)
        m[ipos, rpos] = values
        mats[name] = m
    wide = {}
    for j, r in enumerate(ranks):
        wide[f"rank_{r}_ts"] = mats["ts"][:, j]
        wide[f"rank_{r}_dur"] = mats["dur"][:, j]
    for j, r in enumerate(ranks):
        wide[f"rank_{r}_wait_time"] = mats["wait_time"][:, j]
    extra = {
        "xfer_latency": (st["min_e"] - st["max_s"])[sel] / 1000.0,
        "straggler_rank": st["last_rank"][sel],
        "blame_us": np.where(st["count"][sel] >= 2, (st["max_s"] - st["second_s"])[sel] / 1000.0, np.nan),
        "participants": st["count"][sel],
        "metadata_mismatch": mism[sel] != "",
        "mismatch_fields": np.where(mism[sel] != "", mism[sel], None),
        "instance": st["ids"][sel],
        "flags": _flags_by_instance(long, st)[sel],
    }
    result = pd.concat([out, pd.DataFrame(wide), pd.DataFrame(extra)], axis=1)
    return result, rows


def _summary_implicit(implicit, aggs):
    if not len(implicit):
        cols = SUMMARY_IMPLICIT_KEYS + ["Process Group Name", "Group size", "Full msg size (MB)"]
        for m in SUMMARY_IMPLICIT_METRICS:
            cols += [f"{m}_{agg_label(a)}" for a in aggs]
        return pd.DataFrame({c: [] for c in cols + ["count", "Total comm latency (ms)"]})
    df = implicit.copy()
    for k in SUMMARY_IMPLICIT_KEYS:
        df[k] = df[k].astype(object).where(df[k].notna(), "Unknown")
    codes = [factorize(df[k].to_numpy(dtype=object))[0] for k in SUMMARY_IMPLICIT_KEYS]
    g = df.groupby(codes, sort=False)
    res = g[SUMMARY_IMPLICIT_KEYS].first()
    for c in ("Process Group Name", "Group size", "Full msg size (MB)"):
        res[c] = g[c].agg(_first_agg)
    for m in SUMMARY_IMPLICIT_METRICS:
        if m.startswith(("algo", "bus")) and df[m].isna().all():
            continue
        for a in aggs:
            res[f"{m}_{agg_label(a)}"] = g[m].agg(a)
    res["count"] = g.size()
    res["Total comm latency (ms)"] = g["comm_latency"].sum() / 1000.0
    res = res.reset_index(drop=True)
    order = np.lexsort((np.arange(len(res)), -res["Total comm latency (ms)"].to_numpy(dtype=np.float64)))
    res = res.iloc[order].reset_index(drop=True)
    res["Group size"] = res["Group size"].astype("Int64")
    return res


def _straggler(ns, imp_rows, implicit, nodes):
    N = len(implicit)
    rows = imp_rows
    rank = ns["rank"]
    inst_rows = ns["instance"][rows]
    # waits on implicit rows: max start of the instance - start
    frame = pd.DataFrame({"instance": inst_rows, "rank": rank[rows], "s": ns["s"][rows]})
    frame["max_s"] = frame.groupby("instance")["s"].transform("max")
    frame["wait"] = (frame["max_s"] - frame["s"]) / 1000.0
    by_rank = frame.groupby("rank")
    total = by_rank["wait"].sum()
    mean = by_rank["wait"].mean()
    participated = by_rank.size()
    last = pd.Series(implicit["straggler_rank"].to_numpy()).value_counts()
    first = pd.Series(implicit["earliest arrival rank"].to_numpy()).value_counts()
    blame = pd.Series(implicit["blame_us"].to_numpy()).groupby(implicit["straggler_rank"].to_numpy()).sum()
    all_dur = pd.Series(ns["dur"] / 1000.0).groupby(rank).sum()
    ranks = total.index.to_numpy()
    df = pd.DataFrame({
        "rank": ranks.astype(np.int64),
        "total_wait_time_us": np.round(total.to_numpy(dtype=np.float64), 1),
        "mean_wait_time_us": np.round(mean.to_numpy(dtype=np.float64), 1),
        "times_arrived_last": last.reindex(ranks, fill_value=0).to_numpy(dtype=np.int64),
        "times_arrived_first": first.reindex(ranks, fill_value=0).to_numpy(dtype=np.int64),
    })
    df["pct_arrived_last"] = np.round(100.0 * df["times_arrived_last"] / N, 1)
    df["num_collectives"] = N
    df["total_nccl_dur_us"] = np.round(all_dur.reindex(ranks, fill_value=0.0).to_numpy(dtype=np.float64), 1)
    df["participated"] = participated.reindex(ranks).to_numpy(dtype=np.int64)
    df["pct_arrived_last_of_participated"] = np.round(100.0 * df["times_arrived_last"] / df["participated"], 1)
    df["total_blame_us"] = np.round(blame.reindex(ranks, fill_value=0.0).to_numpy(dtype=np.float64), 1)
    order = np.lexsort((df["rank"].to_numpy(), df["total_wait_time_us"].to_numpy()))
    df = df.iloc[order].reset_index(drop=True)
    if nodes is not None:
        df.insert(len(STRAGGLER_COLUMNS), "node_id", pd.array(df["rank"].to_numpy() // nodes.G, dtype="Int64"))
    return df

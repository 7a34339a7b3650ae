"""The all_to_allv sheets: ``nccl_all2allv`` (one row per instance, with
per-rank blocks), ``nccl_summary_all2allv`` and ``nccl_all2allv_heatmap``
(bytes from each rank to each peer, from the split lists)."""
import logging
import math

import numpy as np
import pandas as pd

from .. import collectives as coll
from ..errors import MetadataMismatchError
from .columns import A2AV_CHECK, A2AV_RANK_BLOCK, HEATMAP_COLUMNS
from .options import agg_label
from .rows import _cached, _first_agg, _first_rows, _flags_by_instance, _mismatch_by_instance

log = logging.getLogger("streamtrace")

HEATMAP_MAX_WORLD, HEATMAP_WARN_WORLD = 1024, 256


def _all2allv(long, ns, st, strict, findings, nodes):
    """nccl_all2allv: one row per all_to_allv instance, largest total data
    first; Part A's instance columns, a block of columns per rank, Part B's."""
    if not len(long):
        return pd.DataFrame()
    first = _first_rows(long, st)
    include = (first["Collective name"] == "all_to_allv").to_numpy()
    if not include.any():
        return pd.DataFrame()
    mism = _a2av_mismatch(long, st, first, include, strict, findings)
    picked = _A2avRows(st, include)
    # only the columns the rank blocks and the off-rank bytes read
    sub = long.loc[picked.rows, list(dict.fromkeys(A2AV_RANK_BLOCK + _OFFRANK_COLUMNS))]
    out = _a2av_instance_columns(long, ns, st, first, picked)
    wide, skew = _a2av_rank_blocks(ns, st, picked, sub)
    result = pd.concat([out, pd.DataFrame(wide), pd.DataFrame(skew)], axis=1)
    if nodes is not None:
        result["node_span"] = nodes.spans(result["Process Group Ranks"].to_numpy(dtype=object),
                                          result["Process Group Name"].to_numpy(dtype=object))
    sel = picked.sel
    # B5: bus bandwidth from the actual bytes each rank sends to other ranks
    offrank = _offrank_mb(sub, ns["rank"][picked.rows])
    lat = st["min_dur"][sel] / 1000.0
    with np.errstate(divide="ignore", invalid="ignore"):
        result["bus bw (GB/s)"] = np.where(lat > 0, (picked.max(offrank) / 1024) / (lat / 1e6), np.nan)
    result["participants"] = st["count"][sel]
    result["metadata_mismatch"] = ~np.isin(mism[sel], ["", "stream"])
    result["stream_mismatch"] = ns["stream_mismatch"][st["starts"]][sel]
    result["instance"] = st["ids"][sel]
    result["flags"] = _flags_by_instance(long, st)[sel]
    order = np.lexsort((np.arange(picked.count),
                        np.nan_to_num(-result["total data communicated (MB)"].to_numpy(dtype=np.float64), nan=np.inf)))
    return result.iloc[order].reset_index(drop=True)


def _a2av_mismatch(long, st, first, include, strict, findings):
    """Per instance: the first ``A2AV_CHECK`` column its ranks disagree on, or
    ''.  A disagreement is an error when ``strict``, else one finding (info
    when it is only the NCCL stream id)."""
    mism = _mismatch_by_instance(long, A2AV_CHECK, st["starts"], st["codes"])
    bad = include & (mism != "")
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        msg = f"Metadata mismatch in '{mism[i]}' across the ranks of all_to_allv {first['collective_id'][i]}"
        if strict:
            raise MetadataMismatchError(msg + " (--strict)")
        only_stream = include & (mism == "stream")
        findings.append({"severity": "warning" if (bad & ~only_stream).any() else "info",
                         "category": "all2allv_mismatch", "rank": None, "pg": None,
                         "collective_id": first["collective_id"][i], "count": int(bad.sum()),
                         "message": f"{int(bad.sum())} all_to_allv instance(s) disagree on metadata "
                                    f"({int(only_stream.sum())} only on the NCCL stream id, which is per-process "
                                    f"and meaningless across ranks); first: {msg}"})
    return mism


class _A2avRows:
    """The all_to_allv instances (``sel``: their positions among all
    instances, ``count`` of them) and their rows (``rows``: a mask over
    nccl_long; ``ipos``: each such row's position in ``sel``), with
    reductions per instance over those rows."""

    def __init__(self, st, include):
        self.sel = np.flatnonzero(include)
        self.count = len(self.sel)
        self.rows = include[st["pos"]]
        self.ipos = np.searchsorted(self.sel, st["pos"][self.rows])
        # rows come grouped by instance and each selected instance has rows:
        # exact reductions (NaN-skipping max / min as pandas') over contiguous runs
        self.bounds = np.flatnonzero(np.r_[True, self.ipos[1:] != self.ipos[:-1]])

    def agg(self, values, how):
        """pandas' groupby(instance).agg(how) of ``values``, one float per instance."""
        res = np.full(self.count, np.nan)
        frame = pd.DataFrame({"p": self.ipos, "v": values})
        agg = frame.groupby("p")["v"].agg(how)
        res[agg.index.to_numpy()] = agg.to_numpy(dtype=np.float64)
        return res

    def max(self, values):
        return np.fmax.reduceat(values, self.bounds)

    def min(self, values):
        return np.fmin.reduceat(values, self.bounds)

    def any(self, mask):
        return np.logical_or.reduceat(mask, self.bounds)


def _a2av_instance_columns(long, ns, st, first, picked):
    """Part A's per-instance columns (``A2AV_COLUMNS``)."""
    sel, rows = picked.sel, picked.rows
    in_mb = long["In msg size (MB)"].to_numpy(dtype=np.float64)[rows]
    nelems = long["In msg nelems"].astype("Float64").to_numpy(dtype=np.float64, na_value=np.nan)[rows]
    dur = ns["dur"][rows]
    total_mb = np.where(picked.any(np.isnan(in_mb)), np.nan, picked.agg(np.nan_to_num(in_mb), "sum"))
    total_n = np.where(picked.any(np.isnan(nelems)), np.nan, picked.agg(np.nan_to_num(nelems), "sum"))
    wall = (st["max_e"] - st["min_s"])[sel] / 1000.0
    with np.errstate(divide="ignore", invalid="ignore"):
        throughput = np.where(wall > 0, (total_mb / 1024) / (wall / 1e6), np.nan)
        rank_throughput = np.where((in_mb > 0) & (dur > 0), (in_mb / 1024) / ((dur / 1000.0) / 1e6), np.nan)
        mean_mb = picked.agg(in_mb, "mean")
        imbalance = np.where(mean_mb != 0, picked.max(in_mb) / mean_mb, np.nan)
    out = first.loc[sel, ["collective_id", "Process Group Name", "Process Group Ranks", "Collective name",
                          "Group size", "dtype", "stream"]].reset_index(drop=True)
    out["total data communicated (MB)"] = total_mb
    out["total nelems communicated"] = pd.array([None if math.isnan(x) else int(x) for x in total_n], dtype="Int64")
    out["wall_time (us)"] = wall
    out["max_rank_dur (us)"] = st["max_dur"][sel] / 1000.0
    out["min_rank_dur (us)"] = st["min_dur"][sel] / 1000.0
    out["avg_rank_dur (us)"] = st["sum_dur"][sel] / st["count"][sel] / 1000.0
    out["throughput (GB/s)"] = throughput
    out["max_rank_throughput (GB/s)"] = picked.max(rank_throughput)
    out["min_rank_throughput (GB/s)"] = picked.min(rank_throughput)
    out["size_imbalance"] = imbalance
    out["skew in start time"] = (st["max_s"] - st["min_s"])[sel] / 1000.0
    out["skew in end time"] = (st["max_e"] - st["min_e"])[sel] / 1000.0
    return out


def _a2av_rank_blocks(ns, st, picked, sub):
    """The per-rank columns: ``rank_<r>_<col>`` for every ``A2AV_RANK_BLOCK``
    column, then each rank's start and end skews (two dicts of columns)."""
    sel, rows, ipos, count = picked.sel, picked.rows, picked.ipos, picked.count
    ranks = np.unique(ns["rank"][rows])
    rank_col = np.searchsorted(ranks, ns["rank"][rows])
    start_skews = (ns["s"][rows] - st["min_s"][sel][ipos]) / 1000.0
    end_skews = (st["max_e"][sel][ipos] - ns["e"][rows]) / 1000.0
    wide, skew = {}, {}
    for j, r in enumerate(ranks):
        mask = rank_col == j
        for col in A2AV_RANK_BLOCK:
            values = sub[col].to_numpy()[mask]
            if col in ("In split size", "Out split size"):
                column = np.full(count, None, dtype=object)
            elif col in ("In msg nelems", "Out msg nelems"):
                column = pd.array([None] * count, dtype="Int64")
                values = sub[col].astype("Int64").array[mask]
            else:
                column = np.full(count, np.nan)
            column[ipos[mask]] = values
            wide[f"rank_{r}_{col}"] = column
        start = np.full(count, np.nan)
        start[ipos[mask]] = start_skews[mask]
        skew[f"rank_{r}_skew in start time"] = start
        end = np.full(count, np.nan)
        end[ipos[mask]] = end_skews[mask]
        skew[f"rank_{r}_skew in end time"] = end
    return wide, skew


_OFFRANK_COLUMNS = ["In msg size (MB)", "In msg nelems", "Group size", "In split size", "Process Group Ranks"]


def _offrank_mb(rows, ranks):
    """MiB each a2av row sends to ranks other than itself (from its In split
    size when readable, else (n-1)/n of its input)."""
    in_mb = rows["In msg size (MB)"].to_numpy(dtype=np.float64)
    in_n = rows["In msg nelems"].astype("Float64").to_numpy(dtype=np.float64, na_value=np.nan)
    gsz = rows["Group size"].astype("Float64").to_numpy(dtype=np.float64, na_value=np.nan)
    splits, members = {}, {}

    def one(split, pgr, r, mb, n, g):
        if math.isnan(mb):
            return math.nan
        if split not in splits:
            splits[split] = coll.parse_split(split)
        if pgr not in members:
            m, truncated = coll.parse_rank_list(pgr)
            members[pgr] = None if truncated or m is None else {x: j for j, x in enumerate(m)}
        parts, where = splits[split], members[pgr]
        r = int(r)
        if parts and where is not None and len(parts) == len(where) and r in where and n > 0:
            return mb * (n - parts[where[r]]) / n
        if not math.isnan(g) and g > 0:
            return mb * (g - 1) / g
        return math.nan

    # once per distinct row: the split lists repeat from step to step
    return np.array(_cached(one, rows["In split size"].to_numpy(dtype=object),
                            rows["Process Group Ranks"].to_numpy(dtype=object), np.asarray(ranks), in_mb, in_n, gsz),
                    dtype=np.float64)


def _summary_all2allv(a2av, aggs, nodes):
    df = a2av.dropna(subset=["Process Group Name", "dtype"])
    cols = ["Process Group Name", "dtype"]
    if not len(df):
        return pd.DataFrame({c: [] for c in cols})
    g = df.groupby(cols, sort=True)
    res = pd.DataFrame(index=g.size().index)
    for a in aggs:
        res[f"total data communicated (MB)_{agg_label(a)}"] = g["total data communicated (MB)"].agg(a)
    for a in aggs:
        res[f"wall_time (us)_{agg_label(a)}"] = g["wall_time (us)"].agg(a)
    res["Total wall_time (us)"] = g["wall_time (us)"].sum()
    for a in aggs:
        res[f"throughput (GB/s)_{agg_label(a)}"] = g["throughput (GB/s)"].agg(a)
    for m in ("size_imbalance", "max_rank_dur (us)", "skew in start time", "skew in end time"):
        res[f"{m}_mean"] = g[m].mean()
        res[f"{m}_max"] = g[m].max()
    res["count"] = g.size()
    for c in ("Process Group Ranks", "Collective name", "Group size"):
        res[c] = g[c].agg(_first_agg)
    res["Total wall_time (ms)"] = res["Total wall_time (us)"] / 1000.0
    res = res.reset_index()
    res["Group size"] = res["Group size"].astype("Int64")
    if nodes is not None:
        res["node_span"] = nodes.spans(res["Process Group Ranks"].to_numpy(dtype=object),
                                      res["Process Group Name"].to_numpy(dtype=object))
    order = np.lexsort((np.arange(len(res)), -res["Total wall_time (ms)"].to_numpy(dtype=np.float64)))
    return res.iloc[order].reset_index(drop=True)


def _heatmap(long, world, findings):
    if world > HEATMAP_MAX_WORLD:
        findings.append({"severity": "warning", "category": "heatmap_skipped", "rank": None, "pg": None,
                         "collective_id": None, "count": None,
                         "message": f"world size {world} > {HEATMAP_MAX_WORLD}: the all2allv heatmap is skipped"})
        return None
    if world > HEATMAP_WARN_WORLD:
        log.warning(f"all2allv heatmap for a world of {world} ranks: the sheet may be large")
    rows = long[long["Collective name"] == "all_to_allv"]
    acc = {}
    skipped = {"unreadable split list": 0, "split list length != Group size": 0, "unknown dtype": 0}
    cache = {}
    for split, gsz, dtype, rank, pgr in zip(rows["In split size"].tolist(), rows["Group size"].tolist(),
                                            rows["dtype"].tolist(), rows["rank"].tolist(),
                                            rows["Process Group Ranks"].tolist()):
        if split not in cache:
            cache[split] = coll.parse_split(split)
        parts = cache[split]
        if parts is None:
            skipped["unreadable split list"] += 1
            continue
        if gsz is None or gsz is pd.NA or len(parts) != int(gsz):
            skipped["split list length != Group size"] += 1
            continue
        bpe = coll.bytes_per_elem(dtype)
        if bpe is None:
            skipped["unknown dtype"] += 1
            continue
        members, truncated = coll.parse_rank_list(pgr)
        if members is not None and (truncated or len(members) != len(parts)):
            members = None
        for j, count in enumerate(parts):
            key = (int(rank), j)
            b, c, g = acc.get(key, (0, 0, None))
            acc[key] = (b + count * bpe, c + 1, members[j] if members is not None else g)
    for why, count in skipped.items():
        if count:
            findings.append({"severity": "info", "category": "heatmap_rows_skipped", "rank": None, "pg": None,
                             "collective_id": None, "count": count,
                             "message": f"all2allv heatmap: {count} all_to_allv kernel row(s) skipped ({why})"})
    if not acc:
        return pd.DataFrame({c: [] for c in HEATMAP_COLUMNS + ["dst_global_rank"]})
    keys = sorted(acc)
    total = np.array([acc[k][0] for k in keys], dtype=np.float64) / coll.MIB
    count = np.array([acc[k][1] for k in keys], dtype=np.int64)
    return pd.DataFrame({"src_rank": [k[0] for k in keys], "dst_rank": [k[1] for k in keys],
                         "total_sent_MB": total, "avg_sent_MB": total / count, "count": count,
                         "dst_global_rank": pd.array([acc[k][2] for k in keys], dtype="Int64")})

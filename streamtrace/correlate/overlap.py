"""What ran alongside each collective (spec blocking-analysis.md, part 2):
per NCCL kernel, its overlap with compute kernels on other streams, SM share
and wave (tail-effect) risk; and the contention pairs summed over ranks."""
import math
import re

import numpy as np
import pandas as pd

from .columns import OVERLAP_COLUMNS, PAIR_COLUMNS
from .. import _native
from ..collectives import size_bucket
from .constants import NS_PER_US, TOP_N
from .inputs import _rows_by_rank


def _signature(row):
    parts = [str(row.get("collective_name") or "?"), f"pg={row.get('pg_name')}", str(row.get("dtype") or "?"),
             size_bucket(row.get("nbytes")), f"n={row.get('group_size')}"]
    algo = _algo_proto(row.get("kernel_name"))
    if algo:
        parts.append(algo)
    return " ".join(parts)


_ALGO_RE = re.compile(r"_(RING|TREE|COLLNET\w*|NVLS\w*|PAT)_(LL128|LL|SIMPLE)|_(LL128|LL|SIMPLE)_(RING|TREE|COLLNET\w*|NVLS\w*|PAT)")


def _algo_proto(name):
    if not isinstance(name, str):
        return None
    m = _ALGO_RE.search(name.split("(")[0])
    if not m:
        return None
    return f"{m.group(1)}/{m.group(2)}" if m.group(1) else f"{m.group(4)}/{m.group(3)}"


def resident_blocks_per_sm(threads, regs, smem, props):
    """Blocks of one kernel that fit on an SM at once, from its geometry and
    the device limits (the occupancy calculation, without allocation
    granularity).  None when something needed is unknown."""
    if props is None or threads is None or not threads or threads != threads or threads <= 0:
        return None
    limits = []
    max_threads = props.get("maxThreadsPerMultiProcessor") or props.get("maxThreadsPerMultiprocessor")
    if max_threads:
        limits.append(int(max_threads) // int(threads))
    regs_sm = props.get("regsPerMultiprocessor")
    if regs_sm and regs is not None and regs == regs and regs > 0:
        limits.append(int(regs_sm) // (int(regs) * int(threads)))
    smem_sm = props.get("sharedMemPerMultiprocessor") or props.get("maxSharedMemoryPerMultiProcessor")
    if smem_sm and smem is not None and smem == smem and smem > 0:
        limits.append(int(smem_sm) // int(smem))
    limits.append(32)  # hardware cap on resident blocks per SM (recent NVIDIA GPUs)
    return max(min(limits), 0) if len(limits) > 1 else None


def wave_risk(blocks, bpsm, num_sms, nccl_ctas):
    """(waves alone, waves with the NCCL kernel's CTAs resident, risk)."""
    if not blocks or blocks != blocks or not bpsm or not num_sms:
        return None, None, None
    alone = math.ceil(blocks / (num_sms * bpsm))
    free = num_sms - (nccl_ctas or 0)
    if free <= 0:
        return alone, None, True
    with_nccl = math.ceil(blocks / (free * bpsm))
    return alone, with_nccl, with_nccl > alone


def _overlap_analysis(inputs):
    """collective_overlap (per NCCL kernel per rank) and contention_pairs;
    vectorised per rank into plain arrays (one DataFrame at the end: pandas
    assignments cost more than the work), Python only per output row."""
    inst, comp = inputs.instances, inputs.compute
    sig_cache = {}
    parts, pair_parts = {c: [] for c in OVERLAP_COLUMNS + ["has_top"]}, []
    # over lists: iterating the Series themselves costs several times more
    sig_fields = [inst[c].to_numpy(object) for c in ("collective_name", "pg_name", "dtype", "nbytes", "group_size",
                                                     "kernel_name")]
    for r, mine in _rows_by_rank(inputs):
        col, pairs = _overlap_of_rank(inputs, r, mine, sig_fields, sig_cache)
        if pairs is not None:
            pair_parts.append(pairs)
        for c in parts:
            parts[c].append(col[c])
    if not parts["rank"]:
        return pd.DataFrame(columns=OVERLAP_COLUMNS), _pairs(comp, pair_parts)
    data = {c: np.concatenate(parts[c]) for c in parts}
    ctas = data["nccl_ctas"]
    data["nccl_ctas"] = pd.arrays.IntegerArray(np.nan_to_num(ctas).astype(np.int64), np.isnan(ctas))
    # a stream id: an integer, empty when no compute kernel overlapped
    data["top_kernel_stream"] = pd.arrays.IntegerArray(data["top_kernel_stream"], ~data.pop("has_top"))
    return pd.DataFrame(data), _pairs(comp, pair_parts)


#: collective_overlap's columns from the top kernel's launch shape
_WAVE_COLUMNS = ("top_kernel_blocks_per_sm", "waves_alone", "waves_with_nccl", "tail_effect_risk")


def _overlap_of_rank(inputs, r, mine, sig_fields, sig_cache):
    """collective_overlap's columns (and ``has_top``) of rank r's NCCL
    kernels, ``mine`` their instance rows; with the rank's part of the
    contention pairs (None when no compute kernel overlaps them)."""
    inst, comp = inputs.instances, inputs.compute
    tl, m = inputs.timelines[r], len(mine)
    props = tl.device_props()
    num_sms = props.get("numSms") if props else None
    if props is None:
        inputs.quality.append(("no deviceProperties", r, "SM share and wave risk left empty"))
    starts, ends = inst["start"].to_numpy(np.int64)[mine], inst["end"].to_numpy(np.int64)[mine]
    dur = ends - starts
    overlap = _native.overlap_with_union(starts, ends, *tl.compute_union())
    ctas = tl.ctas_of_events(inst["event"].to_numpy()[mine])   # the NCCL kernels' CTAs
    sig = np.array([_cached_signature(sig_cache, row) for row in zip(*(f[mine].tolist() for f in sig_fields))],
                   dtype=object)
    col = {
        "collective_id": inst["instance"].to_numpy(object)[mine], "rank": np.full(m, r, dtype=np.int64),
        "Collective name": sig_fields[0][mine], "Process Group Name": sig_fields[1][mine], "signature": sig,
        "stream": inst["stream"].to_numpy()[mine],
        "ts_us": starts / NS_PER_US, "dur_us": dur / NS_PER_US, "overlap_us": overlap / NS_PER_US,
        "overlap_frac": np.divide(overlap, dur, out=np.zeros(m), where=dur > 0),
        "overlapping_kernels": np.zeros(m, dtype=np.int64), "nccl_ctas": ctas,
        "sm_share": ctas / num_sms if num_sms else np.full(m, np.nan),
        "top_kernel_overlap_us": np.full(m, np.nan), "top_kernel_stream": np.zeros(m, dtype=np.int64),
        "has_top": np.zeros(m, dtype=bool),
    }
    for c in ("top_overlapping", "top_kernel", "top_kernel_grid"):
        col[c] = np.full(m, np.nan, dtype=object)
    for c in _WAVE_COLUMNS:
        col[c] = np.full(m, None, dtype=object)
    # every (NCCL kernel, compute kernel) pair that intersects, by NCCL kernel
    rank_rows = comp.rank_slice(r)
    pair_nccl, pair_kernel, pair_length = _native.intersecting_pairs(starts, ends, comp.start[rank_rows],
                                                                     comp.end[rank_rows])
    if not len(pair_nccl):
        return col, None
    pair_kernel = pair_kernel + rank_rows.start    # into comp
    col["overlapping_kernels"] = np.bincount(pair_nccl, minlength=m)
    i_top, text = _top_overlapping(pair_nccl, comp.ident[pair_kernel], pair_length, comp.texts)
    col["top_overlapping"][i_top] = text
    _fill_top_kernel(col, comp, r, pair_nccl, pair_kernel, pair_length, ctas, props, num_sms)
    return col, (comp.key[pair_kernel], sig[pair_nccl], pair_length, r, pair_kernel, ctas[pair_nccl], num_sms, props)


def _fill_top_kernel(col, comp, r, pair_nccl, pair_kernel, pair_length, ctas, props, num_sms):
    """Per NCCL kernel of rank r, the compute kernel of the pair of largest
    overlap (the first on ties) into the top_kernel columns of ``col``, with
    its wave risk beside the NCCL kernel's ``ctas``."""
    seg = np.flatnonzero(np.r_[True, pair_nccl[1:] != pair_nccl[:-1]])
    is_max = pair_length == np.repeat(np.maximum.reduceat(pair_length, seg), np.diff(np.r_[seg, len(pair_nccl)]))
    best = np.flatnonzero(is_max)
    best = best[np.r_[True, pair_nccl[best][1:] != pair_nccl[best][:-1]]]
    rows, kernels = pair_nccl[best], pair_kernel[best]
    triples = [comp.triples[k] for k in comp.key[kernels].tolist()]
    col["top_kernel"][rows] = [t[0] for t in triples]
    col["top_kernel_overlap_us"][rows] = pair_length[best] / NS_PER_US
    col["top_kernel_stream"][rows] = comp.column(r, "stream", kernels)
    col["has_top"][rows] = True
    col["top_kernel_grid"][rows] = [t[1] for t in triples]
    waves = _waves_of_kernels(comp, r, kernels, ctas[rows], props, num_sms)
    for k, c in enumerate(_WAVE_COLUMNS):
        col[c][rows] = [w[k] for w in waves]


def _waves_of_kernels(comp, r, kernels, nccl_ctas, props, num_sms):
    """(blocks per SM, waves alone, waves with the NCCL kernel, risk) of
    compute kernels ``kernels`` of rank r, each beside an NCCL kernel of
    ``nccl_ctas`` CTAs (NaN: unknown).  Few distinct launch shapes: each
    worked out once (a NaN, never equal to itself, just misses the cache)."""
    waves, shapes = [], {}
    geometry = [comp.column(r, c, kernels).tolist() for c in ("threads", "regs", "smem", "ctas")]
    for shape in zip(*geometry, nccl_ctas.tolist()):
        w = shapes.get(shape)
        if w is None:
            threads, regs, smem, blocks, nccl = shape
            bpsm = resident_blocks_per_sm(threads, regs, smem, props)
            w = shapes[shape] = (bpsm, *wave_risk(blocks, bpsm, num_sms, None if nccl != nccl else nccl))
        waves.append(w)
    return waves


def _cached_signature(cache, values):
    key = tuple(values)
    try:
        return cache[key]
    except (KeyError, TypeError):
        pass
    names = ("collective_name", "pg_name", "dtype", "nbytes", "group_size", "kernel_name")
    sig = _signature(dict(zip(names, values)))
    try:
        cache[key] = sig
    except TypeError:
        pass
    return sig


def _top_overlapping(ia, ident, il, texts):
    """Per NCCL kernel (ia), the TOP_N compute kernel identities with the most
    intersection, as text: (NCCL kernel rows, texts)."""
    codes, first = _native.factorize_rows(np.column_stack([ia, ident]))   # (i, identity) in first-appearance order
    order = np.argsort(codes, kind="stable")
    seg = np.flatnonzero(np.r_[True, np.diff(codes[order]) != 0])
    total = np.add.reduceat(il[order], seg) if len(order) else il[:0]
    gi, gid = ia[first], ident[first]
    rank_order = np.lexsort((-total, gi))       # by NCCL kernel, largest first, stable
    gi, gid, total = gi[rank_order], gid[rank_order], total[rank_order]
    start = np.r_[True, gi[1:] != gi[:-1]]
    place = np.arange(len(gi)) - np.maximum.accumulate(np.where(start, np.arange(len(gi)), 0))
    keep = place < TOP_N
    gi, gid, total = gi[keep], gid[keep], total[keep]
    us = np.round(total / NS_PER_US, 1)
    by_i = {}
    for i, c, u in zip(gi.tolist(), gid.tolist(), us.tolist()):
        by_i.setdefault(i, []).append(f"{texts[c]} ({u} us)")
    rows = np.array(list(by_i), dtype=np.int64)
    return rows, ["; ".join(v) for v in by_i.values()]


def _pairs(comp, parts):
    if not parts:
        return pd.DataFrame(columns=PAIR_COLUMNS)
    key = np.concatenate([p[0] for p in parts])
    sig = np.concatenate([p[1] for p in parts])
    length = np.concatenate([p[2] for p in parts])
    rank = np.concatenate([np.full(len(p[0]), p[3], dtype=np.int64) for p in parts])
    j = np.concatenate([p[4] for p in parts])
    nccl_ctas = np.concatenate([p[5] for p in parts])
    part_of = np.concatenate([np.full(len(p[0]), k, dtype=np.int64) for k, p in enumerate(parts)])
    sig_codes, sig_values = pd.factorize(sig)
    codes, first = _native.factorize_rows(np.column_stack([key, sig_codes]))
    order = np.argsort(codes, kind="stable")
    seg = np.r_[np.flatnonzero(np.r_[True, np.diff(codes[order]) != 0]), len(order)]
    out = []
    for g in range(len(first)):
        rows = order[seg[g]:seg[g + 1]]
        f = first[g]
        name, grid, block = comp.triples[key[f]]
        _, _, _, r, _, _, num_sms, props = parts[part_of[f]]
        threads, regs, smem, blocks = (comp.column(r, c, j[f]) for c in ("threads", "regs", "smem", "ctas"))
        bpsm = resident_blocks_per_sm(threads, regs, smem, props)
        c = nccl_ctas[rows]
        ctas = c[~np.isnan(c)].max() if (~np.isnan(c)).any() else None
        alone, with_nccl, risk = wave_risk(blocks, bpsm, num_sms, ctas)
        out.append({"compute_kernel": name, "grid": grid, "block": block, "signature": sig_values[sig_codes[f]],
                    "overlap_us": length[rows].sum() / NS_PER_US, "occurrences": len(rows),
                    "ranks": ",".join(str(r) for r in sorted(set(rank[rows].tolist()))),
                    "nccl_ctas": ctas, "sm_share": (ctas / num_sms) if ctas and num_sms else None,
                    "blocks_per_sm": bpsm, "waves_alone": alone, "waves_with_nccl": with_nccl,
                    "tail_effect_risk": risk})
    return pd.DataFrame(out).sort_values(["overlap_us", "compute_kernel"], ascending=[False, True]) \
        .reset_index(drop=True).reindex(columns=PAIR_COLUMNS)


def _overlap_rows(inputs):
    """The instance rows of collective_overlap, in its order."""
    return np.concatenate([rows for _, rows in _rows_by_rank(inputs)] + [np.zeros(0, np.int64)])

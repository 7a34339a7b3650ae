"""How much slower under overlap (spec blocking-analysis.md, part 2): NCCL
transfer time and compute kernel durations with much vs little overlap."""
import numpy as np
import pandas as pd

from .columns import COMPUTE_INFLATION_COLUMNS, NCCL_INFLATION_COLUMNS
from .constants import HIGH_OVERLAP, LOW_OVERLAP, MIN_SAMPLES, NS_PER_US
from .overlap import _overlap_rows


def _inflation(hi, lo, names):
    """The columns comparing durations while overlapped (``hi``) with those
    while isolated (``lo``): the two medians (us), the inflation and the
    excess over the isolated median (us), named ``names``; only a note when
    either side has too few samples."""
    if len(hi) < MIN_SAMPLES or len(lo) < MIN_SAMPLES:
        return {"note": f"too few samples (need {MIN_SAMPLES} overlapped and {MIN_SAMPLES} isolated)"}
    mh, ml = float(np.median(hi)), float(np.median(lo))
    return {names[0]: mh / NS_PER_US, names[1]: ml / NS_PER_US, "inflation": (mh / ml - 1.0) if ml > 0 else None,
            names[2]: float(np.clip(hi - ml, 0, None).sum()) / NS_PER_US, "note": ""}


def _nccl_inflation(inputs, overlap):
    """Transfer time (end − last arrival) with ≥ 50 % vs < 5 % compute overlap."""
    inst = inputs.instances
    if not len(inst) or not len(overlap):
        return pd.DataFrame(columns=NCCL_INFLATION_COLUMNS)
    start, end = inst["start"].to_numpy(np.int64), inst["end"].to_numpy(np.int64)
    last_arrival = inst.groupby("instance")["start"].transform("max").to_numpy(np.int64)
    # in overlap's row order (collective_overlap's rows are the instance rows, rank by rank)
    transfer = np.clip(end - np.maximum(start, last_arrival), 0, None)[_overlap_rows(inputs)]
    frac = overlap["overlap_frac"].to_numpy(np.float64)
    codes, sigs = pd.factorize(overlap["signature"].to_numpy(object))
    rows = []
    for c in sorted(range(len(sigs)), key=lambda c: sigs[c]):   # by signature, as a sorted groupby
        members = np.flatnonzero(codes == c)
        f, t = frac[members], transfer[members]
        hi, lo = t[f >= HIGH_OVERLAP], t[f < LOW_OVERLAP]
        row = {"signature": sigs[c], "instances": len(members), "overlapped_n": len(hi), "isolated_n": len(lo)}
        row.update(_inflation(hi, lo, ("median_transfer_overlapped_us", "median_transfer_isolated_us",
                                       "total_excess_us")))
        rows.append(row)
    return pd.DataFrame(rows).reindex(columns=NCCL_INFLATION_COLUMNS)


def _compute_inflation(inputs):
    """Per compute kernel identity: median duration when ≥ 50 % of it overlaps
    comm vs when < 5 % does.  From each rank's buckets (made at its end, while
    the next rank streams in), gathered by the identity shared by all ranks."""
    comp = inputs.compute
    if not len(comp.start):
        return pd.DataFrame(columns=COMPUTE_INFLATION_COLUMNS)
    by_key = {}   # {key: {rank: [bucket, ...]}}, ranks in comp's order
    for r, tl in inputs.timelines.items():
        for lcode, bucket in tl.buckets().items():
            by_key.setdefault(int(comp.l_key[r][lcode]), {}).setdefault(r, []).append(bucket)
    rows = []
    for key in sorted(by_key):   # in order of first appearance, as a groupby
        per_rank = by_key[key].values()
        d_hi = np.concatenate([_in_row_order([b[1] for b in buckets]) for buckets in per_rank])
        if not len(d_hi):   # never overlapped: nothing to say
            continue
        d_lo = np.concatenate([_in_row_order([b[2] for b in buckets]) for buckets in per_rank])
        name, grid, block = comp.triples[key]
        row = {"kernel": name, "grid": grid, "block": block, "occurrences": sum(b[0] for bs in per_rank for b in bs),
               "overlapped_n": len(d_hi), "isolated_n": len(d_lo)}
        row.update(_inflation(d_hi, d_lo, ("median_overlapped_us", "median_isolated_us", "time_lost_us")))
        rows.append(row)
    out = pd.DataFrame(rows).reindex(columns=COMPUTE_INFLATION_COLUMNS)
    return out.sort_values(["time_lost_us", "kernel"], ascending=[False, True], na_position="last").reset_index(drop=True)


def _in_row_order(pieces):
    """The durations of (rows, durations) pieces of one rank, by row (the
    order of a sum that rounds)."""
    if len(pieces) == 1:
        return pieces[0][1]
    rows, durations = (np.concatenate(c) for c in zip(*pieces))
    return durations[np.argsort(rows, kind="stable")]

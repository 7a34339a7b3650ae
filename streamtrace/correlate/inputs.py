"""The analyses' inputs: align's matched collectives as an instance table,
the ranks' timelines moved onto the aligned clock (``Inputs``)."""
import numpy as np
import pandas as pd

from ..errors import StreamtraceError
from .compute import _Compute
from .timeline import _classify


#: the columns of align.collectives that instances_from_align and
#: offsets_from_align read (the others are not decoded)
ALIGN_COLUMNS_USED = frozenset((
    "collective_id", "clock_offset_ns", "base_ns", "ts_aligned_ns", "launch_ts_ns", "launch_dur_ns", "category",
    "out_bytes", "in_bytes", "rank", "event", "dur_aligned_ns", "stream", "implicit_sync", "collective_name",
    "pg_name", "dtype", "group_size", "kernel_name", "launch_tid"))


def instances_from_align(coll):
    """Correlate's instance table from ``align.collectives`` (aligned clock:
    base + ts - clock offset, as align applies it).  Column by column in
    numpy (pandas' nullable arithmetic costs more than the rest)."""
    coll = coll[coll["collective_id"].notna()]

    def floats(col):   # nullable integers as float64, NaN missing
        return coll[col].to_numpy(dtype=np.float64, na_value=np.nan)

    offset = coll["clock_offset_ns"].to_numpy(np.int64)
    base = coll["base_ns"].to_numpy(np.int64)
    start = coll["ts_aligned_ns"].to_numpy(np.int64)
    # in float64, the order of the sum as it always was
    launch_end = floats("launch_ts_ns") + floats("launch_dur_ns") + base.astype(np.float64) - offset.astype(np.float64)
    nbytes = np.where(coll["category"].to_numpy(object) == "allgather", floats("out_bytes"), floats("in_bytes"))
    return pd.DataFrame({
        "instance": coll["collective_id"].astype(str).to_numpy(),
        "rank": coll["rank"].to_numpy(np.int64),
        "event": coll["event"].to_numpy(np.int64),
        "start": start,
        "end": start + coll["dur_aligned_ns"].to_numpy(np.int64),
        "stream": coll["stream"].to_numpy(),
        "implicit_sync": coll["implicit_sync"].fillna(False).astype(bool).to_numpy(),
        "collective_name": coll["collective_name"].to_numpy(),
        "pg_name": coll["pg_name"].to_numpy(),
        "dtype": coll["dtype"].to_numpy(),
        "nbytes": nbytes,
        "group_size": coll["group_size"].to_numpy(),
        "kernel_name": coll["kernel_name"].to_numpy(),
        "launch_end": launch_end,
        "launch_tid": floats("launch_tid"),
    }).reset_index(drop=True)


def instances_from_p2p(pairs, coll):
    """Each matched send/recv pair of ``align.p2p`` as a two-rank instance
    (``p2p_<pair>``) of the sender's and the receiver's kernels, so that a
    late half is explained as a late collective rank is.  Halves whose kernel
    is not in ``align.collectives`` are left out."""
    rows = instances_from_align(coll)
    by_kernel = {(r, e): i for i, (r, e) in enumerate(zip(rows["rank"].tolist(), rows["event"].tolist()))}
    take, names = [], []
    for pair, s, r, se, re_ in zip(pairs["pair"].tolist(), pairs["sender"].tolist(), pairs["receiver"].tolist(),
                                   pairs["send_event"].tolist(), pairs["recv_event"].tolist()):
        i, j = by_kernel.get((s, se)), by_kernel.get((r, re_))
        if i is None or j is None:
            continue
        take += [i, j]
        names += [f"p2p_{pair}"] * 2
    out = rows.iloc[take].reset_index(drop=True)
    out["instance"] = names
    # the send/recv names would leave them out of the late-rank analysis
    out["collective_name"] = [f"p2p {a}->{b}" for a, b in zip(pairs.set_index("pair").loc[
        [int(n[4:]) for n in names], "sender"], pairs.set_index("pair").loc[[int(n[4:]) for n in names], "receiver"])]
    return out


def offsets_from_align(coll):
    """ns to add to each rank's (base-applied) times to reach the aligned clock."""
    if not len(coll):
        return {}
    per_rank = coll.groupby("rank")["clock_offset_ns"].first()
    return {int(r): -int(v) for r, v in per_rank.items()}


def _empty_instances():
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in (
        ("instance", object), ("rank", np.int64), ("event", np.int64), ("start", np.int64), ("end", np.int64),
        ("stream", object), ("implicit_sync", bool), ("collective_name", object), ("pg_name", object),
        ("dtype", object), ("nbytes", float), ("group_size", object), ("kernel_name", object),
        ("launch_end", float), ("launch_tid", float))})


class Inputs:
    """Normalised inputs: per-rank timelines on the aligned clock, plus the
    matched collective kernels (one row per rank per instance); ``compute``:
    the _Compute table made as the ranks ended, if any (used when it still
    holds these timelines)."""

    def __init__(self, timelines, instances, offsets, compute=None):
        self.timelines = timelines
        self.quality = []
        self.instances = instances.copy()
        # aligned clock: raw + base + offset (offsets from align; 0 when absent)
        inst_rank, inst_event = instances["rank"].to_numpy(np.int64), instances["event"].to_numpy(np.int64)
        for r, tl in timelines.items():
            tl.shift_by(tl.base_ns + int(offsets.get(r, 0)) - tl.shift)
            linked = inst_event[inst_rank == r]
            # the rank was classified by kernel name at its end: linking only
            # adds events to comm, so it changes nothing when all are in comm already
            if not np.isin(linked, tl.comm_events).all():
                if tl.gpu is None:   # a summary made with other links than align's tables say
                    raise StreamtraceError(f"rank {r}: align linked kernels this rank's summary took for compute "
                                           "(align's tables come from other input than the ranks' events)")
                _classify(tl, linked)
        self._compute = compute if compute is not None and compute.holds(timelines) else None

    @property
    def compute(self):
        """The _Compute table, built on first use."""
        if self._compute is None:
            self._compute = _Compute.of(self.timelines)
        return self._compute


def _rows_by_rank(inputs):
    """[(rank, its instance rows in instance order)] for the timelines with
    instances, in timeline order: collective_overlap's rows, rank by rank."""
    inst_rank = inputs.instances["rank"].to_numpy(np.int64)
    by_rank = [(r, np.flatnonzero(inst_rank == r)) for r in inputs.timelines]
    return [(r, rows) for r, rows in by_rank if len(rows)]

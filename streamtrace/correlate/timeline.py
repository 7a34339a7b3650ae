"""One rank's ``Timeline`` and what the analyses need of it that no other
rank changes: ``_classify`` splits its GPU activity into communication and
compute and works out their unions, the compute kernels' overlap buckets and
exposed_comm's window lengths.  Also the interval helpers on unions."""
import numpy as np

from .. import _native
from .constants import HIGH_OVERLAP, LOW_OVERLAP


# cat spellings, old and new (trace-format.md §4)
KERNEL_CATS = {"kernel", "Kernel"}
MEMCPY_CATS = {"gpu_memcpy", "Memcpy"}
MEMSET_CATS = {"gpu_memset", "Memset"}
CPU_CATS = {"cpu_op", "user_annotation", "Operator"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime"}

KIND_NONE, KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET, KIND_CPU, KIND_RUNTIME = range(6)


def _cat_kind(cat):
    if cat in KERNEL_CATS:
        return KIND_KERNEL
    if cat in MEMCPY_CATS:
        return KIND_MEMCPY
    if cat in MEMSET_CATS:
        return KIND_MEMSET
    if cat in CPU_CATS:
        return KIND_CPU
    if cat in RUNTIME_CATS:
        return KIND_RUNTIME
    return KIND_NONE


class Timeline:
    """What correlate keeps of one rank, as numpy arrays.

    ``gpu``: GPU activities (kernels, memcpy, memset) sorted by start, raw ns
    until Inputs shifts them to the aligned clock: columns start, end, stream,
    kind, name (string id), event, ctas, threads, regs, smem and lcode,
    the rank's kernel identity code (``lkeys[lcode]``: name id, grid x, y,
    z, block x, y, z with -1 when absent, 0).  ``cpu_ops``: the CPU ops and
    runtime calls, per EVENTS frame in stream order, each packed by
    ``summary.pack_ops`` (start, end, tid, name id; raw ns).  ``steps``: ProfilerStep#N ops as (names,
    starts, ends), sorted by start.
    """

    def __init__(self, rank, meta, names, gpu, by_event, cpu_ops, steps):
        self.rank, self.meta, self.names = rank, meta, names
        self.gpu, self.by_event, self.cpu_ops, self.steps = gpu, by_event, cpu_ops, steps
        self.shift = 0          # ns to the aligned clock (base time at the rank's end, offset by Inputs)
        self.gpu_extent = None  # (first start, last end) of its GPU activity, set by _classify
        device = gpu.pop("device")
        self.device = _mode(device[device >= 0])   # the rank's GPU

    def shift_by(self, ns):
        """Move every time this timeline holds (but the CPU ops, read in raw
        ns) by ns, in place: a fresh copy of each column costs more than the add."""
        if not ns:
            return
        self.shift += ns
        g = self.gpu
        if g is not None:   # None once compacted (summary.compact)
            g["start"] += ns
            g["end"] += ns
        if self.gpu_extent is not None:
            self.gpu_extent = (self.gpu_extent[0] + ns, self.gpu_extent[1] + ns)
        self.steps = (self.steps[0], self.steps[1] + ns, self.steps[2] + ns)
        self.compute_start += ns
        self.compute_end += ns
        for u in self.unions.values():
            u[0][:] += ns
            u[1][:] += ns

    @property
    def base_ns(self):
        return int(self.meta.get("trace", {}).get("baseTimeNanoseconds") or 0)

    def device_props(self):
        props = self.meta.get("trace", {}).get("deviceProperties")
        if not isinstance(props, list) or not props:
            return None
        want = self.device
        for p in props:
            if isinstance(p, dict) and p.get("id") == want:
                return p
        return props[0] if isinstance(props[0], dict) else None

    def compute_column(self, name, j):
        """Timeline column ``name`` (stream, ctas, threads, regs or smem) of
        the compute kernels j (indices into the rank's compute kernels)."""
        if self.gpu is None:   # compacted: one code per kernel into a small table
            return self.compute_shapes[name][self.compute_shape[j]]
        return self.gpu[name][self.compute_rows[j]]

    def compute_union(self):
        """The union of the compute kernels: kept from the rank's end, or
        made again from them (a compacted timeline keeps the kernels only)."""
        u = self.unions.get("compute")
        return u if u is not None else _native.interval_union(self.compute_start, self.compute_end)

    def buckets(self):
        """compute_inflation's buckets (``_buckets_by_identity``): kept from
        the rank's end, or worked out again from the kept compute kernels and
        comm union (a compacted timeline keeps only those)."""
        if self.compute_buckets is not None:
            return self.compute_buckets
        dur = self.compute_end - self.compute_start
        table, index = self.by_lcode(np.arange(len(self.lkeys)))
        return _buckets_by_identity(table[index], dur, _comm_fractions(self, dur))

    def by_lcode(self, values):
        """(table, index) with ``table[index]`` the ``values[lcode]`` of each
        compute kernel (a compacted timeline holds a kernel's lcode in its
        shape: no array of lcodes is made)."""
        if self.compute_lcode is not None:
            return values, self.compute_lcode
        return values[self.compute_shapes["lcode"]], self.compute_shape

    def ctas_of_events(self, events):
        """NCCL-kernel CTAs (float, NaN when unknown) for event indices."""
        ev, ctas = self.by_event
        events = np.asarray(events, dtype=np.int64)
        if not len(ev):
            return np.full(len(events), np.nan)
        at = np.clip(np.searchsorted(ev, events), 0, len(ev) - 1)
        return np.where(ev[at] == events, ctas[at], np.nan)


def _mode(values):
    """The most frequent value, the lowest on ties; None for no values."""
    if not len(values):
        return None
    if (values == values[0]).all():   # the usual case: one device per rank
        return int(values[0])
    uniq, counts = np.unique(values, return_counts=True)
    return int(uniq[np.argmax(counts)])


def _dims_text(d):
    return "[" + ",".join(str(int(x)) for x in d) + "]" if d[0] >= 0 else ""


# ---------------------------------------------------------------------- unions of intervals


def _union(starts, ends):
    order = np.argsort(starts, kind="stable")
    return _native.interval_union(np.asarray(starts)[order], np.asarray(ends)[order])


def _intersect(a, b):
    """A ∩ B of two disjoint sorted unions, as a union."""
    if not len(a[0]) or not len(b[0]):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    ia, ib, _ = _native.intersecting_pairs(a[0], a[1], b[0], b[1])
    s = np.maximum(a[0][ia], b[0][ib])
    e = np.minimum(a[1][ia], b[1][ib])
    return _union(s, e)


# ---------------------------------------------------------------------- a rank alone


def _in_order_of_appearance(codes, n_codes, chunk=1 << 12):
    """The distinct values of codes (ints in [0, n_codes)) in order of first
    appearance.  A chunk at a time, stopping once every value present was
    seen (all are, usually, in the first chunk): cheaper than factorizing."""
    present = int(np.count_nonzero(np.bincount(codes, minlength=n_codes)))
    order, seen = [], set()
    for lo in range(0, len(codes), chunk):
        values, first = np.unique(codes[lo:lo + chunk], return_index=True)
        for c in values[np.argsort(first)].tolist():
            if c not in seen:
                seen.add(c)
                order.append(c)
        if len(order) == present:
            break
    return np.array(order, dtype=np.int64)


def _classify(tl, linked):
    """Comm activities (``gpu["comm"]``: collective kernels, by name or
    ``linked`` by align to a collective, and memcpy on their streams) and
    compute kernels (``gpu["compute"]``: the other kernels) of one rank, with
    what the analyses need of each that does not depend on other ranks: the
    compute kernels' rows, times and identities (``compute_*``), the union
    of comm (on the timeline's clock) and the window lengths for
    exposed_comm.  The unions of compute, copies and all GPU activity are
    made for those lengths only, and compute_inflation's buckets are left
    to ``Timeline.buckets``: a rank's summary drops them (``compact``), and
    made here they were the largest part of a rank's end beside its rows."""
    g = tl.gpu
    # a lookup table over the events' range, not a pass per collective
    is_linked = np.isin(g["event"], linked, kind="table") if len(linked) else np.zeros(len(g["event"]), bool)
    is_coll = is_linked | ((g["kind"] == KIND_KERNEL) & tl.nccl_name)
    coll_streams = np.unique(g["stream"][is_coll])
    comm = is_coll | ((g["kind"] == KIND_MEMCPY) & np.isin(g["stream"], coll_streams))
    g["comm"] = comm
    g["compute"] = (g["kind"] == KIND_KERNEL) & ~comm
    tl.comm_events = g["event"][comm]
    tl.gpu_extent = (int(g["start"].min()), int(g["end"].max())) if len(g["start"]) else None
    rows = tl.compute_rows = np.flatnonzero(g["compute"])   # already sorted by start
    tl.compute_start, tl.compute_end = g["start"][rows], g["end"][rows]
    tl.compute_lcode = g["lcode"][rows]
    # the rank's identities in order of first appearance among its compute kernels
    tl.compute_lcodes = _in_order_of_appearance(tl.compute_lcode, len(tl.lkeys))
    tl.compute_triples = [(tl.names[d[0]], _dims_text(d[1:4]), _dims_text(d[4:7])) for d in tl.lkeys[tl.compute_lcodes]]
    comm_union = _native.interval_union(g["start"][comm], g["end"][comm])
    tl.unions = {"comm": comm_union}
    tl.compute_max_dur = int((tl.compute_end - tl.compute_start).max()) if len(rows) else 0
    tl.compute_buckets = None
    # exposed_comm's lengths that need no other rank: |W ∩ U| per window W
    lo, hi = _exposed_windows(tl)

    def lengths(u):
        return _native.overlap_with_union(lo, hi, *u).tolist() if len(u[0]) else [0] * len(lo)

    compute_union = _native.interval_union(tl.compute_start, tl.compute_end)
    tl.window_lengths = {"comm": lengths(comm_union), "hidden": lengths(_intersect(comm_union, compute_union)),
                         "compute": lengths(compute_union)}
    del compute_union
    copy = g["kind"] != KIND_KERNEL
    tl.window_lengths["copy"] = lengths(_native.interval_union(g["start"][copy], g["end"][copy]))
    tl.window_lengths["busy"] = lengths(_native.interval_union(g["start"], g["end"]))


def _comm_fractions(tl, dur):
    """Per compute kernel (of duration ``dur``), the share of it under comm
    (for compute_inflation's buckets)."""
    u = tl.unions["comm"]
    ov = _native.overlap_with_union(tl.compute_start, tl.compute_end, *u) if len(u[0]) else \
        np.zeros(len(dur), dtype=np.int64)
    return np.divide(ov, dur, out=np.zeros(len(dur)), where=dur > 0)


def _exposed_windows(tl):
    """exposed_comm's windows of a rank, (starts, ends): its whole GPU span,
    then each ProfilerStep#N."""
    lo, hi = tl.gpu_extent if tl.gpu_extent is not None else (0, 0)
    return np.r_[lo, tl.steps[1]].astype(np.int64), np.r_[hi, tl.steps[2]].astype(np.int64)


def _buckets_by_identity(lcode, dur, frac):
    """{lcode: (kernels, overlapped, isolated)} of one rank's compute kernels
    (in start order), for compute_inflation: per identity, its kernel count
    and the (rows, durations) of its kernels with >= HIGH_OVERLAP and with
    < LOW_OVERLAP of their time under comm, rows ascending."""
    if not len(lcode):
        return {}
    top = int(lcode.max()) + 1
    # one stable sort by (identity, bucket: 0 overlapped, 1 isolated, 2 neither);
    # numpy sorts 16-bit ints by radix
    group = lcode * 3 + np.where(frac >= HIGH_OVERLAP, 0, np.where(frac < LOW_OVERLAP, 1, 2))
    order = np.argsort(group.astype(np.uint16) if 3 * top <= 1 << 16 else group, kind="stable")
    bounds = np.r_[0, np.cumsum(np.bincount(group, minlength=3 * top))]
    d = dur[order]
    out = {}
    for c in np.flatnonzero(bounds[3::3] > bounds[:-1:3]).tolist():
        h0, h1, i1 = bounds[3 * c], bounds[3 * c + 1], bounds[3 * c + 2]
        out[c] = (int(bounds[3 * c + 3] - h0), (order[h0:h1], d[h0:h1]), (order[h1:i1], d[h1:i1]))
    return out

"""``correlate``: which kernels block or contend with NCCL collectives.

The contract is spec blocking-analysis.md.  Three analyses, over GPU and CPU
activity collected from the stream plus align's matched collectives:

1. *Why was the late rank late?*  For every matched collective instance
   (send/recv excepted), the delay Δ of the last arriver L behind the first
   arriver R is split on L into host launch lateness, GPU dependency wait and
   GPU backlog (they add up to Δ);
   backlog is attributed to the compute kernels that ran in the window, by
   their excess over the same kernel on the other ranks, and host lateness to
   the CPU ops on the launching thread by self time.
2. *What ran alongside each collective?*  Per NCCL kernel, its overlap with
   compute kernels on other streams; contention pairs; NCCL and compute
   inflation under overlap; SM share and wave (tail-effect) risk.
3. *How much communication was exposed?*  Per rank (and profiler step): comm
   time hidden under compute vs exposed, split into waiting and transfer, and
   an HTA-style temporal breakdown.

All interval arithmetic runs in the C sweeps (``_native``) over numpy arrays;
Python loops run per collective instance or output row, never per kernel.
Times are integer ns on the aligned timeline; sheets show µs.

Memory: per rank, the GPU activities (about 100 bytes each with launch
geometry) and the CPU ops and runtime calls (28 bytes each: start, end,
thread, name), picked out of each EVENTS frame by a C pass as it streams
past, with launch geometry joined per KERNELS frame; a rank is compacted at
its META frame.  Nothing else of the trace is kept.
"""
import logging
import math
import re

import numpy as np
import pandas as pd

from .. import _native
from ..collectives import is_collective_kernel_name, size_bucket
from ..errors import StreamtraceError

log = logging.getLogger("streamtrace")

NS_PER_US = 1000.0
HIGH_OVERLAP, LOW_OVERLAP = 0.5, 0.05   # buckets of spec §2
MIN_SAMPLES = 3                         # fewer in a bucket: say so, no number
TOP_N = 3
P2P_NAMES = ("send", "recv")
NOISE_FRACTION, NOISE_NS = 0.05, 1000   # excess below max(5 % of baseline, 1 us) is noise

# cat spellings, old and new (trace-format.md §4)
KERNEL_CATS = {"kernel", "Kernel"}
MEMCPY_CATS = {"gpu_memcpy", "Memcpy"}
MEMSET_CATS = {"gpu_memset", "Memset"}
CPU_CATS = {"cpu_op", "user_annotation", "Operator"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime"}
LAUNCH_RE = re.compile(r"(LaunchKernel|launchKernel|LaunchCooperativeKernel|ExtLaunchKernel|GraphLaunch|cuLaunch)")

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


# ====================================================================== timelines

# per-string classes, computed once per string of a rank's table
S_NCCL, S_STEP = 1, 2   # collective kernel name; ProfilerStep#N annotation
# string classes as bits, for the C row selection: categories of GPU
# activity and of host ops, and ProfilerStep#N names
SEL_GPU, SEL_HOST, SEL_STEP_NAME = 1, 2, 4
_SEL_OF_KIND = np.array([0, SEL_GPU, SEL_GPU, SEL_GPU, SEL_HOST, SEL_HOST], dtype=np.uint16)


class Timeline:
    """What correlate keeps of one rank, as numpy arrays.

    ``gpu``: GPU activities (kernels, memcpy, memset) sorted by start, raw ns
    until Inputs shifts them to the aligned clock: columns start, end, stream,
    kind, name (string id), event, ctas, threads, regs, smem and lcode,
    the rank's kernel identity code (``lkeys[lcode]``: name id, grid x, y,
    z, block x, y, z with -1 when absent, 0).  ``cpu_parts``: the CPU ops and
    runtime calls, per EVENTS frame in stream order, as (start, end, tid,
    name id) arrays, raw ns.  ``steps``: ProfilerStep#N ops as (names,
    starts, ends), sorted by start.
    """

    def __init__(self, rank, meta, names, gpu, by_event, cpu_parts, steps):
        self.rank, self.meta, self.names = rank, meta, names
        self.gpu, self.by_event, self.cpu_parts, self.steps = gpu, by_event, cpu_parts, steps
        self.shift = 0          # ns to the aligned clock (base time at the rank's end, offset by Inputs)
        device = gpu.pop("device")
        self.device = _mode(device[device >= 0])   # the rank's GPU

    def shift_by(self, ns):
        """Move every time this timeline holds (but the CPU ops, read in raw
        ns) by ns, in place: a fresh copy of each column costs more than the add."""
        if not ns:
            return
        self.shift += ns
        g = self.gpu
        g["start"] += ns
        g["end"] += ns
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


class _Growing:
    """Columns filled part by part into arrays with spare room (doubling),
    so that a rank's end takes the arrays as they are instead of
    concatenating its parts.  ``spec``: {name: (dtype, row shape)}."""

    def __init__(self, spec, capacity=4096):
        self.n = 0
        self.cols = {name: np.empty((capacity,) + shape, dtype=dtype) for name, (dtype, shape) in spec.items()}

    def extend(self, m, at_least=0):
        """Room for m more rows: the slice of them (to fill).  When the
        arrays must grow, to at least ``at_least`` rows (else they double)."""
        need = self.n + m
        cap = len(next(iter(self.cols.values())))
        if need > cap:
            size = max(need, at_least, 2 * cap)
            for name, a in self.cols.items():
                grown = np.empty((size,) + a.shape[1:], dtype=a.dtype)
                grown[:self.n] = a[:self.n]
                self.cols[name] = grown
        rows = slice(self.n, need)
        self.n = need
        return rows

    def take(self):
        """The filled rows as {name: array}, the spare room given back in
        place.  numpy refuses that while anything else refers to an array
        (a profiler or tracer holding the bound method does): the rows are
        then copied out instead."""
        cols, self.cols = self.cols, None
        for name in list(cols):
            a = cols.pop(name)
            try:
                a.resize((self.n,) + a.shape[1:])
            except ValueError:
                a = a[:self.n].copy()
            cols[name] = a
        return cols


# per GPU row: kernel identity (name, grid x y z, block x y z, 0) as int32,
# so that 4 int64 hold one row; launch geometry; CTAs and threads (NaN: unknown)
_GPU_SPEC = {"event": (np.int64, ()), "start": (np.int64, ()), "end": (np.int64, ()), "device": (np.int64, ()),
             "name": (np.int64, ()), "stream": (np.int64, ()), "kind": (np.uint8, ()), "keys": (np.int32, (8,)),
             "regs": (np.float64, ()), "smem": (np.float64, ()), "ctas": (np.float64, ()),
             "threads": (np.float64, ())}


class RankTimeline:
    """Keeps, per rank, the X events correlate needs, as compact numpy arrays,
    while frames stream past: one vectorised filter per EVENTS frame, with
    category and name classes looked up once per string.  What can be
    worked out a part at a time is done as the parts arrive (it runs while
    the extractor reads on), so a rank's end is left with what needs the
    whole rank."""

    def __init__(self, rank, capacity=4096):
        """``capacity``: GPU rows to make room for at first (more as needed)."""
        self.rank = rank
        self.strings = []
        # slot len(strings) is always 0: NOSTR and ids not yet defined
        self._kind = np.zeros(1024, dtype=np.uint8)
        self._name = np.zeros(1024, dtype=np.uint8)
        self._sel = np.zeros(1024, dtype=np.uint16)   # SEL_* bits of each category
        self.gpu = _Growing(_GPU_SPEC, max(1, capacity))
        self.cpu_parts, self.step_parts = [], []
        # launch geometry is joined as each KERNELS frame arrives, into the
        # rows of the latest EVENTS frame (``last_part``); records matching
        # none of them wait in ``pending`` and are joined at the rank's end.
        # A row's CTAs and threads are worked out where its geometry is joined.
        self.last_part, self.pending = slice(0, 0), []
        self.n_events = 0
        self.meta = {}

    def add(self, frame):
        """Take one of the rank's frames (kinds correlate does not read are ignored)."""
        from ..stream.format import Kind

        kind = frame.kind
        if kind == Kind.STRINGS:
            self.add_strings(frame.strings()[1])
        elif kind == Kind.EVENTS:
            self.add_events(frame.records())
        elif kind == Kind.KERNELS:
            self.add_kernels(frame.records())
        elif kind == Kind.META:
            self.meta = frame.json()

    def add_strings(self, strings):
        n0 = len(self.strings)
        need = n0 + len(strings) + 1
        if need > len(self._kind):
            size = max(need, 2 * len(self._kind))
            self._kind = np.concatenate([self._kind[:n0], np.zeros(size - n0, dtype=np.uint8)])
            self._name = np.concatenate([self._name[:n0], np.zeros(size - n0, dtype=np.uint8)])
            self._sel = np.concatenate([self._sel[:n0], np.zeros(size - n0, dtype=np.uint16)])
        new = slice(n0, n0 + len(strings))
        self._kind[new] = [_cat_kind(s) for s in strings]
        self._name[new] = [(S_NCCL if is_collective_kernel_name(s) else 0)
                           | (S_STEP if s.startswith("ProfilerStep#") else 0) for s in strings]
        self._sel[new] = _SEL_OF_KIND[self._kind[new]] | np.where(self._name[new] & S_STEP, SEL_STEP_NAME, 0)
        self.strings.extend(strings)

    def add_events(self, records):
        base = self.n_events
        self.n_events += len(records)
        if not len(records):
            return
        # rows picked by C passes (complete events with a timestamp, by
        # category class), then the kept rows' fields copied in one C pass
        # (a numpy gather passes over the frame once per field)
        n_cls, has_ts = len(self.strings), _native.FLAGS["has_ts"]
        # GPU rows and the ProfilerStep#N host ops in one pass
        g, steps = _native.select_many(records, self._sel, n_cls, (
            dict(cat_any=SEL_GPU, flags_all=has_ts, ph=b"X"),
            dict(cat_any=SEL_HOST, name_any=SEL_STEP_NAME, flags_all=has_ts, ph=b"X")))
        if len(steps):
            ts = records["ts"][steps]
            self.step_parts.append((ts, ts + records["dur"][steps], records["name"][steps]))
        # CPU ops are most events: kept as spans, 28 bytes each (an event record is 96)
        spans = _native.select_spans(records, self._sel, n_cls, SEL_HOST, flags_all=has_ts, ph=b"X")
        if len(spans[0]):
            self.cpu_parts.append(spans)
        rows = self.gpu.extend(len(g))
        self.last_part = rows
        if len(g):
            c = self.gpu.cols
            device, pid = np.empty(len(g), np.int64), np.empty(len(g), np.int64)
            flags, cat = np.empty(len(g), np.uint16), np.empty(len(g), np.uint32)
            _native.gather(records, g, [("ts", c["start"][rows]), ("dur", c["end"][rows]), ("name", c["name"][rows]),
                                        ("stream", c["stream"][rows]), ("device", device), ("pid", pid),
                                        ("flags", flags), ("cat", cat)])
            c["end"][rows] += c["start"][rows]
            c["event"][rows] = g + base
            c["device"][rows] = np.where(device >= 0, device, np.where(flags & _native.FLAGS["pid_str"], -1, pid))
            c["kind"][rows] = self._kind[cat]
            keys = c["keys"][rows]
            keys[:, 1:7] = -1
            keys[:, 0], keys[:, 7] = c["name"][rows], 0
            c["regs"][rows] = c["smem"][rows] = c["ctas"][rows] = c["threads"][rows] = np.nan

    def add_kernels(self, records):
        """Join a KERNELS frame's geometry to the latest GPU part (extract
        writes it right after the EVENTS frame of the same batch)."""
        rows = self.last_part
        if rows.stop == rows.start:
            self.pending.append(records)
            return
        c = self.gpu.cols
        rest = _join_geometry(c["event"][rows], records, *_geometry_columns(c, rows))
        if len(rest):
            self.pending.append(rest)

    def finish(self):
        for records in self.pending:   # none when the stream comes from extract
            rows = slice(0, self.gpu.n)
            _join_geometry(self.gpu.cols["event"][rows], records, *_geometry_columns(self.gpu.cols, rows))
        gpu = self.gpu.take()
        cpu_parts, step_parts = self.cpu_parts, self.step_parts
        self.gpu = self.cpu_parts = self.step_parts = self.pending = None
        n_str = len(self.strings)
        names = np.array(self.strings + [""], dtype=object)
        nostr = gpu["name"] == _native.NOSTR
        gpu["name"][nostr] = n_str     # the "" slot
        keys = gpu.pop("keys")
        keys[nostr, 0] = n_str
        for part in cpu_parts:
            part[3][part[3] == _native.NOSTR] = n_str
        by_event = (gpu["event"], gpu["ctas"])          # rows are in stream (event) order
        start = gpu["start"]
        order = np.argsort(start, kind="stable") if len(start) > 1 and (start[1:] < start[:-1]).any() else None

        def sort(a):
            return a if order is None else a[order]

        keys = sort(keys)
        cols = {c: sort(gpu[c]) for c in ("start", "end", "stream", "kind", "name", "event", "device", "ctas",
                                          "threads", "regs", "smem")}
        s_start, s_end, s_name = (np.concatenate(c) for c in zip(*step_parts)) if step_parts else \
            (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint32))
        o = np.argsort(s_start, kind="stable")
        steps = (names[s_name[o]], s_start[o], s_end[o])
        cols["lcode"], first = _native.factorize_rows(keys.view(np.int64))
        tl = Timeline(self.rank, self.meta, names, cols, by_event, cpu_parts, steps)
        tl.lkeys = keys[first]
        tl.nccl_name = (self._name.take(cols["name"], mode="clip") & S_NCCL) != 0
        # here, overlapped with the next rank's extraction; Inputs redoes it
        # only when align links an event this left out
        _classify(tl, np.zeros(0, dtype=np.int64))
        # onto the aligned clock as far as this rank alone says (its base
        # time); Inputs adds align's clock offset, when there is one
        tl.shift_by(tl.base_ns)
        return tl


def _geometry_columns(cols, rows):
    """The GPU columns _join_geometry writes, for ``rows`` (a slice: views)."""
    return cols["keys"][rows, 1:7], cols["regs"][rows], cols["smem"][rows], cols["ctas"][rows], cols["threads"][rows]


def _join_geometry(events, records, dims, regs, smem, ctas, threads):
    """Write the geometry of KERNELS ``records`` into the rows of the GPU
    rows whose (increasing) event indices are ``events``, with the CTAs and
    threads it makes (NaN without a grid and a block); returns the records
    that match no row.  Fields are taken one at a time: a gather of whole
    structured records is several times slower."""
    n = len(events)
    if not n:
        return records
    k_event = records["event"].astype(np.int64)
    at = np.minimum(np.searchsorted(events, k_event), n - 1)
    hit = events[at] == k_event
    everything = bool(hit.all())

    def hits(values):
        return values if everything else values[hit]

    rows = hits(at)
    grid, block = hits(records["grid"]), hits(records["block"])
    dims[rows, 0:3] = grid
    dims[rows, 3:6] = block
    has = (grid[:, 0] >= 0) & (block[:, 0] >= 0)
    for out, d in ((ctas, grid), (threads, block)):   # as int64: never an int32 overflow
        out[rows] = np.where(has, d[:, 0].astype(np.int64) * d[:, 1] * d[:, 2], np.nan)
    r, m = hits(records["registers_per_thread"]), hits(records["shared_memory"])
    regs[rows] = np.where(r >= 0, r, np.nan)
    smem[rows] = np.where(m >= 0, m, np.nan)
    return records[:0] if everything else records[~hit]


def _dims_text(d):
    return "[" + ",".join(str(int(x)) for x in d) + "]" if d[0] >= 0 else ""


#: the columns of align.collectives that instances_from_align and
#: offsets_from_align read (the others are not decoded)
ALIGN_COLUMNS_USED = frozenset((
    "collective_id", "clock_offset_ns", "base_ns", "ts_aligned_ns", "launch_ts_ns", "launch_dur_ns", "category",
    "out_bytes", "in_bytes", "rank", "event", "dur_aligned_ns", "stream", "implicit_sync", "collective_name",
    "pg_name", "dtype", "group_size", "kernel_name", "launch_tid"))


class StreamCollector:
    """Feeds frames to per-rank collectors and keeps align's collectives
    table (the columns correlate reads).  A rank is finished (compacted into its Timeline) at its META frame, which
    extract writes after the rank's events."""

    def __init__(self):
        self.collectors, self.done, self.tables = {}, {}, {}
        # ranks are alike: a rank starts with room for as many GPU rows as
        # the largest one so far (no doubling copies; room never written to
        # costs no memory)
        self.gpu_rows = 4096
        # the analysis' table of compute kernels, a rank added at its end
        # while ranks come in ascending order (else made when first used)
        self.compute = _Compute()

    def _finished(self, r, tl):
        self.done[r] = tl
        self.gpu_rows = max(self.gpu_rows, len(tl.gpu["start"]))
        if self.compute is not None and self.compute.timelines and r < max(self.compute.timelines):
            self.compute = None
        if self.compute is not None:
            ws = tl.meta.get("world_size")
            self.compute.add(r, tl, room_for=ws if isinstance(ws, int) and ws > 0 else 2 * (len(self.done) + 1))

    def add(self, frame):
        from ..stream.format import Kind

        kind = frame.kind
        if kind in (Kind.STRINGS, Kind.EVENTS, Kind.KERNELS, Kind.META):
            if frame.rank in self.done:
                raise StreamtraceError(f"rank {frame.rank} appears twice in the input (frames after its metadata frame)")
            c = self.collectors.get(frame.rank)
            if c is None:
                c = self.collectors[frame.rank] = RankTimeline(frame.rank, self.gpu_rows)
            c.add(frame)
            if kind == Kind.META:
                self._finished(frame.rank, self.collectors.pop(frame.rank).finish())
        elif kind == Kind.TABLE and frame.table_name() == "align.collectives":   # the only table used
            name, df = frame.table(ALIGN_COLUMNS_USED)
            self.tables[name] = pd.concat([self.tables[name], df], ignore_index=True) if name in self.tables else df

    def finish(self):
        """({rank: Timeline}, {table name: DataFrame})"""
        for r, c in self.collectors.items():   # ranks whose section has no META frame
            self._finished(r, c.finish())
        self.collectors = {}
        return dict(sorted(self.done.items())), self.tables


def compute_table(timelines):
    """The analysis' table of compute kernels, ``{rank: Timeline}`` added in
    ascending rank order (as ``StreamCollector`` adds ranks that arrive so)."""
    compute = _Compute()
    for i, (r, tl) in enumerate(sorted(timelines.items())):
        ws = tl.meta.get("world_size")
        compute.add(r, tl, room_for=ws if isinstance(ws, int) and ws > 0 else 2 * (i + 2))
    return compute


def collect(frames):
    """Consume frames; return ``({rank: Timeline}, {table name: DataFrame})``."""
    sc = StreamCollector()
    for frame in frames:
        sc.add(frame)
    return sc.finish()


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


def offsets_from_align(coll):
    """ns to add to each rank's (base-applied) times to reach the aligned clock."""
    if not len(coll):
        return {}
    per_rank = coll.groupby("rank")["clock_offset_ns"].first()
    return {int(r): -int(v) for r, v in per_rank.items()}


TABLE_PREFIX = "correlate."


def correlate_frames(frames):
    """The correlate stage: yield every input frame as it is read, then the
    ``correlate.*`` result tables and one END frame.

    The input must carry align's tables (run ``align`` first): without them
    there are no matched collectives and every table comes out empty, with a
    data-quality note.  ``correlate.*`` tables already in the input (a stream
    correlated twice) are dropped with a warning, as align does with its own:
    the output is that of one run.
    """
    from ..stream.format import Kind, json_frame, table_frame

    sc = StreamCollector()
    replaced = False
    for frame in frames:
        if frame.kind == Kind.END:
            continue
        if frame.kind == Kind.TABLE and frame.table_name().startswith(TABLE_PREFIX):
            replaced = True
            continue
        sc.add(frame)
        yield frame
    if replaced:
        log.warning("the input already held correlate tables; they are replaced by this run's")
    sheets = analyze_collected(*sc.finish(), compute=sc.compute)
    for name, df in sheets.items():
        yield table_frame(TABLE_PREFIX + name, df)
    yield json_frame(Kind.END, 0, {"stage": "correlate"})


def analyze_collected(timelines, tables, compute=None):
    """Sheets from collected timelines and align's tables (``compute``: the
    StreamCollector's table of compute kernels)."""
    coll = tables.get("align.collectives")
    if coll is None:
        inputs = Inputs(timelines, _empty_instances(), {}, compute)
        inputs.quality.append(("no align tables", None, "the stream has no align.collectives table: "
                                                        "run 'streamtrace align' before correlate"))
    else:
        inputs = Inputs(timelines, instances_from_align(coll), offsets_from_align(coll), compute)
    return analyze(inputs)


def _empty_instances():
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in (
        ("instance", object), ("rank", np.int64), ("event", np.int64), ("start", np.int64), ("end", np.int64),
        ("stream", object), ("implicit_sync", bool), ("collective_name", object), ("pg_name", object),
        ("dtype", object), ("nbytes", float), ("group_size", object), ("kernel_name", object),
        ("launch_end", float), ("launch_tid", float))})


# ====================================================================== sweeps

def _union(starts, ends):
    order = np.argsort(starts, kind="stable")
    return _native.interval_union(np.asarray(starts)[order], np.asarray(ends)[order])


# ====================================================================== the analysis

class _Compute:
    """Every rank's compute kernels K, concatenated in rank order, each rank's
    block sorted by start, with identity codes shared by all ranks:
    ``ident`` by identity text (name grid block) and ``key`` by the
    (name, grid, block) triple, both numbered in order of first appearance.
    Other columns are read from the rank's timeline with ``column``.

    Built a rank at a time (``add``): StreamCollector adds each rank at its
    end, while the next one streams in, so the analysis finds it made.  A
    rank's ``compute_start``/``compute_end`` then become views of its block:
    shifting the timeline onto the aligned clock shifts the table too."""

    COLUMNS = ("start", "end", "ident", "key")

    def __init__(self, capacity=0):
        self.timelines = {}
        self.offset, self.offset_end, self.max_dur, self.l_key = {}, {}, {}, {}
        self.texts, self.triples = [], []        # by ident / by key
        self._text_code, self._triple_code = {}, {}
        self._rows = _Growing({c: (np.int64, ()) for c in self.COLUMNS}, capacity)

    @classmethod
    def of(cls, timelines):
        """The table of these timelines, in their order."""
        comp = cls(sum(len(tl.compute_rows) for tl in timelines.values()))
        for r, tl in timelines.items():
            comp.add(r, tl)
        return comp

    def add(self, r, tl, room_for=1):
        """Append rank r's kernels, with room for ``room_for`` ranks of this
        size in all when the arrays must grow (untouched room costs no memory)."""
        m = len(tl.compute_rows)
        before = self._rows.cols["start"]
        block = self._rows.extend(m, at_least=m * room_for)
        c = self._rows.cols
        if c["start"] is not before:   # grown: the earlier ranks' views, onto the new arrays
            for q, earlier in self.timelines.items():
                rows = self.rank_slice(q)
                earlier.compute_start, earlier.compute_end = c["start"][rows], c["end"][rows]
        # by the rank's kernel identity code (lcode): the shared codes
        l_ident = np.zeros(len(tl.lkeys), dtype=np.int64)
        l_key = np.zeros(len(tl.lkeys), dtype=np.int64)
        for i, triple in zip(tl.compute_lcodes.tolist(), tl.compute_triples):   # once per distinct identity
            text = f"{triple[0]} {triple[1]} {triple[2]}"
            l_ident[i] = self._text_code.setdefault(text, len(self._text_code))
            if l_ident[i] == len(self.texts):
                self.texts.append(text)
            l_key[i] = self._triple_code.setdefault(triple, len(self._triple_code))
            if l_key[i] == len(self.triples):
                self.triples.append(triple)
        c["start"][block], c["end"][block] = tl.compute_start, tl.compute_end
        np.take(l_ident, tl.compute_lcode, out=c["ident"][block])
        np.take(l_key, tl.compute_lcode, out=c["key"][block])
        tl.compute_start, tl.compute_end = c["start"][block], c["end"][block]
        self.timelines[r] = tl
        self.offset[r], self.offset_end[r] = block.start, block.stop
        self.l_key[r] = l_key
        self.max_dur[r] = tl.compute_max_dur

    def holds(self, timelines):
        """True when this table is still that of ``timelines``: the same
        ranks in the same order, none classified again since it was added."""
        return list(self.timelines) == list(timelines) and all(
            self.timelines[r] is tl and tl.compute_start.base is self._rows.cols["start"]
            for r, tl in timelines.items())

    start = property(lambda self: self._rows.cols["start"][:self._rows.n])
    end = property(lambda self: self._rows.cols["end"][:self._rows.n])
    ident = property(lambda self: self._rows.cols["ident"][:self._rows.n])
    key = property(lambda self: self._rows.cols["key"][:self._rows.n])
    n_ident = property(lambda self: len(self.texts))

    def rank_slice(self, r):
        return slice(self.offset[r], self.offset_end[r])

    def column(self, r, name, j):
        """Timeline column ``name`` of compute kernels j (indices into this
        table) of rank r."""
        tl = self.timelines[r]
        return tl.gpu[name][tl.compute_rows[np.asarray(j) - self.offset[r]]]


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
            # adds events to C, so it changes nothing when all are in C already
            if not np.isin(linked, tl.gpu["event"][tl.gpu["comm"]]).all():
                _classify(tl, linked)
        self._compute = compute if compute is not None and compute.holds(timelines) else None

    @property
    def compute(self):
        """The _Compute table, built on first use."""
        if self._compute is None:
            self._compute = _Compute.of(self.timelines)
        return self._compute


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
    """Comm activities C (collective kernels: by name or ``linked`` by align
    to a collective, and memcpy on their streams) and compute kernels K of one
    rank, with what the analyses need of each that does not depend on other
    ranks: K's rows, times and identities (``compute_*``), the unions of C,
    K, copies and all GPU activity (on the timeline's clock), K's duration
    buckets for compute_inflation and the window lengths for exposed_comm."""
    g = tl.gpu
    # a lookup table over the events' range, not a pass per collective
    is_linked = np.isin(g["event"], linked, kind="table") if len(linked) else np.zeros(len(g["event"]), bool)
    is_coll = is_linked | ((g["kind"] == KIND_KERNEL) & tl.nccl_name)
    coll_streams = np.unique(g["stream"][is_coll])
    comm = is_coll | ((g["kind"] == KIND_MEMCPY) & np.isin(g["stream"], coll_streams))
    g["comm"] = comm
    g["compute"] = (g["kind"] == KIND_KERNEL) & ~comm
    rows = tl.compute_rows = np.flatnonzero(g["compute"])   # already sorted by start
    tl.compute_start, tl.compute_end = g["start"][rows], g["end"][rows]
    tl.compute_lcode = g["lcode"][rows]
    # the rank's identities in order of first appearance among its compute kernels
    tl.compute_lcodes = _in_order_of_appearance(tl.compute_lcode, len(tl.lkeys))
    tl.compute_triples = [(tl.names[d[0]], _dims_text(d[1:4]), _dims_text(d[4:7])) for d in tl.lkeys[tl.compute_lcodes]]
    copy = g["kind"] != KIND_KERNEL
    tl.unions = {"compute": _native.interval_union(tl.compute_start, tl.compute_end),
                 "comm": _native.interval_union(g["start"][comm], g["end"][comm]),
                 "copy": _native.interval_union(g["start"][copy], g["end"][copy]),
                 "busy": _native.interval_union(g["start"], g["end"])}
    # per compute kernel, the share of it under comm (for compute_inflation)
    u = tl.unions["comm"]
    ov = _native.overlap_with_union(tl.compute_start, tl.compute_end, *u) if len(u[0]) else \
        np.zeros(len(rows), dtype=np.int64)
    dur = tl.compute_end - tl.compute_start
    tl.compute_max_dur = int(dur.max()) if len(dur) else 0
    tl.compute_comm_frac = np.divide(ov, dur, out=np.zeros(len(dur)), where=dur > 0)
    tl.compute_buckets = _buckets_by_identity(tl.compute_lcode, dur, tl.compute_comm_frac)
    # exposed_comm's lengths that need no other rank: |W ∩ U| per window W
    u = dict(tl.unions, hidden=_intersect(tl.unions["comm"], tl.unions["compute"]))
    lo, hi = _exposed_windows(tl)
    tl.window_lengths = {k: _native.overlap_with_union(lo, hi, *u[k]).tolist() if len(u[k][0]) else [0] * len(lo)
                         for k in ("comm", "hidden", "compute", "copy", "busy")}


def _exposed_windows(tl):
    """exposed_comm's windows of a rank, (starts, ends): its whole GPU span,
    then each ProfilerStep#N."""
    g = tl.gpu
    lo = np.r_[int(g["start"].min()) if len(g["start"]) else 0, tl.steps[1]].astype(np.int64)
    hi = np.r_[int(g["end"].max()) if len(g["end"]) else 0, tl.steps[2]].astype(np.int64)
    return lo, hi


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


SHEET_NAMES = ["collective_blockers", "blocking_kernels", "blocking_host_ops", "collective_overlap",
               "contention_pairs", "nccl_inflation", "compute_inflation", "exposed_comm", "correlate_quality"]


def analyze(inputs):
    """All correlate sheets as ``{name: DataFrame}`` plus ``data_quality`` rows.

    The analyses run one after another in this process, each adding its
    data-quality notes to ``inputs.quality`` in turn: splitting them with a
    forked child made the whole slower on two cores (see
    docs/performance.md)."""
    blockers, blocking_kernels, blocking_host_ops = _late_rank_analysis(inputs)
    sheets = {"collective_blockers": blockers, "blocking_kernels": blocking_kernels,
              "blocking_host_ops": blocking_host_ops, "compute_inflation": _compute_inflation(inputs)}
    overlap, pairs = _overlap_analysis(inputs)
    sheets.update({"collective_overlap": overlap, "contention_pairs": pairs,
                   "nccl_inflation": _nccl_inflation(inputs, overlap), "exposed_comm": _exposed_comm(inputs)})
    sheets["correlate_quality"] = pd.DataFrame(inputs.quality, columns=["check", "rank", "detail"])
    return {name: sheets[name] for name in SHEET_NAMES}


# ---------------------------------------------------------------------- part 1

BLOCKER_COLUMNS = [
    "collective_id", "Process Group Name", "Collective name", "late_rank", "reference_rank", "delta_us", "blame_us",
    "host_launch_lateness_us", "gpu_dependency_wait_us", "gpu_backlog_us", "dominant_cause",
    "top_blockers", "blocker_1", "blocker_1_stream", "blocker_1_excess_us",
    "blocker_2", "blocker_2_stream", "blocker_2_excess_us", "blocker_3", "blocker_3_stream", "blocker_3_excess_us",
]
BLOCKING_KERNEL_COLUMNS = ["kernel", "grid", "block", "total_blocking_us", "instances_delayed", "ranks",
                           "mean_excess_us", "max_excess_us", "mean_duration_us", "baseline_median_us"]
BLOCKING_HOST_COLUMNS = ["op", "total_blocking_us", "instances_delayed", "ranks", "mean_self_us_in_gap",
                         "max_self_us_in_gap"]


def _late_rank_analysis(inputs):
    inst = inputs.instances
    # every matched multi-rank collective makes ranks wait for the last one;
    # point-to-point send/recv only pair two ranks and are left out
    sync = inst[~inst["collective_name"].isin(P2P_NAMES)].sort_values(["instance", "start", "rank"], kind="stable")
    comp, tls = inputs.compute, inputs.timelines
    coll_ends = {int(r): np.sort(g["end"].to_numpy()) for r, g in inst.groupby("rank")}

    inst_ids = sync["instance"].to_numpy()
    ranks, starts = sync["rank"].to_numpy(np.int64), sync["start"].to_numpy(np.int64)
    launch_end, launch_tid = sync["launch_end"].to_numpy(float), sync["launch_tid"].to_numpy(float)
    pgs, names = sync["pg_name"].to_numpy(object), sync["collective_name"].to_numpy(object)
    bounds = np.flatnonzero(np.r_[True, inst_ids[1:] != inst_ids[:-1], True])
    lo_i, hi_i = bounds[:-1], bounds[1:]
    # instances with at least two ranks whose late rank has a timeline
    keep = hi_i - lo_i >= 2
    lo_i, last = lo_i[keep], hi_i[keep] - 1
    keep = np.isin(ranks[last], list(tls))
    lo_i, last = lo_i[keep], last[keep]
    n = len(lo_i)
    L, R = ranks[last], ranks[lo_i]
    a_L, a_R = starts[last], starts[lo_i]
    delta = a_L - a_R
    blame = a_L - starts[np.maximum(last - 1, 0)]
    no_launch = np.isnan(launch_end[last])
    le = np.where(no_launch, 0, launch_end[last]).astype(np.int64)
    host = np.where(no_launch, 0, np.minimum(np.maximum(le - a_R, 0), delta))
    g0 = a_R + host   # from here the kernel was launched and the GPU side waited
    gap_busy = np.zeros(n, dtype=np.int64)
    prev_L = np.zeros(n, dtype=np.int64)
    for r in np.unique(L):
        q = np.flatnonzero(L == r)
        gap_busy[q] = _native.overlap_with_union(g0[q], a_L[q], *tls[int(r)].unions["compute"])
        prev_L[q] = _previous_ends(coll_ends.get(int(r)), a_L[q])
    backlog = np.minimum(gap_busy, delta - host)
    dependency = delta - host - backlog

    # kernels that ran on L between its previous collective's end and a_L,
    # against the same kernels on the other ranks in their own windows
    q_lo, q_hi = _windows(comp, L, prev_L, a_L)
    others = np.concatenate([np.arange(a, b) for a, b in zip(lo_i, last)]) if n else np.zeros(0, dtype=np.int64)
    owner = np.repeat(np.arange(n), last - lo_i)
    present = np.isin(ranks[others], list(tls))
    others, owner = others[present], owner[present]
    prev_o = np.zeros(len(others), dtype=np.int64)
    for r in np.unique(ranks[others]):
        q = np.flatnonzero(ranks[others] == r)
        prev_o[q] = _previous_ends(coll_ends.get(int(r)), starts[others[q]])
    r_lo, r_hi = _windows(comp, ranks[others], prev_o, starts[others])
    ref_ptr = np.searchsorted(owner, np.arange(n + 1), side="left")
    ptr, kern, baseline = _native.window_medians(comp.start, comp.end, comp.ident, comp.n_ident, q_lo, q_hi, prev_L,
                                                 ref_ptr, r_lo, r_hi, prev_o)
    q_of = np.repeat(np.arange(n), np.diff(ptr))
    k_start, k_end = comp.start[kern], comp.end[kern]
    dur = k_end - k_start
    excess = dur - baseline
    in_gap = np.clip(np.minimum(k_end, a_L[q_of]) - np.maximum(k_start, g0[q_of]), 0, None)
    # a kernel blocks by at most its time in the gap, and only by what it
    # took beyond its usual duration elsewhere (when that is known);
    # an excess within timing noise is no excess
    significant = np.nan_to_num(excess) > np.maximum(NOISE_FRACTION * np.nan_to_num(baseline), NOISE_NS)
    attributed = np.where(np.isnan(excess), in_gap,
                          np.where(significant, np.minimum(in_gap, np.clip(np.nan_to_num(excess), 0, None)), 0))
    hit = np.flatnonzero(attributed > 0)
    hit = hit[np.lexsort((-attributed[hit], q_of[hit]))]   # per instance, largest first (stable)
    hit_ptr = np.searchsorted(q_of[hit], np.arange(n + 1), side="left")

    has_tid = ~np.isnan(launch_tid[last])
    host_ops = _host_ops_in_gaps(tls, L, np.where(has_tid, launch_tid[last], -1).astype(np.int64),
                                 a_R, a_R + host, (host > 0) & has_tid)

    rows, kernel_hits, host_hits = [], [], []
    for i in range(n):
        cid = inst_ids[lo_i[i]]
        Li = int(L[i])
        d, h, bl, dep = int(delta[i]), int(host[i]), int(backlog[i]), int(dependency[i])
        if no_launch[i] and d > 0:
            inputs.quality.append(("no launch record", Li, f"collective {cid}: the late rank's kernel has no launch "
                                                           "record; host lateness counted as 0"))
        parts = {"host launch lateness": h, "GPU dependency wait": dep, "GPU backlog": bl}
        cause = max(parts, key=parts.get) if d > 0 else "none"
        top = []
        for k in hit[hit_ptr[i]:hit_ptr[i + 1]]:
            j = kern[k]
            name, grid, block = comp.triples[comp.key[j]]
            kernel_hits.append((name, grid, block, int(attributed[k]), cid, Li, excess[k], int(dur[k]), baseline[k]))
            top.append((name, int(comp.column(Li, "stream", j)), excess[k], int(attributed[k])))

        ops = host_ops.get(i, [])
        host_hits.extend((name, t, cid, Li) for name, t in ops)
        host_top = ops[:TOP_N]

        row = {
            "collective_id": cid, "Process Group Name": pgs[last[i]], "Collective name": names[last[i]],
            "late_rank": Li, "reference_rank": int(R[i]), "delta_us": d / NS_PER_US, "blame_us": int(blame[i]) / NS_PER_US,
            "host_launch_lateness_us": h / NS_PER_US, "gpu_dependency_wait_us": dep / NS_PER_US,
            "gpu_backlog_us": bl / NS_PER_US, "dominant_cause": cause,
        }
        if cause == "host launch lateness" and host_top:
            row["top_blockers"] = "; ".join(f"{name} ({t / NS_PER_US:.1f} us)" for name, t in host_top)
        else:
            row["top_blockers"] = "; ".join(f"{name} ({a / NS_PER_US:.1f} us)" for name, _, _, a in top[:TOP_N])
        for b, (name, stream, exc, _) in enumerate(top[:TOP_N], 1):
            row[f"blocker_{b}"] = name
            row[f"blocker_{b}_stream"] = stream
            row[f"blocker_{b}_excess_us"] = None if np.isnan(exc) else exc / NS_PER_US
        rows.append(row)

    blockers_df = pd.DataFrame(rows).reindex(columns=BLOCKER_COLUMNS)
    return blockers_df, _summarize_kernels(kernel_hits), _summarize_host(host_hits)


def _previous_ends(ends, t):
    """Per time in t, the latest collective end on the rank at or before it
    (-2**62 when none)."""
    t = np.asarray(t, dtype=np.int64)
    if ends is None or not len(ends):
        return np.full(len(t), -(1 << 62), dtype=np.int64)
    i = np.searchsorted(ends, t, side="right")
    return np.where(i > 0, ends[np.maximum(i - 1, 0)], -(1 << 62)).astype(np.int64)


def _windows(comp, ranks, lo, hi):
    """Index ranges [a, b) into comp of the kernels that may meet [lo, hi) on
    each rank (those also need end > lo): binary search on start."""
    a = np.zeros(len(ranks), dtype=np.int64)
    b = np.zeros(len(ranks), dtype=np.int64)
    for r in np.unique(ranks):
        q = np.flatnonzero(ranks == r)
        s = comp.start[comp.rank_slice(int(r))]
        off = comp.offset[int(r)]
        a[q] = off + np.searchsorted(s, lo[q] - comp.max_dur[int(r)], side="left")
        b[q] = off + np.searchsorted(s, hi[q], side="left")
    return a, b


def _host_ops_in_gaps(tls, ranks, tids, lo, hi, wanted):
    """{instance: [(op name, self ns), ...]} of the CPU ops on the launching
    thread during [lo, hi), by self time within it (the innermost op at each
    instant), largest first; one pass over a rank's ops, then one C sweep per
    (rank, thread)."""
    out = {}
    todo = np.flatnonzero(wanted)
    for r in sorted(set(ranks[todo].tolist())):
        tl = tls[r]
        mine = todo[ranks[todo] == r]
        q_lo, q_hi = lo[mine] - tl.shift, hi[mine] - tl.shift     # CPU ops are raw ns
        ops = _ops_meeting(tl.cpu_parts, tids[mine], q_lo, q_hi)
        for tid, (start, end, name_ids) in ops.items():
            on = tids[mine] == tid
            q, w_lo, w_hi = mine[on], q_lo[on], q_hi[on]
            max_dur = int((end - start).max())
            a = np.searchsorted(start, w_lo - max_dur, side="left")
            b = np.searchsorted(start, w_hi, side="left")
            qq, op, self_ns, first = _native.innermost_self(start, end, a, b, w_lo, w_hi)
            order = np.lexsort((first, qq))   # per query, names in order of first appearance
            for k, o, t in zip(qq[order].tolist(), op[order].tolist(), self_ns[order].tolist()):
                totals = out.setdefault(int(q[k]), {})
                name = tl.names[name_ids[o]]
                totals[name] = totals.get(name, 0) + t
    return {i: sorted(totals.items(), key=lambda kv: -kv[1]) for i, totals in out.items()}


def _ops_meeting(parts, tids, lo, hi):
    """{tid: (start, end, name ids)} of the ops on the threads ``tids`` that
    meet any window [lo, hi), sorted by start (stable: stream order on ties):
    every op of any window's selection is among them, in the same relative
    order.  One pass over the rank's per-frame parts."""
    w_start, w_end = _union(lo, hi)
    picked = []
    for start, end, t, name in parts:
        # windows only (few ops meet one); the threads are picked once, below
        m = _native.meeting_union(start, end, w_start, w_end)
        if len(m):
            picked.append((start[m], end[m], t[m], name[m]))
    if not picked:
        return {}
    s, e, t, n = (np.concatenate(c) for c in zip(*picked))
    out = {}
    for tid in np.intersect1d(t, tids).tolist():
        on = np.flatnonzero(t == tid)
        order = on[np.argsort(s[on], kind="stable")]
        out[tid] = (s[order], e[order], n[order])
    return out


def _summarize_kernels(hits):
    """blocking_kernels: per (kernel, grid, block), in order of first
    appearance then by total blocking time, the aggregates of its hits
    (name, grid, block, attributed ns, instance, rank, excess, duration,
    baseline), NaN skipped, as pandas' groupby gives them.  Plain Python (a
    few thousand hits at most) but for the mean excess, a float sum that
    pandas compensates its own way: a sum of integer ns is exact anyway."""
    if not hits:
        return pd.DataFrame(columns=BLOCKING_KERNEL_COLUMNS)
    groups = {}
    for name, grid, block, *rest in hits:
        groups.setdefault((name, grid, block), []).append(rest)
    index = {key: c for c, key in enumerate(groups)}   # first appearance, as groupby(sort=False)
    code = [index[h[:3]] for h in hits]
    mean_excess = pd.Series([h[6] for h in hits], dtype=np.float64).groupby(np.array(code), sort=False).mean()
    rows = []
    for c, ((name, grid, block), g) in enumerate(groups.items()):
        attributed, instances, ranks, excess, dur, baseline = zip(*g)
        present = [float(x) for x in excess if x == x]
        rows.append((name, grid, block, sum(attributed) / NS_PER_US, len(set(instances)), _rank_list(ranks),
                     mean_excess.iloc[c] / NS_PER_US, (max(present) if present else math.nan) / NS_PER_US,
                     sum(dur) / len(dur) / NS_PER_US, _median([float(x) for x in baseline if x == x]) / NS_PER_US))
    out = pd.DataFrame(rows, columns=BLOCKING_KERNEL_COLUMNS)
    return out.sort_values(["total_blocking_us", "kernel"], ascending=[False, True]).reset_index(drop=True)


def _summarize_host(hits):
    """blocking_host_ops: per op, the aggregates of its (op, self ns,
    instance, rank) hits, as _summarize_kernels does them."""
    if not hits:
        return pd.DataFrame(columns=BLOCKING_HOST_COLUMNS)
    groups = {}
    for op, self_ns, instance, rank in hits:
        groups.setdefault(op, []).append((self_ns, instance, rank))
    rows = []
    for op, g in groups.items():
        self_ns, instances, ranks = zip(*g)
        rows.append((op, sum(self_ns) / NS_PER_US, len(set(instances)), _rank_list(ranks),
                     sum(self_ns) / len(self_ns) / NS_PER_US, max(self_ns) / NS_PER_US))
    out = pd.DataFrame(rows, columns=BLOCKING_HOST_COLUMNS)
    return out.sort_values(["total_blocking_us", "op"], ascending=[False, True]).reset_index(drop=True)


def _rank_list(ranks):
    return ",".join(str(r) for r in sorted(set(ranks)))


def _median(values):
    """The median as pandas' groupby median takes it: the middle value, or
    the mean of the two middle ones (NaN when empty)."""
    if not values:
        return math.nan
    s, n = sorted(values), len(values)
    return s[n // 2] if n % 2 else (s[n // 2] + s[n // 2 - 1]) / 2


# ---------------------------------------------------------------------- part 2

OVERLAP_COLUMNS = ["collective_id", "rank", "Collective name", "Process Group Name", "signature", "stream",
                   "ts_us", "dur_us", "overlap_us", "overlap_frac", "overlapping_kernels", "top_overlapping",
                   "nccl_ctas", "sm_share", "top_kernel", "top_kernel_overlap_us", "top_kernel_stream",
                   "top_kernel_grid", "top_kernel_blocks_per_sm", "waves_alone", "waves_with_nccl", "tail_effect_risk"]
PAIR_COLUMNS = ["compute_kernel", "grid", "block", "signature", "overlap_us", "occurrences", "ranks",
                "nccl_ctas", "sm_share", "blocks_per_sm", "waves_alone", "waves_with_nccl", "tail_effect_risk"]


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
    inst = inputs.instances
    comp = inputs.compute
    sig_cache = {}
    parts, pair_parts = {c: [] for c in OVERLAP_COLUMNS + ["has_top"]}, []
    # over lists: iterating the Series themselves costs several times more
    sig_fields = [inst[c].to_numpy(object) for c in ("collective_name", "pg_name", "dtype", "nbytes", "group_size",
                                                     "kernel_name")]
    for r, mine in _rows_by_rank(inputs):
        tl, m = inputs.timelines[r], len(mine)
        props = tl.device_props()
        num_sms = props.get("numSms") if props else None
        if props is None:
            inputs.quality.append(("no deviceProperties", r, "SM share and wave risk left empty"))
        starts, ends = inst["start"].to_numpy(np.int64)[mine], inst["end"].to_numpy(np.int64)[mine]
        dur = ends - starts
        overlap = _native.overlap_with_union(starts, ends, *tl.unions["compute"])
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
        for c in ("top_kernel_blocks_per_sm", "waves_alone", "waves_with_nccl", "tail_effect_risk"):
            col[c] = np.full(m, None, dtype=object)
        cs = comp.rank_slice(r)
        ia, jb, il = _native.intersecting_pairs(starts, ends, comp.start[cs], comp.end[cs])
        if len(ia):
            jb = jb + cs.start    # into comp
            col["overlapping_kernels"] = np.bincount(ia, minlength=m)
            i_top, text = _top_overlapping(ia, comp.ident[jb], il, comp.texts)
            col["top_overlapping"][i_top] = text
            # the pair of largest overlap per NCCL kernel (the first on ties)
            seg = np.flatnonzero(np.r_[True, ia[1:] != ia[:-1]])
            is_max = il == np.repeat(np.maximum.reduceat(il, seg), np.diff(np.r_[seg, len(ia)]))
            best = np.flatnonzero(is_max)
            best = best[np.r_[True, ia[best][1:] != ia[best][:-1]]]
            rows_i, bj = ia[best], jb[best]
            triples = [comp.triples[k] for k in comp.key[bj].tolist()]
            col["top_kernel"][rows_i] = [t[0] for t in triples]
            col["top_kernel_overlap_us"][rows_i] = il[best] / NS_PER_US
            col["top_kernel_stream"][rows_i] = comp.column(r, "stream", bj)
            col["has_top"][rows_i] = True
            col["top_kernel_grid"][rows_i] = [t[1] for t in triples]
            # few distinct launch shapes: each worked out once (a NaN, never
            # equal to itself, just misses the cache)
            waves, shapes = [], {}
            geo = [comp.column(r, c, bj).tolist() for c in ("threads", "regs", "smem", "ctas")]
            for shape in zip(*geo, ctas[rows_i].tolist()):
                w = shapes.get(shape)
                if w is None:
                    th, rg, sm, ct, nccl = shape
                    bpsm = resident_blocks_per_sm(th, rg, sm, props)
                    w = shapes[shape] = (bpsm, *wave_risk(ct, bpsm, num_sms, None if nccl != nccl else nccl))
                waves.append(w)
            for k, c in enumerate(("top_kernel_blocks_per_sm", "waves_alone", "waves_with_nccl", "tail_effect_risk")):
                col[c][rows_i] = [w[k] for w in waves]
            pair_parts.append((comp.key[jb], sig[ia], il, r, jb, ctas[ia], num_sms, props))
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


NCCL_INFLATION_COLUMNS = ["signature", "instances", "overlapped_n", "isolated_n", "median_transfer_overlapped_us",
                          "median_transfer_isolated_us", "inflation", "total_excess_us", "note"]
COMPUTE_INFLATION_COLUMNS = ["kernel", "grid", "block", "occurrences", "overlapped_n", "isolated_n",
                             "median_overlapped_us", "median_isolated_us", "inflation", "time_lost_us", "note"]


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
        if len(hi) >= MIN_SAMPLES and len(lo) >= MIN_SAMPLES:
            mh, ml = float(np.median(hi)), float(np.median(lo))
            row.update({"median_transfer_overlapped_us": mh / NS_PER_US, "median_transfer_isolated_us": ml / NS_PER_US,
                        "inflation": (mh / ml - 1.0) if ml > 0 else None,
                        "total_excess_us": float(np.clip(hi - ml, 0, None).sum()) / NS_PER_US, "note": ""})
        else:
            row["note"] = f"too few samples (need {MIN_SAMPLES} overlapped and {MIN_SAMPLES} isolated)"
        rows.append(row)
    return pd.DataFrame(rows).reindex(columns=NCCL_INFLATION_COLUMNS)


def _rows_by_rank(inputs):
    """[(rank, its instance rows in instance order)] for the timelines with
    instances, in timeline order: collective_overlap's rows, rank by rank."""
    inst_rank = inputs.instances["rank"].to_numpy(np.int64)
    by_rank = [(r, np.flatnonzero(inst_rank == r)) for r in inputs.timelines]
    return [(r, rows) for r, rows in by_rank if len(rows)]


def _overlap_rows(inputs):
    """The instance rows of collective_overlap, in its order."""
    return np.concatenate([rows for _, rows in _rows_by_rank(inputs)] + [np.zeros(0, np.int64)])


def _compute_inflation(inputs):
    """Per compute kernel identity: median duration when ≥ 50 % of it overlaps
    comm vs when < 5 % does.  From each rank's buckets (made at its end, while
    the next rank streams in), gathered by the identity shared by all ranks."""
    comp = inputs.compute
    if not len(comp.start):
        return pd.DataFrame(columns=COMPUTE_INFLATION_COLUMNS)
    by_key = {}   # {key: {rank: [bucket, ...]}}, ranks in comp's order
    for r, tl in inputs.timelines.items():
        for lcode, bucket in tl.compute_buckets.items():
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
        if row["overlapped_n"] >= MIN_SAMPLES and row["isolated_n"] >= MIN_SAMPLES:
            mh, ml = float(np.median(d_hi)), float(np.median(d_lo))
            row.update({"median_overlapped_us": mh / NS_PER_US, "median_isolated_us": ml / NS_PER_US,
                        "inflation": (mh / ml - 1.0) if ml > 0 else None,
                        "time_lost_us": float(np.clip(d_hi - ml, 0, None).sum()) / NS_PER_US, "note": ""})
        else:
            row["note"] = f"too few samples (need {MIN_SAMPLES} overlapped and {MIN_SAMPLES} isolated)"
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


# ---------------------------------------------------------------------- part 3

EXPOSED_COLUMNS = ["rank", "step", "window_us", "comm_us", "hidden_us", "exposed_us", "exposed_waiting_us",
                   "exposed_transfer_us", "comp_comm_overlap_pct", "compute_us", "memcpy_memset_us", "idle_us", "note"]


def _exposed_comm(inputs):
    """Per rank and window (the whole GPU span, then each ProfilerStep#N):
    every length is |W ∩ U| for one union U, so each is one sweep over all
    the rank's windows (intersections of unions are unions).  Those of the
    rank's own unions were taken at its end (``window_lengths``); here only
    the waiting, which needs every rank's arrival."""
    rows = []
    inst = inputs.instances
    start, end = inst["start"].to_numpy(np.int64), inst["end"].to_numpy(np.int64)
    last_arrival = inst.groupby("instance")["start"].transform("max").to_numpy(np.int64) if len(inst) else start
    by_rank = dict(_rows_by_rank(inputs))
    for r, tl in inputs.timelines.items():
        mine = by_rank.get(r, np.zeros(0, dtype=np.int64))
        wait_s = start[mine]
        wait_e = np.minimum(last_arrival[mine], end[mine])
        waiting = _union(wait_s, np.maximum(wait_e, wait_s))
        names = ["all"] + list(tl.steps[0])
        lo, hi = _exposed_windows(tl)
        u = tl.unions
        wait_comm = _intersect(waiting, u["comm"])
        unions = {"wait_in_comm": wait_comm, "wait_hidden": _intersect(wait_comm, u["compute"])}
        length = {k: _native.overlap_with_union(lo, hi, *u).tolist() if len(u[0]) else [0] * len(lo)
                  for k, u in unions.items()}
        length.update(tl.window_lengths)
        for w, step in enumerate(names):
            c, hidden, busy = length["comm"][w], length["hidden"][w], length["busy"][w]
            exposed = c - hidden
            exposed_wait = length["wait_in_comm"][w] - length["wait_hidden"][w]
            span = int(hi[w]) - int(lo[w])
            rows.append({
                "rank": r, "step": step, "window_us": span / NS_PER_US, "comm_us": c / NS_PER_US,
                "hidden_us": hidden / NS_PER_US, "exposed_us": exposed / NS_PER_US,
                "exposed_waiting_us": exposed_wait / NS_PER_US, "exposed_transfer_us": (exposed - exposed_wait) / NS_PER_US,
                "comp_comm_overlap_pct": (100.0 * hidden / c) if c else 0.0,
                "compute_us": length["compute"][w] / NS_PER_US,
                "memcpy_memset_us": length["copy"][w] / NS_PER_US,
                "idle_us": max(span - busy, 0) / NS_PER_US,
                "note": "" if c else "no communication on this rank in this window",
            })
    return pd.DataFrame(rows).reindex(columns=EXPOSED_COLUMNS)


def _intersect(a, b):
    """A ∩ B of two disjoint sorted unions, as a union."""
    if not len(a[0]) or not len(b[0]):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    ia, ib, _ = _native.intersecting_pairs(a[0], a[1], b[0], b[1])
    s = np.maximum(a[0][ia], b[0][ib])
    e = np.minimum(a[1][ia], b[1][ib])
    return _union(s, e)


# ====================================================================== the short answer

def blockers_text(sheets, top=5):
    """What a user reads first: straggler, dominant cause, top blockers, top
    contention pairs -- as plain text lines."""
    lines = []
    b = sheets.get("collective_blockers")
    if b is None or not len(b):
        lines.append("No implicit-sync collective was matched across ranks: nothing waited on anything.")
        return "\n".join(lines)
    by_rank = b.groupby("late_rank").agg(n=("collective_id", "size"), delta=("delta_us", "sum"),
                                         blame=("blame_us", "sum")).sort_values("delta", ascending=False)
    straggler = int(by_rank.index[0])
    lines.append(f"Straggler: rank {straggler} (last to arrive at {int(by_rank.iloc[0]['n'])} of {len(b)} collectives; "
                 f"others waited {by_rank.iloc[0]['delta']:.1f} us for it, blame {by_rank.iloc[0]['blame']:.1f} us)")
    parts = {"host launch lateness": b["host_launch_lateness_us"].sum(), "GPU dependency wait": b["gpu_dependency_wait_us"].sum(),
             "GPU backlog": b["gpu_backlog_us"].sum()}
    total = sum(parts.values())
    cause = max(parts, key=parts.get)
    share = 100.0 * parts[cause] / total if total else 0.0
    lines.append(f"Dominant cause of waiting: {cause} ({parts[cause]:.1f} of {total:.1f} us, {share:.0f}%)  "
                 + "  ".join(f"{k}: {v:.1f} us" for k, v in parts.items() if k != cause))
    k = sheets.get("blocking_kernels")
    lines.append("Top blocking kernels:" if k is not None and len(k) else "Top blocking kernels: none")
    if k is not None:
        for i, row in enumerate(k.head(top).itertuples(), 1):
            excess = f", excess {row.mean_excess_us:.1f} us" if row.mean_excess_us == row.mean_excess_us else ""
            lines.append(f"  {i}. {row.total_blocking_us:10.1f} us  {_short(row.kernel)} grid {row.grid} block {row.block}"
                         f"  ({row.instances_delayed} collectives, rank {row.ranks}{excess})")
    h = sheets.get("blocking_host_ops")
    if h is not None and len(h):
        lines.append("Top blocking host ops:")
        for i, row in enumerate(h.head(top).itertuples(), 1):
            lines.append(f"  {i}. {row.total_blocking_us:10.1f} us  {_short(row.op)}  ({row.instances_delayed} collectives, rank {row.ranks})")
    p = sheets.get("contention_pairs")
    if p is not None and len(p):
        lines.append("Top contention pairs (compute kernel x collective, overlap):")
        for i, row in enumerate(p.head(top).itertuples(), 1):
            risk = "  tail-effect risk" if row.tail_effect_risk is True else ""
            lines.append(f"  {i}. {row.overlap_us:10.1f} us  {_short(row.compute_kernel)} x {row.signature}{risk}")
    return "\n".join(lines)


def _short(name, width=70):
    name = str(name)
    return name if len(name) <= width else name[: width - 3] + "..."


def sheets_from_tables(tables):
    """{sheet: DataFrame} of the correlate.* tables in a stream."""
    return {n[len(TABLE_PREFIX):]: df for n, df in tables.items() if n.startswith(TABLE_PREFIX)}

"""Per-rank collection as frames stream past: ``RankTimeline`` keeps what
correlate needs of one rank's frames and finishes it into a ``Timeline`` at
the rank's end; ``StreamCollector`` does so for every rank of a stream and
keeps align's collectives table.

Memory: per rank, the GPU activities (69 bytes each with launch
geometry) and the CPU ops and runtime calls (about 14 bytes each: start,
end, thread, name in narrow columns), picked out of each EVENTS frame by a C
pass as it streams past, with launch geometry joined per KERNELS frame; a
rank is compacted at its META frame.  Nothing else of the trace is kept.
The blocking analysis' map then reduces the Timeline to its summary
(``summary.compact``).
"""
import numpy as np

from .. import _native
from ..collectives import is_collective_kernel_name
from ..align.collect import RankCollector
from ..errors import StreamtraceError
from .compute import _Compute
from .growing import _Growing
from ..stream.summaries import RankSummaries
from .summary import SUMMARY_NAME, SUMMARY_VERSION, _squeeze, _unsqueeze, compact, pack_ops, timeline_from_summary
from .timeline import Timeline, _cat_kind, _classify


# per-string classes, computed once per string of a rank's table
S_NCCL, S_STEP = 1, 2   # collective kernel name; ProfilerStep#N annotation
# string classes as bits, for the C row selection: categories of GPU
# activity and of host ops, and ProfilerStep#N names
SEL_GPU, SEL_HOST, SEL_STEP_NAME = 1, 2, 4
_SEL_OF_KIND = np.array([0, SEL_GPU, SEL_GPU, SEL_GPU, SEL_HOST, SEL_HOST], dtype=np.uint16)


# per GPU row while the rank streams past, in the trace's own widths (69
# bytes a row): launch geometry as grid x y z, block x y z (-1: none joined
# yet), registers and shared memory (-1: unknown).  The rank's end widens
# them into the Timeline's columns (``RankTimeline.finish``).
_GPU_SPEC = {"event": (np.uint32, ()), "start": (np.int64, ()), "end": (np.int64, ()), "device": (np.int64, ()),
             "name": (np.uint32, ()), "stream": (np.int32, ()), "kind": (np.uint8, ()), "dims": (np.int32, (6,)),
             "regs": (np.int32, ()), "smem": (np.int32, ())}


class RankTimeline:
    """Keeps, per rank, the X events correlate needs, as compact numpy arrays,
    while frames stream past: one vectorised filter per EVENTS frame, with
    category and name classes looked up once per string.  What can be
    worked out a part at a time is done as the parts arrive (it runs while
    the extractor reads on), so a rank's end is left with what needs the
    whole rank."""

    def __init__(self, rank, capacity=4096, squeeze=False):
        """``capacity``: GPU rows to make room for at first (more as needed).
        ``squeeze``: each frame's CPU ops are kept zstd-compressed (a third
        of their bytes), for a map holding whole ranks beside other state
        (the blocking analysis); they are read part by part at the end."""
        self.rank = rank
        self.squeeze = squeeze
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
        if self.n_events > 1 << 32:   # a KERNELS record names its event in 32 bits too
            raise StreamtraceError(f"rank {self.rank}: more than 2**32 events")
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
        # CPU ops are most events: kept as spans in narrow columns, about 14
        # bytes each (an event record is 96; the spans as selected, 28)
        spans = _native.select_spans(records, self._sel, n_cls, SEL_HOST, flags_all=has_ts, ph=b"X")
        if len(spans[0]):
            ops = pack_ops(*spans)
            self.cpu_parts.append(_squeeze(ops) if self.squeeze else ops)
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
            c["dims"][rows] = c["regs"][rows] = c["smem"][rows] = -1

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
        gpu["name"][gpu["name"] == _native.NOSTR] = n_str     # the "" slot
        for i, part in enumerate(cpu_parts):
            squeezed = "data" in part
            if (part["dtypes"][-1] if squeezed else part["name"].dtype.str) == "<u2":
                continue   # a uint16 column holds no NOSTR
            part = _unsqueeze(part) if squeezed else part
            part["name"] = np.where(part["name"] == _native.NOSTR, np.uint32(n_str), part["name"]).astype(np.uint32)
            cpu_parts[i] = _squeeze(part) if squeezed else part
        # kernel identity (name, grid x y z, block x y z, 0) as int32, so
        # that 4 int64 hold one row; CTAs and threads (NaN: no grid and block)
        dims = gpu.pop("dims")
        keys = np.empty((len(dims), 8), dtype=np.int32)
        keys[:, 0], keys[:, 1:7], keys[:, 7] = gpu["name"], dims, 0
        has = (dims[:, 0] >= 0) & (dims[:, 3] >= 0)
        for c, d in (("ctas", dims[:, 0:3]), ("threads", dims[:, 3:6])):   # as int64: never an int32 overflow
            gpu[c] = np.where(has, d[:, 0].astype(np.int64) * d[:, 1] * d[:, 2], np.nan)
        del dims, has
        gpu["event"] = gpu["event"].astype(np.int64)
        by_event = (gpu["event"], gpu["ctas"])          # rows are in stream (event) order
        start = gpu["start"]
        order = np.argsort(start, kind="stable") if len(start) > 1 and (start[1:] < start[:-1]).any() else None
        del start

        def sort(a):
            return a if order is None else a[order]

        keys = sort(keys)
        # each column sorted (and widened) and its unsorted array let go at
        # once: a rank's GPU rows are the largest thing its end holds, and two
        # copies of them were the blocking map's peak (by_event keeps event
        # and ctas unsorted)
        cols = {c: sort(_widened(c, gpu.pop(c))) for c in ("start", "end", "stream", "kind", "name", "event",
                                                            "device", "ctas", "threads", "regs", "smem")}
        del gpu
        s_start, s_end, s_name = (np.concatenate(c) for c in zip(*step_parts)) if step_parts else \
            (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint32))
        o = np.argsort(s_start, kind="stable")
        steps = (names[s_name[o]], s_start[o], s_end[o])
        cols["lcode"], first = _native.factorize_rows(keys.view(np.int64))
        tl = Timeline(self.rank, self.meta, names, cols, by_event, cpu_parts, steps)
        tl.lkeys = keys[first]
        del keys, first   # the rows' identities are their lcodes now
        tl.nccl_name = (self._name.take(cols["name"], mode="clip") & S_NCCL) != 0
        # here, overlapped with the next rank's extraction; Inputs redoes it
        # only when align links an event this left out
        _classify(tl, np.zeros(0, dtype=np.int64))
        # onto the aligned clock as far as this rank alone says (its base
        # time); Inputs adds align's clock offset, when there is one
        tl.shift_by(tl.base_ns)
        return tl


def _widened(name, column):
    """A GPU column as the Timeline holds it: ids as int64, registers and
    shared memory as floats with NaN for unknown (-1 while streaming)."""
    if name in ("stream", "name"):
        return column.astype(np.int64)
    if name in ("regs", "smem"):
        return np.where(column >= 0, column, np.nan)
    return column


def _geometry_columns(cols, rows):
    """The GPU columns _join_geometry writes, for ``rows`` (a slice: views)."""
    return cols["dims"][rows], cols["regs"][rows], cols["smem"][rows]


def _join_geometry(events, records, dims, regs, smem):
    """Write the geometry of KERNELS ``records`` into the rows of the GPU
    rows whose (increasing) event indices are ``events``; returns the
    records that match no row.  Fields are taken one at a time: a gather of
    whole structured records is several times slower."""
    n = len(events)
    if not n:
        return records
    k_event = records["event"]
    at = np.minimum(np.searchsorted(events, k_event), n - 1)
    hit = events[at] == k_event
    everything = bool(hit.all())

    def hits(values):
        return values if everything else values[hit]

    rows = hits(at)
    grid, block = hits(records["grid"]), hits(records["block"])
    dims[rows, 0:3] = grid
    dims[rows, 3:6] = block
    regs[rows] = hits(records["registers_per_thread"])
    smem[rows] = hits(records["shared_memory"])
    return records[:0] if everything else records[~hit]


class StreamCollector:
    """Feeds frames to per-rank collectors and keeps align's collectives
    table (the columns correlate reads) and its send/recv pairs
    (p2p_blockers).  A rank is finished (compacted into its Timeline) at its
    META frame, which extract writes after the rank's events, and reduced to
    its summary
    (``summary.compact``): align's own collection of the rank, made beside
    it, says which kernels align may link and which threads launched them
    (align's tables come after every rank in a stream)."""

    def __init__(self):
        self.collectors, self.links, self.done, self.tables = {}, {}, {}, {}
        self.summaries = RankSummaries(SUMMARY_NAME, SUMMARY_VERSION)   # ranks whose Timeline is read, not collected
        # ranks are alike: a rank starts with room for as many GPU rows as
        # the largest one so far (no doubling copies; room never written to
        # costs no memory)
        self.gpu_rows = 4096
        # the analysis' table of compute kernels, a rank added at its end
        # while ranks come in ascending order (else made when first used)
        self.compute = _Compute()

    def _finish(self, r):
        """Rank r's collection finished into its Timeline and reduced to its summary."""
        from ..align.describe import finish_rank

        tl = self.collectors.pop(r).finish()
        self.gpu_rows = max(self.gpu_rows, len(tl.gpu["start"]))
        result = finish_rank(self.links.pop(r))
        return compact(tl, result.rows["event"], result.rows["launch_tid"])

    def _finished(self, r, tl):
        self.done[r] = tl
        if self.compute is not None and self.compute.timelines and r < max(self.compute.timelines):
            self.compute = None
        if self.compute is not None:
            ws = tl.meta.get("world_size")
            self.compute.add(r, tl, room_for=ws if isinstance(ws, int) and ws > 0 else 2 * (len(self.done) + 1))

    def add(self, frame):
        from ..stream.format import Kind

        kind = frame.kind
        if kind == Kind.SUMMARY:
            self._summary(frame)
        elif kind in (Kind.STRINGS, Kind.EVENTS, Kind.KERNELS, Kind.META, Kind.COMMS):
            if frame.rank in self.done:
                raise StreamtraceError(f"rank {frame.rank} appears twice in the input (frames after its metadata frame)")
            if frame.rank in self.summaries.announced:   # its summary comes after its META frame
                return
            c = self.collectors.get(frame.rank)
            if c is None:
                c = self.collectors[frame.rank] = RankTimeline(frame.rank, self.gpu_rows)
                self.links[frame.rank] = RankCollector(frame.rank)
            if kind != Kind.COMMS:
                c.add(frame)
            if kind != Kind.KERNELS:
                self.links[frame.rank].add(frame)
            if kind == Kind.META:
                self._finished(frame.rank, self._finish(frame.rank))
        elif kind == Kind.TABLE:
            self._table(frame)

    def _table(self, frame):
        """Keep the align tables correlate uses: the collectives (the columns
        it reads) and the send/recv pairs (p2p_blockers)."""
        name = frame.table_name()
        if name not in ("align.collectives", "align.p2p"):
            return
        import pandas as pd   # here: extract's summaries collect ranks without pandas

        from .inputs import ALIGN_COLUMNS_USED
        _, df = frame.table(ALIGN_COLUMNS_USED if name == "align.collectives" else None)
        self.tables[name] = pd.concat([self.tables[name], df], ignore_index=True) if name in self.tables else df

    def _summary(self, frame):
        """A rank whose section announces correlate's summary (``extract``
        wrote it, of this version) is not collected: its summary is read."""
        tl = self.summaries.add(frame, lambda r: r in self.done or r in self.collectors, timeline_from_summary)
        if tl is not None:
            self._finished(tl.rank, tl)

    def finish(self):
        """({rank: Timeline}, {table name: DataFrame})"""
        self.summaries.check_complete()
        for r in list(self.collectors):   # ranks whose section has no META frame
            self._finished(r, self._finish(r))
        return dict(sorted(self.done.items())), self.tables


def collect(frames):
    """Consume frames; return ``({rank: Timeline}, {table name: DataFrame})``."""
    sc = StreamCollector()
    for frame in frames:
        sc.add(frame)
    return sc.finish()

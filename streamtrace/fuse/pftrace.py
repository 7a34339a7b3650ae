"""Perfetto's native protobuf trace (``.pftrace``): a ``Trace`` is a run of
``TracePacket``s; the events are ``TrackEvent``s on tracks declared by
``TrackDescriptor`` packets.

Each rank is one packet sequence (``trusted_packet_sequence_id`` = rank + 1)
with its own interning tables (event names, categories, annotation names:
sequence-scoped incremental state), so ranks are still encoded independently
and in parallel, from the rewriter's JSON output of the write pass (ids,
pids, lanes and clocks already placed exactly as in the JSON output).

Tracks: one process track per rank and kind (``RANK r - CPU`` / ``RANK r -
GPU``, with the JSON's labels and sort index); under it one track per thread
or stream (its name, ordered by its sort index); sibling lanes (overlapping
slices) are child tracks of their thread's track.  Complete (X) events become
a SLICE_BEGIN and a SLICE_END, their args debug annotations; a CPU launch
(``cuda_runtime``/``cuda_driver``) and its GPU kernel, memcpy or memset share
a flow id (the correlation id, with the rank's offset): the launch starts it,
the GPU event ends it.  Counters (C) get one counter track per series.

Timestamps are deltas on an incremental clock of the sequence (clock 64,
sequence-scoped): a ClockSnapshot ``{64: 0 (incremental), BOOTTIME: 0}``
starts it at 0, every event packet's ``timestamp`` is its time minus the
previous packet's on that clock, and the sequence's TracePacketDefaults
(``timestamp_clock_id`` 64, sent with every packet that clears the
incremental state) say so.  A rank's packets are written in time order within
a chunk (each complete event's end waits in a heap until the next packet is
at or past it); a packet earlier than the one before it (the next chunk, or a
new sequence) is preceded by a new snapshot, which restarts the clock at 0 so
the delta is the absolute time again.

Field numbers: perfetto/trace/trace_packet.proto, track_event/*.proto,
clock_snapshot.proto.
"""
import heapq
import json
import os
from decimal import Decimal

from ..errors import StreamtraceError
from ..extract import decode_raw_string
from .layout import _labels, rank_pid_string
from .protobuf import _SMALL, _TABLE, field_bytes as _b, field_double, field_fixed64, field_varint as _v, key, varint

# Trace
TRACE_PACKET = 1
# TracePacket
P_TIMESTAMP, P_SEQ_ID, P_TRACK_EVENT, P_INTERNED, P_SEQ_FLAGS, P_TRACK_DESCRIPTOR = 8, 10, 11, 12, 13, 60
P_CLOCK_SNAPSHOT, P_DEFAULTS, D_TIMESTAMP_CLOCK_ID = 6, 59, 58   # TracePacketDefaults.timestamp_clock_id
SEQ_CLEARED, SEQ_NEEDS = 1, 2
# ClockSnapshot.clocks (1): Clock {clock_id = 1, timestamp = 2, is_incremental = 3}
CLOCK_BOOTTIME, CLOCK_DELTA = 6, 64   # the trace's clock; the sequences' incremental one (64-127: sequence-scoped)
# TrackEvent
E_CATEGORY_IIDS, E_DEBUG, E_TYPE, E_NAME_IID, E_TRACK_UUID = 3, 4, 9, 10, 11
E_DOUBLE_COUNTER, E_FLOW_IDS, E_TERMINATING_FLOW_IDS = 44, 47, 48
SLICE_BEGIN, SLICE_END, INSTANT, COUNTER = 1, 2, 3, 4
# InternedData: event_categories, event_names, debug_annotation_names; each entry {iid = 1, name = 2}
I_CATEGORIES, I_NAMES, I_ANNOTATION_NAMES = 1, 2, 3
# DebugAnnotation
A_NAME_IID, A_BOOL, A_INT, A_DOUBLE, A_STRING, A_JSON = 1, 2, 4, 5, 6, 9
# TrackDescriptor, ProcessDescriptor, CounterDescriptor
T_UUID, T_NAME, T_PROCESS, T_PARENT, T_COUNTER, T_CHILD_ORDERING, T_SIBLING_RANK = 1, 2, 3, 5, 8, 11, 12
ORDER_EXPLICIT = 3
PR_PID, PR_SORT, PR_NAME, PR_LABELS = 1, 3, 6, 8

LAUNCH_CATS = frozenset(("cuda_runtime", "cuda_driver", "Runtime"))
GPU_CATS = frozenset(("kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"))
FLOW_PHASES = frozenset("stf")   # represented by the slices' flow ids
# what the JSON rewrite adds to args (docs/fuse.md): in a .pftrace the track says the rank and lane, and
# the raw pids and ids are in the metadata (inputs.<rank>.pid_map, id_offset); left out, they were
# unique numbers on every event, more than a third of the file
BOOKKEEPING_ARGS = frozenset(("rank", "lane", "pid_raw", "tid_raw", "id_raw", "correlation_raw", "External id_raw",
                              "external id_raw"))
MAX_INTERNED = 1 << 16           # entries per sequence before its tables are cleared (bounded memory)
META_SEQUENCE = (1 << 31) - 1    # the run's own track (metadata, focus window)
DEFAULT_ENCODER = "c"            # STREAMTRACE_PFTRACE_ENCODER: "c" or "python" (the reference)
_DEBUG_TAG, _INT_TAG = key(E_DEBUG, 2), key(A_INT, 0)
_TS_TAG, _EVENT_TAG, _PACKET_TAG = key(P_TIMESTAMP, 0), key(P_TRACK_EVENT, 2), key(TRACE_PACKET, 2)
_FLAGS = {SEQ_NEEDS: _v(P_SEQ_FLAGS, SEQ_NEEDS),
          # clearing the incremental state drops the sequence's defaults too: they go with it
          SEQ_NEEDS | SEQ_CLEARED: _v(P_SEQ_FLAGS, SEQ_NEEDS | SEQ_CLEARED)
          + _b(P_DEFAULTS, _v(D_TIMESTAMP_CLOCK_ID, CLOCK_DELTA))}
_SNAPSHOT = _b(P_CLOCK_SNAPSHOT, _b(1, _v(1, CLOCK_DELTA) + _v(2, 0) + _v(3, 1)) + _b(1, _v(1, CLOCK_BOOTTIME) + _v(2, 0)))
_BEGIN, _END, _INSTANT = _v(E_TYPE, SLICE_BEGIN), _v(E_TYPE, SLICE_END), _v(E_TYPE, INSTANT)
_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)
_TS_LIMIT = 1 << 63


def _int32(v):
    return min(max(v, _INT32[0]), _INT32[1])


def packet(body):
    """One TracePacket as a ``Trace.packet`` field."""
    return _b(TRACE_PACKET, body)


def _ns(v):
    """A JSON time in microseconds (int or Decimal) -> integer nanoseconds."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v * 1000
    if isinstance(v, Decimal) and v.is_finite():
        return int((v * 1000).to_integral_value())
    return None


class RankEncoder:
    """One rank's packets from its rewritten JSON events (the write pass's
    output chunks), written to ``out`` (a segment's ``write``)."""

    def __init__(self, rk, out):
        self.rank, self.out = rk.rank, out
        self.seq = rk.rank + 1
        self._seq_field = _v(P_SEQ_ID, self.seq)
        self._tables = ({}, {}, {})          # categories, names, annotation names -> iid
        self._arg_keys, self._arg_values = {}, {}   # encodings made from the tables (cleared with them)
        self._fields = ({}, {})                     # category and name -> their TrackEvent field
        self._cleared = True                 # the next event packet clears the incremental state
        self._clock = None                   # the incremental clock's time (ns); None: no snapshot yet
        self._snapshot = packet(self._seq_field + _SNAPSHOT)
        self._ends = []                      # (end ns, -n, track field): complete events' ends not yet written
        self._n_ends = 0
        self._interned = 0                   # entries in the three tables
        self._uuids = {}
        self._processes = _process_info(rk)
        self._threads = _thread_info(rk)
        self.stats = {"slices": 0, "instants": 0, "counters": 0, "flow_events": 0, "skipped": {}}

    # ------------------------------------------------------------ tracks

    def _uuid(self, key):
        n = len(self._uuids) + 1
        # small uuids are short varints on every event: (seq << 12) | n while a rank has < 4096 tracks
        # (and seq < 2^20), then (seq << 32) | n: the two ranges never meet
        uuid = (self.seq << 12) | n if n < 4096 and self.seq < (1 << 20) else (self.seq << 32) | n
        self._uuids[key] = uuid
        return uuid

    def _descriptor(self, body, parts):
        parts.append(packet(self._seq_field + _b(P_TRACK_DESCRIPTOR, body)))

    def _process_track(self, pid, parts):
        key = ("p", pid)
        uuid = self._uuids.get(key)
        if uuid is not None:
            return uuid
        uuid = self._uuid(key)
        self._descriptor(_v(T_UUID, uuid) + _process_rest(pid, *self._processes.get(pid, (None, (), None))), parts)
        return uuid

    def _thread_track(self, pid, tid, lane, parts):
        key = ("t", pid, tid, lane)
        uuid = self._uuids.get(key)
        if uuid is not None:
            return uuid
        name, sort = self._threads.get((pid, tid), (None, None))
        if name is None:
            name = f"thread {tid}" if isinstance(tid, int) else (str(tid) if tid not in (None, "") else "(no tid)")
        if lane:
            parent = self._thread_track(pid, tid, 0, parts)
            name, sort = f"{name} (lane {lane})", lane
        else:
            parent = self._process_track(pid, parts)
            if sort is None:
                sort = tid if isinstance(tid, int) else 0
        uuid = self._uuid(key)
        self._descriptor(_v(T_UUID, uuid) + _v(T_PARENT, parent) + _b(T_NAME, name)
                         + _v(T_CHILD_ORDERING, ORDER_EXPLICIT) + _v(T_SIBLING_RANK, _int32(sort)), parts)
        return uuid

    def _counter_track(self, pid, name, series, parts):
        key = ("c", pid, name, series)
        uuid = self._uuids.get(key)
        if uuid is not None:
            return uuid
        parent = self._process_track(pid, parts)
        uuid = self._uuid(key)
        self._descriptor(_v(T_UUID, uuid) + _v(T_PARENT, parent) + _b(T_NAME, f"{name} {series}")
                         + _b(T_COUNTER, b""), parts)
        return uuid

    # ------------------------------------------------------------ interning

    def _iid(self, kind, text, pending):
        table = self._tables[kind]
        iid = table.get(text)
        if iid is None:
            iid = table[text] = len(table) + 1
            self._interned += 1
            pending.append(_b(kind + 1, _v(1, iid) + _b(2, text)))
        return iid

    def _interned_field(self, kind, field, text, pending):
        """The field referring to ``text``'s iid (interned on first use), its bytes made once."""
        cache = self._fields[kind]
        enc = cache.get(text)
        if enc is None:
            enc = cache[text] = _v(field, self._iid(kind, text, pending))
        return enc

    def _event_packet(self, ts, event, pending, parts):
        """An event's packet, after the ends due by then (time order)."""
        ends = self._ends
        while ends and ends[0][0] <= ts:
            end, _, field = heapq.heappop(ends)
            self._packet(end, _END + field, pending, parts)
        self._packet(ts, event, pending, parts)

    def _end_later(self, ts, track_field):
        self._n_ends += 1
        heapq.heappush(self._ends, (ts, -self._n_ends, track_field))   # equal ends: the inner (later) first

    def _flush_ends(self, pending, parts):
        ends = self._ends
        while ends:
            end, _, field = heapq.heappop(ends)
            self._packet(end, _END + field, pending, parts)

    def _packet(self, ts, event, pending, parts):
        clock = self._clock
        if clock is None or ts < clock:   # restart the clock at 0: this delta is the absolute time
            parts.append(self._snapshot)
            clock = 0
        self._clock = ts
        flags = SEQ_NEEDS
        if self._cleared:
            flags |= SEQ_CLEARED
            self._cleared = False
        body = (_TS_TAG + varint(ts - clock) + self._seq_field + _FLAGS[flags] + _EVENT_TAG + varint(len(event))
                + event)
        if pending:
            body += _b(P_INTERNED, b"".join(pending))
            pending.clear()
        parts.append(_PACKET_TAG + varint(len(body)) + body)

    def _maybe_reset(self):
        """Past MAX_INTERNED entries (a trace of unique names), the tables
        restart: the next packet clears the sequence's incremental state."""
        if self._interned > MAX_INTERNED:
            self._interned = 0
            for t in self._tables:
                t.clear()
            self._arg_keys.clear()
            self._arg_values.clear()
            for f in self._fields:
                f.clear()
            self._cleared = True

    def _annotations(self, args, pending):
        out = []
        keys, values = self._arg_keys, self._arg_values
        for k, v in args.items():
            if k in BOOKKEEPING_ARGS:
                continue
            t = type(v)
            if t is str or t is bool:   # repeated values: their encoding made once (cleared with the tables)
                enc = values.get((k, t, v))
                if enc is not None:
                    out.append(enc)
                    continue
            name = keys.get(k)
            if name is None:
                name = keys[k] = _v(A_NAME_IID, self._iid(2, str(k), pending))
            if t is int and _INT64[0] <= v <= _INT64[1]:   # the common case, inlined
                a = name + _INT_TAG + (_SMALL[v] if 0 <= v < _TABLE else varint(v))
                out.append(_DEBUG_TAG + _SMALL[len(a)] + a)   # (len(a) < 32: name + tag + varint)
                continue
            a = name
            if isinstance(v, bool):
                a += _v(A_BOOL, int(v))
            elif isinstance(v, int) and _INT64[0] <= v <= _INT64[1]:
                a += _v(A_INT, v)
            elif isinstance(v, Decimal):
                a += field_double(A_DOUBLE, float(v))
            elif isinstance(v, str):
                a += _b(A_STRING, v)
            else:   # an object, an array, null, a huge integer: its JSON text
                a += _b(A_JSON, json.dumps(_plain(v), default=str, separators=(",", ":")))
            enc = _DEBUG_TAG + varint(len(a)) + a
            if (t is str or t is bool) and len(values) < MAX_INTERNED:
                values[(k, t, v)] = enc
            out.append(enc)
        return b"".join(out)

    # ------------------------------------------------------------ events

    def feed(self, chunk):
        """One output chunk of the rewriter: whole events, each after a comma."""
        data = bytes(chunk).lstrip()
        if data.startswith(b","):
            data = data[1:]
        if not data.strip():
            return
        events = json.loads(b"[" + data + b"]", parse_float=Decimal)
        keyed = []
        for e in events:
            if not isinstance(e, dict):
                continue
            ts = _ns(e.get("ts"))
            dur = _ns(e.get("dur")) if e.get("ph") == "X" else 0
            keyed.append((ts if ts is not None else -1, -(dur or 0), len(keyed), e, ts, dur))
        # in time order, longer first on ties: a parent's begin before its child's,
        # so equal timestamps pair each end with its own begin
        keyed.sort()   # (the index is unique: the events themselves are never compared)
        parts, pending = [], []
        for _, _, _, e, ts, dur in keyed:
            self._event(e, ts, dur, pending, parts)
            self._maybe_reset()
        self._flush_ends(pending, parts)
        if parts:
            self.out(b"".join(parts))

    def _skip(self, what):
        self.stats["skipped"][what] = self.stats["skipped"].get(what, 0) + 1

    def _event(self, e, ts, dur, pending, parts):
        ph = e.get("ph")
        if ph == "M":
            return   # names and sort indices are the descriptors'
        if ph in FLOW_PHASES:
            self.stats["flow_events"] += 1
            return
        if ts is None or not 0 <= ts < _TS_LIMIT:   # a TracePacket's timestamp is an unsigned 64-bit ns count
            self._skip(f"{ph} without a usable ts")
            return
        pid = e.get("pid")
        args = e.get("args")
        args = args if isinstance(args, dict) else {}
        if ph == "C":
            self._counter(e, pid, ts, args, pending, parts)
            return
        if ph not in ("X", "B", "E", "i", "I", "R"):
            self._skip(f"ph {ph!r}")
            return
        lane = args.get("lane") if ph == "X" else None
        if isinstance(lane, int) and lane > 0 and "tid_raw" in args:
            track = self._thread_track(pid, args["tid_raw"], lane, parts)
        else:
            track = self._thread_track(pid, e.get("tid"), 0, parts)
        track_field = _v(E_TRACK_UUID, track)
        if ph == "E":
            self._event_packet(ts, _END + track_field, pending, parts)
            return
        name, cat = e.get("name"), e.get("cat")
        ev = (_INSTANT if ph in ("i", "I", "R") else _BEGIN) + track_field
        if name is not None:
            ev += self._interned_field(1, E_NAME_IID, name if isinstance(name, str) else json.dumps(name, default=str),
                                       pending)
        if isinstance(cat, str):
            ev += self._interned_field(0, E_CATEGORY_IIDS, cat, pending)
        ev += self._annotations(args, pending)
        if ph == "X":
            corr = args.get("correlation")
            if isinstance(corr, int) and not isinstance(corr, bool) and cat in LAUNCH_CATS:
                ev += field_fixed64(E_FLOW_IDS, corr)
            elif isinstance(corr, int) and not isinstance(corr, bool) and cat in GPU_CATS:
                ev += field_fixed64(E_TERMINATING_FLOW_IDS, corr)
        self._event_packet(ts, ev, pending, parts)
        if ph == "X":
            self.stats["slices"] += 1
            self._end_later(min(ts + max(dur or 0, 0), _TS_LIMIT - 1), track_field)
        elif ph == "B":
            self.stats["slices"] += 1
        else:
            self.stats["instants"] += 1

    def _counter(self, e, pid, ts, args, pending, parts):
        name = e.get("name")
        name = name if isinstance(name, str) else ""
        for series, value in args.items():
            if series == "rank" or series.endswith("_raw"):
                continue   # fuse's own args, not series of the input
            if isinstance(value, bool) or not isinstance(value, (int, Decimal)):
                continue
            track = self._counter_track(pid, name, series, parts)
            self._event_packet(ts, _v(E_TYPE, COUNTER) + _v(E_TRACK_UUID, track)
                               + field_double(E_DOUBLE_COUNTER, float(value)), pending, parts)
            self.stats["counters"] += 1


def _process_rest(pid, name, labels, sort):
    """A process track's descriptor after its uuid."""
    body = _v(T_CHILD_ORDERING, ORDER_EXPLICIT)
    if isinstance(pid, int):
        proc = _v(PR_PID, _int32(pid)) + _b(PR_NAME, name or f"pid {pid}")
        if sort is not None:
            proc += _v(PR_SORT, _int32(sort))
        for label in labels:
            proc += _b(PR_LABELS, label)
        body += _b(T_PROCESS, proc)
    else:
        body += _b(T_NAME, name or str(pid))
    if sort is not None:
        body += _v(T_SIBLING_RANK, _int32(sort))
    return body


# ------------------------------------------------------------ the C encoder

def _ckey(v):
    """A pid or tid as csrc/st_pftrace.c keys it (None: a value it never keys)."""
    if v is None:
        return b"n"
    if type(v) is int and _INT64[0] <= v <= _INT64[1]:
        return b"i" + v.to_bytes(8, "little", signed=True)
    if type(v) is str:
        raw = v.encode("utf-8", "surrogatepass")   # (a lone surrogate: bytes the C side never has)
        return b"s" + len(raw).to_bytes(4, "little") + raw
    return None


def _key_values(raw):
    """The pids, tids and texts of an exported C track key, and what is left (a lane)."""
    out, i = [], 0
    while i < len(raw):
        t = raw[i:i + 1]
        if t == b"n":
            out.append(None)
            i += 1
        elif t == b"i":
            out.append(int.from_bytes(raw[i + 1:i + 9], "little", signed=True))
            i += 9
        else:
            n = int.from_bytes(raw[i + 1:i + 5], "little")
            out.append(raw[i + 5:i + 5 + n].decode("utf-8"))
            i += 5 + n
    return out


def _track_key(raw):
    """An exported C track key as RankEncoder keys its tracks."""
    kind, rest = raw[:1].decode(), raw[1:]
    if kind == "t":   # pid, tid, then the lane as 8 raw bytes
        lane = int.from_bytes(rest[-8:], "little", signed=True)
        pid, tid = _key_values(rest[:-8])
        return ("t", pid, tid, lane)
    return (kind, *_key_values(rest))


class NativeRankEncoder:
    """RankEncoder's interface over the C encoder (csrc/st_pftrace.c),
    byte for byte the same output; from a chunk the C side does not
    reproduce exactly, the rank goes on in the Python encoder from the C
    encoder's state."""

    def __init__(self, rk, out):
        from .._native import PftraceEncoder
        self.rk, self.out = rk, out
        self._py = None
        self._c = PftraceEncoder(rk.rank + 1, MAX_INTERNED)
        for pid, info in _process_info(rk).items():
            k = _ckey(pid)
            if k is not None:
                self._c.add_process(k, _process_rest(pid, *info))
        for (pid, tid), (name, sort) in _thread_info(rk).items():
            kp, kt = _ckey(pid), _ckey(tid)
            if kp is not None and kt is not None:
                sort = sort if isinstance(sort, int) and not isinstance(sort, bool) else None
                self._c.add_thread(kp + kt, None if name is None else name.encode("utf-8", "replace"),
                                   None if sort is None else min(max(sort, _INT64[0]), _INT64[1]))

    def feed(self, chunk):
        if self._py is None:
            data = self._c.feed(chunk)
            if data is not None:
                if data:
                    self.out(data)
                return
            self._py = self._take_over()
        self._py.feed(chunk)

    def _take_over(self):
        py = RankEncoder(self.rk, self.out)
        cleared, interned, entries = self._c.export()
        py._cleared, py._interned = cleared, interned
        for table, raw, value in entries:
            if table == 4:   # the incremental clock's time + 1 (0: no snapshot yet)
                py._clock = value - 1 if value else None
            elif table < 3:
                py._tables[table][raw.decode("utf-8")] = value
            else:
                py._uuids[_track_key(raw)] = value
        py.stats = self.stats
        return py

    @property
    def stats(self):
        if self._py is not None:
            return self._py.stats
        slices, instants, counters, flows = self._c.counts()
        return {"slices": slices, "instants": instants, "counters": counters, "flow_events": flows,
                "skipped": self._c.skipped()}


def encoder_for(rk, out, kind=None):
    """The rank encoder: STREAMTRACE_PFTRACE_ENCODER=c (the default) or python (the reference)."""
    kind = (kind or os.environ.get("STREAMTRACE_PFTRACE_ENCODER", "") or DEFAULT_ENCODER).strip().lower()
    if kind not in ("c", "python"):
        raise StreamtraceError(f"STREAMTRACE_PFTRACE_ENCODER={kind}: expected c or python")
    return NativeRankEncoder(rk, out) if kind == "c" else RankEncoder(rk, out)


def _plain(v):
    """A parsed JSON value with its decimals as floats again (json writes those as numbers)."""
    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def _process_info(rk):
    """fused pid -> (name, labels, sort index), from the labels fuse writes in JSON."""
    info = {}
    for m in _labels(rk, rk.pid_map):
        name, labels, sort = info.get(m["pid"], (None, (), None))
        if m["name"] == "process_name":
            name = m["args"]["name"]
        elif m["name"] == "process_labels":
            labels = labels + (m["args"]["labels"],)
        elif m["name"] == "process_sort_index":
            sort = m["args"]["sort_index"]
        info[m["pid"]] = (name, labels, sort)
    return info


def _thread_info(rk):
    """(fused pid, tid) -> (thread name, sort index), from the scan's tracks."""
    out = {}
    for t in rk.tracks or ():
        pid, tid = t["pid"], t["tid"]
        if isinstance(pid, int):
            pid = rk.pid_map.get(pid, pid)
        elif isinstance(pid, bytes):
            pid = rank_pid_string(pid, rk.rank)
        if isinstance(tid, bytes):
            tid = decode_raw_string(tid)
        name = decode_raw_string(t["name"]).strip() if t["name"] is not None else None
        out[(pid, tid)] = (name or None, t["sort_index"])
    return out


def meta_packets(meta, ts, focus=None):
    """The run's own track, ``streamtrace``: an instant carrying the fuse
    metadata (the JSON trailer's ``streamtrace`` member, as JSON text) and,
    with a focus window, a slice spanning it."""
    seq = _v(P_SEQ_ID, META_SEQUENCE)
    uuid = META_SEQUENCE << 32 | 1
    out = [packet(seq + _b(P_TRACK_DESCRIPTOR, _v(T_UUID, uuid) + _b(T_NAME, "streamtrace")
                                                + _v(T_SIBLING_RANK, _INT32[0])))]
    first = True

    def event(t, body):
        nonlocal first
        flags = SEQ_NEEDS | (SEQ_CLEARED if first else 0)
        first = False
        out.append(packet(_v(P_TIMESTAMP, max(t, 0)) + seq + _v(P_SEQ_FLAGS, flags) + _b(P_TRACK_EVENT, body)))

    note = _b(E_DEBUG, _b(10, "streamtrace") + _b(A_JSON, json.dumps(meta, separators=(",", ":"), default=str)))
    event(ts, _v(E_TYPE, INSTANT) + _v(E_TRACK_UUID, uuid) + _b(23, "streamtrace fuse") + note)
    if focus is not None:
        lo, hi, label = focus
        event(lo, _v(E_TYPE, SLICE_BEGIN) + _v(E_TRACK_UUID, uuid) + _b(23, f"focus: {label}"))
        event(hi, _v(E_TYPE, SLICE_END) + _v(E_TRACK_UUID, uuid))
    return b"".join(out)

"""Decode a .pftrace with Perfetto's own descriptors (the ``perfetto``
package's perfetto_trace_pb2) and rebuild what a viewer would show: tracks
(with their parents), slices (begin/end paired per track), instants,
counters and flows; every reference checked on the way (interned ids defined
in their sequence since its last clear, every track used declared, every
parent declared).  Timestamps resolved as the trace processor does
(ProtoTraceReader, ClockSynchronizer): a packet's clock is its
timestamp_clock_id, else its sequence's TracePacketDefaults (dropped when the
sequence's incremental state is cleared), else BOOTTIME; a sequence-scoped
incremental clock adds each packet's timestamp to the clock's last value,
which a ClockSnapshot sets; its snapshots (and BOOTTIME's beside them) must
never go back.  And the same view from a fused JSON, to compare."""
import gzip
import json
import re
from collections import defaultdict
from decimal import Decimal

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

TE = pb.TrackEvent
#: args the JSON rewrite adds (docs/fuse.md), left out of a .pftrace (its tracks and metadata carry them)
BOOKKEEPING = {"rank", "lane", "pid_raw", "tid_raw", "id_raw", "correlation_raw", "External id_raw",
               "external id_raw"}


def _value(a):
    kind = a.WhichOneof("value")
    if kind == "legacy_json_value":
        return json.loads(a.legacy_json_value)
    if kind == "double_value":
        return a.double_value
    return getattr(a, kind)


def read_trace(path):
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    trace = pb.Trace()
    trace.ParseFromString(raw)
    return trace


BOOTTIME = 6


class _Clocks:
    """The sequences' clocks: (seq, clock id) -> [incremental, last value, snapshots [(value, boottime)]]."""

    def __init__(self):
        self.clocks, self.defaults = {}, {}

    def snapshot(self, seq, snap):
        values = {c.clock_id: c for c in snap.clocks}
        assert BOOTTIME in values, f"sequence {seq}: a clock snapshot without BOOTTIME"
        boot = values[BOOTTIME].timestamp
        for cid, c in values.items():
            if cid == BOOTTIME:
                continue
            assert 64 <= cid < 128, f"sequence {seq}: clock {cid} is not sequence-scoped"
            state = self.clocks.setdefault((seq, cid), [c.is_incremental, None, []])
            assert state[0] == c.is_incremental, f"sequence {seq}: clock {cid} changed its encoding"
            assert not c.unit_multiplier_ns or c.unit_multiplier_ns == 1
            if state[2]:
                last_value, last_boot = state[2][-1]
                assert c.timestamp >= last_value, f"sequence {seq}: clock {cid} goes back in its snapshots"
                assert boot >= last_boot, f"sequence {seq}: BOOTTIME goes back in its snapshots"
            state[2].append((c.timestamp, boot))
            state[1] = c.timestamp

    def resolve(self, seq, p):
        """The packet's time on BOOTTIME (ns)."""
        cid = p.timestamp_clock_id if p.HasField("timestamp_clock_id") else self.defaults.get(seq)
        if not cid or cid == BOOTTIME:
            return p.timestamp
        state = self.clocks.get((seq, cid))
        assert state is not None, f"sequence {seq}: a packet on clock {cid} before its snapshot"
        value = state[1] + p.timestamp if state[0] else p.timestamp
        state[1] = value
        # the nearest snapshot at or before the value (ClockSynchronizer's upper_bound - 1)
        base_value, base_boot = state[2][0]
        for v, b in state[2]:
            if v <= value:
                base_value, base_boot = v, b
        return value - base_value + base_boot


def decode(path):
    """-> dict(tracks={uuid: desc}, slices=[...], instants=[...], counters=[...], meta=..., focus=...)."""
    trace = read_trace(path)
    tracks, tables, used = {}, {}, set()
    clocks = _Clocks()
    events = []
    for order, p in enumerate(trace.packet):
        seq = p.trusted_packet_sequence_id
        assert seq, "every packet names its sequence"
        if p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            tables[seq] = {"cat": {}, "name": {}, "arg": {}}
            clocks.defaults.pop(seq, None)
        if p.HasField("trace_packet_defaults"):
            clocks.defaults[seq] = p.trace_packet_defaults.timestamp_clock_id
        if p.HasField("clock_snapshot"):
            clocks.snapshot(seq, p.clock_snapshot)
            continue
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            assert d.uuid not in tracks or tracks[d.uuid] == d, f"track {d.uuid} declared twice, differently"
            tracks[d.uuid] = d
            continue
        if not p.HasField("track_event"):
            continue
        assert seq in tables, f"sequence {seq}: an event before any packet clearing the incremental state"
        t = tables[seq]
        ev = p.track_event
        uses_interning = ev.name_iid or ev.category_iids or any(a.name_iid for a in ev.debug_annotations)
        if uses_interning or p.HasField("interned_data"):
            assert p.sequence_flags & pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        i = p.interned_data
        for kind, entries in (("cat", i.event_categories), ("name", i.event_names),
                              ("arg", i.debug_annotation_names)):
            for e in entries:
                assert e.iid not in t[kind], f"sequence {seq}: {kind} iid {e.iid} defined twice"
                t[kind][e.iid] = e.name
        used.add(ev.track_uuid)
        name = t["name"][ev.name_iid] if ev.name_iid else (ev.name if ev.HasField("name") else None)
        cats = [t["cat"][c] for c in ev.category_iids]
        args = {}
        for a in ev.debug_annotations:
            key = t["arg"][a.name_iid] if a.name_iid else a.name
            args[key] = _value(a)
        events.append(dict(order=order, ts=clocks.resolve(seq, p), seq=seq, type=ev.type, track=ev.track_uuid, name=name,
                           cat=cats[0] if cats else None, args=args, flow_ids=list(ev.flow_ids),
                           terminating=list(ev.terminating_flow_ids),
                           value=ev.double_counter_value if ev.HasField("double_counter_value") else None))
    missing = used - set(tracks)
    assert not missing, f"events on tracks without a descriptor: {sorted(missing)[:5]}"
    for d in tracks.values():
        assert not d.HasField("parent_uuid") or d.parent_uuid in tracks, f"track {d.uuid}: parent not declared"
    # what the trace processor does: packets in time order (stable), slices paired on a stack per track
    events.sort(key=lambda e: (e["ts"], e["order"]))
    stacks = defaultdict(list)
    slices, instants, counters = [], [], []
    for e in events:
        if e["type"] == TE.TYPE_SLICE_BEGIN:
            stacks[e["track"]].append(e)
        elif e["type"] == TE.TYPE_SLICE_END:
            assert stacks[e["track"]], f"an end with no open slice on track {e['track']}"
            b = stacks[e["track"]].pop()
            slices.append(dict(b, dur=e["ts"] - b["ts"]))
        elif e["type"] == TE.TYPE_INSTANT:
            instants.append(e)
        elif e["type"] == TE.TYPE_COUNTER:
            counters.append(e)
    assert not any(stacks.values()), "slices left open"
    meta = [e for e in instants if e["name"] == "streamtrace fuse"]
    assert len(meta) == 1
    focus = [s for s in slices if s["name"] and s["name"].startswith("focus: ")]
    return dict(tracks=tracks, slices=[s for s in slices if s not in focus],
                instants=[e for e in instants if e not in meta], counters=counters,
                meta=meta[0]["args"]["streamtrace"], focus=focus[0] if focus else None)


def track_path(tracks, uuid):
    """(process key, track name): the process's pid (or a string pid's name) and the thread's or lane's name."""
    d = tracks[uuid]
    name = d.name
    while d.HasField("parent_uuid"):
        d = tracks[d.parent_uuid]
    proc = d.process.pid if d.HasField("process") else d.name
    return proc, name


def process_names(tracks):
    out = {}
    for d in tracks.values():
        if d.HasField("process"):
            out[d.process.pid] = (d.process.process_name, tuple(d.process.process_labels),
                                  d.process.legacy_sort_index)
    return out


def _ns(v):
    return int(Decimal(str(v)) * 1000)


def json_view(doc):
    """The same view from a fused JSON document: slices keyed like track_path."""
    threads, procs = {}, {}
    labels = defaultdict(tuple)
    for e in doc["traceEvents"]:
        if e.get("ph") != "M":
            continue
        if e["name"] == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
        elif e["name"] == "process_name":
            procs.setdefault(e["pid"], [None, (), None])[0] = e["args"]["name"]
        elif e["name"] == "process_labels":
            procs.setdefault(e["pid"], [None, (), None])[1] += (e["args"]["labels"],)
        elif e["name"] == "process_sort_index":
            procs.setdefault(e["pid"], [None, (), None])[2] = e["args"]["sort_index"]

    def track(e):
        tid = e.get("tid")
        name = threads.get((e["pid"], tid))
        if name is None:
            name = f"thread {tid}" if isinstance(tid, int) else (tid if tid not in (None, "") else "(no tid)")
        return e["pid"], name.strip()

    slices = [dict(track=track(e), name=e.get("name"), cat=e.get("cat"), ts=_ns(e["ts"]),
                   dur=_ns(e.get("dur", 0)), args={k: v for k, v in e.get("args", {}).items() if k not in BOOKKEEPING})
              for e in doc["traceEvents"] if e.get("ph") == "X"]
    instants = [dict(track=track(e), name=e.get("name"), ts=_ns(e["ts"]))
                for e in doc["traceEvents"] if e.get("ph") in ("i", "I")]
    return dict(slices=slices, instants=instants,
                processes={p: (v[0], v[1], v[2]) for p, v in procs.items() if isinstance(p, int)})


def slice_key(s):
    return (s["track"], s["name"], s["cat"], s["ts"], s["dur"], json.dumps(s["args"], sort_keys=True, default=str))


def track_rank(tracks, uuid):
    """The rank a track belongs to, from its top track's name (RANK r - ..., or a string pid's '(rank r)')."""
    d = tracks[uuid]
    while d.HasField("parent_uuid"):
        d = tracks[d.parent_uuid]
    name = d.process.process_name if d.HasField("process") else d.name
    m = re.match(r"RANK (\d+) - ", name) or re.search(r"\(rank (\d+)\)$", name)
    return int(m.group(1)) if m else None


def pftrace_slices(view):
    return [dict(track=track_path(view["tracks"], s["track"]), rank=track_rank(view["tracks"], s["track"]),
                 name=s["name"], cat=s["cat"], ts=s["ts"], dur=s["dur"], args=s["args"], flow_ids=s["flow_ids"],
                 terminating=s["terminating"])
            for s in view["slices"]]

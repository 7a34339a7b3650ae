"""One rank's collective kernels, described: ``finish_rank`` turns a
``collect.RankCollector`` into a ``RankResult`` (kernels joined to their
launches and CPU ops, the collective kernels selected, their kind, sizes and
process group filled in from the best source present).  numpy only (no
pandas import)."""
import collections
import json
import sys
from dataclasses import dataclass, field

import numpy as np

from .. import collectives as coll
from .._native import COMM_DTYPE, NONE, NOSTR
from ..parallel.heap import give_back_freed_memory
from ..stream.packing import arrays
from .collect import OP_ANNOT, OP_C10D, OP_RPC, S_NCCL_NAME, _K_DTYPE, _L_DTYPE, _O_DTYPE, _U_DTYPE, collected_rank
from .p2p import rank_p2p
from .quality import _described_findings, _finding


@dataclass
class RankResult:
    """What align keeps of one rank: its collective kernel rows and metadata."""

    rank: int
    meta: dict
    rows: dict  # {column: numpy array}, one row per collective kernel, in (ts, event) order
    quality: list = field(default_factory=list)
    events: int = 0
    p2p: dict = None  # point-to-point halves and stage work (align.p2p), None without send/recv
    # the rank's ProfilerStep ops: (numbers, starts, ends), ns from its base
    # time, one per step number (steps.rank_steps); align pairs within steps
    steps: tuple = None

    def __setstate__(self, state):
        # results that arrive pickled (worker processes, Dask) share their
        # equal pg_config texts again, as results made in this process do
        self.__dict__.update(state)
        _intern_pg_config(self.meta)


#: the SUMMARY frame holding a RankResult (``extract`` writes it after the
#: rank's META frame; ``align`` reads it instead of the rank's events)
from ..steps import SUMMARY_NAME  # noqa: E402  (one definition, below align)
#: changes whenever RankResult's fields, or what the collection makes of a
#: rank's frames, change: a stage reads only summaries of its own version
#: (a rank whose announcement names another is collected from its events,
#: which the stream holds too).  2: the rank's ProfilerStep ops (``steps``)
from ..steps import SUMMARY_VERSION  # noqa: E402
#: the RankResult's fields a summary holds: not ``meta``, which is made
#: again from the rank's META frame (its process groups can be most of a
#: small trace's stream)
_SUMMARY_FIELDS = ("rank", "rows", "quality", "events", "p2p", "steps")


def result_summary(result):
    """A RankResult as a SUMMARY frame's value (plain values and arrays)."""
    return {f: getattr(result, f) for f in _SUMMARY_FIELDS}


def result_from_summary(value, meta):
    """The RankResult a SUMMARY frame's value holds, with the rank's META
    frame's object ``meta``; ValueError when the value is not one."""
    if not isinstance(value, dict) or set(value) != set(_SUMMARY_FIELDS) or not isinstance(value["rows"], dict):
        raise ValueError("not a rank's collective rows")
    steps = value["steps"]
    if not (isinstance(steps, tuple) and len(steps) == 3 and all(isinstance(a, np.ndarray) and a.ndim == 1
                                                                 and a.dtype.kind == "i" and len(a) == len(steps[0])
                                                                 for a in steps)):
        raise ValueError("its ProfilerSteps are not three arrays of integers of one length")
    return RankResult(meta=_meta_summary(meta, value["rank"]), **value)


def finish_rank(collector):
    """A RankCollector's RankResult: link, select and describe the rank's
    collective kernels (its per-frame arrays are dropped)."""
    meta = _meta_summary(collector.meta or {}, collector.rank)
    # the free pages handed back here and after the description: the frames
    # read and its temporaries (for a rank of a million collective kernels,
    # hundreds of MB) would stay resident beside what comes next
    give_back_freed_memory()
    # each kind's frames dropped once joined, before the next kind is
    ops, collector.ops = _concat(collector.ops, _O_DTYPE), None
    comms, collector.comms = _concat(collector.comms, COMM_DTYPE), None
    labels, collector.labels = _concat(collector.labels, _U_DTYPE), None
    kernels, launches = _candidates(collector.kernels, collector.launches, ops, comms, collector.lookup)
    kernel_parts, launch_parts = collector.kernels, collector.launches
    # every row a candidate (e.g. a rank of send/recv kernels only): the
    # joined candidates are the parts' rows in the same order, so the parts
    # go (two copies of every kernel and launch would be held otherwise)
    if sum(map(len, kernel_parts)) == len(kernels):
        kernel_parts = [kernels] if len(kernels) else []
    if sum(map(len, launch_parts)) == len(launches):
        launch_parts = [launches] if len(launches) else []
    collector.kernels = collector.launches = None
    rows, quality = _describe_rank(collector.rank, kernels, launches, ops, comms, collector.strings,
                                   collector.lookup, meta, labels, collector.custom,
                                   _parsed_pg_config(collector.meta or {}))
    give_back_freed_memory()
    p2p = rank_p2p(ops, comms, rows, kernel_parts, launch_parts, collector.steps, collector.strings, meta)
    del kernel_parts, launch_parts
    if collector.meta is None:
        quality.append(_finding("warning", "incomplete_rank", f"rank {collector.rank}: no metadata frame "
                                "(the stream section of this rank is incomplete)", rank=collector.rank))
    return RankResult(collector.rank, meta, rows, quality, collector.n_events, p2p, _rank_steps(collector))


def _rank_steps(collector):
    """(numbers, starts, ends) of the rank's ProfilerStep ops (``steps.rank_steps``)."""
    from ..steps import rank_steps

    ops = _concat(collector.steps, _O_DTYPE)
    _, numbers, starts, ends = rank_steps(collector.rank, ops["name"], ops["ts"], ops["ts"] + ops["dur"],
                                          strings=collector.strings)
    return numbers, starts, ends


def collect_rank(frames, rank=None):
    """One rank's frames (e.g. an ``extract_rank`` generator) collected and
    finished: its RankResult."""
    return finish_rank(collected_rank(frames, rank))


def _labels(table, codes):
    """Object array: ``table[code]`` per row (a few shared str objects, not one per row)."""
    return np.array(table, dtype=object)[codes]


def _words(records):
    """A contiguous record array as rows of 8-byte words (a view), or None
    when its layout is not a whole number of words."""
    if records.dtype.itemsize % 8 or not records.flags.c_contiguous:
        return None
    return records.view(np.int64).reshape(len(records), records.dtype.itemsize // 8)


def _take(records, index):
    """``records[index]`` (integer indices) for a record array: gathered as
    rows of 8-byte words when the layout allows, as numpy's own gather of
    structured records goes field by field."""
    words = _words(records) if len(records) else None
    if words is None:
        return records[index]
    return np.take(words, index, axis=0).view(records.dtype).reshape(-1)


def _concat(parts, dtype):
    """The per-frame record arrays ``parts`` (all of ``dtype``) as one, in
    ``dtype``'s own layout.  Joined as rows of 8-byte words when the layout
    allows: numpy's concatenate of structured records copies field by field,
    and it drops the padding of a layout not made with align=True (the C
    core's comm records: 92 bytes instead of 96), which then makes every
    ``_take`` of them a field-by-field gather too."""
    if not parts:
        return np.empty(0, dtype)
    if len(parts) == 1:
        return parts[0]
    words = [_words(p) if p.dtype == dtype else None for p in parts]
    if any(w is None for w in words):
        return np.concatenate(parts).astype(dtype, copy=False)
    return np.concatenate(words).view(dtype).reshape(-1)


def _candidates(kernel_parts, launch_parts, ops, comms, lookup):
    """The kernels of a rank that can be collective kernels, and their
    launches, from the per-frame parts: NCCL/RCCL names, kernels with comm
    args of their own, kernels whose External id names a collective op (new
    traces) and, in old traces, every launched kernel (only the
    time-containment test can tell).  The others could never be selected, so
    every join after this is proportional to the collectives rather than to
    the trace; filtering part by part never builds the whole kernel table."""
    comm_events = comms["event"].astype(np.int64)
    if (comm_events[1:] < comm_events[:-1]).any():  # records come in event order: usually sorted already
        comm_events = np.sort(comm_events)
    op_ext = np.sort(ops["ext"])
    kernels = _concat([_take(part, np.flatnonzero(_maybe_collective(part, lookup, comm_events, op_ext)))
                       for part in arrays(kernel_parts)], _K_DTYPE)
    corr = np.sort(kernels["corr"])
    launches = _concat([_take(part, np.flatnonzero(_in_sorted(part["corr"], corr))) for part in arrays(launch_parts)],
                       _L_DTYPE)
    return kernels, launches


def _maybe_collective(kernels, lookup, comm_events, op_ext):
    """Which of ``kernels`` can be collective kernels (see _candidates)."""
    new_regime = (kernels["ext"] != NONE) & (kernels["ext"] != kernels["corr"])
    return (((lookup(kernels["name"]) & S_NCCL_NAME) != 0) | ~new_regime | _in_sorted(kernels["event"], comm_events)
            | (new_regime & _in_sorted(kernels["ext"], op_ext)))


def _int_or_none(v):
    try:
        return int(v) if v is not None and not isinstance(v, bool) else None
    except (TypeError, ValueError):
        return None


def _distributed_info(meta):
    trace = meta.get("trace") if isinstance(meta.get("trace"), dict) else {}
    return trace.get("distributedInfo") if isinstance(trace.get("distributedInfo"), dict) else {}


def _parsed_pg_config(meta):
    """distributedInfo.pg_config of a rank's metadata (a list), or None."""
    config = _distributed_info(meta).get("pg_config")
    return config if isinstance(config, list) else None


def _meta_summary(meta, rank):
    trace = meta.get("trace") if isinstance(meta.get("trace"), dict) else {}
    dist = _distributed_info(meta)
    devices = trace.get("deviceProperties")
    base = trace.get("baseTimeNanoseconds")
    base = _int_or_none(base) if isinstance(base, (int, float)) else None
    pg_config = _parsed_pg_config(meta)
    counts = meta.get("counts") if isinstance(meta.get("counts"), dict) else {}
    return {
        "rank": rank, "source": meta.get("source"), "world_size": _int_or_none(meta.get("world_size")),
        "trace_rank": _int_or_none(dist.get("rank")), "trace_world_size": _int_or_none(dist.get("world_size")),
        "gpus": len(devices) if isinstance(devices, list) else None, "base_ns": base or 0,
        "pg_config": None if pg_config is None else pg_config_text(pg_config),
        "warnings": list(meta.get("warnings") or []),
        "truncated_at_byte": _int_or_none(meta.get("truncated_at_byte")), "counts": counts,
    }




def _in_sorted(values, pool):
    """Boolean mask: which of ``values`` occur in the sorted array ``pool``
    (a binary search per value: cheap when the pool is small)."""
    if not len(values) or not len(pool):
        return np.zeros(len(values), dtype=bool)
    pos = np.minimum(np.searchsorted(pool, values), len(pool) - 1)
    return pool[pos] == values


def _join_sorted(keys, queries, valid=None):
    """Index into ``keys`` of each query's first equal key (-1 if none)."""
    out = np.full(len(queries), -1, dtype=np.int64)
    if not len(keys) or not len(queries):
        return out
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    pos = np.searchsorted(sk, queries)
    pos_c = np.minimum(pos, len(sk) - 1)
    ok = sk[pos_c] == queries
    if valid is not None:
        ok &= valid
    out[ok] = order[pos_c[ok]]
    return out


def _containing(ops, sel, pid, tid, t):
    """Per query (pid, tid, t): index into ops of the innermost op among
    ``ops[sel]`` (the ops of one kind) on that thread whose [ts, ts+dur]
    covers t, else -1."""
    out = np.full(len(t), -1, dtype=np.int64)
    if not len(sel) or not len(t):
        return out
    ts, dur, opid, otid = (ops[f][sel] for f in ("ts", "dur", "pid", "tid"))
    # group by thread; within a thread by start, outer (longer) first at equal
    # starts, so the last start <= t is the innermost candidate.  Sort keys
    # that cannot change the order are left out: ops are often in start
    # order already, on one or two threads of one process.
    keys = [] if (ts[1:] > ts[:-1]).all() else [-dur, ts]
    keys += [k for k in (otid, opid) if (k != k[0]).any()]
    if keys:
        order = np.lexsort(keys)
        ts, dur, opid, otid, sel = ts[order], dur[order], opid[order], otid[order], sel[order]
    change = np.flatnonzero((opid[1:] != opid[:-1]) | (otid[1:] != otid[:-1])) + 1
    bounds = np.r_[0, change, len(sel)]
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        q = np.flatnonzero((pid == opid[a]) & (tid == otid[a]))
        if not len(q):
            continue
        starts = ts[a:b]
        ends = starts + dur[a:b]
        tq = t[q]
        j = np.searchsorted(starts, tq, side="right") - 1
        for back in (0, 1, 2):  # tolerate a little nesting of the same kind
            jj = j - back
            ok = (jj >= 0) & (out[q] < 0)
            jc = np.maximum(jj, 0)
            ok &= (starts[jc] <= tq) & (tq <= ends[jc])
            out[q[ok]] = sel[a + jc[ok]]
    return out


class _Parsed:
    """Per-rank cache of parsed Input Dims / Input type strings."""

    def __init__(self, strings):
        self.strings = strings
        self.nelems = {}
        self.types = {}

    def s(self, sid):
        return None if sid == NOSTR or sid >= len(self.strings) else self.strings[sid]

    def dims(self, sid, index=0):
        key = (sid, index)
        if key not in self.nelems:
            self.nelems[key] = coll.input_dims_nelems(self.s(sid), index)
        return self.nelems[key]

    def dtype(self, sid, index=0):
        key = (sid, index)
        if key not in self.types:
            self.types[key] = coll.dtype_from_input_type(coll.input_type_at(self.s(sid), index))
        return self.types[key]


class _CommRecords:
    """The comm-args record of each row (``index``: into ``comms``, -1
    for none), read field by field: a gather of whole records would hold
    another ~100 bytes a row for each of the four sources (kernel, rpc,
    annotation, c10d op), most of them often without any record."""

    def __init__(self, comms, index):
        self.missing = index < 0
        self.comms = comms if len(comms) and not self.missing.all() else None
        self.index = np.maximum(index, 0)

    def field(self, name, missing_value):
        """One field per row as int64, ``missing_value`` where a row has no record."""
        if self.comms is None:
            return np.full(len(self.missing), missing_value, dtype=np.int64)
        out = self.comms[name][self.index].astype(np.int64, copy=False)
        out[self.missing] = missing_value
        return out


def _describe_rank(rank, kernels, launches, ops, comms, strings, lookup, meta, labels=None, custom=None,
                   pg_config=None):
    """Select the collective kernels of one rank and describe them (one row each)."""
    if not len(kernels):
        return _empty_rank_rows(), []
    name_match = (lookup(kernels["name"]) & S_NCCL_NAME) != 0
    new_regime = (kernels["ext"] != NONE) & (kernels["ext"] != kernels["corr"])
    # kernel -> launch, by correlation
    launch = _join_sorted(launches["corr"], kernels["corr"], valid=kernels["corr"] != NONE)
    op_of_kind, link = _link_ops(kernels, launches, ops, launch, name_match, new_regime)
    # comm-argument records by event
    comm_events = comms["event"].astype(np.int64)
    kernel_comm = _join_sorted(comm_events, kernels["event"])
    has_kernel_comm = kernel_comm >= 0
    sel = np.flatnonzero(_collective_kernels(op_of_kind, name_match, has_kernel_comm))
    if not len(sel):
        return _empty_rank_rows(), []

    chosen = kernels if len(sel) == len(kernels) else _take(kernels, sel)   # every kernel chosen: no copy
    n = len(sel)
    sel_by = _labels(("name", "comm_args", "cpu_op"),
                     np.where(name_match[sel], 0, np.where(has_kernel_comm[sel], 1, 2)))
    launch_s = launch[sel]
    ann, rpc, c10 = op_of_kind[OP_ANNOT][sel], op_of_kind[OP_RPC][sel], op_of_kind[OP_C10D][sel]
    rpc_ev, ann_ev, c10_ev = _op_events(ops, rpc, n), _op_events(ops, ann, n), _op_events(ops, c10, n)
    rpc_comm = _join_sorted(comm_events, rpc_ev, valid=rpc >= 0)
    ann_comm = _join_sorted(comm_events, ann_ev, valid=ann >= 0)
    c10_comm = _join_sorted(comm_events, c10_ev, valid=c10 >= 0)

    texts = _Texts(strings)
    uniq, inv = np.unique(chosen["name"], return_inverse=True)
    uniq_names = texts.of(uniq)
    kernel_names = uniq_names[inv]
    kinds_tok = np.array([coll.kernel_kind(s) for s in uniq_names] + [None], dtype=object)[:-1][inv]
    ann_name, c10_name, rpc_name = _op_names(ops, ann, n, texts), _op_names(ops, c10, n, texts), \
        _op_names(ops, rpc, n, texts)

    pg_conf = _pg_config_by_name(pg_config)
    args = _ArgSources(_CommRecords(comms, kernel_comm[sel]), _CommRecords(comms, rpc_comm))
    described, pg_id, need = _described_by_args(args, texts, pg_conf)
    if custom is not None:   # the user's pattern names what the args do not
        for i in np.flatnonzero(described["collective_name"] == None).tolist():  # noqa: E711 - object array
            name = custom.collective_of(kernel_names[i])
            if name is not None:
                described["collective_name"][i], described["name_source"][i] = name, "custom_pattern"
    _fill_from_fallbacks(described, pg_id, need, ann_name, c10_name, kinds_tok, _CommRecords(comms, ann_comm),
                         _CommRecords(comms, c10_comm), _Parsed(strings), pg_conf)

    no_ids = (chosen["corr"] == NONE) & (chosen["ext"] == NONE)
    columns = {
        "event": chosen["event"], "ts": chosen["ts"], "dur": chosen["dur"], "pid": chosen["pid"],
        "stream": chosen["stream"].astype(np.int64), "device": chosen["device"].astype(np.int64),
        "correlation": chosen["corr"], "external_id": chosen["ext"],
        "kernel_name": kernel_names, "kernel_kind": kinds_tok, "selected_by": sel_by,
        "launch_event": _launch_field(launches, launch_s, "event", missing=-1),
        "launch_ts": _launch_field(launches, launch_s, "ts"), "launch_dur": _launch_field(launches, launch_s, "dur"),
        "launch_tid": _launch_field(launches, launch_s, "tid"),
        "rpc_event": rpc_ev, "annotation_event": ann_ev, "c10d_event": c10_ev,
        "rpc_name": rpc_name, "annotation_name": ann_name, "c10d_name": c10_name,
        "link": np.array(["none", "external_id", "containment"], dtype=object)[link[sel]],
        **described, "no_ids": no_ids,
    }
    columns["user_label"] = _user_labels(labels, columns["launch_ts"], columns["launch_dur"], columns["launch_tid"],
                                         texts)
    columns["cpu_op_event"] = np.where(rpc_ev >= 0, rpc_ev, np.where(ann_ev >= 0, ann_ev, columns["c10d_event"]))
    columns["cpu_op_name"] = np.where(rpc_ev >= 0, columns.pop("rpc_name"),
                                      np.where(ann_ev >= 0, columns.pop("annotation_name"), columns.pop("c10d_name")))
    rows = _in_time_order(columns, n)
    return rows, _described_findings(rank, rows, no_ids, sel_by)


def _user_labels(labels, launch_ts, launch_dur, launch_tid, texts):
    """Per row: the name of the innermost user annotation (``record_function``
    label, e.g. ``PP::fwd_send (stage 0)``) around its launch on the launching
    thread, or None."""
    out = np.full(len(launch_ts), None, dtype=object)
    if labels is None or not len(labels):
        return out
    order = np.lexsort((labels["ts"], labels["tid"]))
    tid, ts = labels["tid"][order], labels["ts"][order]
    end = ts + labels["dur"][order]
    name = texts.of(labels["name"][order])
    for i in np.flatnonzero(launch_ts != NONE).tolist():
        t0, t1, th = launch_ts[i], launch_ts[i] + max(int(launch_dur[i]), 0), launch_tid[i]
        lo = np.searchsorted(tid, th, side="left")
        j = lo + np.searchsorted(ts[lo:np.searchsorted(tid, th, side="right")], t0, side="right") - 1
        while j >= lo:   # the latest-starting label that still holds the launch is the innermost
            if end[j] >= t1:
                out[i] = name[j]
                break
            j -= 1
    return out


def _launch_field(launches, launch, name, missing=NONE):
    """Per kernel: ``name`` of its launch (``launch``: index into launches),
    ``missing`` when it has none."""
    if not len(launches):
        return np.full(len(launch), missing)
    return np.where(launch >= 0, launches[name][np.maximum(launch, 0)], missing)


def _link_ops(kernels, launches, ops, launch, name_match, new_regime):
    """Kernel -> CPU ops: External id (new traces), else containment of the
    launch.  Returns ``{op kind: index into ops per kernel (-1: none)}`` and
    per kernel how it was linked (0 none, 1 External id, 2 containment)."""
    n = len(kernels)
    has_launch = launch >= 0
    launch_pid, launch_tid, launch_ts = (_launch_field(launches, launch, name)
                                         for name in ("pid", "tid", "ts"))
    op_of_kind = {}
    any_ext = np.zeros(n, dtype=bool)
    any_time = np.zeros(n, dtype=bool)
    by_ext = {}
    of_kind = {kind: np.flatnonzero(ops["kind"] == kind) for kind in (OP_ANNOT, OP_RPC, OP_C10D)}
    for kind in (OP_ANNOT, OP_RPC, OP_C10D):
        by_ext[kind] = np.full(n, -1, dtype=np.int64)
        sel = of_kind[kind]
        if len(sel):
            found = _join_sorted(ops["ext"][sel], kernels["ext"], valid=new_regime)
            by_ext[kind][found >= 0] = sel[found[found >= 0]]
        any_ext |= by_ext[kind] >= 0
    # time containment: every launched kernel in old traces; in new traces the
    # External id already says which op launched a kernel, so only NCCL kernels
    # (for their annotation and c10d op) and linked ones need it
    probe = has_launch & (name_match | ~new_regime | any_ext)
    for kind in (OP_ANNOT, OP_RPC, OP_C10D):
        by_time = np.full(n, -1, dtype=np.int64)
        if probe.any():
            probed = np.flatnonzero(probe)
            by_time[probed] = _containing(ops, of_kind[kind], launch_pid[probed], launch_tid[probed],
                                          launch_ts[probed])
        op_of_kind[kind] = np.where(by_ext[kind] >= 0, by_ext[kind], by_time)
        any_time |= by_time >= 0
    link = np.where(any_ext, 1, np.where(any_time, 2, 0)).astype(np.int8)  # none / external id / containment
    return op_of_kind, link


def _collective_kernels(op_of_kind, name_match, has_kernel_comm):
    """Which kernels are collective kernels (B2): NCCL/RCCL names, kernels
    with comm args of their own, and kernels linked to a collective op that
    no NCCL-named kernel is linked to (a helper kernel inside the same op as
    an NCCL kernel is not one)."""
    op_key = np.where(op_of_kind[OP_RPC] >= 0, op_of_kind[OP_RPC], op_of_kind[OP_ANNOT])
    linked = op_key >= 0
    named_ops = np.unique(op_key[name_match & linked])
    linked_free = linked & ~np.isin(op_key, named_ops)
    return name_match | has_kernel_comm | linked_free


def _op_events(ops, op, n):
    """The event of each row's op (``op``: index into ops, -1: none)."""
    return np.where(op >= 0, ops["event"][np.maximum(op, 0)], -1) if len(ops) else np.full(n, -1, dtype=np.int64)


def _op_names(ops, op, n, texts):
    """The name of each row's op (None: none)."""
    if not len(ops):
        return np.full(n, None, object)
    return texts.of(np.where(op >= 0, ops["name"][np.maximum(op, 0)].astype(np.int64), -1))


class _Texts:
    """A rank's string table: ids to str objects (None for ids that stand for
    no string)."""

    def __init__(self, strings):
        self.count = len(strings)
        self.table = np.array(strings + [None], dtype=object)

    def absent(self, ids):
        return (ids < 0) | (ids >= self.count)

    def of(self, ids):
        ids = np.asarray(ids, dtype=np.int64)
        return self.table[np.where(self.absent(ids), self.count, ids)]


class _ArgSources:
    """A field of each row's comm args: the kernel's own record, else its
    record_param_comms op's."""

    def __init__(self, kernel_records, rpc_records):
        self.kernel, self.rpc = kernel_records, rpc_records

    def string_ids(self, name):
        """(string id per row, from the kernel's record, from the rpc's)."""
        a, b = self.kernel.field(name, NOSTR), self.rpc.field(name, NOSTR)
        return np.where(a != NOSTR, a, b), a != NOSTR, b != NOSTR

    def ints(self, name):
        """(value per row, from the kernel's record, from the rpc's)."""
        a, b = self.kernel.field(name, NONE), self.rpc.field(name, NONE)
        return np.where(a != NONE, a, b), a != NONE, b != NONE


#: the configs whose texts were made last, with their texts: the ranks of a
#: job list the same config, and comparing two configs costs ~1 % of encoding one
_RECENT_PG_CONFIGS = collections.deque(maxlen=4)


def pg_config_text(pg_config):
    """distributedInfo.pg_config as the compact JSON text kept per rank (and
    written to align.ranks), interned.  Every rank's trace lists every
    group's ranks there, so a job of N ranks holds N copies of an O(N) list
    (4,096 ranks: ~150 KB a rank as Python lists); as one shared text per
    distinct config, the ranks' results stay O(N) together.  A config equal
    to a recent one (Python's ==, which also holds for 1 and 1.0) takes its
    text without being encoded again: the encoding was O(N) per rank."""
    for config, text in list(_RECENT_PG_CONFIGS):   # list(): a snapshot, other threads append
        if type(config) is type(pg_config) and config == pg_config:
            return text
    text = sys.intern(json.dumps(pg_config, separators=(",", ":"), default=str))
    _RECENT_PG_CONFIGS.append((pg_config, text))
    return text


def _intern_pg_config(meta):
    if isinstance(meta, dict) and isinstance(meta.get("pg_config"), str):
        meta["pg_config"] = sys.intern(meta["pg_config"])


def _pg_config_by_name(pg_config):
    """The rank's distributedInfo.pg_config entries (a list, or None) by process group name."""
    pg_conf = {}
    for pg in pg_config or []:
        if isinstance(pg, dict) and pg.get("pg_name") is not None:
            pg_conf[str(pg["pg_name"])] = pg
    return pg_conf


def _described_by_args(args, texts, pg_conf):
    """The rows' kind, sizes and process group from their comm args:
    ``({column: array}, pg_id, need)``, where ``need`` marks the rows that
    lack a field a fallback may give."""
    name_id, from_k, from_r = args.string_ids("collective_name")
    dtype_id, _, _ = args.string_ids("dtype")
    in_n, ink, inr = args.ints("in_nelems")
    out_n, _, _ = args.ints("out_nelems")
    group_size, _, _ = args.ints("group_size")
    pg_name_id = args.string_ids("pg_name")[0]
    pg_id, _, _ = args.ints("pg_id")
    pg_ranks_id = args.string_ids("pg_ranks")[0]
    described = {
        "collective_name": texts.of(name_id),
        "name_source": _labels(("kernel_args", "record_param_comms", None),
                               np.where(from_k, 0, np.where(from_r, 1, 2))),
        "dtype": texts.of(dtype_id), "in_nelems": in_n, "out_nelems": out_n,
        "size_source": _labels(("kernel_args", "record_param_comms", None), np.where(ink, 0, np.where(inr, 1, 2))),
        "group_size": group_size, "group_size_source": _labels(("args", None), (group_size == NONE).astype(np.int64)),
        "pg_name": texts.of(pg_name_id), "pg_desc": texts.of(args.string_ids("pg_desc")[0]),
        "pg_ranks": texts.of(pg_ranks_id), "in_split": texts.of(args.string_ids("in_split")[0]),
        "out_split": texts.of(args.string_ids("out_split")[0]), "seq": args.ints("seq")[0],
        "comms_id": texts.of(args.string_ids("comms_id")[0]),
    }
    need = (texts.absent(name_id) | texts.absent(dtype_id) | (in_n == NONE) | (out_n == NONE)
            | (texts.absent(pg_name_id) & (pg_id != NONE)))
    if pg_conf:
        need |= (group_size == NONE) | texts.absent(pg_ranks_id)
    return described, pg_id, need


def _fill_from_fallbacks(described, pg_id, need, ann_name, c10_name, kinds_tok, ann_records, c10_records, parsed,
                         pg_conf):
    """Fill in, for the rows ``need`` marks, what the comm args did not give:
    from the collective ops' names, the annotation's Input Dims / Input type,
    pg_config and the kernel name (Python per row, parsed strings cached)."""
    cname, name_source, dtype = described["collective_name"], described["name_source"], described["dtype"]
    in_n, out_n, size_source = described["in_nelems"], described["out_nelems"], described["size_source"]
    group_size, gs_source = described["group_size"], described["group_size_source"]
    pg_name, pg_ranks = described["pg_name"], described["pg_ranks"]
    a_dims, a_type = ann_records.field("input_dims", NOSTR), ann_records.field("input_type", NOSTR)
    c_dims, c_type = c10_records.field("input_dims", NOSTR), c10_records.field("input_type", NOSTR)
    for i in np.flatnonzero(need).tolist():
        if pg_name[i] is None and pg_id[i] != NONE:
            pg_name[i] = str(int(pg_id[i]))
        if cname[i] is None:
            guess, source = coll.collective_from_ops(ann_name[i], c10_name[i])
            if guess is not None:
                cname[i], name_source[i] = guess, source
            else:
                guess = coll.collective_from_kernel_kind(kinds_tok[i])
                if guess is not None:
                    cname[i], name_source[i] = guess, "kernel_name"
        if dtype[i] is None and a_type[i] != NOSTR:
            dtype[i] = parsed.dtype(a_type[i])
        if in_n[i] == NONE and a_dims[i] != NOSTR:
            v = parsed.dims(a_dims[i])
            if v is not None:
                in_n[i], size_source[i] = v, "annotation"
        conf = pg_conf.get(pg_name[i]) if pg_name[i] is not None else None
        if conf is not None:
            if group_size[i] == NONE:
                size = conf.get("pg_size")
                if not isinstance(size, int) and isinstance(conf.get("ranks"), list):
                    size = len(conf["ranks"])
                if isinstance(size, int):
                    group_size[i], gs_source[i] = size, "pg_config"
            if pg_ranks[i] is None and isinstance(conf.get("ranks"), list):
                pg_ranks[i] = str(conf["ranks"])
        if out_n[i] == NONE and in_n[i] != NONE:
            out_n[i] = _out_nelems(cname[i], in_n[i], group_size[i], c_dims[i], c_type[i], parsed)


def _in_time_order(columns, n):
    """The rows in (ts, event) order, text as object arrays (None when
    missing).  Kernels usually come in that order already: then no column is
    gathered, only the strided views of the kernel records are copied."""
    order = np.lexsort((columns["event"], columns["ts"]))
    if (order == np.arange(n)).all():
        order = slice(None)
    return {k: np.ascontiguousarray(v[order]) if v.dtype.kind in "iufb" else np.asarray(v, dtype=object)[order]
            for k, v in columns.items()}


def _out_nelems(cname, in_n, group_size, c_dims, c_type, parsed):
    """Output element count when no arg gives it (old traces)."""
    k = coll.kind(cname)
    if c_dims != NOSTR and cname in ("all_to_allv", "_allgather_base", "_reduce_scatter_base"):
        if parsed.dtype(c_type) is not None:
            v = parsed.dims(c_dims)
            if v is not None:
                return v
    if k in ("allreduce", "broadcast", "reduce", "send", "recv", "alltoall", "alltoallv"):
        return in_n
    if k == "allgather" and group_size != NONE and group_size > 0:
        return in_n * int(group_size)
    if k == "reducescatter" and group_size != NONE and group_size > 0:
        return in_n // int(group_size)
    return NONE


def _empty_rank_rows():
    cols = {"event": "int64", "ts": "int64", "dur": "int64", "pid": "int64", "stream": "int64", "device": "int64",
            "correlation": "int64", "external_id": "int64", "kernel_name": object, "kernel_kind": object,
            "selected_by": object, "launch_event": "int64", "launch_ts": "int64", "launch_dur": "int64",
            "launch_tid": "int64", "rpc_event": "int64", "annotation_event": "int64", "c10d_event": "int64",
            "link": object, "collective_name": object, "name_source": object, "dtype": object, "in_nelems": "int64",
            "out_nelems": "int64", "size_source": object, "group_size": "int64", "group_size_source": object,
            "pg_name": object, "pg_desc": object, "pg_ranks": object, "in_split": object, "out_split": object,
            "seq": "int64", "comms_id": object, "no_ids": bool, "user_label": object, "cpu_op_event": "int64",
            "cpu_op_name": object}
    return {k: np.zeros(0, dtype=v) for k, v in cols.items()}


def rank_row_count(rows):
    """Rows in a RankResult's ``rows``."""
    return len(rows["event"])


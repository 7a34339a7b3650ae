"""``align``: collective kernels per rank, matched across ranks, with clock offsets.

A stage over the event stream (stream in -> stream out)::

    for frame in align_frames(frames):      # every input frame, then the results
        ...

It passes every frame through as it reads it (END frames are replaced by one
END at its own end) and appends its results as TABLE frames (see
docs/stream-format.md, "Stage tables"):

``align.options``      one row: the options align ran with (written first, so
                       a later stage knows that align tables will follow)
``align.ranks``        one row per rank: source, world size, GPUs, time base,
                       process groups (distributedInfo.pg_config), warnings
``align.collectives``  one row per collective kernel per rank (COLLECTIVE_COLUMNS)
``align.clocks``       one row per rank: estimated clock offset and residual
``align.quality``      data-quality findings

How it works, per rank (``collect.RankCollector``, then ``finish_rank``), as
frames arrive:

* each new string of the rank's string table is classified once (NCCL/RCCL
  kernel name, ``nccl:*`` annotation, ``record_param_comms``, ``c10d::*``,
  kernel-launch API, event category);
* each EVENTS frame is filtered with numpy into three small arrays: kernels,
  kernel launches and collective CPU ops; comm-argument records are kept;
  everything else is dropped;
* at the rank's META frame the rank is finished (in a background thread,
  started before the frame is passed on, so that a stage downstream finishes
  its own view of the rank meanwhile): kernels join their launch by
  ``correlation``; launches/kernels join the CPU ops by ``External id`` (new
  traces) or by time containment of the launch on its thread (old traces,
  where External id == correlation); a kernel is a collective kernel when its
  name matches the NCCL/RCCL patterns or it is linked to ``record_param_comms``
  / ``nccl:*`` (spec B2); its kind, dtype, sizes and process group come from
  the kernel's args, then ``record_param_comms``, then the ``nccl:*``
  annotation's ``Input Dims``/``Input type``, then the c10d op, then the
  kernel name.  Only the collective rows are kept.

Across ranks (``match_ranks``): rows are grouped by process group (name plus
rank list, so disjoint subgroups sharing a name stay apart); within a group the
key is ``Seq`` when every row has one, else the per-rank ordinal aligned like a
diff against a consensus sequence (signature = name, dtype, sizes; ties broken
by end-time consistency), so a rank whose window starts or ends at another
collective does not shift every later index (B3).  Clock offsets are estimated
from the ends of implicit-sync collectives (B4) and applied when requested, or
by default when the ranks span more than one node (``collective-report`` applies
them only when asked); offsets not applied that would change the
last-arriving ranks are a warning in the quality table
(``clock_offsets_change_results``).

Memory: the collective rows, plus, for the rank being read, its kernels and
kernel launches (about 100 bytes per kernel) -- never CPU ops it does not use,
python frames, flows or other events.
"""
import functools
import json
import logging
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .. import collectives as coll
from ..parallel.threads import in_thread
from .._native import COMM_DTYPE, NONE, NOSTR
from ..codes import Text, dense_rank, group_ids, joined_labels, occurrence
from ..parallel.fork import both
from ..parallel.cpus import available_cpus
from ..errors import StreamtraceError
# the per-frame collector lives apart, free of pandas; re-exported here
from .collect import OP_ANNOT, OP_C10D, OP_RPC, S_NCCL_NAME, _K_DTYPE, _L_DTYPE, _O_DTYPE
from .collect import RankCollector, classify_string, collected_rank  # noqa: F401
from ..stream.format import Kind, json_frame, table_frame

log = logging.getLogger("streamtrace")

VERSION = 1
TABLE_NAMES = ("align.options", "align.ranks", "align.collectives", "align.clocks", "align.quality")

#: Columns of ``align.collectives``, in order (see docs/stream-format.md).
COLLECTIVE_COLUMNS = [
    "instance", "collective_id", "index_in_group", "pg", "pg_key", "match_method", "match_key",
    "rank", "event", "kernel_name", "kernel_kind", "selected_by",
    "pid", "device", "stream", "correlation", "external_id",
    "ts_ns", "dur_ns", "base_ns", "clock_offset_ns", "ts_aligned_ns", "dur_aligned_ns",
    "launch_event", "launch_ts_ns", "launch_dur_ns", "launch_tid",
    "cpu_op_event", "cpu_op_name", "rpc_event", "annotation_event", "c10d_event", "link",
    "collective_name", "name_source", "category", "kind", "implicit_sync",
    "dtype", "bytes_per_elem", "in_nelems", "out_nelems", "size_source", "in_bytes", "out_bytes",
    "in_split", "out_split", "pg_name", "pg_desc", "pg_ranks", "group_size", "group_size_source", "seq",
    "participants", "metadata_mismatch", "mismatch_fields", "stream_mismatch", "flags",
]
CLOCK_COLUMNS = ["rank", "offset_ns", "residual_ns", "max_residual_ns", "collectives", "reference_rank",
                 "applied", "method"]
QUALITY_COLUMNS = ["severity", "category", "rank", "pg", "collective_id", "count", "message"]
RANK_COLUMNS = ["rank", "source", "world_size", "trace_rank", "trace_world_size", "gpus", "base_ns",
                "pg_config", "collective_kernels", "events", "truncated_at_byte", "warnings"]

#: the largest message size taken as real (1 TiB, beyond any GPU's memory);
#: sums of it over 2^20 ranks still fit int64
MAX_MESSAGE_BYTES = 1 << 40
#: ends of one collective on two ranks closer than this are "consistent" (ns)
MATCH_TOLERANCE_NS = 20_000
#: a rank whose median clock residual exceeds this is reported (ns)
CLOCK_RESIDUAL_WARN_NS = 5_000
#: estimated offsets above this, when not applied, are reported (ns)
CLOCK_OFFSET_NOTE_NS = 10_000
#: offsets not applied that change the last-arriving rank of at least this
#: share of the collectives are a warning (they change the report's answers)
STORY_CHANGE_SHARE = 0.1
#: estimated offsets above this, when not applied, are an error finding (ns).
#: Offsets come from the ends of implicit-sync collectives, which coincide on
#: every rank within microseconds however late a rank arrives, and NTP keeps
#: hosts within milliseconds of each other (ranks on one node share a clock);
#: a second or more can only be a wrong clock or time base (a day, a time
#: zone), and it turns every skew, wait and xfer_latency into nonsense.
CLOCK_OFFSET_ERROR_NS = 1_000_000_000

# ====================================================================== per rank


@dataclass
class RankResult:
    """What align keeps of one rank: its collective kernel rows and metadata."""

    rank: int
    meta: dict
    rows: dict  # {column: numpy array}, one row per collective kernel, in (ts, event) order
    quality: list = field(default_factory=list)
    events: int = 0


def finish_rank(c):
    """A RankCollector's RankResult: link, select and describe the rank's
    collective kernels (its per-frame arrays are dropped)."""
    meta = _meta_summary(c.meta or {}, c.rank)
    O = _concat(c.ops, _O_DTYPE)
    C = _concat(c.comms, COMM_DTYPE)
    K, L = _candidates(c.kernels, c.launches, O, C, c.lookup)
    c.kernels = c.launches = c.ops = c.comms = None
    rows, quality = _describe_rank(c.rank, K, L, O, C, c.strings, c.lookup, meta)
    if c.meta is None:
        quality.append(_finding("warning", "incomplete_rank", f"rank {c.rank}: no metadata frame "
                                "(the stream section of this rank is incomplete)", rank=c.rank))
    return RankResult(c.rank, meta, rows, quality, c.n_events)


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
    structured records goes field by field and is ~10x slower."""
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


def _candidates(kernel_parts, launch_parts, O, C, lookup):
    """The kernels of a rank that can be collective kernels, and their
    launches, from the per-frame parts: NCCL/RCCL names, kernels with comm
    args of their own, kernels whose External id names a collective op (new
    traces) and, in old traces, every launched kernel (only the
    time-containment test can tell).  The others could never be selected, so
    every join after this is proportional to the collectives rather than to
    the trace; filtering part by part never builds the whole kernel table."""
    comm_events = C["event"].astype(np.int64)
    if (comm_events[1:] < comm_events[:-1]).any():  # records come in event order: usually sorted already
        comm_events = np.sort(comm_events)
    op_ext = np.sort(O["ext"])

    def maybe(k):
        new_regime = (k["ext"] != NONE) & (k["ext"] != k["corr"])
        return (((lookup(k["name"]) & S_NCCL_NAME) != 0) | ~new_regime | _in_sorted(k["event"], comm_events)
                | (new_regime & _in_sorted(k["ext"], op_ext)))

    K = _concat([_take(k, np.flatnonzero(maybe(k))) for k in kernel_parts], _K_DTYPE)
    corr = np.sort(K["corr"])
    L = _concat([_take(launch, np.flatnonzero(_in_sorted(launch["corr"], corr))) for launch in launch_parts],
                _L_DTYPE)
    return K, L


def _int_or_none(v):
    try:
        return int(v) if v is not None and not isinstance(v, bool) else None
    except (TypeError, ValueError):
        return None


def _meta_summary(meta, rank):
    trace = meta.get("trace") if isinstance(meta.get("trace"), dict) else {}
    dist = trace.get("distributedInfo") if isinstance(trace.get("distributedInfo"), dict) else {}
    devices = trace.get("deviceProperties")
    base = trace.get("baseTimeNanoseconds")
    base = _int_or_none(base) if isinstance(base, (int, float)) else None
    pg_config = dist.get("pg_config") if isinstance(dist.get("pg_config"), list) else None
    counts = meta.get("counts") if isinstance(meta.get("counts"), dict) else {}
    return {
        "rank": rank, "source": meta.get("source"), "world_size": _int_or_none(meta.get("world_size")),
        "trace_rank": _int_or_none(dist.get("rank")), "trace_world_size": _int_or_none(dist.get("world_size")),
        "gpus": len(devices) if isinstance(devices, list) else None, "base_ns": base or 0,
        "pg_config": pg_config, "warnings": list(meta.get("warnings") or []),
        "truncated_at_byte": _int_or_none(meta.get("truncated_at_byte")), "counts": counts,
    }


def _finding(severity, category, message, rank=None, pg=None, collective_id=None, count=None):
    return {"severity": severity, "category": category, "rank": rank, "pg": pg,
            "collective_id": collective_id, "count": count, "message": message}


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


def _containing(O, sel, pid, tid, t):
    """Per query (pid, tid, t): index into O of the innermost op among
    ``O[sel]`` (the ops of one kind) on that thread whose [ts, ts+dur]
    covers t, else -1."""
    out = np.full(len(t), -1, dtype=np.int64)
    if not len(sel) or not len(t):
        return out
    ts, dur, opid, otid = (O[f][sel] for f in ("ts", "dur", "pid", "tid"))
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
    """The comm-args record of each row (``ci``: index into ``C``, -1 for
    none), gathered once as whole records: each field read after it is a
    cheap strided pass instead of a gather of its own."""

    def __init__(self, C, ci):
        self.missing = ci < 0
        self.records = _take(C, np.maximum(ci, 0)) if len(C) else None

    def field(self, name, missing_value):
        """One field per row as int64, ``missing_value`` where a row has no record."""
        if self.records is None:
            return np.full(len(self.missing), missing_value, dtype=np.int64)
        out = self.records[name].astype(np.int64)
        out[self.missing] = missing_value
        return out


def _describe_rank(rank, K, L, O, C, strings, lookup, meta):
    """Select the collective kernels of one rank and describe them (one row each)."""
    quality = []
    nK = len(K)
    if not nK:
        return _empty_rank_rows(), quality
    name_match = (lookup(K["name"]) & S_NCCL_NAME) != 0
    new_regime = (K["ext"] != NONE) & (K["ext"] != K["corr"])

    # kernel -> launch, by correlation
    launch = _join_sorted(L["corr"], K["corr"], valid=K["corr"] != NONE)
    has_launch = launch >= 0
    lpid = np.where(has_launch, L["pid"][np.maximum(launch, 0)], NONE) if len(L) else np.full(nK, NONE)
    ltid = np.where(has_launch, L["tid"][np.maximum(launch, 0)], NONE) if len(L) else np.full(nK, NONE)
    lts = np.where(has_launch, L["ts"][np.maximum(launch, 0)], NONE) if len(L) else np.full(nK, NONE)

    # kernel -> CPU ops: External id (new traces), else containment of the launch
    ops = {}
    any_ext = np.zeros(nK, dtype=bool)
    any_time = np.zeros(nK, dtype=bool)
    by_ext = {}
    of_kind = {kind: np.flatnonzero(O["kind"] == kind) for kind in (OP_ANNOT, OP_RPC, OP_C10D)}
    for kind in (OP_ANNOT, OP_RPC, OP_C10D):
        by_ext[kind] = np.full(nK, -1, dtype=np.int64)
        sel = of_kind[kind]
        if len(sel):
            j = _join_sorted(O["ext"][sel], K["ext"], valid=new_regime)
            by_ext[kind][j >= 0] = sel[j[j >= 0]]
        any_ext |= by_ext[kind] >= 0
    # time containment: every launched kernel in old traces; in new traces the
    # External id already says which op launched a kernel, so only NCCL kernels
    # (for their annotation and c10d op) and linked ones need it
    probe = has_launch & (name_match | ~new_regime | any_ext)
    for kind in (OP_ANNOT, OP_RPC, OP_C10D):
        by_time = np.full(nK, -1, dtype=np.int64)
        if probe.any():
            q = np.flatnonzero(probe)
            by_time[q] = _containing(O, of_kind[kind], lpid[q], ltid[q], lts[q])
        ops[kind] = np.where(by_ext[kind] >= 0, by_ext[kind], by_time)
        any_time |= by_time >= 0
    link = np.where(any_ext, 1, np.where(any_time, 2, 0)).astype(np.int8)  # none / external id / containment

    # comm-argument records by event
    cev = C["event"].astype(np.int64)
    kcomm = _join_sorted(cev, K["event"])
    has_kcomm = kcomm >= 0

    # which kernels are collective kernels (B2)
    op_key = np.where(ops[OP_RPC] >= 0, ops[OP_RPC], ops[OP_ANNOT])
    linked = op_key >= 0
    named_ops = np.unique(op_key[name_match & linked])
    linked_free = linked & ~np.isin(op_key, named_ops)
    selected = name_match | has_kcomm | linked_free
    # a kernel with comm args of its own but without the NCCL name is kept; a
    # helper kernel inside the same op as an NCCL kernel is not
    sel = np.flatnonzero(selected)
    if not len(sel):
        return _empty_rank_rows(), quality

    Ks = _take(K, sel)
    n = len(sel)
    sel_by = _labels(("name", "comm_args", "cpu_op"), np.where(name_match[sel], 0, np.where(has_kcomm[sel], 1, 2)))
    launch_s = launch[sel]
    ann, rpc, c10 = ops[OP_ANNOT][sel], ops[OP_RPC][sel], ops[OP_C10D][sel]
    link_s = link[sel]
    kc = kcomm[sel]

    def op_events(op):  # the event of each row's op (-1: none)
        return np.where(op >= 0, O["event"][np.maximum(op, 0)], -1) if len(O) else np.full(n, -1, dtype=np.int64)

    rpc_ev, ann_ev, c10_ev = op_events(rpc), op_events(ann), op_events(c10)
    rc = _join_sorted(cev, rpc_ev, valid=rpc >= 0)
    ac = _join_sorted(cev, ann_ev, valid=ann >= 0)
    cc = _join_sorted(cev, c10_ev, valid=c10 >= 0)

    k_recs, r_recs = _CommRecords(C, kc), _CommRecords(C, rc)

    def coalesce_s(name):
        a, b = k_recs.field(name, NOSTR), r_recs.field(name, NOSTR)
        return np.where(a != NOSTR, a, b), a != NOSTR, b != NOSTR

    def coalesce_i(name):
        a, b = k_recs.field(name, NONE), r_recs.field(name, NONE)
        return np.where(a != NONE, a, b), a != NONE, b != NONE

    table = np.array(strings + [None], dtype=object)

    def absent(ids):  # ids that stand for no string (their text is None)
        return (ids < 0) | (ids >= len(strings))

    def text(ids):
        ids = np.asarray(ids, dtype=np.int64)
        return table[np.where(absent(ids), len(strings), ids)]

    uniq, inv = np.unique(Ks["name"], return_inverse=True)
    uniq_names = text(uniq)
    kernel_names = uniq_names[inv]
    kinds_tok = np.array([coll.kernel_kind(s) for s in uniq_names] + [None], dtype=object)[:-1][inv]

    name_id, from_k, from_r = coalesce_s("collective_name")
    cname = text(name_id)
    name_absent = absent(name_id)
    name_source = _labels(("kernel_args", "record_param_comms", None), np.where(from_k, 0, np.where(from_r, 1, 2)))
    dtype_id, _, _ = coalesce_s("dtype")
    dtype = text(dtype_id)
    dtype_absent = absent(dtype_id)
    in_n, ink, inr = coalesce_i("in_nelems")
    out_n, _, _ = coalesce_i("out_nelems")
    size_source = _labels(("kernel_args", "record_param_comms", None), np.where(ink, 0, np.where(inr, 1, 2)))
    group_size, _, _ = coalesce_i("group_size")
    gs_source = _labels(("args", None), (group_size == NONE).astype(np.int64))
    pg_name_id = coalesce_s("pg_name")[0]
    pg_name = text(pg_name_id)
    pg_id, _, _ = coalesce_i("pg_id")
    pg_desc = text(coalesce_s("pg_desc")[0])
    pg_ranks_id = coalesce_s("pg_ranks")[0]
    pg_ranks = text(pg_ranks_id)
    in_split = text(coalesce_s("in_split")[0])
    out_split = text(coalesce_s("out_split")[0])
    seq, _, _ = coalesce_i("seq")

    def op_names(op):  # the name of each row's op (None: none)
        if not len(O):
            return np.full(n, None, object)
        return text(np.where(op >= 0, O["name"][np.maximum(op, 0)].astype(np.int64), -1))

    ann_name, c10_name, rpc_name = op_names(ann), op_names(c10), op_names(rpc)

    # fallbacks, per collective (Python, cached per distinct string)
    parsed = _Parsed(strings)
    pg_conf = {}
    for pg in meta.get("pg_config") or []:
        if isinstance(pg, dict) and pg.get("pg_name") is not None:
            pg_conf[str(pg["pg_name"])] = pg
    a_recs, c_recs = _CommRecords(C, ac), _CommRecords(C, cc)
    a_dims, a_type = a_recs.field("input_dims", NOSTR), a_recs.field("input_type", NOSTR)
    c_dims, c_type = c_recs.field("input_dims", NOSTR), c_recs.field("input_type", NOSTR)
    need = name_absent | dtype_absent | (in_n == NONE) | (out_n == NONE) | (absent(pg_name_id) & (pg_id != NONE))
    if pg_conf:
        need |= (group_size == NONE) | absent(pg_ranks_id)
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

    no_ids = (Ks["corr"] == NONE) & (Ks["ext"] == NONE)
    columns = {
        "event": Ks["event"], "ts": Ks["ts"], "dur": Ks["dur"], "pid": Ks["pid"], "stream": Ks["stream"].astype(np.int64),
        "device": Ks["device"].astype(np.int64), "correlation": Ks["corr"], "external_id": Ks["ext"],
        "kernel_name": kernel_names, "kernel_kind": kinds_tok, "selected_by": sel_by,
        "launch_event": np.where(launch_s >= 0, L["event"][np.maximum(launch_s, 0)] if len(L) else -1, -1),
        "launch_ts": np.where(launch_s >= 0, L["ts"][np.maximum(launch_s, 0)] if len(L) else NONE, NONE),
        "launch_dur": np.where(launch_s >= 0, L["dur"][np.maximum(launch_s, 0)] if len(L) else NONE, NONE),
        "launch_tid": np.where(launch_s >= 0, L["tid"][np.maximum(launch_s, 0)] if len(L) else NONE, NONE),
        "rpc_event": rpc_ev, "annotation_event": ann_ev, "c10d_event": c10_ev,
        "rpc_name": rpc_name, "annotation_name": ann_name, "c10d_name": c10_name,
        "link": np.array(["none", "external_id", "containment"], dtype=object)[link_s],
        "collective_name": cname, "name_source": name_source, "dtype": dtype,
        "in_nelems": in_n, "out_nelems": out_n, "size_source": size_source,
        "group_size": group_size, "group_size_source": gs_source,
        "pg_name": pg_name, "pg_desc": pg_desc, "pg_ranks": pg_ranks, "in_split": in_split, "out_split": out_split,
        "seq": seq, "no_ids": no_ids,
    }
    columns["cpu_op_event"] = np.where(rpc_ev >= 0, rpc_ev, np.where(ann_ev >= 0, ann_ev, columns["c10d_event"]))
    columns["cpu_op_name"] = np.where(rpc_ev >= 0, columns.pop("rpc_name"),
                                      np.where(ann_ev >= 0, columns.pop("annotation_name"), columns.pop("c10d_name")))
    # rows in (ts, event) order, text as object arrays (None when missing);
    # kernels usually come in that order already: then no column is gathered,
    # only the strided views of the kernel records are copied
    order = np.lexsort((columns["event"], columns["ts"]))
    if (order == np.arange(n)).all():
        order = slice(None)
    rows = {k: np.ascontiguousarray(v[order]) if v.dtype.kind in "iufb" else np.asarray(v, dtype=object)[order]
            for k, v in columns.items()}

    # per-rank findings
    n_nolaunch = int((rows["launch_event"] < 0).sum())
    if n_nolaunch:
        quality.append(_finding("info", "no_launch", f"rank {rank}: {n_nolaunch} collective kernel(s) without a launch "
                                "record (launched before the profiling window opened); kept, unattributed",
                                rank=rank, count=n_nolaunch))
    n_noop = int((rows["cpu_op_event"] < 0).sum())
    if n_noop:
        quality.append(_finding("info", "no_cpu_op", f"rank {rank}: {n_noop} collective kernel(s) not linked to a "
                                "collective CPU op (record_param_comms / nccl:* / c10d::*)", rank=rank, count=n_noop))
    n_noids = int(no_ids.sum())
    if n_noids:
        quality.append(_finding("info", "no_ids", f"rank {rank}: {n_noids} NCCL kernel(s) with neither correlation nor "
                                "External id (TraceLens drops these; kept here)", rank=rank, count=n_noids))
    n_cpu = int((sel_by == "cpu_op").sum() + (sel_by == "comm_args").sum())
    if n_cpu:
        quality.append(_finding("info", "linked_kernels", f"rank {rank}: {n_cpu} kernel(s) without an NCCL/RCCL name "
                                "identified as collectives through their CPU op or comm args", rank=rank, count=n_cpu))
    n_unknown = int((rows["collective_name"] == None).sum())  # noqa: E711 - elementwise, on an object array
    if n_unknown:
        quality.append(_finding("info", "unknown_kind", f"rank {rank}: {n_unknown} collective kernel(s) whose "
                                "collective kind is unknown (no Collective name arg, no collective CPU op)",
                                rank=rank, count=n_unknown))
    return rows, quality


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
            "seq": "int64", "no_ids": bool, "cpu_op_event": "int64", "cpu_op_name": object}
    return {k: np.zeros(0, dtype=v) for k, v in cols.items()}


def rank_row_count(rows):
    """Rows in a RankResult's ``rows``."""
    return len(rows["event"])


# ====================================================================== the stage


def align_frames(frames, align_clocks=None, gpus_per_node=None, tolerance_ns=MATCH_TOLERANCE_NS):
    """The align stage: yield every input frame, then the ``align.*`` tables.

    ``align_clocks``: True/False, or None for "on when the ranks span more than
    one node" (nodes from ``gpus_per_node`` or the first rank's
    ``deviceProperties``).  END frames of the input are dropped and one END is
    written after the tables.  TABLE frames named ``align.*`` already in the
    input (a stream aligned twice) are dropped with a warning.
    """
    yield table_frame("align.options", align_options_table(align_clocks, gpus_per_node, tolerance_ns))
    ranks = _Ranks()
    replaced = False
    for frame in frames:
        kind = frame.kind
        if kind == Kind.END:
            continue
        if kind == Kind.TABLE:
            if frame.table_name().startswith("align."):
                replaced = True
                continue
            yield frame
            continue
        ranks.add(frame)   # first: a rank's end starts its finishing before the frame goes on
        yield frame
    if replaced:
        log.warning("the input already held align tables; they are replaced by this run's")
    results = ranks.results()
    tables = match_ranks(results, align_clocks=align_clocks, gpus_per_node=gpus_per_node, tolerance_ns=tolerance_ns)
    for name in TABLE_NAMES[1:]:
        yield table_frame(name, tables[name])
    yield json_frame(Kind.END, 0, {"stage": "align", "ranks": len(results),
                                   "collective_kernels": int(len(tables["align.collectives"]))})


def align_tables(frames, align_clocks=None, gpus_per_node=None, tolerance_ns=MATCH_TOLERANCE_NS):
    """The ``align.*`` tables of ``frames`` as ``{name: DataFrame}``, for
    callers that want the results, not a stream (``collective-report``): the
    same analysis as ``align_frames`` without encoding the tables into frames
    and decoding them again.  Frames align does not use are dropped."""
    ranks = _Ranks()
    for frame in frames:
        ranks.add(frame)
    tables = match_ranks(ranks.results(), align_clocks=align_clocks, gpus_per_node=gpus_per_node,
                         tolerance_ns=tolerance_ns)
    tables["align.options"] = align_options_table(align_clocks, gpus_per_node, tolerance_ns)
    return tables


class _Ranks:
    """One RankCollector per rank of an interleaved frame sequence; a rank is
    finished (its bulky per-event arrays dropped) at its META frame."""

    def __init__(self):
        self.collectors, self.done = {}, {}

    def add(self, frame):
        kind = frame.kind
        if kind not in (Kind.EVENTS, Kind.STRINGS, Kind.COMMS, Kind.META):
            return
        r = frame.rank
        if r in self.done:
            raise StreamtraceError(f"rank {r} appears twice in the input (two metadata frames)")
        c = self.collectors.get(r)
        if c is None:
            c = self.collectors[r] = RankCollector(r)
        c.add(frame)
        if kind == Kind.META:
            # in a thread: in a chain, correlate finishes the rank meanwhile
            # (the last rank's finishing is otherwise all in the chain's tail)
            self.done[r] = in_thread(functools.partial(finish_rank, self.collectors.pop(r)), name="streamtrace-align-finish")

    def results(self):
        """RankResult of every rank, in rank order (unfinished ranks finished now)."""
        for r, c in self.collectors.items():
            self.done[r] = in_thread(functools.partial(finish_rank, c))
        self.collectors = {}
        return [self.done[r].result() for r in sorted(self.done)]


def align_options_table(align_clocks=None, gpus_per_node=None, tolerance_ns=MATCH_TOLERANCE_NS):
    """The one-row ``align.options`` table (strings; '' = automatic/absent)."""
    options = {"align_clocks": align_clocks, "gpus_per_node": gpus_per_node, "tolerance_ns": tolerance_ns,
               "version": VERSION}
    return pd.DataFrame({k: pd.Series(["" if v is None else str(v)], dtype=object) for k, v in options.items()})


# ====================================================================== across ranks


def _rank_key(text, cache):
    """Normalised rank list of a ``Process Group Ranks`` string: (key, tuple, truncated)."""
    if text in cache:
        return cache[text]
    ranks, truncated = coll.parse_rank_list(text)
    if ranks is None:
        key = "" if text is None else str(text).strip()
    else:
        key = ",".join(map(str, ranks)) + (",..." if truncated else "")
    cache[text] = (key, ranks, truncated)
    return cache[text]


def _median(x):
    return float(np.median(x)) if len(x) else 0.0


def _score(s_sig, s_end, c_sig, c_end, k, tol):
    m, n = len(s_sig), len(c_sig)
    i0, i1 = max(0, -k), min(m, n - k)
    if i1 <= i0:
        return None
    eq = s_sig[i0:i1] == c_sig[i0 + k:i1 + k]
    diffs = s_end[i0:i1] - c_end[i0 + k:i1 + k]
    neq = int(eq.sum())
    d = _median(diffs[eq]) if neq else _median(diffs)
    consistent = int((eq & (np.abs(diffs - d) <= tol)).sum())
    return (consistent, neq, i1 - i0, -abs(d), -abs(k)), d


def align_sequences(s_sig, s_end, c_sig, c_end, tol=MATCH_TOLERANCE_NS, band=16):
    """Align one rank's collective sequence S to a consensus sequence C.

    Both are in time order: ``*_sig`` integer signatures, ``*_end`` end times
    (ns; S on its own clock, C on the reference clock).  Returns
    ``(s_index, c_index, offset, trivial)``: matched pairs, the estimated
    clock offset of S relative to C (ns, None when nothing matched) and
    whether the match was the plain ordinal one (same length, shift 0).

    Shifts k (S[i] <-> C[i+k]) are tried around 0, around the end-aligned
    shift n-m and around the shift suggested by raw end times; the best one
    maximises the number of pairs with equal signatures whose end-time
    difference is within ``tol`` of the median difference, then the number of
    equal signatures, the overlap, and prefers a small offset.  If some pairs
    of the best shift disagree in time, a greedy merge on offset-corrected end
    times repairs gaps in the middle of a sequence.
    """
    m, n = len(s_sig), len(c_sig)
    empty = np.empty(0, dtype=np.int64)
    if m == 0 or n == 0:
        return empty, empty, None, m == n
    # fast paths: shift 0, or end-aligned, with every pair consistent
    quick = []
    for k in sorted({0, n - m}, key=abs):
        sc = _score(s_sig, s_end, c_sig, c_end, k, tol)
        if sc is not None and sc[0][0] == min(m, n):
            quick.append((k, sc[1]))
    if len(quick) == 1:
        k, d = quick[0]
        best_k, best_d = k, d
    else:
        cands = set()
        if m + n <= 8 * band:
            cands.update(range(-(m - 1), n))
        else:
            bases = {0, n - m}
            j = np.clip(np.searchsorted(c_end, s_end), 0, n - 1)
            jl = np.maximum(j - 1, 0)
            nearest = np.where(np.abs(c_end[jl] - s_end) < np.abs(c_end[j] - s_end), jl, j)
            ks, counts = np.unique(nearest - np.arange(m), return_counts=True)
            bases.update(ks[np.argsort(-counts)[:3]].tolist())
            for b in bases:
                cands.update(range(b - band, b + band + 1))
        best = None
        for k in sorted(cands):
            if not (-(m - 1) <= k <= n - 1):
                continue
            sc = _score(s_sig, s_end, c_sig, c_end, k, tol)
            if sc is not None and (best is None or sc[0] > best[0]):
                best = (sc[0], k, sc[1])
        _, best_k, best_d = best
    k, d = best_k, best_d
    i0, i1 = max(0, -k), min(m, n - k)
    si = np.arange(i0, i1, dtype=np.int64)
    ci = si + k
    res = (s_end[si] - d) - c_end[ci]
    eq = s_sig[si] == c_sig[ci]
    gaps = np.diff(c_end).astype(np.float64) if n > 1 else np.empty(0)
    lo = np.concatenate([[np.inf], gaps])[ci]
    hi = np.concatenate([gaps, [np.inf]])[ci]
    ok = (np.abs(res) <= tol) | (eq & (np.abs(res) < 0.5 * np.minimum(lo, hi)))
    if ok.all():
        return si, ci, d, (m == n and k == 0)
    # greedy repair on corrected times
    t = s_end.astype(np.float64) - d
    gl = np.concatenate([[np.inf], gaps])
    gh = np.concatenate([gaps, [np.inf]])
    out_s, out_c = [], []
    i = j = 0
    while i < m and j < n:
        r = t[i] - c_end[j]
        if abs(r) <= tol or (s_sig[i] == c_sig[j] and abs(r) < 0.5 * min(gl[j], gh[j])):
            out_s.append(i)
            out_c.append(j)
            i += 1
            j += 1
        elif r < 0:
            i += 1
        else:
            j += 1
    return np.array(out_s, dtype=np.int64), np.array(out_c, dtype=np.int64), d, False


def _match_ordinal(g_rank, g_sig, g_end, tol):
    """Slots for the rows of one process group (rows sorted by rank, then time).

    Returns ``(slot, slot_order, info, reference_rank)``: a consensus slot per
    row, the time order of the slots, per rank the match method and the number
    of its rows without a counterpart, and the rank used as reference.
    """
    ranks, starts = np.unique(g_rank, return_index=True)
    bounds = list(starts) + [len(g_rank)]
    span = {int(r): (bounds[i], bounds[i + 1]) for i, r in enumerate(ranks)}
    counts = {r: b - a for r, (a, b) in span.items()}
    ref = min(counts, key=lambda r: (-counts[r], r))
    a, b = span[ref]
    slot = np.full(len(g_rank), -1, dtype=np.int64)
    cons_sig = g_sig[a:b].copy()
    cons_end = g_end[a:b].astype(np.int64)
    cons_id = np.arange(b - a, dtype=np.int64)
    slot[a:b] = cons_id
    next_id = b - a
    info = {ref: ("ordinal", 0)}
    for r in sorted(span):
        if r == ref:
            continue
        a, b = span[r]
        s_sig, s_end = g_sig[a:b], g_end[a:b]
        si, ci, d, trivial = align_sequences(s_sig, s_end, cons_sig, cons_end, tol)
        slot[a + si] = cons_id[ci]
        unmatched = np.setdiff1d(np.arange(b - a), si)
        info[r] = ("ordinal" if trivial else "aligned", len(unmatched))
        if len(unmatched):
            new_ids = np.arange(next_id, next_id + len(unmatched), dtype=np.int64)
            next_id += len(unmatched)
            slot[a + unmatched] = new_ids
            times = s_end[unmatched] - int(round(d or 0))
            cons_sig = np.concatenate([cons_sig, s_sig[unmatched]])
            cons_end = np.concatenate([cons_end, times])
            cons_id = np.concatenate([cons_id, new_ids])
            order = np.argsort(cons_end, kind="stable")
            cons_sig, cons_end, cons_id = cons_sig[order], cons_end[order], cons_id[order]
    position = np.empty(next_id, dtype=np.int64)
    position[cons_id] = np.arange(len(cons_id))
    return slot, position, info, ref


def estimate_clock_offsets(inst, rank, end):
    """Per-rank clock offsets from collective end times (B4).

    ``inst``, ``rank``, ``end`` (ns) describe participations in collectives
    that end together on every rank.  Model: end = common_end[inst] +
    offset[rank] + noise.  Offsets start from a weighted least-squares fit of
    the per-pair median differences and are refined by alternating medians, so
    a few outliers do not move them.  The lowest rank of each connected set of
    ranks is the reference (offset 0).

    Returns ``{rank: dict(offset_ns, residual_ns, max_residual_ns, collectives,
    reference_rank)}`` for every rank in ``rank``.
    """
    inst = np.asarray(inst, dtype=np.int64)
    rank = np.asarray(rank, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    out = {}
    if not len(inst):
        return out
    ranks = np.unique(rank)
    ri = np.searchsorted(ranks, rank).astype(np.int64)
    # connected components (union-find over instances)
    parent = list(range(len(ranks)))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    order = np.lexsort((ri, inst))
    inst_o, ri_o, end_o = inst[order], ri[order], end[order]
    first = np.r_[True, inst_o[1:] != inst_o[:-1]]
    head = np.maximum.accumulate(np.where(first, np.arange(len(inst_o)), 0))
    R = len(ranks)
    pair_keys = np.unique(ri_o[head] * R + ri_o)  # (head rank, rank) pairs as one integer: 10x faster than axis=0
    links = np.stack([pair_keys // R, pair_keys % R], axis=1)
    for x, y in links.tolist():
        fx, fy = find(x), find(y)
        if fx != fy:
            parent[max(fx, fy)] = min(fx, fy)
    comp = np.array([find(i) for i in range(len(ranks))])
    # pairwise medians against the lowest rank of each instance
    pa, pb = ri_o[head], ri_o
    diff = (end_o - end_o[head]).astype(np.float64)
    keep = pa != pb
    offset = np.zeros(len(ranks))
    if keep.any():
        pair, d_med, size = _medians_by(pa[keep] * R + pb[keep], diff[keep])   # by (a, b), sorted
        rows_a = np.zeros((len(pair) + R, R))
        rhs = np.zeros(len(pair) + R)
        w = np.sqrt(size.astype(np.float64))
        idx = np.arange(len(pair))
        rows_a[idx, pair % R] = w
        rows_a[idx, pair // R] -= w
        rhs[: len(pair)] = d_med * w
        big = 1e3 * (w.max() if len(w) else 1.0)
        for i in range(R):  # gauge: the reference of each component is 0
            if comp[i] == i:
                rows_a[len(pair) + i, i] = big
        offset = np.linalg.lstsq(rows_a, rhs, rcond=None)[0]
    # refine with alternating medians (robust to outliers)
    # float64 only after removing the common part: epoch ns do not fit a double's 53 bits
    e = (end_o - end_o.min()).astype(np.float64)
    # instance ids as 0..n-1 (rows are sorted by instance): a row's common end is its group's
    inst_id = np.cumsum(first) - 1
    # every rank has rows (ranks come from them), so per-rank results are
    # indexed by the rank's position 0..R-1
    for _ in range(4):
        common = _medians_by(inst_id, e - offset[ri_o])[1][inst_id]
        offset = _medians_by(ri_o, e - common)[1]
        offset -= offset[comp]
    common = _medians_by(inst_id, e - offset[ri_o])[1][inst_id]
    resid = np.abs(e - offset[ri_o] - common)
    _, res_med, size = _medians_by(ri_o, resid)
    res_max = np.full(len(ranks), -np.inf)
    np.maximum.at(res_max, ri_o, resid)
    for i, r in enumerate(ranks):
        out[int(r)] = {"offset_ns": int(round(offset[i])), "residual_ns": float(res_med[i]),
                       "max_residual_ns": float(res_max[i]), "collectives": int(size[i]),
                       "reference_rank": int(ranks[comp[i]])}
    return out


def _medians_by(group, values):
    """(group ids present, sorted; the median of each one's values; its
    count): pandas' groupby median (the mean of the two middle values for an
    even count) without building a grouper.  ``group`` holds non-negative
    ints; values must not be NaN."""
    g, v = group, values
    if len(g) > 1 and (g[1:] < g[:-1]).any():
        small = g.max() < 1 << 16
        order = np.argsort(g.astype(np.uint16) if small else g, kind="stable")   # 16 bits: a radix sort
        g, v = g[order], v[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]]) if len(g) else np.zeros(0, dtype=np.int64)
    counts = np.diff(np.r_[starts, len(g)])
    n_groups, width = len(starts), int(counts.max()) if len(counts) else 0
    if n_groups * width <= 4 * len(v) + 4096:
        # groups of similar sizes (an instance's ranks, a rank's instances):
        # sorted as the rows of one block, padded with +inf past their ends
        block = np.full(n_groups * width, np.inf)
        block[np.arange(len(v)) + np.repeat(np.arange(n_groups) * width - starts, counts)] = v
        block = block.reshape(n_groups, width)
        block.sort(axis=1)
        rows = np.arange(n_groups)
        lower, upper = block[rows, (counts - 1) // 2], block[rows, counts // 2]
    else:
        v = v[np.lexsort((v, g))]
        lower, upper = v[starts + (counts - 1) // 2], v[starts + counts // 2]
    return g[starts], (upper + lower) / 2, counts


def _nodes(results, gpus_per_node):
    if gpus_per_node:
        return int(gpus_per_node)
    for res in results:
        if res.meta.get("gpus"):
            return int(res.meta["gpus"])
    return None


def _world_size(results):
    sizes = [res.meta.get("world_size") for res in results if res.meta.get("world_size")]
    return max(sizes) if sizes else (len(results) if results else None)


#: fields that must agree across participants (A5.3; for all_to_allv A5.5 without stream)
MISMATCH_FIELDS = (("pg", "Process Group Name"), ("pg_ranks", "Process Group Ranks"),
                   ("collective_name", "Collective name"), ("group_size", "Group size"), ("dtype", "dtype"),
                   ("in_nelems", "In msg nelems"), ("out_nelems", "Out msg nelems"))


def _combined_rows(results):
    """The collective rows of every rank as ``{column: numpy array}``, sorted
    by rank, time and event, with ``rank`` and ``base_ns`` columns."""
    parts = [res for res in results if rank_row_count(res.rows)]
    lengths = [rank_row_count(res.rows) for res in parts]
    d = {col: np.concatenate([res.rows[col] for res in parts]) for col in parts[0].rows}
    d["rank"] = np.repeat(np.array([res.rank for res in parts], dtype=np.int64), lengths)
    d["base_ns"] = np.repeat(np.array([res.meta.get("base_ns") or 0 for res in parts], dtype=np.int64), lengths)
    order = np.lexsort((d["event"], d["ts"], d["rank"]))
    if (order != np.arange(len(order))).any():  # each rank's rows come sorted: usually nothing to do
        d = {col: v[order] for col, v in d.items()}
    return d


def _process_groups(d, quality):
    """(pg, pg_key, simplified): the group name of each row (its pg_name, else
    "all" in simplified mode or "Unknown_Group"), and the matching key: the
    name, tagged with the lowest rank when disjoint rank sets share it."""
    name = Text.of(d["pg_name"])
    stream, rank = d["stream"], d["rank"]
    rank_starts = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1]])
    one_stream = (np.minimum.reduceat(stream, rank_starts) == np.maximum.reduceat(stream, rank_starts)).all()
    simplified = bool(name.missing().all() and one_stream)
    pg = name.recode(str, "all" if simplified else "Unknown_Group")
    cache = {}
    rkey = Text.of(d["pg_ranks"]).recode(lambda t: _rank_key(t, cache)[0], _rank_key(None, cache)[0])
    nk = len(rkey.uniques)
    rk = rkey.codes.copy()
    # rows of a named group without a rank list join the group's only list
    empty = [k for k, u in enumerate(rkey.uniques.tolist()) if u == ""]
    if empty:
        for p, ks in _lists_by_group(pg.codes, rk, nk).items():
            others = [k for k in ks if k != empty[0]]
            if empty[0] in ks and len(others) == 1:
                rk[(pg.codes == p) & (rk == empty[0])] = others[0]
    # one key per (name, rank list); a name with several rank lists is split
    lists = _lists_by_group(pg.codes, rk, nk)
    label = {}
    for p in sorted(lists, key=lambda p: pg.uniques[p]):
        name_p, ks = pg.uniques[p], lists[p]
        if len(ks) == 1:
            label[(p, ks[0])] = name_p
            continue
        for k in ks:
            key = rkey.uniques[k]
            ranks_k = [int(x) for x in key.split(",") if x.lstrip("-").isdigit()]
            tag = f"@r{min(ranks_k)}" if ranks_k else f"@{key or '?'}"
            label[(p, k)] = name_p + tag
        quality.append(_finding("warning", "shared_pg_name", f"process group name {name_p!r} is used by "
                                f"{len(ks)} disjoint rank sets; they are told apart by their rank lists "
                                "(TraceLens merges them and aborts with 'Metadata mismatch')", pg=name_p))
    pair_of_row = pg.codes * nk + rk
    pairs = np.unique(pair_of_row)
    labels = np.empty(len(pairs), dtype=object)
    for i, pair in enumerate(pairs.tolist()):
        labels[i] = label[divmod(pair, nk)]
    pair_codes, uniques = pd.factorize(labels)  # equal labels share a code
    pg_key = Text(pair_codes.astype(np.int64)[np.searchsorted(pairs, pair_of_row)], np.asarray(uniques, dtype=object))
    return pg, pg_key, simplified


def _lists_by_group(pg, rk, nk):
    """``{pg code: [rank-list codes]}`` of the (pg, rank list) pairs present."""
    lists = {}
    for pair in np.unique(pg * nk + rk).tolist():
        p, k = divmod(pair, nk)
        lists.setdefault(p, []).append(k)
    return lists


def _signatures(cname, kernel_kind, dtype, a2av, inn, out):
    """Integer signature per row: collective name (or kernel token), dtype,
    and sizes except for all_to_allv (whose sizes differ per rank).  Only
    equality of signatures matters."""
    texts = np.array([str(u) for u in cname.uniques.tolist()] + ["~" + str(u) for u in kernel_kind.uniques.tolist()]
                     + ["~?"], dtype=object)
    token = np.where(kernel_kind.codes >= 0, kernel_kind.codes, len(kernel_kind.uniques))
    name_code = pd.factorize(texts)[0][np.where(cname.codes >= 0, cname.codes, len(cname.uniques) + token)]
    dtype_code = dtype.recode(str, "?").codes
    return group_ids(name_code, dtype_code, np.where(a2av, -2, inn), np.where(a2av, -2, out))


def _disagree(values, inst, n_inst):
    """Per row: do the rows of its instance hold different ``values``
    (integers: codes or numbers)?"""
    lo = np.full(n_inst, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(n_inst, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(lo, inst, values)
    np.maximum.at(hi, inst, values)
    return (lo != hi)[inst]


def _seq_slots(g_rank, g_seq, key, quality):
    """Slots of one process group whose rows all carry Seq: (slot, match keys)."""
    occ = occurrence(group_ids(g_rank, g_seq))
    slot = dense_rank(g_seq, occ)
    seq_values, seq_inv = np.unique(g_seq, return_inverse=True)
    keys = np.array([f"seq={v}" for v in seq_values.tolist()], dtype=object)[seq_inv]
    dup = np.flatnonzero(occ > 0)
    if len(dup):
        keys[dup] = [f"{k}#{o}" for k, o in zip(keys[dup], occ[dup].tolist())]
    for r in np.unique(g_rank[dup]).tolist():
        quality.append(_finding("warning", "duplicate_seq", f"rank {int(r)}: Seq values repeat in "
                                f"process group {key}", rank=int(r), pg=key))
    return slot, keys


#: collective rows from which match_ranks estimates clock offsets in a forked
#: child while it builds the rows (forking a process that holds every row
#: costs ~20 ms)
_PARALLEL_MIN_ROWS = 20_000

#: match_method values, by code
METHODS = np.array(["seq", "ordinal", "aligned", "unmatched"], dtype=object)
M_SEQ, M_ORDINAL, M_ALIGNED, M_UNMATCHED = 0, 1, 2, 3


def match_ranks(results, align_clocks=None, gpus_per_node=None, tolerance_ns=MATCH_TOLERANCE_NS):
    """Match the collective rows of every rank; return the ``align.*`` tables
    (except ``align.options``) as ``{name: DataFrame}``.

    Rows are numpy arrays throughout; text columns are ``Text`` codes, so
    each step costs a few integer passes over the rows."""
    results = sorted(results, key=lambda r: r.rank)
    quality = []
    for res in results:
        quality += res.quality
    present = [res.rank for res in results]
    quality += _rank_findings(results)
    ranks_table = _ranks_table(results)
    G = _nodes(results, gpus_per_node)
    multi_node = G is not None and len({r // G for r in present}) > 1
    # None: on across nodes.  (collective-report passes False unless asked:
    # TraceLens's columns mean the times as recorded.)  Offsets not applied
    # are still estimated and reported, loudly when applying them would
    # change the answers (_story_findings)
    apply = bool(align_clocks) if align_clocks is not None else multi_node
    if not any(rank_row_count(res.rows) for res in results):
        quality.append(_finding("warning", "no_collectives",
                                f"no collective kernels in {len(results)} rank(s): the report is empty"))
        clocks = pd.DataFrame({"rank": pd.Series(present, dtype="int64"),
                               "offset_ns": np.zeros(len(present), dtype=np.int64),
                               "residual_ns": np.full(len(present), np.nan),
                               "max_residual_ns": np.full(len(present), np.nan),
                               "collectives": np.zeros(len(present), dtype=np.int64),
                               "reference_rank": pd.Series(present, dtype="int64"),
                               "applied": np.full(len(present), apply), "method": ["none"] * len(present)})
        return {"align.ranks": ranks_table, "align.collectives": _empty_collectives(),
                "align.clocks": clocks, "align.quality": quality_table(quality)}
    d = _combined_rows(results)
    n = len(d["rank"])
    rank = d["rank"]
    abs_ts = d["base_ns"] + d["ts"].astype(np.int64, copy=False)
    abs_end = abs_ts + d["dur"].astype(np.int64, copy=False)
    text = {col: Text.of(v) for col, v in d.items() if v.dtype.kind not in "iufb"}
    cname, dtype = text["collective_name"], text["dtype"]

    # ---- process groups
    pg, pg_key, simplified = _process_groups(d, quality)
    category = cname.recode(coll.CATEGORY.get, coll.CATEGORY.get(None))
    a2av = category.lookup(lambda u: u == "alltoallv", False, bool)
    sig = _signatures(cname, text["kernel_kind"], dtype, a2av, d["in_nelems"].astype(np.int64, copy=False),
                      d["out_nelems"].astype(np.int64, copy=False))

    # ---- slots within each process group
    slot = np.full(n, -1, dtype=np.int64)
    position = np.full(n, -1, dtype=np.int64)
    method = np.full(n, M_ORDINAL, dtype=np.int8)
    mkey = np.empty(n, dtype=object)
    seq = d["seq"].astype(np.int64, copy=False)
    by_key = np.argsort(pg_key.codes, kind="stable")
    bounds = np.r_[0, np.cumsum(np.bincount(pg_key.codes, minlength=len(pg_key.uniques)))]
    for c in sorted(range(len(pg_key.uniques)), key=lambda c: pg_key.uniques[c]):
        key = pg_key.uniques[c]
        idx = by_key[bounds[c]:bounds[c + 1]]  # ascending: the argsort is stable
        g_rank = rank[idx]
        if (seq[idx] != NONE).all():
            s, keys = _seq_slots(g_rank, seq[idx], key, quality)
            slot[idx] = s
            position[idx] = s
            method[idx] = M_SEQ
            mkey[idx] = keys
            continue
        s, pos_of_slot, info, ref = _match_ordinal(g_rank, sig[idx], abs_end[idx], tolerance_ns)
        slot[idx] = s
        position[idx] = pos_of_slot[s]
        ranks_g, inv = np.unique(g_rank, return_inverse=True)
        method[idx] = np.array([M_ALIGNED if info[r][0] == "aligned" else M_ORDINAL for r in ranks_g.tolist()],
                               dtype=np.int8)[inv]
        for r, (how, unmatched) in info.items():
            if how == "aligned":
                quality.append(_finding("info", "sequence_aligned", f"rank {r}: its collectives in process group {key} "
                                        f"do not line up one-to-one with reference rank {ref}'s (profiling window "
                                        "starts or ends at another collective, or one is missing); aligned by "
                                        f"signature and end time, {unmatched} without a counterpart",
                                        rank=r, pg=key, count=unmatched))
    # ordinal index per pg: the positions compacted to 0..n-1
    dense = dense_rank(pg_key.codes, position)
    group_first = np.full(len(pg_key.uniques), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(group_first, pg_key.codes, dense)
    index_in_group = dense - group_first[pg_key.codes]
    is_seq = method == M_SEQ
    if not is_seq.all():
        ix_values, ix_inv = np.unique(index_in_group[~is_seq], return_inverse=True)
        mkey[~is_seq] = np.array([f"ordinal={v}" for v in ix_values.tolist()], dtype=object)[ix_inv]
    inst = group_ids(pg_key.codes, slot)
    n_inst = int(inst.max()) + 1
    participants = np.bincount(inst)[inst]
    # a row alone in its instance, in a group that other ranks take part in
    pairs = group_ids(pg_key.codes, rank)
    _, first_of_pair = np.unique(pairs, return_index=True)
    ranks_per_group = np.bincount(pg_key.codes[first_of_pair], minlength=len(pg_key.uniques))
    single = (participants == 1) & ~is_seq
    method[single & (ranks_per_group[pg_key.codes] > 1)] = M_UNMATCHED

    # ---- names, categories, sizes
    kind = cname.recode(coll.KIND.get, coll.KIND.get(None))
    implicit_sync = category.isin(coll.IMPLICIT_SYNC)
    bytes_per_elem = dtype.lookup(lambda u: float(coll.DTYPE_BYTES[u]) if u in coll.DTYPE_BYTES else np.nan,
                                  np.nan, np.float64)
    # group size from the instance when no arg or pg_config gives it
    world = _world_size(results)
    gs = d["group_size"].astype(np.int64, copy=False).copy()
    gsrc = text["group_size_source"]
    infer = (gs == NONE) & pg.isin(("Unknown_Group", "all"))
    if infer.any() and world:
        full = infer & (participants == world)
        gs[full] = world
        gsrc = gsrc.assign(full, "world_size")
    # output sizes of all-gather / reduce-scatter that needed the group size
    inn, out = d["in_nelems"].astype(np.int64, copy=False), d["out_nelems"].astype(np.int64, copy=False).copy()
    fix = (out == NONE) & (inn != NONE) & (gs != NONE) & (gs > 0)
    ag, rs = fix & kind.isin(("allgather",)), fix & kind.isin(("reducescatter",))
    out[ag] = inn[ag] * gs[ag]
    out[rs] = inn[rs] // np.maximum(gs[rs], 1)

    # ---- checks per instance
    a2av_inst = np.zeros(n_inst, dtype=bool)
    a2av_inst[inst[a2av]] = True
    a2av_row = a2av_inst[inst]
    values = {"pg": pg.codes, "pg_ranks": text["pg_ranks"].codes, "collective_name": cname.codes, "group_size": gs,
              "dtype": dtype.codes, "in_nelems": inn, "out_nelems": out}
    checks = []
    for col, label in MISMATCH_FIELDS:
        bad = _disagree(values[col], inst, n_inst)
        if col in ("in_nelems", "out_nelems"):
            bad &= ~a2av_row
        checks.append((label, bad))
    mismatch_fields = joined_labels(checks, ",")
    metadata_mismatch = mismatch_fields.lookup(lambda u: u != "", False, bool)
    stream_mismatch = _disagree(d["stream"].astype(np.int64, copy=False), inst, n_inst)

    # ---- clocks
    sync = implicit_sync & (participants > 1)
    if not sync.any():
        sync = participants > 1
        clock_method = "all_collectives"
    else:
        clock_method = "implicit_sync_ends"
    est_args = (inst[sync], rank[sync], abs_end[sync])

    def clocks_table(est):
        clock_rows = []
        for r in present:
            e = est.get(r)
            if e is None:
                clock_rows.append({"rank": r, "offset_ns": 0, "residual_ns": math.nan, "max_residual_ns": math.nan,
                                   "collectives": 0, "reference_rank": r, "applied": apply, "method": "none"})
            else:
                clock_rows.append({"rank": r, **e, "applied": apply, "method": clock_method})
        values = {c: [row[c] for row in clock_rows] for c in CLOCK_COLUMNS}
        dtypes = {"rank": np.int64, "offset_ns": np.int64, "collectives": np.int64, "reference_rank": np.int64,
                  "applied": bool, "residual_ns": np.float64, "max_residual_ns": np.float64}
        return pd.DataFrame({c: np.array(v, dtype=dtypes[c]) if c in dtypes else pd.Series(v)
                             for c, v in values.items()})

    def rows_table(applied_off):
        """align.collectives with these clock offsets, and its findings."""
        ts_aligned = abs_ts - applied_off
        # ---- instance order (by first start, process group, index), ids, collective_id
        first_ts = np.full(n_inst, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(first_ts, inst, ts_aligned)
        inst_pg = np.empty(n_inst, dtype=np.int64)
        inst_pg[inst] = pg_key.codes
        inst_ix = np.empty(n_inst, dtype=np.int64)
        inst_ix[inst] = index_in_group
        by_time = np.lexsort((inst_ix, pg_key.sort_rank()[inst_pg], first_ts))
        new_id = np.empty(n_inst, dtype=np.int64)
        new_id[by_time] = np.arange(n_inst)
        instance = new_id[inst]
        inst_ids = np.empty(n_inst, dtype=object)  # collective_id per instance code: "<pg>_<index>"
        for p, prefix in enumerate([""] * len(pg_key.uniques) if simplified else
                                   [f"{u}_" for u in pg_key.uniques.tolist()]):
            of_pg = np.flatnonzero(inst_pg == p)   # a few groups: one string join per instance
            inst_ids[of_pg] = [prefix + ix for ix in map(str, inst_ix[of_pg].tolist())]
        collective_id = Text(inst, inst_ids)

        # ---- rows in (instance, rank) order: one take per column (text columns
        # as codes: the objects are looked up after the take, from a few values)
        order = np.lexsort((rank, instance))
        cols = {"instance": instance, "collective_id": collective_id, "index_in_group": index_in_group,
                "pg": pg, "pg_key": pg_key, "match_key": mkey,
                "clock_offset_ns": applied_off, "ts_aligned_ns": ts_aligned, "dur_aligned_ns": d["dur"],
                "ts_ns": d["ts"], "dur_ns": d["dur"], "launch_ts_ns": d["launch_ts"], "launch_dur_ns": d["launch_dur"],
                "category": category, "kind": kind, "implicit_sync": implicit_sync,
                "bytes_per_elem": bytes_per_elem, "group_size": gs, "group_size_source": gsrc, "out_nelems": out,
                "participants": participants, "metadata_mismatch": metadata_mismatch,
                "mismatch_fields": mismatch_fields, "stream_mismatch": stream_mismatch}
        for col in COLLECTIVE_COLUMNS:
            if col not in cols and col not in ("match_method", "in_bytes", "out_bytes", "flags"):  # those come below
                cols[col] = text.get(col, d[col])
        cols["no_ids"] = d["no_ids"]
        cols = {col: v.take(order) for col, v in cols.items()}  # ndarray.take or Text.take
        row_method = method[order]
        cols["match_method"] = Text(row_method.astype(np.int64, copy=False), METHODS)

        # ---- flags and findings
        # a size no message can have (negative, or above MAX_MESSAGE_BYTES:
        # 2^62 elements overflow int64 bytes) is unknown, never a wrapped number
        implausible = np.zeros(n, dtype=bool)
        for src in ("in_nelems", "out_nelems"):
            v = cols[src].astype(np.int64, copy=False)
            bad = (v != NONE) & ((v < 0) | (v * np.nan_to_num(cols["bytes_per_elem"], nan=1.0) > MAX_MESSAGE_BYTES))
            if bad.any():
                cols[src] = np.where(bad, NONE, v)
                implausible |= bad
        cols["flags"] = _flags(cols, row_method, cname.missing()[order])
        findings = _instance_findings(cols, row_method, present)
        if implausible.any():
            findings.append(_finding("warning", "implausible_size", f"{int(implausible.sum())} collective kernel row(s) "
                                     "give In/Out msg nelems no message can have (negative, or over 1 TiB): "
                                     "their sizes are left unknown (flag size_unknown)", count=int(implausible.sum())))
        bpe = cols["bytes_per_elem"]
        for src, dst in (("in_nelems", "in_bytes"), ("out_nelems", "out_bytes")):
            v = cols[src]
            ok = (v != NONE) & ~np.isnan(bpe)
            vals = np.zeros(n, dtype=np.int64)
            vals[ok] = v[ok] * bpe[ok].astype(np.int64, copy=False)
            cols[dst] = pd.arrays.IntegerArray(vals, ~ok)
        # nullable integers (the arrays are this function's own: no copy needed)
        for col in ("in_nelems", "out_nelems", "group_size", "seq", "launch_ts_ns", "launch_dur_ns", "launch_tid",
                    "correlation", "external_id"):
            v = cols[col].astype(np.int64, copy=False)
            cols[col] = pd.arrays.IntegerArray(v, v == NONE)
        for col in ("stream", "device"):
            v = cols[col].astype(np.int64, copy=False)
            cols[col] = pd.arrays.IntegerArray(v, v == -1)
        columns = {}
        for col in COLLECTIVE_COLUMNS:  # text columns: plain object dtype, None for missing
            v = cols[col]
            if isinstance(v, Text):
                v = v.objects()
            columns[col] = pd.Series(v, dtype=object, copy=False) if v.dtype == object else v
        # copy=False: one block per column instead of copying them into 2-D blocks
        out_df = pd.DataFrame(columns, copy=False)
        return out_df, findings

    if apply:
        clocks = clocks_table(estimate_clock_offsets(*est_args))
        offs = dict(zip(clocks["rank"].tolist(), clocks["offset_ns"].tolist()))
        ranks_u, rank_inv = np.unique(rank, return_inverse=True)
        out_df, row_findings = rows_table(np.array([offs[r] for r in ranks_u.tolist()], dtype=np.int64)[rank_inv])
    else:
        # the offsets change no row, only align.clocks: on two cores (large
        # sets) they are estimated in a forked child while the rows are built
        (out_df, row_findings), est = both(functools.partial(rows_table, np.zeros(n, dtype=np.int64)),
                                           functools.partial(estimate_clock_offsets, *est_args),
                                           fork=n >= _PARALLEL_MIN_ROWS and available_cpus() > 1)
        clocks = clocks_table(est)
        quality += _story_findings(clocks, inst[sync], rank[sync], abs_ts[sync])
    quality += _clock_findings(clocks, apply, multi_node, G) + row_findings
    return {"align.ranks": ranks_table, "align.collectives": out_df, "align.clocks": clocks,
            "align.quality": quality_table(quality)}


def _flags(cols, method, name_missing):
    checks = (("no_launch", cols["launch_event"] < 0), ("no_cpu_op", cols["cpu_op_event"] < 0),
              ("no_ids", cols["no_ids"]), ("unmatched", method == M_UNMATCHED), ("aligned", method == M_ALIGNED),
              ("metadata_mismatch", cols["metadata_mismatch"]), ("stream_mismatch", cols["stream_mismatch"]),
              ("size_unknown", (cols["in_nelems"].astype(np.int64) == NONE) | np.isnan(cols["bytes_per_elem"])),
              ("kind_unknown", name_missing))
    return joined_labels(checks, ";")


def _instance_findings(cols, method, present):
    """Findings over the output rows (sorted by instance, then rank)."""
    out = []
    pg_ranks, pg_key = cols["pg_ranks"], cols["pg_key"]
    inst = cols["instance"]
    firsts = np.flatnonzero(np.r_[True, inst[1:] != inst[:-1]])  # first row of each instance
    mm = firsts[cols["metadata_mismatch"][firsts]]
    if len(mm):
        first_id, first_fields = cols["collective_id"].at(mm[0]), cols["mismatch_fields"].at(mm[0])
        out.append(_finding("warning", "metadata_mismatch", f"{len(mm)} collective instance(s) whose participants "
                            f"disagree on metadata (first: {first_id}: {first_fields});"
                            " rows are flagged, not dropped", collective_id=first_id, count=len(mm)))
    um = np.flatnonzero(method == M_UNMATCHED)
    if len(um):  # per (rank, process group), in that order
        r, k = cols["rank"][um], pg_key.sort_rank()[pg_key.codes[um]]
        o = np.lexsort((k, r))
        r, c = r[o], pg_key.codes[um][o]
        starts = np.flatnonzero(np.r_[True, (r[1:] != r[:-1]) | (c[1:] != c[:-1])])
        counts = np.diff(np.r_[starts, len(r)])
        for rr, cc, count in zip(r[starts].tolist(), c[starts].tolist(), counts.tolist()):
            key = pg_key.uniques[cc]
            out.append(_finding("warning", "unmatched", f"rank {rr}: {count} collective(s) of process group {key} "
                                "have no counterpart on any other rank", rank=rr, pg=key, count=count))
    neg = np.flatnonzero(cols["dur_ns"] < 0)
    if len(neg):  # per (rank, process group): recorded as is, but every latency built on them is wrong
        r, c = cols["rank"][neg], pg_key.codes[neg]
        o = np.lexsort((pg_key.sort_rank()[c], r))
        r, c = r[o], c[o]
        starts = np.flatnonzero(np.r_[True, (r[1:] != r[:-1]) | (c[1:] != c[:-1])])
        counts = np.diff(np.r_[starts, len(r)])
        for rr, cc, count in zip(r[starts].tolist(), c[starts].tolist(), counts.tolist()):
            key = pg_key.uniques[cc]
            out.append(_finding("error", "negative_duration", f"rank {rr}: {count} collective kernel(s) of process "
                                f"group {key} have a negative duration in the trace; kept as recorded, so their "
                                "latencies and skews are wrong", rank=rr, pg=key, count=count))
    # participants against the process group's rank list
    present_set = set(present)

    def expected(text):
        ranks, truncated = coll.parse_rank_list(text)
        return len([r for r in ranks if r in present_set]) if ranks is not None and not truncated else np.nan

    exp = pg_ranks.take(firsts).lookup(expected, np.nan, np.float64)
    partial = firsts[~np.isnan(exp) & (cols["participants"][firsts] < np.nan_to_num(exp, nan=0.0))]
    if len(partial):
        first = cols["collective_id"].at(partial[0])
        out.append(_finding("warning", "partial_instances", f"{len(partial)} collective instance(s) have fewer "
                            f"participants than their process group's ranks present in the input (first: {first})",
                            collective_id=first, count=len(partial)))
    return out


def _rank_findings(results):
    out = []
    world = _world_size(results)
    present = {res.rank for res in results}
    if world and len(present) < world:
        missing = sorted(set(range(world)) - present)
        if missing:
            shown = missing if len(missing) <= 20 else missing[:20] + ["..."]
            out.append(_finding("warning", "missing_ranks", f"{len(missing)} of {world} ranks are absent from the "
                                f"input: {shown}; collectives are matched across the ranks present",
                                count=len(missing)))
    for res in results:
        m = res.meta
        if m.get("truncated_at_byte") is not None:
            out.append(_finding("warning", "truncated_input", f"rank {res.rank}: {m.get('source')} is truncated at "
                                f"byte {m['truncated_at_byte']}; events after the cut are missing", rank=res.rank))
        for w in m.get("warnings") or []:
            if "truncated" in w and m.get("truncated_at_byte") is not None:
                continue
            out.append(_finding("warning", "extract_warning", w, rank=res.rank))
        counts = m.get("counts") or {}
        bad = counts.get("bad_numbers")
        if bad:
            out.append(_finding("info", "events_dropped", f"rank {res.rank}: {bad} numeric field(s) were unreadable "
                                "and left empty", rank=res.rank, count=bad))
    return out


def _last_arrivers(inst, rank, ts):
    """Per instance (``inst`` codes, any order) with two or more rows: its
    last-arriving rank (largest start, ties -> lowest rank) and its skew in
    start time, as arrays in instance order."""
    order = np.lexsort((rank, -ts, inst))
    i_sorted = inst[order]
    first = np.flatnonzero(np.r_[True, i_sorted[1:] != i_sorted[:-1]])
    counts = np.diff(np.r_[first, len(order)])
    keep = counts > 1
    last = rank[order][first][keep]
    lo = np.minimum.reduceat(ts[order], first)[keep]
    hi = ts[order][first][keep]
    return last, hi - lo


def _story_findings(clocks, inst, rank, ts):
    """A warning when the clock offsets estimated (and not applied) would
    change the answers of the skew, wait and straggler columns: the
    last-arriving rank of at least STORY_CHANGE_SHARE of the implicit-sync
    collectives differs with the offsets applied."""
    if not len(inst):
        return []
    offs = dict(zip(clocks["rank"].tolist(), clocks["offset_ns"].tolist()))
    if not any(offs.values()):
        return []
    ranks_u, inv = np.unique(rank, return_inverse=True)
    off = np.array([offs.get(r, 0) for r in ranks_u.tolist()], dtype=np.int64)[inv]
    last, skew = _last_arrivers(inst, rank, ts)
    last_al, skew_al = _last_arrivers(inst, rank, ts - off)
    n = len(last)
    changed = int((last != last_al).sum())
    if not n or changed < max(1, STORY_CHANGE_SHARE * n):
        return []
    spread = (max(offs.values()) - min(offs.values())) / 1000
    return [_finding("warning", "clock_offsets_change_results",
                     f"CLOCKS DISAGREE: the per-rank clock offsets estimated from collective ends (up to {spread:.1f} "
                     f"us apart, clock_alignment sheet) are not applied, and applying them changes the last-arriving "
                     f"rank of {changed} of {n} collectives and the median skew in start time from "
                     f"{np.median(skew) / 1000:.1f} to {np.median(skew_al) / 1000:.1f} us: the skew, wait, earliest "
                     "arrival and straggler columns use the clocks as recorded (as TraceLens does); rerun with "
                     "--align_clocks for the aligned view", count=changed)]


def _clock_findings(clocks, applied, multi_node, G):
    out = []
    for row in clocks.itertuples(index=False):
        if row.method == "none":
            continue
        if not math.isnan(row.residual_ns) and row.residual_ns > CLOCK_RESIDUAL_WARN_NS:
            out.append(_finding("warning", "clock_residual", f"rank {row.rank}: collective ends disagree by a median "
                                f"{row.residual_ns / 1000:.1f} us after clock alignment (threshold "
                                f"{CLOCK_RESIDUAL_WARN_NS / 1000:.0f} us)", rank=row.rank))
        if not applied and abs(row.offset_ns) > CLOCK_OFFSET_ERROR_NS:
            out.append(_finding("error", "clock_offset", f"rank {row.rank}: its clock is offset by "
                                f"{row.offset_ns / 1e9:.3f} s from rank {row.reference_rank}'s (estimated from "
                                f"collective ends), beyond any real clock skew (> {CLOCK_OFFSET_ERROR_NS / 1e9:g} s): "
                                "skews, waits and xfer_latency in the other sheets are wrong by that much; "
                                "rerun with --align_clocks to apply the offsets", rank=row.rank))
        elif not applied and abs(row.offset_ns) > CLOCK_OFFSET_NOTE_NS:
            out.append(_finding("info", "clock_offset", f"rank {row.rank}: its clock appears offset by "
                                f"{row.offset_ns / 1000:.1f} us from rank {row.reference_rank}'s (estimated from "
                                "collective ends, not applied; use --align_clocks)", rank=row.rank))
    if applied:
        out.append(_finding("info", "clocks_aligned", "per-rank clock offsets (clock_alignment sheet) were applied "
                            "before computing skews and waits" + (" (ranks span more than one node)" if multi_node
                                                                  else "")))
    return out


def _ranks_table(results):
    """align.ranks, built column by column (a DataFrame of row dicts and
    per-column conversions cost ~15 ms for a few rows)."""
    metas = [res.meta for res in results]
    cols = {
        "rank": np.array([res.rank for res in results], dtype=np.int64),
        "source": _objects([m.get("source") for m in metas]),
        "base_ns": np.array([int(m.get("base_ns") or 0) for m in metas], dtype=np.int64),
        "pg_config": _objects([None if m.get("pg_config") is None else _json(m["pg_config"]) for m in metas]),
        "collective_kernels": np.array([rank_row_count(res.rows) for res in results], dtype=np.int64),
        "events": np.array([res.events for res in results], dtype=np.int64),
        "warnings": _objects(["; ".join(m.get("warnings") or []) for m in metas]),
    }
    for col in ("world_size", "trace_rank", "trace_world_size", "gpus", "truncated_at_byte"):
        cols[col] = nullable_ints([m.get(col) for m in metas])
    return pd.DataFrame({col: cols[col] for col in RANK_COLUMNS})


def _missing(v):
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def nullable_ints(values):
    """An Int64 array of values, None or NaN as missing."""
    return pd.array([None if _missing(v) else int(v) for v in values], dtype="Int64")


def _objects(values):
    """An object column of values, None for missing."""
    return pd.Series([None if _missing(v) else v for v in values], dtype=object)


def _json(v):
    return json.dumps(v, separators=(",", ":"), default=str)


def quality_table(findings):
    """Finding dicts as a QUALITY_COLUMNS table: Int64 rank and count, None
    for every missing value (also report's data_quality sheet)."""
    cols = {c: [f.get(c) for f in findings] for c in QUALITY_COLUMNS}
    return pd.DataFrame({c: nullable_ints(v) if c in ("rank", "count") else _objects(v) for c, v in cols.items()})


def _empty_collectives():
    ints = {"instance", "index_in_group", "rank", "event", "pid", "ts_ns", "dur_ns", "base_ns", "clock_offset_ns",
            "ts_aligned_ns", "dur_aligned_ns", "launch_event", "cpu_op_event", "rpc_event", "annotation_event",
            "c10d_event", "participants"}
    nullable = {"device", "stream", "correlation", "external_id", "launch_ts_ns", "launch_dur_ns", "launch_tid",
                "in_nelems", "out_nelems", "in_bytes", "out_bytes", "group_size", "seq"}
    bools = {"implicit_sync", "metadata_mismatch", "stream_mismatch"}
    cols = {}
    for c in COLLECTIVE_COLUMNS:
        if c in ints:
            cols[c] = pd.Series([], dtype="int64")
        elif c in nullable:
            cols[c] = pd.Series([], dtype="Int64")
        elif c in bools:
            cols[c] = pd.Series([], dtype=bool)
        elif c == "bytes_per_elem":
            cols[c] = pd.Series([], dtype="float64")
        else:
            cols[c] = pd.Series([], dtype=object)
    return pd.DataFrame(cols)


def read_align_tables(tables):
    """Check that ``tables`` holds the align tables; return them."""
    missing = [n for n in TABLE_NAMES[1:] if n not in tables]
    if missing:
        raise StreamtraceError("the stream has no align results (" + ", ".join(missing) + "): run 'streamtrace align' "
                               "on it first, e.g. 'streamtrace extract ... | streamtrace align | streamtrace report'")
    return tables


__all__ = ["align_frames", "align_tables", "match_ranks", "RankCollector", "RankResult", "collect_rank",
           "align_sequences", "estimate_clock_offsets", "COLLECTIVE_COLUMNS", "CLOCK_COLUMNS", "QUALITY_COLUMNS", "RANK_COLUMNS",
           "TABLE_NAMES", "classify_string", "read_align_tables"]

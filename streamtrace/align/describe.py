"""One rank's collective kernels, described: ``finish_rank`` turns a
``collect.RankCollector`` into a ``RankResult`` (kernels joined to their
launches and CPU ops, the collective kernels selected, their kind, sizes and
process group filled in from the best source present).  numpy only (no
pandas import)."""
from dataclasses import dataclass, field

import numpy as np

from .. import collectives as coll
from .._native import COMM_DTYPE, NONE, NOSTR
from .collect import OP_ANNOT, OP_C10D, OP_RPC, S_NCCL_NAME, _K_DTYPE, _L_DTYPE, _O_DTYPE, collected_rank
from .quality import _finding


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


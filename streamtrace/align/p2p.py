"""Point-to-point operations (send/recv) matched across ranks, and what a
pipeline-parallel run spends waiting on them.

Per rank (``rank_p2p``, at the end of ``describe.finish_rank``, only when the
rank has point-to-point ops, so other runs pay one check): every
``record_param_comms`` whose ``Collective name`` is ``send`` or ``recv`` is one
*half* of a transfer.  Its peer is the ``Rank`` arg (the peer's rank in the
op's process group, as PyTorch records it) mapped through the group's ranks;
its GPU kernel is the one the op launched, or, for the members of a
``batch_isend_irecv`` group (which launch nothing: one ``nccl:coalesced``
launch follows them), the next collective kernel launched on the same thread
that no ``record_param_comms`` claims.  Also per rank, for the pipeline
sheet: the profiler steps, and per step the busy time and the gaps (bubbles)
of the rank's other kernels (its stage work).

Across ranks (``p2p_tables``): the sends of rank a to rank b in a group meet
the receives of b from a in the same group, in posting order.  A rank whose
window starts or ends mid-run lacks a prefix or suffix of a link's halves, so
the two sides are lined up at the shift whose kernel ends agree best (both
kernels of a transfer end when its data is through); what is left on either
side is listed as unmatched, never dropped.  PyTorch's point-to-point ``Seq``
counts a rank's point-to-point ops in the group (every peer together), so it
orders one rank's halves but does not name the pair.

Tables (only when the run has point-to-point ops):
``align.p2p``            one row per matched pair
``align.p2p_unmatched``  one row per half without a partner, and why (the
                         first UNMATCHED_MAX_ROWS; the rest counted in
                         align.quality); a peer that is the rank itself or
                         outside the world, or a missing kernel, is a reason
``align.pipeline``       per rank and step: P2P wait, bubbles, stage work, the
                         peer waited for most, and which stage bounds the pipeline

numpy only (a rank is described before pandas is loaded); the cross-rank
matching and the tables are in ``p2p_match``.
"""
import numpy as np

from .. import collectives as coll
from .._native import NONE
from ..stream.format import MAX_RANK
from ..stream.packing import arrays


# ======================================================================= per rank
def rank_p2p(ops, comms, rows, kernel_parts, launch_parts, step_parts, strings, meta):
    """One rank's point-to-point halves and per-step stage work, or None when
    the rank has no point-to-point op.  ``ops``/``comms``: the rank's
    collective CPU ops and comm records; ``rows``: its described collective
    kernels; ``*_parts``: the collector's per-frame kernels, launches and
    ProfilerStep spans."""
    if not len(comms) or not len(ops):
        return None
    names = comms["collective_name"].astype(np.int64)
    uniq = np.unique(names)
    kind_of = {int(u): strings[u] for u in uniq.tolist() if 0 <= u < len(strings) and strings[u] in ("send", "recv")}
    if not kind_of:
        return None
    is_p2p_comm = np.isin(names, list(kind_of))
    rpc = np.flatnonzero(ops["kind"] == 2)   # OP_RPC
    if not len(rpc):
        return None
    comm_ev = comms["event"].astype(np.int64)
    order = np.argsort(comm_ev, kind="stable")
    pos = np.minimum(np.searchsorted(comm_ev[order], ops["event"][rpc]), len(order) - 1)
    found = comm_ev[order][pos] == ops["event"][rpc]
    ci = np.where(found, order[pos], -1)
    keep = (ci >= 0) & is_p2p_comm[np.maximum(ci, 0)]
    rpc, ci = rpc[keep], ci[keep]
    del names, is_p2p_comm, comm_ev, order, pos, found, keep
    if not len(rpc):
        return None
    # field by field, never whole records: a million halves are a few
    # columns of a million numbers (strings are shared objects)
    c = {f: comms[f][ci].astype(np.int64) for f in ("collective_name", "pg_name", "rank", "pg_ranks", "in_nelems",
                                                     "dtype", "seq")}
    op = {f: ops[f][rpc].astype(np.int64) for f in ("event", "ts", "tid")}
    del rpc
    text = np.array(strings + [None], dtype=object)
    n_str = len(strings)

    def s(ids):
        ids = np.asarray(ids, dtype=np.int64)
        return text[np.where((ids < 0) | (ids >= n_str), n_str, ids)]

    kind = s(c.pop("collective_name"))
    # one mapping per distinct (Rank arg, group ranks): a few, however many ops
    me = meta.get("rank")
    r_u, r_inv = np.unique(c.pop("rank"), return_inverse=True)
    p_u, p_inv = np.unique(c.pop("pg_ranks"), return_inverse=True)
    pair_u, inv = np.unique(r_inv.reshape(-1) * len(p_u) + p_inv.reshape(-1), return_inverse=True)
    del r_inv, p_inv
    peer = np.array([_global_peer(int(r_u[k // len(p_u)]), s(p_u[k % len(p_u):k % len(p_u) + 1])[0], me)
                     for k in pair_u.tolist()], dtype=np.int64)[inv.reshape(-1)]
    del inv
    disagree = _rank_disagreement(kind, peer, comms["dst_rank"][ci], comms["src_rank"][ci], c["seq"])
    d_u, d_inv = np.unique(c.pop("dtype"), return_inverse=True)
    elem = np.array([coll.DTYPE_BYTES.get(d, np.nan) if d is not None else np.nan for d in s(d_u).tolist()],
                    dtype=np.float64)[d_inv.reshape(-1)]
    del d_inv
    nelems = c.pop("in_nelems")
    nbytes = np.where(nelems != NONE, nelems * elem, np.nan)
    del elem, nelems

    kernel_row = _kernels_of(op, rows)
    has = kernel_row >= 0
    kr = np.maximum(kernel_row, 0)
    n_rows = len(rows["event"])
    n = len(op["event"])
    pick = (lambda col, missing: np.where(has, rows[col][kr], missing)) if n_rows else \
        (lambda col, missing: np.full(n, missing))
    batched = has & (rows["rpc_event"][kr] != op["event"]) if n_rows else np.zeros(n, bool)
    if batched.any():
        sel = np.flatnonzero(batched)
        _name_batched_groups(rows, kernel_row[sel], s(c["pg_name"][sel]), s(comms["pg_desc"][ci[sel]]),
                             s(comms["pg_ranks"][ci[sel]]), comms["group_size"][ci[sel]].astype(np.int64))
    pg_text = text.copy()
    pg_text[n_str] = ""
    halves = {
        "kind": kind, "peer": peer, "pg": pg_text[np.where((c["pg_name"] < 0) | (c["pg_name"] >= n_str), n_str,
                                                         c["pg_name"])],
        "bytes": nbytes, "seq": c["seq"], "post_ts": op["ts"],
        "kernel_event": pick("event", -1).astype(np.int64), "start": pick("ts", NONE).astype(np.int64),
        "end": np.where(has, pick("ts", 0) + pick("dur", 0), NONE).astype(np.int64),
        "batched": batched, "kernel_name": pick("kernel_name", None).astype(object),
    }
    steps = _steps(step_parts, strings)
    halves["step"] = _step_of(steps, halves["post_ts"])
    work = _stage_work(kernel_parts, launch_parts, rows, steps)
    out = {"halves": halves, "steps": steps, "work": work}
    if disagree is not None:
        out["rank_disagrees"] = disagree
    return out


def _rank_disagreement(kind, peer, dst_rank, src_rank, seq):
    """The halves whose peer, from the ``Rank`` arg through the group's
    ranks, is not the global rank their ``Dst Rank`` (send) or ``Src Rank``
    (recv) names, where both are known: ``{"count", "peer", "named",
    "seq"}`` (the last three of the first such half), or None.  The halves
    stay paired by ``Rank``; the finding says the trace contradicts itself."""
    named = np.where(kind == "send", dst_rank, src_rank).astype(np.int64)
    bad = np.flatnonzero((named >= 0) & (peer >= 0) & (named != peer))
    if not len(bad):
        return None
    first = int(bad[0])
    return {"count": len(bad), "peer": int(peer[first]), "named": int(named[first]), "seq": int(seq[first])}


def world_of(results):
    """The world size the ranks' traces state (the largest), or None."""
    sizes = [r.meta.get("world_size") for r in results if r.meta.get("world_size")]
    return max(sizes) if sizes else None


def odd_peers(rank, peer, world):
    """Masks of the halves that can never be paired: a peer that is the rank
    itself, and a known peer outside the world (``world``: its size, or
    None: beyond any rank torch numbers)."""
    itself = (peer >= 0) & (peer == rank)
    outside = (peer >= 0) & ~itself & ((peer > MAX_RANK) | ((peer >= world) if world else False))
    return itself, outside


def _name_batched_groups(rows, kernel_row, pg_name, pg_desc, pg_ranks, group_size):
    """Give a batch_isend_irecv group's kernel (rows ``kernel_row``, in place)
    the process group of its members where it has none: its launch has no
    comm args of its own, and without them align would list it under
    Unknown_Group."""
    for i, k in enumerate(kernel_row.tolist()):
        if rows["pg_name"][k] is None and pg_name[i] is not None:
            rows["pg_name"][k], rows["pg_desc"][k], rows["pg_ranks"][k] = pg_name[i], pg_desc[i], pg_ranks[i]
            if rows["group_size"][k] == NONE and group_size[i] != NONE:
                rows["group_size"][k], rows["group_size_source"][k] = group_size[i], "args"


def _global_peer(local, pg_ranks, me):
    """The global rank of the group-local rank ``local`` (the ``Rank`` arg);
    without one, the other rank of a two-rank group; -1 when unknown."""
    ranks = coll.parse_rank_list(pg_ranks)[0] if pg_ranks else None
    if local == NONE or local < 0:
        others = [r for r in ranks or () if r != me]
        return int(others[0]) if len(others) == 1 and len(ranks) == 2 else -1
    if ranks and local < len(ranks):
        return int(ranks[local])
    return int(local)


def _kernels_of(op, rows):
    """Index into ``rows`` of each op's kernel: the kernel it launched (its
    record_param_comms), else the next collective kernel launched on its
    thread that no record_param_comms claims (a batch_isend_irecv group's
    coalesced launch); -1 when none."""
    n = len(op["event"])
    out = np.full(n, -1, dtype=np.int64)
    if not len(rows["event"]):
        return out
    rpc_ev = rows["rpc_event"].astype(np.int64)
    order = np.argsort(rpc_ev, kind="stable")
    pos = np.minimum(np.searchsorted(rpc_ev[order], op["event"]), len(order) - 1)
    own = rpc_ev[order][pos] == op["event"]
    out[own] = order[pos[own]]
    free = np.flatnonzero((rpc_ev < 0) & (rows["launch_ts"] != NONE))
    if len(free) and (~own).any():
        ltid, lts = rows["launch_tid"][free], rows["launch_ts"][free]
        for t in np.unique(op["tid"][~own]).tolist():
            cand = free[ltid == t]
            if not len(cand):
                continue
            cand = cand[np.argsort(rows["launch_ts"][cand], kind="stable")]
            q = np.flatnonzero(~own & (op["tid"] == t))
            j = np.searchsorted(rows["launch_ts"][cand], op["ts"][q], side="left")
            ok = j < len(cand)
            out[q[ok]] = cand[j[ok]]
    return out


def _steps(step_parts, strings):
    """ProfilerStep spans: {"step", "ts", "end"} arrays in time order."""
    if not step_parts:
        return {"step": np.zeros(0, np.int64), "ts": np.zeros(0, np.int64), "end": np.zeros(0, np.int64)}
    st = np.concatenate(step_parts)
    st = st[np.argsort(st["ts"], kind="stable")]
    num = []
    for sid in st["name"].tolist():
        name = strings[sid] if sid < len(strings) else ""
        try:
            num.append(int(name.split("#", 1)[1]))
        except (IndexError, ValueError):
            num.append(-1)
    return {"step": np.array(num, np.int64), "ts": st["ts"].astype(np.int64),
            "end": (st["ts"] + st["dur"]).astype(np.int64)}


def _step_of(steps, t):
    """The step whose span holds each time (the last one started before it;
    -1 before the first step or when the trace has none)."""
    if not len(steps["ts"]):
        return np.full(len(t), -1, np.int64)
    j = np.searchsorted(steps["ts"], t, side="right") - 1
    return np.where(j >= 0, steps["step"][np.maximum(j, 0)], -1)


def _stage_work(kernel_parts, launch_parts, rows, steps):
    """Per step: busy time of the rank's non-collective kernels (their union)
    and its gaps (the bubbles), each kernel in the step its launch was posted
    in.  {"step", "busy", "bubble", "first", "last"} arrays."""
    empty = {k: np.zeros(0, np.int64) for k in ("step", "busy", "bubble", "first", "last")}
    if not kernel_parts:
        return empty
    k = np.concatenate(list(arrays(kernel_parts)))
    k = k[~np.isin(k["event"], rows["event"])]
    if not len(k):
        return empty
    when = k["ts"].astype(np.int64)
    if launch_parts:
        la = np.concatenate(list(arrays(launch_parts)))
        order = np.argsort(la["corr"], kind="stable")
        pos = np.minimum(np.searchsorted(la["corr"][order], k["corr"]), max(len(order) - 1, 0))
        ok = (len(order) > 0) & (la["corr"][order][pos] == k["corr"]) & (k["corr"] != NONE)
        when = np.where(ok, la["ts"][order][pos], when)
    step = _step_of(steps, when)
    start, end = k["ts"].astype(np.int64), (k["ts"] + k["dur"]).astype(np.int64)
    out = {key: [] for key in empty}
    for s in np.unique(step).tolist():
        m = step == s
        a, b = start[m], end[m]
        o = np.argsort(a, kind="stable")
        a, b = a[o], np.maximum.accumulate(b[o])
        gaps = np.maximum(a[1:] - b[:-1], 0)
        first, last = int(a[0]), int(b[-1])
        out["step"].append(s)
        out["bubble"].append(int(gaps.sum()))
        out["busy"].append(last - first - int(gaps.sum()))
        out["first"].append(first)
        out["last"].append(last)
    return {key: np.array(v, np.int64) for key, v in out.items()}



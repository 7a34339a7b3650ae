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
``align.p2p_unmatched``  one row per half without a partner, and why
``align.pipeline``       per rank and step: P2P wait, bubbles, stage work, the
                         peer waited for most, and which stage bounds the pipeline
"""
import numpy as np
import pandas as pd

from .. import collectives as coll
from .._native import NONE, NOSTR

P2P_COLUMNS = ["pair", "pg", "sender", "receiver", "step", "send_seq", "recv_seq", "send_bytes", "recv_bytes",
               "send_post_us", "recv_post_us", "send_start_us", "recv_start_us", "send_end_us", "recv_end_us",
               "waiter", "waited_for", "wait_us", "transfer_us", "bandwidth_GBps", "send_batched", "recv_batched",
               "send_kernel", "recv_kernel"]
UNMATCHED_COLUMNS = ["rank", "kind", "peer", "pg", "step", "seq", "bytes", "post_us", "start_us", "end_us",
                     "reason"]
PIPELINE_COLUMNS = ["rank", "pipeline", "stage", "step", "p2p_wait_us", "bubble_us", "stage_work_us",
                    "waited_for", "waited_for_us", "p2p_kernels", "bounds_pipeline", "extra_work_us"]
#: how far (in halves) two sides of a link may be shifted against each other
MAX_SHIFT = 256


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
    if not len(rpc):
        return None
    c = comms[ci]
    op = ops[rpc]
    text = np.array(strings + [None], dtype=object)
    n_str = len(strings)

    def s(ids):
        ids = np.asarray(ids, dtype=np.int64)
        return text[np.where((ids < 0) | (ids >= n_str), n_str, ids)]

    kind = np.array([kind_of[int(x)] for x in c["collective_name"].astype(np.int64).tolist()], dtype=object)
    pg_name = s(c["pg_name"].astype(np.int64))
    pg_ranks = s(c["pg_ranks"].astype(np.int64))
    local = c["rank"].astype(np.int64)
    peer = np.array([_global_peer(lp, pr) for lp, pr in zip(local.tolist(), pg_ranks.tolist())], dtype=np.int64)
    nelems = c["in_nelems"].astype(np.int64)
    dtype = s(c["dtype"].astype(np.int64))
    elem = np.array([coll.DTYPE_BYTES.get(d, np.nan) if d is not None else np.nan for d in dtype.tolist()])
    nbytes = np.where(nelems != NONE, nelems * elem, np.nan)
    seq = c["seq"].astype(np.int64)

    kernel_row = _kernels_of(op, rows)
    has = kernel_row >= 0
    kr = np.maximum(kernel_row, 0)
    n_rows = len(rows["event"])
    pick = (lambda col, missing: np.where(has, rows[col][kr], missing)) if n_rows else \
        (lambda col, missing: np.full(len(op), missing))
    batched = has & (rows["rpc_event"][kr] != op["event"]) if n_rows else np.zeros(len(op), bool)
    halves = {
        "kind": kind, "peer": peer, "pg": np.array([p if p is not None else "" for p in pg_name.tolist()], object),
        "bytes": nbytes, "seq": seq, "post_ts": op["ts"].astype(np.int64), "tid": op["tid"].astype(np.int64),
        "event": op["event"].astype(np.int64),
        "kernel_event": pick("event", -1).astype(np.int64), "start": pick("ts", NONE).astype(np.int64),
        "end": np.where(has, pick("ts", 0) + pick("dur", 0), NONE).astype(np.int64),
        "batched": batched, "kernel_name": pick("kernel_name", None).astype(object),
    }
    steps = _steps(step_parts, strings)
    halves["step"] = _step_of(steps, halves["post_ts"])
    work = _stage_work(kernel_parts, launch_parts, rows, steps)
    return {"halves": halves, "steps": steps, "work": work}


def _global_peer(local, pg_ranks):
    """The global rank of the group-local rank ``local`` (the ``Rank`` arg)."""
    if local == NONE or local < 0:
        return -1
    ranks = coll.parse_rank_list(pg_ranks)[0] if pg_ranks else None
    if ranks and local < len(ranks):
        return int(ranks[local])
    return int(local)


def _kernels_of(op, rows):
    """Index into ``rows`` of each op's kernel: the kernel it launched (its
    record_param_comms), else the next collective kernel launched on its
    thread that no record_param_comms claims (a batch_isend_irecv group's
    coalesced launch); -1 when none."""
    n = len(op)
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
    k = np.concatenate(kernel_parts)
    k = k[~np.isin(k["event"], rows["event"])]
    if not len(k):
        return empty
    when = k["ts"].astype(np.int64)
    if launch_parts:
        la = np.concatenate(launch_parts)
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


# ===================================================================== across ranks
def p2p_kernel_rows(results, rank, event):
    """Which rows (``rank``, ``event`` per row) are point-to-point kernels,
    batch_isend_irecv groups' included."""
    out = np.zeros(len(rank), dtype=bool)
    for res in results:
        if getattr(res, "p2p", None) is None:
            continue
        ev = np.unique(res.p2p["halves"]["kernel_event"])
        mine = rank == res.rank
        out[mine] = np.isin(event[mine], ev[ev >= 0])
    return out


def p2p_tables(results, offsets=None):
    """``{"align.p2p", "align.p2p_unmatched", "align.pipeline"}`` DataFrames
    from every rank's RankResult, or {} when no rank has point-to-point ops.
    ``offsets``: {rank: clock offset in ns applied to the other tables} (the
    times here are on the same clock)."""
    have = [r for r in results if getattr(r, "p2p", None) is not None]
    if not have:
        return {}
    offsets = offsets or {}
    base0 = min(r.meta.get("base_ns") or 0 for r in results)
    present = {r.rank for r in results}
    cols = {}
    for res in have:
        h = res.p2p["halves"]
        shift = (res.meta.get("base_ns") or 0) - base0 - int(offsets.get(res.rank, 0))
        n = len(h["kind"])
        add = {"rank": np.full(n, res.rank, np.int64), "abs_post": h["post_ts"] + shift,
               "abs_start": np.where(h["start"] != NONE, h["start"] + shift, NONE),
               "abs_end": np.where(h["end"] != NONE, h["end"] + shift, NONE)}
        for key, v in list(h.items()) + list(add.items()):
            cols.setdefault(key, []).append(v)
    halves = pd.DataFrame({k: np.concatenate(v) for k, v in cols.items()})
    halves["src"] = np.where(halves["kind"] == "send", halves["rank"], halves["peer"])
    halves["dst"] = np.where(halves["kind"] == "send", halves["peer"], halves["rank"])
    pairs, unmatched = _match(halves, present)
    pairs_df = _pairs_table(halves, pairs)
    unmatched_df = _unmatched_table(halves, unmatched)
    pipeline_df = _pipeline_table(have, halves, pairs, base0, offsets)
    return {"align.p2p": pairs_df, "align.p2p_unmatched": unmatched_df, "align.pipeline": pipeline_df}


def _match(halves, present):
    """(list of (send index, recv index), {index: reason}) over ``halves``."""
    pairs, unmatched = [], {}
    for (pg, src, dst), g in halves.groupby(["pg", "src", "dst"], sort=True):
        sends = g[g["kind"] == "send"].sort_values(["abs_post", "seq"], kind="stable")
        recvs = g[g["kind"] == "recv"].sort_values(["abs_post", "seq"], kind="stable")
        if src < 0 or dst < 0:
            for i in g.index:
                unmatched[i] = "peer unknown (no Rank arg)"
            continue
        for side, other in ((sends, dst), (recvs, src)):
            if not len(side) or len(sends) and len(recvs):
                continue
            why = (f"rank {other} is not in the input" if other not in present
                   else f"rank {other} has no matching {'recv' if side is sends else 'send'}")
            for i in side.index:
                unmatched[i] = why
        if not len(sends) or not len(recvs):
            continue
        k = _best_shift(sends, recvs)
        si, ri = sends.index.to_numpy(), recvs.index.to_numpy()
        lo, hi = max(0, -k), min(len(si), len(ri) - k)
        for i in range(lo, hi):
            pairs.append((si[i], ri[i + k]))
        for i in list(si[:lo]) + list(si[hi:]):
            unmatched[i] = f"no recv on rank {dst} (outside its window or never posted)"
        matched_r = set(ri[lo + k:hi + k].tolist())
        for i in ri:
            if i not in matched_r:
                unmatched[i] = f"no send on rank {src} (outside its window or never posted)"
    return pairs, unmatched


def _best_shift(sends, recvs):
    """The offset k (recv i + k pairs with send i) at which the two sides'
    kernel ends agree best (median gap), more pairs and a smaller shift
    breaking ties; sizes that differ count against a shift."""
    se, re_ = sends["abs_end"].to_numpy(), recvs["abs_end"].to_numpy()
    sb, rb = sends["bytes"].to_numpy(), recvs["bytes"].to_numpy()
    ns, nr = len(se), len(re_)
    best = None
    for k in range(max(-ns + 1, -MAX_SHIFT), min(nr, MAX_SHIFT + 1)):
        lo, hi = max(0, -k), min(ns, nr - k)
        if hi <= lo:
            continue
        a, b = se[lo:hi], re_[lo + k:hi + k]
        ok = (a != NONE) & (b != NONE)
        gap = float(np.median(np.abs(a[ok] - b[ok]))) if ok.any() else float("inf")
        size_bad = float(np.mean(~np.isclose(sb[lo:hi], rb[lo + k:hi + k], equal_nan=True)))
        key = (size_bad > 0.5, gap, -(hi - lo), abs(k))
        if best is None or key < best[0]:
            best = (key, k)
    return best[1] if best else 0


def _us(ns):
    ns = np.asarray(ns, dtype=np.int64)
    return np.where(ns == NONE, np.nan, ns / 1000.0)


def _pairs_table(h, pairs):
    if not pairs:
        return pd.DataFrame({c: [] for c in P2P_COLUMNS})
    si = np.array([p[0] for p in pairs])
    ri = np.array([p[1] for p in pairs])
    s, r = h.loc[si].reset_index(drop=True), h.loc[ri].reset_index(drop=True)
    s_start, r_start = s["abs_start"].to_numpy(), r["abs_start"].to_numpy()
    s_end, r_end = s["abs_end"].to_numpy(), r["abs_end"].to_numpy()
    known = (s_start != NONE) & (r_start != NONE)
    diff = np.where(known, r_start - s_start, 0)
    # both kernels of a transfer end once it is through: the earlier end is
    # the closer bound when one kernel also carried other halves of a batch
    transfer = np.where(known, np.minimum(s_end, r_end) - np.maximum(s_start, r_start), NONE)
    nbytes = s["bytes"].to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        bw = np.where(known & (transfer > 0), nbytes / np.where(transfer > 0, transfer, 1), np.nan)
    out = pd.DataFrame({
        "pair": np.arange(len(s)), "pg": s["pg"], "sender": s["rank"], "receiver": r["rank"], "step": s["step"],
        "send_seq": _nullable(s["seq"]), "recv_seq": _nullable(r["seq"]),
        "send_bytes": s["bytes"], "recv_bytes": r["bytes"],
        "send_post_us": _us(s["abs_post"]), "recv_post_us": _us(r["abs_post"]),
        "send_start_us": _us(s_start), "recv_start_us": _us(r_start),
        "send_end_us": _us(s_end), "recv_end_us": _us(r_end),
        "waiter": np.where(~known, "", np.where(diff > 0, "sender", np.where(diff < 0, "receiver", "neither"))),
        "waited_for": pd.array(np.where(diff > 0, r["rank"], np.where(diff < 0, s["rank"], -1)), dtype="Int64"),
        "wait_us": np.where(known, np.abs(diff) / 1000.0, np.nan),
        "transfer_us": _us(transfer), "bandwidth_GBps": bw,   # bytes per ns = GB/s
        "send_batched": s["batched"].astype(bool), "recv_batched": r["batched"].astype(bool),
        "send_kernel": s["kernel_name"], "recv_kernel": r["kernel_name"],
    })
    out.loc[out["waited_for"] == -1, "waited_for"] = pd.NA
    return out.sort_values(["send_start_us", "sender", "receiver"], kind="stable").reset_index(drop=True) \
        .assign(pair=lambda d: np.arange(len(d)))[P2P_COLUMNS]


def _nullable(v):
    v = np.asarray(v, dtype=np.int64)
    return pd.arrays.IntegerArray(v.copy(), v == NONE)


def _unmatched_table(h, unmatched):
    if not unmatched:
        return pd.DataFrame({c: [] for c in UNMATCHED_COLUMNS})
    idx = sorted(unmatched)
    u = h.loc[idx]
    out = pd.DataFrame({
        "rank": u["rank"].to_numpy(), "kind": u["kind"].to_numpy(), "peer": u["peer"].to_numpy(),
        "pg": u["pg"].to_numpy(), "step": u["step"].to_numpy(), "seq": _nullable(u["seq"]),
        "bytes": u["bytes"].to_numpy(), "post_us": _us(u["abs_post"]), "start_us": _us(u["abs_start"]),
        "end_us": _us(u["abs_end"]), "reason": [unmatched[i] for i in idx]})
    return out.sort_values(["rank", "post_us"], kind="stable").reset_index(drop=True)


def _pipeline_table(have, h, pairs, base0, offsets):
    """Per rank and step (see module docstring); the stage of a rank is its
    place among the ranks its point-to-point links connect (ranks in
    increasing order, as pipeline frameworks number their stages)."""
    # per kernel: the wait before its latest peer kernel started (a batched
    # kernel waits for the last of its peers)
    wait_rows = []
    for si, ri in pairs:
        s, r = h.loc[si], h.loc[ri]
        if s["abs_start"] == NONE or r["abs_start"] == NONE:
            continue
        d = int(r["abs_start"] - s["abs_start"])
        if d > 0:
            wait_rows.append((s["rank"], s["kernel_event"], s["step"], r["rank"], d))
        elif d < 0:
            wait_rows.append((r["rank"], r["kernel_event"], r["step"], s["rank"], -d))
    waits = pd.DataFrame(wait_rows, columns=["rank", "kernel", "step", "peer", "wait"])
    if len(waits):
        waits = waits.sort_values("wait", kind="stable").groupby(["rank", "kernel"], sort=False).tail(1)
    kernels = h[h["kernel_event"] >= 0].drop_duplicates(["rank", "kernel_event"])
    n_kernels = kernels.groupby(["rank", "step"]).size()
    pipelines = _pipelines(h)
    rows = []
    for res in have:
        w = res.p2p["work"]
        steps = sorted(set(w["step"].tolist()) | set(h.loc[h["rank"] == res.rank, "step"].tolist()))
        for st in steps:
            mine = waits[(waits["rank"] == res.rank) & (waits["step"] == st)] if len(waits) else waits
            by_peer = mine.groupby("peer")["wait"].sum() if len(mine) else pd.Series(dtype=np.int64)
            j = np.flatnonzero(w["step"] == st)
            pl, stage = pipelines.get(res.rank, (-1, -1))
            rows.append({
                "rank": res.rank, "pipeline": pl, "stage": stage, "step": st,
                "p2p_wait_us": float(mine["wait"].sum()) / 1000.0 if len(mine) else 0.0,
                "bubble_us": float(w["bubble"][j[0]]) / 1000.0 if len(j) else np.nan,
                "stage_work_us": float(w["busy"][j[0]]) / 1000.0 if len(j) else np.nan,
                "waited_for": int(by_peer.idxmax()) if len(by_peer) else pd.NA,
                "waited_for_us": float(by_peer.max()) / 1000.0 if len(by_peer) else 0.0,
                "p2p_kernels": int(n_kernels.get((res.rank, st), 0)),
            })
    out = pd.DataFrame(rows, columns=[c for c in PIPELINE_COLUMNS if c not in ("bounds_pipeline", "extra_work_us")])
    out["waited_for"] = out["waited_for"].astype("Int64")
    bound = bounding_stages(out)
    out["bounds_pipeline"] = out["rank"].isin([b["rank"] for b in bound])
    extra = {b["rank"]: b["extra_work_us"] for b in bound}
    out["extra_work_us"] = out["rank"].map(extra).astype(float)
    return out.sort_values(["pipeline", "stage", "step"], kind="stable").reset_index(drop=True)[PIPELINE_COLUMNS]


def _pipelines(h):
    """{rank: (pipeline, stage)}: ranks joined by point-to-point links form a
    pipeline (numbered by their lowest rank's order); stages in rank order."""
    parent = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in zip(h["rank"].tolist(), h["peer"].tolist()):
        if b >= 0:
            parent[find(a)] = find(b)
        else:
            find(a)
    groups = {}
    for x in list(parent):
        groups.setdefault(find(x), []).append(x)
    out = {}
    for p, members in enumerate(sorted(sorted(g) for g in groups.values())):
        for stage, r in enumerate(members):
            out[r] = (p, stage)
    return out


def bounding_stages(pipeline):
    """Per pipeline, the stage that bounds it in steady state: the one whose
    own work per step is the largest (it is the one the others wait for
    while it never waits on work; a plain sum of waits is dominated by the
    1F1B fill and drain and points elsewhere).  ``extra_work_us``: its work
    per step above the median of the other stages'.  A list of dicts, one
    per pipeline of two stages or more."""
    out = []
    if not len(pipeline):
        return out
    for pl, g in pipeline.groupby("pipeline"):
        work = g.groupby("rank")["stage_work_us"].median().dropna()
        if len(work) < 2:
            continue
        r = int(work.idxmax())
        others = work.drop(index=r)
        out.append({"pipeline": int(pl), "rank": r,
                    "stage": int(g.loc[g["rank"] == r, "stage"].iloc[0]),
                    "work_us": float(work[r]), "extra_work_us": float(work[r] - others.median()),
                    "others_wait_us": float(g[g["rank"] != r].groupby("step")["p2p_wait_us"].sum().median())})
    return out

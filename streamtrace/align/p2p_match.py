"""Point-to-point halves of every rank matched into pairs, and the
``align.p2p``, ``align.p2p_unmatched`` and ``align.pipeline`` tables (see
``align.p2p`` for the halves and the method)."""
import numpy as np
import pandas as pd

from .._native import NONE

P2P_COLUMNS = ["pair", "pg", "sender", "receiver", "step", "send_seq", "recv_seq", "send_bytes", "recv_bytes",
               "send_post_us", "recv_post_us", "send_start_us", "recv_start_us", "send_end_us", "recv_end_us",
               "waiter", "waited_for", "wait_us", "transfer_us", "bandwidth_GBps", "send_batched", "recv_batched",
               "send_kernel", "recv_kernel", "send_event", "recv_event"]
UNMATCHED_COLUMNS = ["rank", "kind", "peer", "pg", "step", "seq", "bytes", "post_us", "start_us", "end_us",
                     "reason"]
PIPELINE_COLUMNS = ["rank", "pipeline", "stage", "step", "p2p_wait_us", "bubble_us", "stage_work_us",
                    "waited_for", "waited_for_us", "p2p_kernels", "bounds_pipeline", "extra_work_us"]
P2P_TABLE_NAMES = ("align.p2p", "align.p2p_unmatched", "align.pipeline")
#: kernel ends this close are the same rendezvous (scanning shifts stops there)
EXACT_NS = 1000
#: how far (in halves) two sides of a link may be shifted against each other
MAX_SHIFT = 256


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
    """(list of (send index, recv index), {index: reason}) over ``halves``
    (index: its row number)."""
    pairs, unmatched = [], {}
    is_send = (halves["kind"] == "send").to_numpy()
    pg = pd.factorize(halves["pg"], sort=True)[0]
    src, dst = halves["src"].to_numpy(np.int64), halves["dst"].to_numpy(np.int64)
    post, seq = halves["abs_post"].to_numpy(np.int64), halves["seq"].to_numpy(np.int64)
    end, nbytes = halves["abs_end"].to_numpy(np.int64), halves["bytes"].to_numpy(np.float64)
    order = np.lexsort((seq, post, dst, src, pg))
    key = np.stack([pg[order], src[order], dst[order]], axis=1)
    bounds = np.flatnonzero(np.r_[True, (key[1:] != key[:-1]).any(axis=1), True])
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        g = order[a:b]
        s_from, s_to = int(src[g[0]]), int(dst[g[0]])
        sends, recvs = g[is_send[g]], g[~is_send[g]]
        if s_from < 0 or s_to < 0:
            unmatched.update((int(i), "peer unknown (no Rank arg)") for i in g)
            continue
        if not len(sends) or not len(recvs):
            side, other, kind = (sends, s_to, "recv") if len(sends) else (recvs, s_from, "send")
            why = (f"rank {other} is not in the input" if other not in present
                   else f"rank {other} has no matching {kind}")
            unmatched.update((int(i), why) for i in side)
            continue
        k = _best_shift(end[sends], end[recvs], nbytes[sends], nbytes[recvs])
        lo, hi = max(0, -k), min(len(sends), len(recvs) - k)
        pairs += list(zip(sends[lo:hi].tolist(), recvs[lo + k:hi + k].tolist()))
        for i in np.r_[sends[:lo], sends[hi:]].tolist():
            unmatched[i] = f"no recv on rank {s_to} (outside its window or never posted)"
        for i in np.r_[recvs[:max(0, lo + k)], recvs[hi + k:]].tolist():
            unmatched[i] = f"no send on rank {s_from} (outside its window or never posted)"
    return pairs, unmatched


def _best_shift(se, re_, sb, rb):
    """The offset k (recv i + k pairs with send i) at which the two sides'
    kernel ends agree best (median gap), more pairs and a smaller shift
    breaking ties; sizes that differ count against a shift.  Shifts are
    tried smallest first, so the usual case (both windows hold the link's
    first transfer) costs one try."""
    ns, nr = len(se), len(re_)
    best = None
    shifts = sorted(range(max(-ns + 1, -MAX_SHIFT), min(nr, MAX_SHIFT + 1)), key=lambda k: (abs(k), k))
    for k in shifts:
        lo, hi = max(0, -k), min(ns, nr - k)
        if hi <= lo:
            continue
        a, b = se[lo:hi], re_[lo + k:hi + k]
        ok = (a != NONE) & (b != NONE)
        gap = float(np.median(np.abs(a[ok] - b[ok]))) if ok.any() else float("inf")
        sa, sb_ = sb[lo:hi], rb[lo + k:hi + k]
        size_bad = np.count_nonzero((sa != sb_) & ~(np.isnan(sa) & np.isnan(sb_))) * 2 > hi - lo
        key = (size_bad, gap, -(hi - lo), abs(k))
        if best is None or key < best[0]:
            best = (key, k)
        if not size_bad and gap <= EXACT_NS:   # the ends agree: no other shift does better
            break
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
        # the kernels' events (align.collectives' "event"): the blocking analysis explains late halves by them
        "send_event": s["kernel_event"].to_numpy(np.int64), "recv_event": r["kernel_event"].to_numpy(np.int64),
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
    si = np.array([p[0] for p in pairs], dtype=np.int64)
    ri = np.array([p[1] for p in pairs], dtype=np.int64)
    rank, start = h["rank"].to_numpy(np.int64), h["abs_start"].to_numpy(np.int64)
    kernel, step = h["kernel_event"].to_numpy(np.int64), h["step"].to_numpy(np.int64)
    known = (start[si] != NONE) & (start[ri] != NONE)
    d = np.where(known, start[ri] - start[si], 0)
    late_send = d > 0    # the sender started first and waited for the receiver
    waiter = np.where(late_send, si, ri)
    other = np.where(late_send, ri, si)
    waits = pd.DataFrame({"rank": rank[waiter], "kernel": kernel[waiter], "step": step[waiter],
                          "peer": rank[other], "wait": np.abs(d)})[d != 0]
    waits = waits.sort_values("wait", kind="stable").drop_duplicates(["rank", "kernel"], keep="last")
    total = waits.groupby(["rank", "step"])["wait"].sum().to_dict()
    per_peer = waits.groupby(["rank", "step", "peer"])["wait"].sum().reset_index() \
        .sort_values(["wait", "peer"], ascending=[False, True], kind="stable") \
        .drop_duplicates(["rank", "step"])
    worst = {(r, st): (p, w) for r, st, p, w in per_peer[["rank", "step", "peer", "wait"]].itertuples(index=False)}
    kernels = h[h["kernel_event"] >= 0].drop_duplicates(["rank", "kernel_event"])
    n_kernels = kernels.groupby(["rank", "step"]).size().to_dict()
    pipelines = _pipelines(h)
    rows = []
    for res in have:
        w = res.p2p["work"]
        steps = sorted(set(w["step"].tolist()) | set(h.loc[h["rank"] == res.rank, "step"].tolist()))
        work = {int(st): j for j, st in enumerate(w["step"].tolist())}
        for st in steps:
            j = work.get(st)
            pl, stage = pipelines.get(res.rank, (-1, -1))
            peer, peer_wait = worst.get((res.rank, st), (pd.NA, 0))
            rows.append({
                "rank": res.rank, "pipeline": pl, "stage": stage, "step": st,
                "p2p_wait_us": float(total.get((res.rank, st), 0)) / 1000.0,
                "bubble_us": float(w["bubble"][j]) / 1000.0 if j is not None else np.nan,
                "stage_work_us": float(w["busy"][j]) / 1000.0 if j is not None else np.nan,
                "waited_for": peer, "waited_for_us": float(peer_wait) / 1000.0,
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

    links = np.unique(np.stack([h["rank"].to_numpy(np.int64), h["peer"].to_numpy(np.int64)], axis=1), axis=0)
    for a, b in links.tolist():
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


def pipeline_text(pipeline, p2p=None, p2p_blockers=None):
    """The pipeline's short answer (blockers): which stage bounds each
    pipeline, the slowest link when it stands out, and why transfers were
    late (from the blocking analysis' p2p_blockers).  '' without pipeline."""
    if pipeline is None or not len(pipeline):
        return ""
    lines = []
    for b in bounding_stages(pipeline):
        ranks = sorted(pipeline.loc[pipeline["pipeline"] == b["pipeline"], "rank"].unique().tolist())
        lines.append(f"Pipeline {b['pipeline']} (ranks {', '.join(map(str, ranks))}): stage {b['stage']} "
                     f"(rank {b['rank']}) bounds it in steady state: its stage work takes {b['work_us'] / 1000:.2f} ms "
                     f"per step, {b['extra_work_us'] / 1000:.2f} ms more than the median stage; the other stages "
                     f"wait on point-to-point transfers {b['others_wait_us'] / 1000:.2f} ms per step (median)")
    if p2p is not None and len(p2p):
        bw = p2p.assign(link=[f"{min(a, b)}<->{max(a, b)}" for a, b in zip(p2p["sender"], p2p["receiver"])]) \
            .groupby("link")["bandwidth_GBps"].median().dropna()
        if len(bw) >= 2:
            slow = bw.idxmin()
            rest = float(bw.drop(index=slow).median())
            if bw[slow] < 0.5 * rest:
                lines.append(f"Slowest link: ranks {slow.replace('<->', ' <-> ')} at {bw[slow]:.2f} GB/s "
                             f"(median of its transfers; the other links {rest:.2f} GB/s)")
    if p2p_blockers is not None and len(p2p_blockers):
        b = p2p_blockers
        parts = {"host launch lateness": b["host_launch_lateness_us"].sum(),
                 "GPU dependency wait": b["gpu_dependency_wait_us"].sum(), "GPU backlog": b["gpu_backlog_us"].sum()}
        total = sum(parts.values())
        cause = max(parts, key=parts.get)
        lines.append(f"Late point-to-point halves: {len(b)}; dominant cause: {cause} "
                     f"({parts[cause]:.1f} of {total:.1f} us)  "
                     + "  ".join(f"{k}: {v:.1f} us" for k, v in parts.items() if k != cause))
    return "\n".join(lines)

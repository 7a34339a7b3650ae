"""Point-to-point halves of every rank matched into pairs, and the
``align.p2p``, ``align.p2p_unmatched`` and ``align.pipeline`` tables (see
``align.p2p`` for the halves and the method)."""
import os

import numpy as np
import pandas as pd

from .._native import NONE
from ..errors import InvalidArgumentError
from .p2p import odd_peers, world_of
from .quality import _finding

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
#: pairs of a link (evenly spaced) on which each shift is judged
SHIFT_SAMPLE = 4096
#: at most this many rows in p2p_unmatched (the first by rank and posting
#: time); the rest are counted, by reason.  A sheet of a million rows costs
#: more than the matching, and no one reads it row by row
UNMATCHED_MAX_ROWS = 10_000
UNMATCHED_ROWS_ENV = "STREAMTRACE_P2P_UNMATCHED_ROWS"


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


def p2p_tables(results, offsets=None, quality=None):
    """``{"align.p2p", "align.p2p_unmatched", "align.pipeline"}`` DataFrames
    from every rank's RankResult, or {} when no rank has point-to-point ops.
    ``offsets``: {rank: clock offset in ns applied to the other tables} (the
    times here are on the same clock).  ``quality``: a list of findings that
    of the cap on p2p_unmatched's rows is appended to, when it cuts (odd
    peers are the ranks' findings: ``quality._p2p_findings``)."""
    have = [r for r in results if getattr(r, "p2p", None) is not None]
    if not have:
        return {}
    max_rows = unmatched_max_rows()   # a bad setting fails before the work
    offsets = offsets or {}
    base0 = min(r.meta.get("base_ns") or 0 for r in results)
    present = {r.rank for r in results}
    world = world_of(results)
    h = _halves(have, base0, offsets)
    itself, outside = odd_peers(h["rank"], h["peer"], world)
    code, reasons, pairs = _match(h, present, world, itself, outside)
    unmatched_df, total = _unmatched_table(h, code, reasons, max_rows)
    if total > len(unmatched_df) and quality is not None:
        quality.append(_capped_finding(code, reasons, total, len(unmatched_df), max_rows))
    pairs_df = _pairs_table(h, pairs)
    pipeline_df = _pipeline_table(have, h, pairs, (h["peer"] >= 0) & ~itself & ~outside)
    return {"align.p2p": pairs_df, "align.p2p_unmatched": unmatched_df, "align.pipeline": pipeline_df}


def unmatched_max_rows():
    """The cap on p2p_unmatched's rows: UNMATCHED_MAX_ROWS, or the
    environment's UNMATCHED_ROWS_ENV (0: none listed, only counted)."""
    setting = os.environ.get(UNMATCHED_ROWS_ENV)
    if setting is None:
        return UNMATCHED_MAX_ROWS
    try:
        value = int(setting)
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidArgumentError(f"{UNMATCHED_ROWS_ENV}={setting!r}: not a number of rows >= 0")
    return value


def _halves(have, base0, offsets):
    """Every rank's halves as one dict of numpy columns (no per-half Python
    object: a million halves are a few columns of a million numbers), times
    on the common clock (``post``, ``start``, ``end``; NONE when unknown)."""
    cols = {}
    for res in have:
        h = res.p2p["halves"]
        shift = (res.meta.get("base_ns") or 0) - base0 - int(offsets.get(res.rank, 0))
        n = len(h["kind"])
        add = {"rank": np.full(n, res.rank, np.int64), "is_send": h["kind"] == "send",
               "post": h["post_ts"] + shift,
               "start": np.where(h["start"] != NONE, h["start"] + shift, NONE),
               "end": np.where(h["end"] != NONE, h["end"] + shift, NONE)}
        for key in ("kind", "peer", "pg", "bytes", "seq", "kernel_event", "batched", "kernel_name", "step"):
            add[key] = h[key]
        for key, v in add.items():
            cols.setdefault(key, []).append(v)
    # one rank: read-only views of its columns, not copies (a write raises
    # instead of changing the rank's halves, which a second match reads again)
    return {k: np.concatenate(v) if len(v) > 1 else _read_only(v[0]) for k, v in cols.items()}


def _read_only(values):
    view = values.view()
    view.flags.writeable = False
    return view


class _Reasons:
    """Why each half is unmatched: a code per half (-1: paired) into a short
    list of distinct reasons (one string per reason, not per half)."""

    def __init__(self, n):
        self.code = np.full(n, -1, np.int32)
        self.text = []
        self._ids = {}

    def mark(self, idx, why):
        if why not in self._ids:
            self._ids[why] = len(self.text)
            self.text.append(why)
        self.code[idx] = self._ids[why]

    def mark_by(self, idx, values, template):
        """Mark ``idx`` with ``template.format(v)`` for each half's value."""
        for v in np.unique(values).tolist():
            self.mark(idx[values == v], template.format(v))


def _match(h, present, world, itself, outside):
    """(reason codes per half, the reasons, (send indices, recv indices) of
    the pairs).  Halves whose peer is unknown, the rank itself or outside
    the world are never paired; a pair with a half whose kernel is missing
    is listed as unmatched (both halves), never timed."""
    n = len(h["rank"])
    why = _Reasons(n)
    is_send, rank, peer = h["is_send"], h["rank"], h["peer"]
    unknown = peer < 0
    why.mark(np.flatnonzero(unknown), "peer unknown (no Rank arg)")
    why.mark(np.flatnonzero(itself & is_send), "a send to the rank itself (its peer is its own rank)")
    why.mark(np.flatnonzero(itself & ~is_send), "a recv from the rank itself (its peer is its own rank)")
    why.mark(np.flatnonzero(outside), f"peer outside the world (world size {world})" if world else
             "peer outside the world (beyond any rank)")
    cand = np.flatnonzero(~(unknown | itself | outside))
    pg = pd.factorize(h["pg"][cand], sort=True)[0]
    src = np.where(is_send[cand], rank[cand], peer[cand])
    dst = np.where(is_send[cand], peer[cand], rank[cand])
    end, nbytes = h["end"], h["bytes"]
    order = np.lexsort((h["seq"][cand], h["post"][cand], dst, src, pg))
    key = np.stack([pg[order], src[order], dst[order]], axis=1)
    bounds = np.flatnonzero(np.r_[True, (key[1:] != key[:-1]).any(axis=1), True]) if len(cand) else np.zeros(1, int)
    del key
    send_parts, recv_parts = [], []
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        g = cand[order[a:b]]
        s_from, s_to = int(src[order[a]]), int(dst[order[a]])
        sends, recvs = g[is_send[g]], g[~is_send[g]]
        if not len(sends) or not len(recvs):
            side, other, kind = (sends, s_to, "recv") if len(sends) else (recvs, s_from, "send")
            why.mark(side, f"rank {other} is not in the input" if other not in present
                     else f"rank {other} has no matching {kind}")
            continue
        k = _best_shift(end[sends], end[recvs], nbytes[sends], nbytes[recvs])
        lo, hi = max(0, -k), min(len(sends), len(recvs) - k)
        send_parts.append(sends[lo:hi])
        recv_parts.append(recvs[lo + k:hi + k])
        why.mark(np.r_[sends[:lo], sends[hi:]], f"no recv on rank {s_to} (outside its window or never posted)")
        why.mark(np.r_[recvs[:max(0, lo + k)], recvs[hi + k:]],
                 f"no send on rank {s_from} (outside its window or never posted)")
    si = np.concatenate(send_parts) if send_parts else np.zeros(0, np.int64)
    ri = np.concatenate(recv_parts) if recv_parts else np.zeros(0, np.int64)
    # a pair without both kernels has no times: listed, with the half to blame
    s_none, r_none = h["start"][si] == NONE, h["start"][ri] == NONE
    no_kernel = "no GPU kernel recorded for it (launched outside the profiling window, or never)"
    why.mark(np.r_[si[s_none], ri[r_none]], no_kernel)
    only_s, only_r = s_none & ~r_none, r_none & ~s_none
    why.mark_by(ri[only_s], rank[si[only_s]], "its send on rank {} has no GPU kernel recorded")
    why.mark_by(si[only_r], rank[ri[only_r]], "its recv on rank {} has no GPU kernel recorded")
    timed = ~(s_none | r_none)
    return why.code, why.text, (si[timed], ri[timed])


def _capped_finding(code, reasons, total, shown, max_rows):
    counts = np.bincount(code[code >= 0], minlength=len(reasons))
    top = np.argsort(-counts, kind="stable")[:5]
    by = "; ".join(f"{reasons[i]}: {int(counts[i])}" for i in top.tolist() if counts[i])
    return _finding("warning", "p2p_unmatched_capped", f"p2p_unmatched lists {shown} of the {total} unmatched "
                    f"point-to-point halves (the first by rank and posting time; {UNMATCHED_ROWS_ENV} sets the cap, "
                    f"{max_rows} here); all of them by reason: {by}", count=total - shown)


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
        # each shift judged on at most SHIFT_SAMPLE evenly spaced pairs: a
        # median of a million gaps per shift made one long link take 30 s
        i = lo + (np.arange(SHIFT_SAMPLE) * (hi - lo)) // SHIFT_SAMPLE if hi - lo > SHIFT_SAMPLE \
            else np.arange(lo, hi)
        a, b = se[i], re_[i + k]
        ok = (a != NONE) & (b != NONE)
        gap = float(np.median(np.abs(a[ok] - b[ok]))) if ok.any() else float("inf")
        sa, sb_ = sb[i], rb[i + k]
        size_bad = np.count_nonzero((sa != sb_) & ~(np.isnan(sa) & np.isnan(sb_))) * 2 > len(i)
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
    si, ri = pairs
    if not len(si):
        return pd.DataFrame({c: [] for c in P2P_COLUMNS})
    s_start, r_start = h["start"][si], h["start"][ri]
    s_end, r_end = h["end"][si], h["end"][ri]
    s_rank, r_rank = h["rank"][si], h["rank"][ri]
    diff = r_start - s_start   # both kernels are known: a pair without both is unmatched
    # both kernels of a transfer end once it is through: the earlier end is
    # the closer bound when one kernel also carried other halves of a batch
    transfer = np.minimum(s_end, r_end) - np.maximum(s_start, r_start)
    nbytes = h["bytes"][si]
    with np.errstate(divide="ignore", invalid="ignore"):
        bw = np.where(transfer > 0, nbytes / np.where(transfer > 0, transfer, 1), np.nan)
    out = pd.DataFrame({
        "pair": np.arange(len(si)), "pg": h["pg"][si], "sender": s_rank, "receiver": r_rank, "step": h["step"][si],
        "send_seq": _nullable(h["seq"][si]), "recv_seq": _nullable(h["seq"][ri]),
        "send_bytes": nbytes, "recv_bytes": h["bytes"][ri],
        "send_post_us": _us(h["post"][si]), "recv_post_us": _us(h["post"][ri]),
        "send_start_us": _us(s_start), "recv_start_us": _us(r_start),
        "send_end_us": _us(s_end), "recv_end_us": _us(r_end),
        "waiter": np.where(diff > 0, "sender", np.where(diff < 0, "receiver", "neither")),
        "waited_for": pd.array(np.where(diff > 0, r_rank, np.where(diff < 0, s_rank, -1)), dtype="Int64"),
        "wait_us": np.abs(diff) / 1000.0,
        "transfer_us": transfer / 1000.0, "bandwidth_GBps": bw,   # bytes per ns = GB/s
        "send_batched": h["batched"][si].astype(bool), "recv_batched": h["batched"][ri].astype(bool),
        "send_kernel": h["kernel_name"][si], "recv_kernel": h["kernel_name"][ri],
        # the kernels' events (align.collectives' "event"): the blocking analysis explains late halves by them
        "send_event": h["kernel_event"][si].astype(np.int64), "recv_event": h["kernel_event"][ri].astype(np.int64),
    })
    out.loc[out["waited_for"] == -1, "waited_for"] = pd.NA
    return out.sort_values(["send_start_us", "sender", "receiver"], kind="stable").reset_index(drop=True) \
        .assign(pair=lambda d: np.arange(len(d)))[P2P_COLUMNS]


def _nullable(v):
    v = np.asarray(v, dtype=np.int64)
    return pd.arrays.IntegerArray(v.copy(), v == NONE)


def _unmatched_table(h, code, reasons, max_rows):
    """(p2p_unmatched: at most ``max_rows`` rows, the first by rank and
    posting time; the number of unmatched halves)."""
    idx = np.flatnonzero(code >= 0)
    total = len(idx)
    idx = idx[np.lexsort((h["post"][idx], h["rank"][idx]))][:max_rows]
    if not len(idx):
        return pd.DataFrame({c: [] for c in UNMATCHED_COLUMNS}), total
    text = np.array(reasons, dtype=object)
    out = pd.DataFrame({
        "rank": h["rank"][idx], "kind": h["kind"][idx], "peer": h["peer"][idx], "pg": h["pg"][idx],
        "step": h["step"][idx], "seq": _nullable(h["seq"][idx]), "bytes": h["bytes"][idx],
        "post_us": _us(h["post"][idx]), "start_us": _us(h["start"][idx]), "end_us": _us(h["end"][idx]),
        "reason": text[code[idx]]})
    return out, total


def _pipeline_table(have, h, pairs, linked):
    """Per rank and step (see module docstring); the stage of a rank is its
    place among the ranks its point-to-point links connect (ranks in
    increasing order, as pipeline frameworks number their stages)."""
    # per kernel: the wait before its latest peer kernel started (a batched
    # kernel waits for the last of its peers)
    si, ri = pairs
    rank, start = h["rank"], h["start"]
    kernel, step = h["kernel_event"], h["step"]
    d = start[ri] - start[si]
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
    has = kernel >= 0
    kernels = pd.DataFrame({"rank": rank[has], "kernel": kernel[has], "step": step[has]}) \
        .drop_duplicates(["rank", "kernel"])
    n_kernels = kernels.groupby(["rank", "step"]).size().to_dict()
    del kernels
    steps_of = {}
    for r, st in zip(*_unique_pairs(rank, step)):
        steps_of.setdefault(r, set()).add(st)
    pipelines = _pipelines(h, linked)
    rows = []
    for res in have:
        w = res.p2p["work"]
        steps = sorted(set(w["step"].tolist()) | steps_of.get(res.rank, set()))
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
    # only a pipeline with matched pairs has evidence of which stage the others wait for
    paired = {pipelines[r][0] for r in np.unique(rank[si]).tolist() if r in pipelines}
    bound = [b for b in bounding_stages(out) if b["pipeline"] in paired]
    out["bounds_pipeline"] = out["rank"].isin([b["rank"] for b in bound])
    extra = {b["rank"]: b["extra_work_us"] for b in bound}
    out["extra_work_us"] = out["rank"].map(extra).astype(float)
    return out.sort_values(["pipeline", "stage", "step"], kind="stable").reset_index(drop=True)[PIPELINE_COLUMNS]


def _pipelines(h, linked):
    """{rank: (pipeline, stage)}: ranks joined by point-to-point links form a
    pipeline (numbered by their lowest rank's order); stages in rank order.
    Only ``linked`` halves link ranks (not a peer that is unknown, the rank
    itself or outside the world)."""
    parent = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a in np.unique(h["rank"]).tolist():
        find(a)
    for a, b in zip(*_unique_pairs(h["rank"][linked], h["peer"][linked])):
        parent[find(a)] = find(b)
    groups = {}
    for x in list(parent):
        groups.setdefault(find(x), []).append(x)
    out = {}
    for p, members in enumerate(sorted(sorted(g) for g in groups.values())):
        for stage, r in enumerate(members):
            out[r] = (p, stage)
    return out


def _unique_pairs(a, b):
    """The distinct (a, b) pairs, as two lists (a hash, not a sort of rows)."""
    d = pd.DataFrame({"a": a, "b": b}).drop_duplicates()
    return d["a"].tolist(), d["b"].tolist()


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
    named = set(pipeline.loc[pipeline["bounds_pipeline"].astype(bool), "rank"].tolist())
    bound = {b["pipeline"]: b for b in bounding_stages(pipeline) if b["rank"] in named}
    paired = set() if p2p is None else set(p2p["sender"].tolist()) | set(p2p["receiver"].tolist())
    for pl, g in pipeline.groupby("pipeline"):
        ranks = sorted(g["rank"].unique().tolist())
        if len(ranks) < 2:
            continue
        if pl not in bound:
            if not paired & set(ranks):   # nothing was waited for on any evidence
                lines.append(f"Pipeline {pl} (ranks {', '.join(map(str, ranks))}): no send/recv pair was matched "
                             "(p2p_unmatched says why): no stage can be named as the one the others wait for")
            continue
        b = bound[pl]
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

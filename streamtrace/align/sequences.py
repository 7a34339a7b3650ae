"""Slots within one process group: which rows of different ranks are one
collective.  By ``Seq`` when every row carries one and the numbers agree
(``_seq_slots``; point-to-point ops count apart from collectives, so the key
is (P2P or not, Seq); ``seq_contradiction`` checks them), else by aligning
each rank's sequence of signatures and end times against a consensus
(``align_sequences``, ``_match_ordinal``).  When that alignment is not a
clean one-to-one match (partial samples, windows that start and end
elsewhere), the pairing that the end times support on one clock offset
(``vote_pairs``) replaces it when it pairs more collectives, and step markers
(``ProfilerStep#N``) keep pairs inside one step."""
import numpy as np

from ..codes import dense_rank, group_ids, occurrence
from .quality import _finding
from .tables import MATCH_TOLERANCE_NS  # noqa: F401 - defined in tables, which the stage reads without pandas

#: the widest tolerance of the offset vote (ns): real ranks' ends of one
#: collective spread by up to a few hundred us (issue #41's pair: 0.3 ms)
VOTE_MAX_TOLERANCE_NS = 1_000_000
#: same-signature pairs the offset vote looks at, at most (the candidates of
#: larger sequences come from an even sample of the rank's collectives)
VOTE_MAX_PAIRS = 250_000


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
    k, d = _best_shift(s_sig, s_end, c_sig, c_end, tol, band)
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
    out_s, out_c = _greedy_merge(s_sig, s_end.astype(np.float64) - d, c_sig, c_end, gaps, tol)
    return out_s, out_c, d, False


def _best_shift(s_sig, s_end, c_sig, c_end, tol, band):
    """(k, d): the best shift S[i] <-> C[i+k] (see align_sequences) and the
    median end-time difference of its pairs."""
    m, n = len(s_sig), len(c_sig)
    # fast paths: shift 0, or end-aligned, with every pair consistent
    quick = []
    for k in sorted({0, n - m}, key=abs):
        sc = _score(s_sig, s_end, c_sig, c_end, k, tol)
        if sc is not None and sc[0][0] == min(m, n):
            quick.append((k, sc[1]))
    if len(quick) == 1:
        return quick[0]
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
    return best_k, best_d


def _greedy_merge(s_sig, s_time, c_sig, c_end, gaps, tol):
    """Pairs (s_index, c_index) of a greedy merge of S (end times corrected
    to C's clock: ``s_time``) and C: a pair when the times agree within
    ``tol``, or the signatures are equal and the times closer than half the
    gaps around C's collective; else the earlier one is skipped."""
    m, n = len(s_sig), len(c_sig)
    gl = np.concatenate([[np.inf], gaps])
    gh = np.concatenate([gaps, [np.inf]])
    out_s, out_c = [], []
    i = j = 0
    while i < m and j < n:
        r = s_time[i] - c_end[j]
        if abs(r) <= tol or (s_sig[i] == c_sig[j] and abs(r) < 0.5 * min(gl[j], gh[j])):
            out_s.append(i)
            out_c.append(j)
            i += 1
            j += 1
        elif r < 0:
            i += 1
        else:
            j += 1
    return np.array(out_s, dtype=np.int64), np.array(out_c, dtype=np.int64)


def vote_tolerance(c_end, tol):
    """The vote's tolerance: a quarter of the median gap between the
    consensus' collective ends, within [tol, VOTE_MAX_TOLERANCE_NS]."""
    gaps = np.diff(np.sort(c_end))
    gaps = gaps[gaps > 0]
    quarter = float(np.median(gaps)) / 4 if len(gaps) else tol
    return max(float(tol), min(float(VOTE_MAX_TOLERANCE_NS), quarter))


def _compatible(s_step, c_step, si, ci):
    """Pairs whose step numbers do not differ (-1: outside any step, or no markers)."""
    if s_step is None or c_step is None:
        return np.ones(len(si), dtype=bool)
    a, b = s_step[si], c_step[ci]
    return (a < 0) | (b < 0) | (a == b)


def _candidate_pairs(s_sig, c_sig, s_step, c_step):
    """(si, ci): every same-signature pair in compatible steps; for large
    sequences only those of an even sample of S's rows (VOTE_MAX_PAIRS)."""
    order = np.argsort(c_sig, kind="stable")
    sorted_sig = c_sig[order]
    lo = np.searchsorted(sorted_sig, s_sig, "left")
    hi = np.searchsorted(sorted_sig, s_sig, "right")
    counts = hi - lo
    rows = np.arange(len(s_sig))
    total = int(counts.sum())
    if total > VOTE_MAX_PAIRS:
        step = -(-total // VOTE_MAX_PAIRS)
        rows = rows[::step]
        counts = counts[rows]
    si = np.repeat(rows, counts)
    within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    ci = order[np.repeat(lo[rows], counts) + within]
    keep = _compatible(s_step, c_step, si, ci)
    return si[keep], ci[keep]


def _pairs_near(d, s_sig, s_end, c_sig, c_end, vtol):
    """(si, ci): every same-signature pair whose ends agree within ``vtol``
    at offset ``d`` (per signature, a search in C's sorted ends)."""
    out_s, out_c = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    for sig in np.intersect1d(s_sig, c_sig).tolist():
        s_idx, c_idx = np.flatnonzero(s_sig == sig), np.flatnonzero(c_sig == sig)
        order = np.argsort(c_end[c_idx], kind="stable")
        c_idx = c_idx[order]
        ends = c_end[c_idx].astype(np.int64)   # epoch ns: integers (a double's 53 bits are too few)
        target = s_end[s_idx].astype(np.int64) - int(round(d))
        lo = np.searchsorted(ends, target - int(vtol), "left")
        hi = np.searchsorted(ends, target + int(vtol), "right")
        counts = hi - lo
        out_s.append(np.repeat(s_idx, counts))
        within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        out_c.append(c_idx[np.repeat(lo, counts) + within])
    return np.concatenate(out_s), np.concatenate(out_c)


def _pairs_at(d, s_sig, s_end, c_sig, c_end, vtol, s_step, c_step):
    """One-to-one same-signature pairs (in time order on both sides) whose ends
    agree within ``vtol`` at clock offset ``d``: closest first."""
    si, ci = _pairs_near(d, s_sig, s_end, c_sig, c_end, vtol)
    keep = _compatible(s_step, c_step, si, ci)
    si, ci = si[keep], ci[keep]
    res = np.abs((s_end[si].astype(np.int64) - c_end[ci].astype(np.int64)) - d)
    used_s, used_c = set(), set()
    out = []
    for k in np.argsort(res, kind="stable").tolist():
        i, j = int(si[k]), int(ci[k])
        if i not in used_s and j not in used_c:
            used_s.add(i)
            used_c.add(j)
            out.append((i, j))
    out.sort()
    keep, last = [], -1
    for i, j in out:   # a pairing that crosses itself is no sequence: the crossing pair goes
        if j > last:
            keep.append((i, j))
            last = j
    a = np.array([i for i, _ in keep], dtype=np.int64)
    b = np.array([j for _, j in keep], dtype=np.int64)
    return a, b


def vote_pairs(s_sig, s_end, c_sig, c_end, tol=MATCH_TOLERANCE_NS, s_step=None, c_step=None, prior=0.0):
    """The pairing of S with C that the end times support on one clock offset.

    Every same-signature pair (in compatible steps: ``*_step`` per row, -1
    unknown) gives a candidate offset; the offsets around which most pairs
    agree within the vote's tolerance (``vote_tolerance``) are tried, each as
    a one-to-one matching within that tolerance.  The one pairing most
    collectives wins; of equal ones, the offset nearest ``prior`` (the
    offset that the ranks' step starts suggest, else 0).

    Returns ``(s_index, c_index, offset, tolerance)``; offset None when no
    pair is possible."""
    vtol = vote_tolerance(c_end, tol)
    empty = np.empty(0, dtype=np.int64)
    if not len(s_sig) or not len(c_sig):
        return empty, empty, None, vtol
    si, ci = _candidate_pairs(s_sig, c_sig, s_step, c_step)
    if not len(si):
        return empty, empty, None, vtol
    d = np.sort(s_end[si].astype(np.int64) - c_end[ci].astype(np.int64))
    support = np.searchsorted(d, d + 2 * vtol, "right") - np.arange(len(d))
    # the densest windows, at most one per 2 * vtol of offsets
    centers = []
    for k in np.argsort(-support, kind="stable").tolist():
        center = float(d[k + int(support[k]) // 2])   # the window's middle offset (d is sorted)
        if all(abs(center - c) > 2 * vtol for c, _ in centers):
            centers.append((center, int(support[k])))
        if len(centers) >= 8 or support[k] < 1:
            break
    best = None
    for center, _ in centers:
        a, b = _pairs_at(center, s_sig, s_end, c_sig, c_end, vtol, s_step, c_step)
        if len(a):
            center = float(np.median(s_end[a].astype(np.int64) - c_end[b].astype(np.int64)))
        key = (len(a), -abs(center - prior))
        if best is None or key > best[0]:
            best = (key, a, b, center)
    _, a, b, center = best
    return a, b, (center if len(a) else None), vtol


def _supported(si, ci, d, s_sig, s_end, c_sig, c_end, vtol):
    """How many pairs agree in signature and, at offset ``d``, in end time."""
    if d is None or not len(si):
        return 0
    diff = s_end[si].astype(np.int64) - c_end[ci].astype(np.int64)
    return int(((s_sig[si] == c_sig[ci]) & (np.abs(diff - d) <= vtol)).sum())


def _step_prior(step_starts, r, ref):
    """The clock offset of rank r to ``ref`` that their shared steps' starts
    suggest (the median difference), or 0.0 without shared steps."""
    if not step_starts or r not in step_starts or ref not in step_starts:
        return 0.0
    shared = sorted(set(step_starts[r]) & set(step_starts[ref]))
    if not shared:
        return 0.0
    return float(np.median([step_starts[r][n] - step_starts[ref][n] for n in shared]))


def _match_ordinal(g_rank, g_sig, g_end, tol, g_step=None, step_starts=None):
    """Slots for the rows of one process group (rows sorted by rank, then time).

    ``g_step``: per row its ProfilerStep number (-1: none, or no markers) or
    None; ``step_starts``: {rank: {step number: start ns}} of the ranks with
    markers.  Returns ``(slot, slot_order, info, reference_rank)``: a
    consensus slot per row, the time order of the slots, per rank the match
    method and the number of its rows without a counterpart, and the rank
    used as reference.
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
    cons_step = None if g_step is None else g_step[a:b].astype(np.int64)
    cons_id = np.arange(b - a, dtype=np.int64)
    slot[a:b] = cons_id
    next_id = b - a
    info = {ref: ("ordinal", 0)}
    for r in sorted(span):
        if r == ref:
            continue
        a, b = span[r]
        s_sig, s_end = g_sig[a:b], g_end[a:b]
        s_step = None if g_step is None else g_step[a:b].astype(np.int64)
        si, ci, d, trivial = align_sequences(s_sig, s_end, cons_sig, cons_end, tol)
        ok = _compatible(s_step, cons_step, si, ci)
        if not (trivial and ok.all()):
            si, ci, d, trivial = _better_pairing(si[ok], ci[ok], d, s_sig, s_end, s_step, cons_sig, cons_end,
                                                 cons_step, tol, _step_prior(step_starts, r, ref))
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
            if cons_step is not None:
                cons_step = np.concatenate([cons_step, s_step[unmatched]])[order]
    position = np.empty(next_id, dtype=np.int64)
    position[cons_id] = np.arange(len(cons_id))
    return slot, position, info, ref



def _better_pairing(si, ci, d, s_sig, s_end, s_step, c_sig, c_end, c_step, tol, prior):
    """The alignment's pairs (``si``, ``ci``, offset ``d``; pairs across steps
    already left out), or the offset vote's (``vote_pairs``) when it pairs
    more collectives on one clock, or as many nearer the prior offset.
    Returns (si, ci, d, trivial=False)."""
    vs, vc, vd, vtol = vote_pairs(s_sig, s_end, c_sig, c_end, tol, s_step, c_step, prior)
    support = _supported(si, ci, d, s_sig, s_end, c_sig, c_end, vtol)
    if vd is not None and (len(vs) > support or (len(vs) == support and len(vs) and d is not None
                                                  and abs(vd - prior) + vtol < abs(d - prior))):
        return vs, vc, vd, False
    return si, ci, d, False


def _seq_slots(g_rank, g_seq, g_p2p, key, quality):
    """Slots of one process group whose rows all carry Seq: (slot, match keys).
    Point-to-point ops have their own counter (ProcessGroupNCCL's seqP2P_):
    their Seq values are another key space ("p2p_seq=...")."""
    occ = occurrence(group_ids(g_rank, g_p2p, g_seq))
    slot = dense_rank(g_p2p, g_seq, occ)
    pairs = group_ids(g_p2p, g_seq)
    _, first = np.unique(pairs, return_index=True)
    names = {int(pairs[i]): f"{'p2p_seq' if g_p2p[i] else 'seq'}={int(g_seq[i])}" for i in first.tolist()}
    keys = np.array([names[int(p)] for p in pairs.tolist()], dtype=object)
    dup = np.flatnonzero(occ > 0)
    if len(dup):
        keys[dup] = [f"{k}#{o}" for k, o in zip(keys[dup], occ[dup].tolist())]
    for r in np.unique(g_rank[dup]).tolist():
        quality.append(_finding("warning", "duplicate_seq", f"rank {int(r)}: Seq values repeat in "
                                f"process group {key}", rank=int(r), pg=key))
    return slot, keys


def seq_contradiction(g_rank, g_seq, g_p2p, g_sig, g_comms):
    """Why the Seq numbers of one process group (rows sorted by rank, then
    time) cannot be trusted, or None.

    They contradict each other when a rank's numbers go back in time (per key
    space), or when for some rank most of its collectives' Seq values are held
    by no other rank, or name a collective of another signature (or Comms Id)
    on other ranks -- as when a rank's counter runs ahead of the others'
    (nccl2's process-global TracingGuard counter before pytorch#192114).  A
    single disagreeing collective is a metadata mismatch, not a numbering
    fault.  Point-to-point rows are checked for order only: their counters are
    per rank and their send and recv halves differ in name."""
    starts = np.flatnonzero(np.r_[True, g_rank[1:] != g_rank[:-1]])
    ends = np.r_[starts[1:], len(g_rank)]
    for a, b in zip(starts.tolist(), ends.tolist()):
        for flag in (False, True):
            s = g_seq[a:b][g_p2p[a:b] == flag]
            back = np.flatnonzero(np.diff(s) < 0)
            if len(back):
                i = int(back[0])
                return (f"rank {int(g_rank[a])}'s Seq goes back from {int(s[i])} to {int(s[i + 1])} "
                        "in time order")
    coll = ~g_p2p
    if len(starts) < 2 or not coll.any():
        return None
    rank, seq, sig = g_rank[coll], g_seq[coll], g_sig[coll]
    if g_comms is not None and (g_comms[coll] >= 0).all():
        sig = group_ids(sig, g_comms[coll])
    key = group_ids(seq, occurrence(group_ids(rank, seq)))
    n_keys = int(key.max()) + 1
    pair = group_ids(key, rank)
    _, first_pair = np.unique(pair, return_index=True)
    ranks_per_key = np.bincount(key[first_pair], minlength=n_keys)
    ks = group_ids(key, sig)
    _, first_ks = np.unique(ks, return_index=True)
    sigs_per_key = np.bincount(key[first_ks], minlength=n_keys)
    bad = (ranks_per_key[key] < 2) | (sigs_per_key[key] > 1)
    for r in np.unique(rank).tolist():
        mine = rank == r
        n_bad, n = int(bad[mine].sum()), int(mine.sum())
        if n_bad >= 2 and 2 * n_bad > n:
            return (f"{n_bad} of rank {r}'s {n} collectives have a Seq that no other rank gives the same "
                    "collective")
    return None

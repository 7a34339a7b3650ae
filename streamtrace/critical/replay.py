"""One step's dependency graph, its replay with one change, and its
critical path.

The graph (``StepGraph``) is made from a step's node rows
(graph.node_tables).  Each GPU item waits for its dependencies:

* ``stream``: the item before it on its rank's stream (stream order);
* ``wait``: a collective or send/recv kernel waits for the compute stream
  (the latest compute kernel ending before it starts: the NCCL stream waits
  on an event the compute stream recorded); a compute kernel that starts
  right after a communication kernel's end, later than its own stream
  allowed, waits for it (``work.wait()``);
* ``receive``: a compute kernel waits for the last receive its rank
  finished before it started (a pipeline stage's input), bound or not;
* ``launch``: a collective's host launch; a compute kernel that starts more
  than ``GAP_NS`` after every item it could wait for was waiting for its
  launch (its host release is its start: the summary keeps no compute
  launches);
* ``group``: a collective kernel (a send/recv kernel) ends when its last
  member started plus its own transfer;
* ``sync``: a host call that waited for the GPU (``cudaStreamSynchronize``)
  ends when the item it waited for ends: the host's later releases move
  with it.

Every item keeps the latency it had after the dependency that bound it, so
replaying with no change gives the measured times exactly; a change (a
duration, a transfer, a host release) is carried through the same
dependencies.
"""
import bisect
import heapq
import math

import numpy as np

from .graph import COMPUTE, P2P

#: a compute kernel starting later than this after everything it could wait
#: for was waiting for the host (its launch); a queued kernel starts 1-3 us
#: after the one before it
GAP_NS = 5000


class StepGraph:
    def __init__(self, nodes, syncs, starts):
        """``nodes``: one step's rows of critical.nodes (sorted by start);
        ``syncs``: its rows of critical.syncs; ``starts``: {rank: its
        ProfilerStep's start}."""
        # a batched send/recv kernel is a member of several pairs: one item, in each pair's group
        kinds = nodes["kind"].to_numpy(np.int64)
        comm_rows = np.flatnonzero(kinds != COMPUTE).tolist()
        events = nodes["event"].to_numpy(np.int64) if "event" in nodes else np.full(len(nodes), -1, np.int64)
        cols = [nodes[c].to_numpy(object) for c in ("instance", "label")]
        ranks_, nbytes_ = nodes["rank"].to_numpy(np.int64), nodes["nbytes"].to_numpy(np.float64)
        keep = np.ones(len(nodes), bool)
        at, memberships = {}, []
        self.glabel, self.gbytes = {}, {}   # each group's label and bytes (a pair's: 'p2p A->B')
        for row in comm_rows:   # compute rows are items of their own; only communication rows repeat
            key = (int(ranks_[row]), int(events[row])) if events[row] >= 0 else ("row", row)
            if key in at:
                keep[row] = False
            else:
                at[key] = row
            inst = cols[0][row]
            memberships.append((inst, at[key]))
            self.glabel.setdefault(inst, cols[1][row])
            self.gbytes.setdefault(inst, float(nbytes_[row]))
        # rows -> item numbers once the repeated rows are dropped
        number = np.cumsum(keep) - 1
        memberships = [(inst, int(number[row])) for inst, row in memberships]
        keep = np.flatnonzero(keep)
        nodes = nodes.iloc[keep]
        n = self.n = len(nodes)
        start = nodes["start"].to_numpy(np.int64)
        # every time from the step's reference (its earliest rank's start):
        # epoch ns are beyond float64's exact integers, the replay's floats are not
        self.origin = min(int(v) for v in starts.values()) if len(starts) else (int(start.min()) if n else 0)
        self.ref = 0
        self.rank = nodes["rank"].to_numpy(np.int64)
        self.kind = nodes["kind"].to_numpy(np.int64)
        self.stream = nodes["stream"].to_numpy(np.int64)
        self.start = start - self.origin
        self.end = nodes["end"].to_numpy(np.int64) - self.origin
        self.dur = self.end - self.start
        self.identity = nodes["identity"].to_numpy(object)
        self.instance = nodes["instance"].to_numpy(object)
        self.label = nodes["label"].to_numpy(object)
        self.release = np.rint(nodes["release"].to_numpy(np.float64) - self.origin)
        self.overlapped = nodes["overlapped"].to_numpy(bool)
        self.nbytes = nodes["nbytes"].to_numpy(np.float64)
        self.starts = {int(r): int(s) - self.origin for r, s in starts.items()}
        self.ranks = sorted(set(self.rank.tolist()) | set(self.starts))
        # groups: the members of each collective / send-recv pair; a group's
        # transfer runs from its last member's start to its first member's end
        self.group = {}
        for inst, k in memberships:
            m = self.group.setdefault(inst, [])
            if k not in m:
                m.append(k)
        self.groups_of = [()] * n   # a tuple shared by the items in no group; a list of its own otherwise
        self.gtransfer = {}
        for inst, m in self.group.items():
            last = max(self.start[k] for k in m)
            self.gtransfer[inst] = max(0, min(self.end[k] for k in m) - last)
            for k in m:
                if not self.groups_of[k]:
                    self.groups_of[k] = []
                self.groups_of[k].append(inst)
        self.members = [None] * n
        self.resid = np.zeros(n, np.int64)   # a member's end after its groups' ends (its own tail)
        for k in sorted({k for m in self.group.values() for k in m}):
            self.members[k] = sorted({j for g in self.groups_of[k] for j in self.group[g]})
            self.resid[k] = max(0, self.end[k] - self._group_end(k, self.start, self.gtransfer))
        self._dependencies()
        self._syncs(syncs)

    def _group_end(self, k, start, transfer):
        """When item k's groups are through: the latest of each group's last
        member start plus its transfer."""
        return max(max(start[j] for j in self.group[g]) + transfer[g] for g in self.groups_of[k])

    def _binding_group(self, k):
        return max(self.groups_of[k], key=lambda g: max(self.start[j] for j in self.group[g]) + self.gtransfer[g])

    def _dependencies(self):
        """Each item's dependencies (stream predecessor, stream wait,
        receive), the one that bound its start, its latency after it and
        its host release, as columns (numpy over the step's items)."""
        n = self.n
        idx = np.arange(n)
        rank, start, end, kind = self.rank, self.start, self.end, self.kind
        # stream predecessor: the item before it on its rank and stream, in start order
        o = np.lexsort((idx, self.stream, rank))
        same = np.r_[False, (rank[o][1:] == rank[o][:-1]) & (self.stream[o][1:] == self.stream[o][:-1])]
        pred = np.full(n, -1, np.int64)
        pred[o[same]] = o[np.flatnonzero(same) - 1]
        receive = np.array([kind[i] == P2P and _receiver(self.label[i]) == rank[i] for i in range(n)], dtype=bool)

        def ended_last(mask):
            """Per item: the item of its rank in ``mask`` that ended last at or before its start (-1: none)."""
            out = np.full(n, -1, np.int64)
            for r in np.unique(rank).tolist():
                on = np.flatnonzero((rank == r) & mask)
                if not len(on):
                    continue
                by_end = on[np.lexsort((on, end[on]))]
                mine = np.flatnonzero(rank == r)
                j = np.searchsorted(end[by_end], start[mine], side="right") - 1
                out[mine] = np.where(j >= 0, by_end[np.maximum(j, 0)], -1)
            return out

        self.prev_a = ended_last(np.ones(n, bool))
        comp, comm, recv = ended_last(kind == COMPUTE), ended_last(kind != COMPUTE), ended_last(receive)
        is_comp = kind == COMPUTE
        end_of = np.append(end, -1)   # end_of[-1]: none
        x = np.where(~is_comp & (comp >= 0) & (comp != pred), comp, -1)
        waited = is_comp & (comm >= 0) & (start - end_of[comm] <= GAP_NS) & ((pred < 0) | (end_of[pred] < end_of[comm]))
        x = np.where(waited, comm, x)
        r = np.where(is_comp & (recv >= 0) & (recv != pred) & (recv != x), recv, -1)
        self.pred_a, self.x_a, self.r_a = pred, x, r
        low = np.iinfo(np.int64).min // 4
        rel = self.release
        cands = np.stack([np.where(pred >= 0, end_of[pred], low), np.where(x >= 0, end_of[x], low),
                          np.where(r >= 0, end_of[r], low),
                          np.where(np.isnan(rel), low, np.nan_to_num(rel, nan=0).astype(np.int64))])
        which = np.argmax(cands, axis=0)
        best = cands[which, idx]
        pinned = (best == low) | (start - best > GAP_NS)
        self.pinned = pinned
        self.lat = np.where(pinned, 0, start - best).astype(np.int64)
        dep_cols = np.stack([pred, x, r])
        only_pred = ((x < 0) & (r < 0)).tolist()   # most items: at most a stream predecessor
        self.deps = [(() if a < 0 else (a,)) if one else tuple(d for d in (a, b, c) if d >= 0)
                     for one, a, b, c in zip(only_pred, pred.tolist(), x.tolist(), r.tolist())]
        self.rel = [float(s) if p else (None if v != v else float(v))
                    for s, p, v in zip(start.tolist(), pinned.tolist(), rel.tolist())]
        bound = dep_cols[np.minimum(which, 2), idx]
        self.bind = ["host" if p or w == 3 else int(b) for p, w, b in zip(pinned.tolist(), which.tolist(), bound.tolist())]
        self.prev = self.prev_a.tolist()

    def _syncs(self, syncs):
        """Per rank: [(call start, call end, the item it waited for or -1)]."""
        self.sync = {}
        for r, y0, y1 in zip(syncs["rank"].tolist(), syncs["start"].tolist(), syncs["end"].tolist()):
            y0, y1 = y0 - self.origin, y1 - self.origin
            on = np.flatnonzero((self.rank == r) & (self.end <= y1))
            w = int(on[np.argmax(self.end[on])]) if len(on) else -1
            self.sync.setdefault(r, []).append((y0, y1, w))
        for v in self.sync.values():
            v.sort(key=lambda x: x[1])

    # ------------------------------------------------------------------ replay

    def replay(self, dur=None, transfer=None, warp=None, no_host=()):
        """The step with the change: ``dur`` (new durations of the compute
        items), ``transfer`` ({group: new transfer}), ``warp`` ({rank: host
        time -> host time}), ``no_host`` (ranks whose host launches are never
        late).  Returns (starts, ends) arrays.

        The measured times satisfy every dependency as they are, so only the
        items the change reaches are worked out again: those it changes
        directly, then, in start order, the items that depend on one whose
        time moved (a heap of item numbers: items are numbered in start
        order, and each depends only on items before it)."""
        n = self.n
        rank, deps, lat0, rel0, pinned, resid, groups_of, measured = self._lists()
        succ, sync_on, by_release = self._successors()
        prev = self.prev
        measured_end = self._end_list
        dur_l = self._dur_list if dur is None else np.asarray(dur, np.float64).tolist()
        transfer = self.gtransfer if transfer is None else {**self.gtransfer, **transfer}
        warp = {r: w for r, w in (warp or {}).items() if w is not None}
        no_host = set(no_host)
        start, end = list(measured), list(measured_end)
        group = self.group
        shift = {r: [] for r in self.sync}    # (sync end measured, host shift after it)
        pending = {r: list(v) for r, v in self.sync.items() if v}
        moved = {}                            # rank -> whether a sync moved its host
        heap, queued = [], bytearray(n)

        def push(i):
            if not queued[i]:
                queued[i] = 1
                heapq.heappush(heap, i)

        def ended(j, e):
            """item j now ends at e: what depends on it is worked out again"""
            end[j] = e
            for k in succ[j]:
                push(k)
            for r, y1 in sync_on.get(j, ()):   # a sync waited for it: the host's later releases
                rels, items = by_release[r]
                for k in items[bisect.bisect_left(rels, y1):]:
                    push(k)

        def group_end(k):
            return max(max(start[j] for j in group[g]) + transfer[g] for g in groups_of[k]) + resid[k]

        def host(r, t):
            """host time t of rank r after the change: warped, then moved with
            the syncs before it"""
            w = warp.get(r)
            todo = pending.get(r)
            if w is None and not moved.get(r) and not (todo and todo[0][1] <= t):
                return t   # no sync before t has moved the host yet
            t2 = w(t) if w is not None else t
            while todo and todo[0][1] <= t:
                y0, y1, k = todo.pop(0)
                h0 = (w(y0) if w is not None else y0) + _last(shift[r], y0)
                gpu = end[k] + (y1 - measured_end[k]) if k >= 0 else -math.inf
                quick = min(y1 - y0, 1000) if k >= 0 and y1 - measured_end[k] <= GAP_NS * 4 else y1 - y0
                y1n = max(h0 + quick, gpu)
                shift[r].append((y1, y1n - (w(y1) if w is not None else y1)))
                moved[r] = moved.get(r, False) or shift[r][-1][1] != 0
            return t2 + _last(shift.get(r, ()), t)

        # what the change touches directly
        if dur is not None:
            for i in np.flatnonzero(np.asarray(dur, np.float64) != self.dur).tolist():
                push(i)
        for g in set(transfer) - set(self.gtransfer) | {g for g in transfer if transfer[g] != self.gtransfer.get(g)}:
            for k in group.get(g, ()):
                push(k)
        for r in set(warp) | no_host:
            for k in np.flatnonzero(self.rank == r).tolist():
                push(k)
        while heap:
            i = heapq.heappop(heap)
            queued[i] = 0
            r = rank[i]
            cands = [end[k] for k in deps[i]]
            lat = lat0[i]
            rel = rel0[i]
            if no_host and r in no_host:
                if pinned[i]:
                    # launched in time: right after what it waited for, or the rank's item before it
                    lat = 0
                    if prev[i] >= 0:
                        cands.append(end[prev[i]])
                    rel = None if cands else self.starts.get(r, measured[i])
                elif rel is not None:
                    rel, lat = None, min(max(lat, 0), GAP_NS)
            if rel is not None:
                cands.append(host(r, rel))
            s = (max(cands) + lat) if cands else measured[i]
            if groups_of[i]:
                changed = s != start[i]
                start[i] = s
                for k in ({j for g in groups_of[i] for j in group[g]} if changed else (i,)):
                    e = group_end(k)
                    if e != end[k]:
                        ended(k, e)
            else:
                start[i] = s
                e = s + dur_l[i]
                if e != end[i]:
                    ended(i, e)
        return np.array(start, np.float64), np.array(end, np.float64)

    def _successors(self):
        """Per item, the items that depend on it; per item a sync waited
        for, (rank, sync end); per rank, its items with a host release by
        release time."""
        if not hasattr(self, "_succ"):
            n = self.n
            # (dependency, dependent) pairs: the deps' columns, and host:R's prev for a launched-late item
            src = np.concatenate([self.pred_a, self.x_a, self.r_a, np.where(self.pinned, self.prev_a, -1)])
            dst = np.tile(np.arange(n), 4)
            on = src >= 0
            pairs = np.unique(np.stack([src[on], dst[on]], axis=1), axis=0) if on.any() else np.zeros((0, 2), np.int64)
            cut = np.searchsorted(pairs[:, 0], np.arange(n + 1))
            flat = pairs[:, 1].tolist()
            succ = [flat[a:b] for a, b in zip(cut[:-1].tolist(), cut[1:].tolist())]
            sync_on = {}
            for r, calls in self.sync.items():
                for _, y1, k in calls:
                    if k >= 0:
                        sync_on.setdefault(k, []).append((r, y1))
            rel = np.array([np.nan if v is None else v for v in self.rel], np.float64)
            by_release = {}
            for r in set(self.rank.tolist()) | set(self.sync):
                on = np.flatnonzero((self.rank == r) & ~np.isnan(rel))
                o = on[np.lexsort((on, rel[on]))]
                by_release[r] = (rel[o].tolist(), o.tolist())
            self._succ = (succ, sync_on, by_release)
            self._end_list, self._dur_list = self.end.tolist(), self.dur.astype(np.float64).tolist()
        return self._succ

    def _lists(self):
        """The graph's per-item columns as Python lists (the replay reads
        them item by item: a list is read faster than a numpy array)."""
        if not hasattr(self, "_as_lists"):
            self._as_lists = (self.rank.tolist(), self.deps, self.lat.tolist(), list(self.rel),
                              self.pinned.tolist(), self.resid.tolist(), self.groups_of, self.start.tolist())
        return self._as_lists

    def step_time(self, ends=None):
        ends = self.end if ends is None else ends
        return float(ends.max() - self.ref) if self.n else 0.0

    # ------------------------------------------------------------------ the path

    def _ended_before(self, r, t):
        """The item of rank r that ended last at or before t, or -1."""
        if not hasattr(self, "_by_end"):
            self._by_end = {}
            for rank in set(self.rank.tolist()):
                on = np.flatnonzero(self.rank == rank)
                o = on[np.argsort(self.end[on], kind="stable")]
                self._by_end[rank] = (self.end[o], o)
        ends, order = self._by_end.get(r, (np.zeros(0, np.int64), np.zeros(0, np.int64)))
        return _ended_before_impl(ends, order, t)

    def path(self):
        """The critical path of the measured step, last segment first:
        [(category, detail, rank, start, end, waited_for)]."""
        if not self.n:
            return []
        segs, marks = [], []
        i = int(np.argmax(self.end))
        t = self.end[i]
        for _ in range(4 * self.n + 8):
            m = self.group[self._binding_group(i)] if self.members[i] is not None else None
            if m is not None and len(m) > 1:
                last = max(m, key=lambda k: (self.start[k], k))
                ms = self.start[last]
                others = max(self.start[k] for k in m if k != last)
                segs.append(("communication", self.label[i], self.rank[i], ms, t, None))
                i = last
                if ms > others:
                    # the others were all there at ``others``: the late rank's own chain from
                    # then to its arrival is what they waited for (relabelled below)
                    late = int(self.rank[last])
                    marks.append((len(segs), others, late, "p2p wait" if self.kind[last] == P2P else "late rank wait"))
            elif self.kind[i] != COMPUTE:
                segs.append(("communication", self.label[i], self.rank[i], self.start[i], t, None))
            else:
                segs.append(("compute", self.identity[i], self.rank[i], self.start[i], t, None))
            s = self.start[i]
            b = self.bind[i]
            if isinstance(b, (int, np.integer)):
                e = min(self.end[b], s)
                if s > e:
                    segs.append(("idle", "", self.rank[i], e, s, None))
                i, t = int(b), e
                continue
            # waited for its launch: the chain runs through the host, back to the
            # GPU item a sync made the host wait for, else to the step's start
            r = int(self.rank[i])
            w = self._sync_before(r, self.rel[i] if self.rel[i] is not None else s)
            if w >= 0 and self.end[w] >= self.ref:
                e = min(self.end[w], s)
                if s > e:
                    segs.append(("host launch gap", "after a sync", r, e, s, None))
                i, t = w, e
                continue
            if s > self.ref:
                segs.append(("host launch gap", "host", r, self.ref, s, None))
            break
        return _waits(segs, marks)

    def _sync_before(self, r, t):
        """The GPU item the last sync of rank r ending by host time t waited
        for (-1: none, or that sync did not wait for the GPU)."""
        found = -1
        for _, y1, w in self.sync.get(r, ()):
            if y1 > t:
                break
            found = w if w >= 0 and y1 - self.end[w] <= 4 * GAP_NS else -1
        return found


def _waits(segs, marks):
    """The path's segments with the stretch of a late rank's chain the
    others waited through (from when they were all there to its arrival)
    labelled as that wait: category ``late rank wait`` (``p2p wait``), detail
    'rank N: ' and what that rank was doing; a segment across the moment the
    others were there is cut in two."""
    out, active = [], None
    at = {k: (others, late, cat) for k, others, late, cat in marks}
    for k, seg in enumerate(segs):
        if k in at:
            active = at[k]
        cat, detail, rank, s, e, waited = seg
        if active is not None and e <= active[0]:   # back before the others were there
            active = None
        if active is None:
            out.append(seg)
            continue
        others, late, wait = active
        what = f"rank {late}: {cat}" + (f" {detail}" if detail else "")
        if s >= others:
            out.append((wait, what, rank, s, e, late))
            continue
        out.append((wait, what, rank, others, e, late))
        out.append(seg[:3] + (s, others, waited))
        active = None
    return out


def _ended_before_impl(ends, order, t):
    """The index (into ``order``) of the latest end <= t, or -1."""
    j = int(np.searchsorted(ends, t, side="right")) - 1
    return int(order[j]) if j >= 0 else -1


def _receiver(label):
    """The receiving rank of a send/recv item's label ('p2p A->B'), or None."""
    a, _, b = str(label).split()[-1].partition("->")
    return int(b) if b.lstrip("-").isdigit() else None


def _last(pairs, t):
    """The shift of the last (time, shift) pair at or before t (0 before any)."""
    out = 0.0
    for y, d in pairs:
        if y <= t:
            out = d
        else:
            break
    return out

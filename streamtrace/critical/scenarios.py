"""What-if scenarios: one change each, replayed through every step's graph
(replay.StepGraph.replay), never a formula on the sheets.

Names (``--scenario``):

``rank:R``            rank R at the median rank's speed: its host late no
                      more than the median rank (its step start and each
                      collective launch), its compute kernels no slower than
                      the median rank's of the same identity
``host:R``            rank R's host launch gaps removed
``kernel:P:IDENTITY`` every kernel of that identity P % faster
``compute:P``         every compute kernel P % faster
``contention:IDENTITY`` that kernel, where it overlapped communication, at
                      the median duration of its instances that did not
``link:A-B``          the send/recv transfers between ranks A and B (both
                      ways) at the median link's bandwidth
"""
import bisect

import numpy as np
import pandas as pd

from ..errors import InvalidArgumentError
from .graph import COMPUTE, P2P

DEFAULT_PERCENT = 20


class Scenario:
    def __init__(self, name, words):
        self.name, self.words = name, words

    def change(self, g, run):
        """replay() keyword arguments for step graph g (``run``: RunFacts)."""
        raise NotImplementedError


class RankSpeed(Scenario):
    def __init__(self, rank):
        super().__init__(f"rank:{rank}", f"rank {rank}'s late arrivals and slower kernels")
        self.rank = rank

    def change(self, g, run):
        r = self.rank
        dur = g.dur.astype(np.float64).copy()
        on = np.flatnonzero((g.rank == r) & (g.kind == COMPUTE))
        if len(on):
            ids = pd.Series(g.identity[on])
            target = ids.map(run.median_dur).to_numpy(np.float64)
            mine = ids.map(run.rank_dur_of(r)).to_numpy(np.float64)
            slower = mine > target   # False where either is missing (NaN)
            dur[on[slower]] = dur[on[slower]] * target[slower] / mine[slower]
        return dict(dur=dur, warp={r: _warp(g, r)})


class HostGaps(Scenario):
    def __init__(self, rank):
        super().__init__(f"host:{rank}", f"rank {rank}'s host launch gaps")
        self.rank = rank

    def change(self, g, run):
        return dict(no_host=(self.rank,))


class KernelFaster(Scenario):
    def __init__(self, identity, percent):
        super().__init__(f"kernel:{_num(percent)}:{identity}", f"{_short(identity)} {_num(percent)} % faster:")
        self.identity, self.percent = identity, percent

    def change(self, g, run):
        dur = g.dur.astype(np.float64).copy()
        on = (g.kind == COMPUTE) & (g.identity == self.identity)
        dur[on] *= 1 - self.percent / 100
        return dict(dur=dur)


class ComputeFaster(Scenario):
    def __init__(self, percent):
        super().__init__(f"compute:{_num(percent)}", f"every compute kernel {_num(percent)} % faster:")
        self.percent = percent

    def change(self, g, run):
        dur = g.dur.astype(np.float64).copy()
        dur[g.kind == COMPUTE] *= 1 - self.percent / 100
        return dict(dur=dur)


class Contention(Scenario):
    def __init__(self, identity):
        super().__init__(f"contention:{identity}", f"{_short(identity)} slowed beside communication")
        self.identity = identity

    def change(self, g, run):
        dur = g.dur.astype(np.float64).copy()
        alone = run.isolated_dur.get(self.identity)
        if alone is not None:
            on = (g.kind == COMPUTE) & (g.identity == self.identity) & g.overlapped
            dur[on] = np.minimum(dur[on], alone)
        return dict(dur=dur)


class LinkBandwidth(Scenario):
    """Both directions of the link between two ranks."""

    def __init__(self, a, b):
        a, b = sorted((a, b))
        super().__init__(f"link:{a}-{b}", f"the slow transfers between ranks {a} and {b}")
        self.link = (a, b)

    def change(self, g, run):
        transfer = {}
        bw = run.median_link_bw
        if bw:
            for inst, t in g.gtransfer.items():
                link, nbytes = _link(g.glabel.get(inst)), g.gbytes.get(inst)
                if link is not None and tuple(sorted(link)) == self.link and nbytes == nbytes:
                    transfer[inst] = min(t, nbytes / bw)
        return dict(transfer=transfer)


def _warp(g, r):
    """Rank r's host times mapped onto the median rank's: anchored at its
    step start and its collective launches, each moved back by how much
    later it was than the median rank's (never forward)."""
    src, dst = [], []
    if r in g.starts:
        src.append(g.starts[r])
        dst.append(float(np.median(list(g.starts.values()))))
    for m in g.group.values():
        if g.kind[m[0]] == P2P or len(m) < 2:
            continue
        mine = [k for k in m if g.rank[k] == r]
        rel = [g.release[k] for k in m if g.release[k] == g.release[k]]
        if not mine or len(rel) < 2 or g.release[mine[0]] != g.release[mine[0]]:
            continue
        src.append(g.release[mine[0]])
        dst.append(float(np.median(rel)))
    if not src:
        return None
    src = np.asarray(src, np.float64)
    o = np.argsort(src, kind="stable")
    src = src[o]
    shift = np.maximum(0.0, src - np.asarray(dst)[o])
    dst = np.maximum.accumulate(src - shift)

    xs, ys, first = src.tolist(), dst.tolist(), float(shift[0])

    def warp(t):   # called once per host release: plain Python, not numpy on a scalar
        if t <= xs[0]:
            return t - first
        if t >= xs[-1]:
            return t - (xs[-1] - ys[-1])
        j = bisect.bisect_right(xs, t)
        x0, x1, y0, y1 = xs[j - 1], xs[j], ys[j - 1], ys[j]
        return y0 + (t - x0) * (y1 - y0) / (x1 - x0) if x1 > x0 else y1
    return warp


class RunFacts:
    """What the scenarios read of the whole run: kernel durations per
    identity (per rank, median rank, alone), link bandwidths."""

    def __init__(self, nodes):
        comp = nodes[nodes["kind"] == COMPUTE]
        dur = (comp["end"] - comp["start"]).astype(np.float64)
        per = dur.groupby([comp["rank"], comp["identity"]]).median()
        self.rank_dur = per.to_dict()
        self.median_dur = per.groupby(level=1).median().to_dict()
        alone = dur[~comp["overlapped"].to_numpy(bool)].groupby(comp["identity"][~comp["overlapped"].to_numpy(bool)])
        self.isolated_dur = alone.median().to_dict()
        over = dur[comp["overlapped"].to_numpy(bool)].groupby(comp["identity"][comp["overlapped"].to_numpy(bool)])
        self.overlapped_dur = over.median().to_dict()
        # what each identity's instances beside communication lost against its median alone
        lost = over.sum() - over.size() * pd.Series(self.isolated_dur).reindex(over.size().index)
        self.contention_lost = lost.dropna().sort_values(ascending=False).to_dict()
        self.total_dur = dur.groupby(comp["identity"]).sum().sort_values(ascending=False)
        self.link_bw, self.median_link_bw = _link_bandwidths(nodes)
        self._rank_dur = {}

    def rank_dur_of(self, r):
        """{identity: rank r's median duration}"""
        if r not in self._rank_dur:
            self._rank_dur[r] = {k: v for (rank, k), v in self.rank_dur.items() if rank == r}
        return self._rank_dur[r]


def _link_bandwidths(nodes):
    """({(a, b): median bytes/ns of the pairs between ranks a and b, both
    ways}, the median over links) from the node rows: a pair's transfer
    runs from its last member's start to its first member's end."""
    p2p = nodes[nodes["kind"] == P2P]
    if not len(p2p):
        return {}, None
    g = p2p.groupby("instance", sort=False)
    pairs = pd.DataFrame({"t": g["end"].min() - g["start"].max(), "bytes": g["nbytes"].first(),
                          "label": g["label"].first()})
    pairs = pairs[(pairs["t"] > 0) & pairs["bytes"].notna()]
    links = [_link(x) for x in pairs["label"].tolist()]
    pairs["link"] = [None if x is None else tuple(sorted(x)) for x in links]
    pairs = pairs[pairs["link"].notna()]
    if not len(pairs):
        return {}, None
    bw = (pairs["bytes"] / pairs["t"]).groupby(pairs["link"]).median()
    out = {k: float(v) for k, v in bw.items()}
    return out, float(np.median(list(out.values())))


def _link(label):
    """(sender, receiver) of a send/recv pair's label ('p2p A->B'), or None."""
    a, _, b = str(label).split()[-1].partition("->")
    return (int(a), int(b)) if a.lstrip("-").isdigit() and b.lstrip("-").isdigit() else None


def parse(name):
    """The Scenario a ``--scenario`` name means."""
    kind, _, rest = str(name).partition(":")
    try:
        if kind == "rank":
            return RankSpeed(int(rest))
        if kind == "host":
            return HostGaps(int(rest))
        if kind == "compute":
            return ComputeFaster(_percent(rest or DEFAULT_PERCENT))
        if kind == "kernel":
            p, _, identity = rest.partition(":")
            if not identity:
                raise ValueError
            return KernelFaster(identity, _percent(p))
        if kind == "contention" and rest:
            return Contention(rest)
        if kind == "link":
            a, _, b = rest.replace("->", "-").partition("-")
            return LinkBandwidth(int(a), int(b))
    except ValueError:
        pass
    raise InvalidArgumentError(f"--scenario {name!r}: not a scenario (rank:R, host:R, kernel:P:IDENTITY, "
                               "compute:P, contention:IDENTITY, link:A-B)")


def _percent(p):
    p = float(p)
    if not 0 < p < 100:
        raise ValueError
    return p


def _num(x):
    return f"{x:g}"


def _short(name, width=60):
    name = str(name)
    return name if len(name) <= width else name[: width - 3] + "..."


def candidates(paths, run, percent=DEFAULT_PERCENT, kernels=3):
    """The scenarios worth replaying for this run, from its critical paths
    (``paths``: the critical_path DataFrame)."""
    out = []
    # the ranks the paths waited for most, and the one whose work they ran through most
    waits = paths[paths["category"].isin(["late rank wait", "p2p wait"])].groupby("waited_for")["dur_us"].sum()
    ranks = [int(r) for r in waits.sort_values(ascending=False).index[:3]]
    busy = paths[paths["category"] == "compute"].groupby("rank")["dur_us"].sum()
    if len(busy) and int(busy.idxmax()) not in ranks:
        ranks.append(int(busy.idxmax()))
    for r in ranks:
        out.append(RankSpeed(r))
    gaps = paths[paths["category"] == "host launch gap"].groupby("rank")["dur_us"].sum()
    for r in gaps[gaps > 0].sort_values(ascending=False).index[:2].tolist():
        out.append(HostGaps(int(r)))
    comp = paths[paths["category"] == "compute"].groupby("detail")["dur_us"].sum().sort_values(ascending=False)
    if not len(comp):   # no kernel on the paths: the run's busiest
        comp = run.total_dur
    for identity in comp.index[:kernels].tolist():
        out.append(KernelFaster(identity, percent))
    # kernels slowed beside communication, by the time they lost (on the paths or not)
    slowed = [k for k, lost in run.contention_lost.items()
              if lost > 0 and run.overlapped_dur[k] > 1.1 * run.isolated_dur[k]]
    for identity in slowed[:kernels]:
        out.append(Contention(identity))
    if run.median_link_bw:
        for link, bw in sorted(run.link_bw.items()):
            if bw < 0.8 * run.median_link_bw:
                out.append(LinkBandwidth(*link))
    return out

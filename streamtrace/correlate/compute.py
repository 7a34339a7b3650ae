"""``_Compute``: every rank's compute kernels in one table, with identity
codes shared by all ranks (built a rank at a time as ranks end)."""
import numpy as np

from ..parallel.heap import give_back_freed_memory
from .growing import _Growing


class _Compute:
    """Every rank's compute kernels, concatenated in rank order, each rank's
    block sorted by start, with identity codes shared by all ranks:
    ``ident`` by identity text (name grid block) and ``key`` by the
    (name, grid, block) triple, both numbered in order of first appearance.
    Other columns are read from the rank's timeline with ``column``.

    Built a rank at a time (``add``): StreamCollector adds each rank at its
    end, while the next one streams in, so the analysis finds it made.  A
    rank's ``compute_start``/``compute_end`` then become views of its block:
    shifting the timeline onto the aligned clock shifts the table too."""

    COLUMNS = ("start", "end", "ident", "key")

    def __init__(self, capacity=0):
        self.timelines = {}
        self.offset, self.offset_end, self.max_dur, self.l_key = {}, {}, {}, {}
        self.texts, self.triples = [], []        # by ident / by key
        self._text_code, self._triple_code = {}, {}
        self._rows = _Growing({c: (np.int64, ()) for c in self.COLUMNS}, capacity)

    @classmethod
    def of(cls, timelines):
        """The table of these timelines, in their order."""
        comp = cls(sum(len(tl.compute_start) for tl in timelines.values()))
        for r, tl in timelines.items():
            comp.add(r, tl)
        return comp

    def add(self, r, tl, room_for=1):
        """Append rank r's kernels, with room for ``room_for`` ranks of this
        size in all when the arrays must grow (untouched room costs no memory)."""
        m = len(tl.compute_start)
        before = self._rows.cols["start"]
        block = self._rows.extend(m, at_least=m * room_for)
        c = self._rows.cols
        if c["start"] is not before:   # grown: the earlier ranks' views, onto the new arrays
            for q, earlier in self.timelines.items():
                rows = self.rank_slice(q)
                earlier.compute_start, earlier.compute_end = c["start"][rows], c["end"][rows]
        # by the rank's kernel identity code (lcode): the shared codes
        l_ident = np.zeros(len(tl.lkeys), dtype=np.int64)
        l_key = np.zeros(len(tl.lkeys), dtype=np.int64)
        for i, triple in zip(tl.compute_lcodes.tolist(), tl.compute_triples):   # once per distinct identity
            text = f"{triple[0]} {triple[1]} {triple[2]}"
            l_ident[i] = self._text_code.setdefault(text, len(self._text_code))
            if l_ident[i] == len(self.texts):
                self.texts.append(text)
            l_key[i] = self._triple_code.setdefault(triple, len(self._triple_code))
            if l_key[i] == len(self.triples):
                self.triples.append(triple)
        c["start"][block], c["end"][block] = tl.compute_start, tl.compute_end
        np.take(*tl.by_lcode(l_ident), out=c["ident"][block])
        np.take(*tl.by_lcode(l_key), out=c["key"][block])
        tl.compute_start, tl.compute_end = c["start"][block], c["end"][block]
        self.timelines[r] = tl
        self.offset[r], self.offset_end[r] = block.start, block.stop
        self.l_key[r] = l_key
        self.max_dur[r] = tl.compute_max_dur
        if m >= 1 << 16:
            # the rank's own start and end arrays (1 MB or more), copied into
            # the table, are freed: their pages are handed back before the next
            # rank's rows are written (8 x 1 GB: ~40 MB off the reduce's peak)
            give_back_freed_memory()

    def holds(self, timelines):
        """True when this table is still that of ``timelines``: the same
        ranks in the same order, none classified again since it was added."""
        return list(self.timelines) == list(timelines) and all(
            self.timelines[r] is tl and tl.compute_start.base is self._rows.cols["start"]
            for r, tl in timelines.items())

    start = property(lambda self: self._rows.cols["start"][:self._rows.n])
    end = property(lambda self: self._rows.cols["end"][:self._rows.n])
    ident = property(lambda self: self._rows.cols["ident"][:self._rows.n])
    key = property(lambda self: self._rows.cols["key"][:self._rows.n])
    n_ident = property(lambda self: len(self.texts))

    def rank_slice(self, r):
        return slice(self.offset[r], self.offset_end[r])

    def column(self, r, name, j):
        """Timeline column ``name`` of compute kernels j (indices into this
        table) of rank r."""
        return self.timelines[r].compute_column(name, np.asarray(j) - self.offset[r])


def compute_table(timelines):
    """The analysis' table of compute kernels, ``{rank: Timeline}`` added in
    ascending rank order (as ``StreamCollector`` adds ranks that arrive so)."""
    compute = _Compute()
    for i, (r, tl) in enumerate(sorted(timelines.items())):
        ws = tl.meta.get("world_size")
        compute.add(r, tl, room_for=ws if isinstance(ws, int) and ws > 0 else 2 * (i + 2))
    return compute

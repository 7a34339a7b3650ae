"""One rank's frames reduced, as they stream past, to what align needs.

``RankCollector`` keeps a rank's kernels, kernel launches, collective CPU ops
and comm-argument records (see ``align.stage``'s docstring for what happens
to them at the rank's end).  This module does not import pandas, so a rank can start
being read before pandas is loaded: ``collective-report`` starts its reading
threads first and imports pandas while the C tokenizer works.
"""
import numpy as np

from .. import collectives as coll
from .._native import NONE, gather, select_many
from ..errors import StreamtraceError
from ..stream.format import Kind
from ..stream.packing import Squeezed

# string classes (bit flags), computed once per string
S_KERNEL_CAT, S_CPU_CAT, S_RUNTIME_CAT = 1, 2, 4
S_NCCL_NAME, S_ANNOT, S_RPC, S_C10D, S_LAUNCH = 8, 16, 32, 64, 128
# user annotations (record_function) that may label a communication launch
S_USER_CAT, S_LABEL = 256, 512
S_STEP = 1024
OP_ANNOT, OP_RPC, OP_C10D = 1, 2, 3
# the complete events kept: kernels, kernel launches, collective CPU ops, user
# labels, profiler steps (a few per rank: point-to-point analysis reports per step)
_RULES = (dict(cat_any=S_KERNEL_CAT, ph=b"X"), dict(cat_any=S_RUNTIME_CAT, name_any=S_LAUNCH, ph=b"X"),
          dict(cat_any=S_CPU_CAT, name_any=S_ANNOT | S_RPC | S_C10D, ph=b"X"),
          dict(cat_any=S_USER_CAT, name_any=S_LABEL, ph=b"X"),
          dict(cat_any=S_CPU_CAT, name_any=S_STEP, ph=b"X"))

_K_DTYPE = np.dtype([("event", "<i8"), ("ts", "<i8"), ("dur", "<i8"), ("pid", "<i8"), ("tid", "<i8"),
                     ("corr", "<i8"), ("ext", "<i8"), ("name", "<u4"), ("stream", "<i4"), ("device", "<i4")],
                    align=True)
_L_DTYPE = np.dtype([("event", "<i8"), ("ts", "<i8"), ("dur", "<i8"), ("pid", "<i8"), ("tid", "<i8"),
                     ("corr", "<i8")])
_O_DTYPE = np.dtype([("event", "<i8"), ("ts", "<i8"), ("dur", "<i8"), ("pid", "<i8"), ("tid", "<i8"),
                     ("ext", "<i8"), ("name", "<u4"), ("kind", "u1")], align=True)
# (kept field, EVENTS field) of each kind; "event" is the rank's event index
_K_FIELDS = (("ts", "ts"), ("dur", "dur"), ("pid", "pid"), ("tid", "tid"), ("corr", "correlation"),
             ("ext", "external_id"), ("name", "name"), ("stream", "stream"), ("device", "device"))
_L_FIELDS = (("ts", "ts"), ("dur", "dur"), ("pid", "pid"), ("tid", "tid"), ("corr", "correlation"))
_O_FIELDS = (("ts", "ts"), ("dur", "dur"), ("pid", "pid"), ("tid", "tid"), ("ext", "external_id"), ("name", "name"))
_U_DTYPE = np.dtype([("ts", "<i8"), ("dur", "<i8"), ("tid", "<i8"), ("name", "<u4")], align=True)
_U_FIELDS = (("ts", "ts"), ("dur", "dur"), ("tid", "tid"), ("name", "name"))


def is_label_name(s):
    """Whether a user annotation of this name may label a launch: not the
    profiler's step marker and not the ``nccl:*`` annotation of the
    collective itself."""
    return bool(s) and not s.startswith(("ProfilerStep#", "nccl:"))


def classify_string(s, custom=None):
    """Bit flags of one string-table entry (S_* constants); ``custom``: a
    CustomCollectives whose patterns also make kernel names collective."""
    c = 0
    if s in ("kernel", "Kernel"):
        c |= S_KERNEL_CAT
    elif s in ("cpu_op", "Operator", "user_annotation"):
        c |= S_CPU_CAT
    elif s in ("cuda_runtime", "Runtime", "cuda_driver"):
        c |= S_RUNTIME_CAT
    if coll.COLLECTIVE_KERNEL_RE.search(s) or (custom is not None and custom.collective_of(s)):
        c |= S_NCCL_NAME
    if s.startswith("nccl:"):
        c |= S_ANNOT
    elif s == "record_param_comms":
        c |= S_RPC
    elif s.startswith("c10d::"):
        c |= S_C10D
    if s.startswith("ProfilerStep#"):
        c |= S_STEP
    if s[:2] in ("cu", "hi") and "Launch" in s and ("Kernel" in s or "Graph" in s):
        c |= S_LAUNCH
    if s == "user_annotation":
        c |= S_USER_CAT
    if is_label_name(s):
        c |= S_LABEL
    return c


class RankCollector:
    """Consumes one rank's frames; ``describe.finish_rank`` makes its RankResult.

    Kept per frame: ``kernels``, ``launches``, ``ops`` and ``labels`` (numpy
    record arrays of the candidate rows; labels: user annotations),
    ``comms`` (comm-argument records) and ``steps`` (the ProfilerStep#
    spans, as ops).  ``squeeze``: kernels and launches are kept compressed
    (``packing.Squeezed``; read them with ``packing.arrays``), for a map that
    holds whole ranks beside other state (the blocking analysis): they are
    most of what a collector holds, and are looked through once at the end."""

    def __init__(self, rank, custom=None, squeeze=False):
        self.rank = rank
        self.custom = custom   # CustomCollectives or None
        self.squeeze = squeeze
        self.strings = []
        self._cls = np.zeros(1024, dtype=np.uint16)  # slot len(strings) is always 0 (NOSTR sentinel)
        self.n_events = 0
        self.kernels, self.launches, self.ops, self.comms, self.labels, self.steps = [], [], [], [], [], []
        self.meta = None

    # ---------------------------------------------------------------- frames
    def add(self, frame):
        kind = frame.kind
        if kind == Kind.EVENTS:
            self._events(frame.records())
        elif kind == Kind.STRINGS:
            self._strings(frame.strings())
        elif kind == Kind.COMMS:
            recs = frame.records()
            if len(recs):
                self.comms.append(recs)  # a view: the payload is exactly the records
        elif kind == Kind.META:
            if self.meta is not None:
                raise StreamtraceError(f"rank {self.rank}: two metadata frames (the same rank appears twice in the input)")
            self.meta = frame.json()

    def _strings(self, decoded):
        first, strings = decoded
        if first != len(self.strings):
            raise StreamtraceError(f"rank {self.rank}: string frame starts at id {first}, expected {len(self.strings)}")
        need = len(self.strings) + len(strings) + 1
        if need > len(self._cls):
            grown = np.zeros(max(need, 2 * len(self._cls)), dtype=np.uint16)
            grown[: len(self.strings)] = self._cls[: len(self.strings)]
            self._cls = grown
        n0 = len(self.strings)
        self._cls[n0:n0 + len(strings)] = [classify_string(s, self.custom) for s in strings]
        self.strings.extend(strings)

    def lookup(self, ids):
        """Class bits of string ids (0 for NOSTR or ids not yet defined)."""
        return self._cls[np.minimum(ids, len(self.strings))]

    def _events(self, recs):
        base = self.n_events
        self.n_events += len(recs)
        if not len(recs):
            return
        # one C pass picks the rows of every kind (no per-frame class
        # lookups or masks in numpy, and no GIL held meanwhile), and one C
        # pass per kind copies the kept rows' fields
        kernels, launches, ops, labels, steps = select_many(recs, self._cls, len(self.strings), _RULES)
        launches = launches[recs["correlation"][launches] != NONE]
        for rows, dtype, fields, kept in ((kernels, _K_DTYPE, _K_FIELDS, self.kernels),
                                          (launches, _L_DTYPE, _L_FIELDS, self.launches),
                                          (ops, _O_DTYPE, _O_FIELDS, self.ops),
                                          (labels, _U_DTYPE, _U_FIELDS, self.labels),
                                          (steps, _O_DTYPE, _O_FIELDS, self.steps)):
            if not len(rows):
                continue
            out = np.empty(len(rows), dtype)
            if "event" in dtype.names:
                out["event"] = base + rows
            gather(recs, rows, [(src, out[dst]) for dst, src in fields])
            if kept is self.ops:
                nc = self.lookup(out["name"])
                out["kind"] = np.where((nc & S_ANNOT) != 0, OP_ANNOT, np.where((nc & S_RPC) != 0, OP_RPC, OP_C10D))
            elif kept is self.steps:
                out["kind"] = 0
            elif self.squeeze and (kept is self.kernels or kept is self.launches):
                out = Squeezed(out)
            kept.append(out)


def collected_rank(frames, rank=None, custom=None):
    """A RankCollector that has taken every one of a rank's frames, not yet
    finished (``describe.finish_rank`` makes its RankResult): a reading
    thread can go on to the next rank while another finishes this one."""
    collector = None
    for frame in frames:
        if collector is None:
            collector = RankCollector(frame.rank if rank is None else rank, custom)
        collector.add(frame)
    return collector or RankCollector(rank or 0, custom)

"""A rank's Timeline reduced, at the rank's end, to what the cross-rank
analyses read of it (``compact``): the blocking analysis' per-rank summary.

What every analysis reads of a rank, and what is kept for it:

- late_rank: the compute kernels (start, end, identity) of the windows
  before each collective, and their median durations across ranks: every
  compute kernel's start, end and identity code is kept (the medians are
  exact, so every duration counts), with its stream and launch shape as
  one small code per kernel into a table of the rank's distinct shapes
  (``compute_shape``, ``compute_shapes``).  Host ops: the CPU ops on the
  threads that launched the rank's collectives (the only threads looked
  at), in narrow columns (``pack_ops``: kept so as the rank streams past),
  compressed part by part (in the bounded map as each part arrives; a part
  with ops on other threads is cut down at the rank's end) and unpacked one
  part at a time when the rank's gaps are read.
- overlap: the same kernels and their union (made again when used,
  ``Timeline.compute_union``); the CTAs of the rank's comm kernels
  (``by_event`` keeps those only).
- inflation: the buckets are worked out again from the kernels and the comm
  union when used (``Timeline.buckets``).
- exposed_comm: the window lengths (taken at the rank's end), the comm
  union, the compute union (made again), the GPU extent and the profiler
  steps.

Everything else of the rank (its other GPU activities: comm kernels,
memcpy, memset; CPU ops on other threads; the copy and busy unions) is
dropped.  The result is still a ``Timeline`` (``gpu`` is None), plain numpy
arrays, dicts and lists: it pickles.

A rank whose collectives align may link include a kernel its name did not
mark as comm is left whole: align may then take that kernel out of compute,
and the rank is classified again from its GPU rows (``Inputs``).
"""
import numpy as np

from .. import _native
from ..stream.summaries import SummaryError
from .timeline import Timeline

#: the SUMMARY frame holding a rank's compacted Timeline (``extract`` writes
#: it after the rank's META frame; ``correlate`` reads it instead of the
#: rank's events)
SUMMARY_NAME = "correlate.rank"
#: changes whenever the Timeline's fields, or what the collection and
#: ``compact`` make of a rank's frames, change
SUMMARY_VERSION = "1"
_REQUIRED = ("rank", "meta", "names", "gpu", "by_event", "cpu_ops", "steps", "shift", "unions", "window_lengths")


def timeline_summary(tl):
    """A compacted Timeline as a SUMMARY frame's value (plain values and arrays)."""
    return dict(tl.__dict__)


def timeline_from_summary(value):
    """The Timeline a SUMMARY frame's value holds; ValueError when it is not one."""
    if not isinstance(value, dict) or not all(k in value for k in _REQUIRED) or not isinstance(value["meta"], dict):
        raise ValueError("not a rank's timeline summary")
    if not isinstance(value["cpu_ops"], list):
        raise ValueError("its host ops are not a list of parts")
    for packed in value["cpu_ops"]:
        if isinstance(packed, dict) and "data" in packed:
            _check_squeezed(packed)
    tl = Timeline.__new__(Timeline)
    tl.__dict__.update(value)
    return tl


def _squeezed_size(packed):
    """The bytes a compressed part of host ops unpacks to, from its count and
    column types (never from what its zstd frame declares)."""
    dtypes = [np.dtype(dt) for dt in packed["dtypes"]]
    if len(dtypes) != len(_COLUMNS) or any(dt.kind not in "iu" for dt in dtypes):
        raise SummaryError(f"a packed part of host ops has column types {packed['dtypes']!r}")
    n = packed["n"]
    if not isinstance(n, (int, np.integer)) or n < 0:
        raise SummaryError(f"a packed part of host ops has a count of {n!r}")
    return dtypes, int(n) * sum(dt.itemsize for dt in dtypes)


def _check_squeezed(packed):
    """A part read from a stream: its zstd frame must declare exactly the size
    its count and types imply, so that unpacking it later costs no more."""
    import zstandard

    _, size = _squeezed_size(packed)
    try:
        declared = zstandard.frame_content_size(packed["data"])
    except zstandard.ZstdError as exc:
        raise SummaryError(f"a packed part of host ops is not a zstd frame ({exc})") from None
    if declared != size:
        raise SummaryError(f"a packed part of host ops declares {declared} bytes, not the {size} its count implies")

#: what compact keeps of each compute kernel's GPU row, in a table of the rank's distinct values
SHAPE_COLUMNS = ("stream", "ctas", "threads", "regs", "smem")


def compact(tl, linked, launch_tids):
    """Reduce Timeline ``tl`` in place to its summary and return it.

    ``linked``: the event indices of the rank's kernels align may link to a
    collective; ``launch_tids``: the threads that launched them (the late
    rank's host ops are looked for on those only)."""
    if not np.isin(np.asarray(linked, dtype=np.int64), tl.comm_events).all():
        return tl   # align may take one of its compute kernels out: kept whole (see above)
    g, rows = tl.gpu, tl.compute_rows
    tl.gpu = tl.compute_rows = tl.compute_buckets = None
    # the compute kernels' shape columns picked out, then the rank's GPU rows
    # let go before the shape key is made: this is the peak of a rank's end
    picked = {c: g[c][rows] for c in SHAPE_COLUMNS}
    del g, rows
    # the shape key filled a column at a time (no stacked temporaries)
    shape = np.empty((len(tl.compute_lcode), 1 + len(SHAPE_COLUMNS)), dtype=np.int64)
    shape[:, 0] = tl.compute_lcode
    shape[:, 1] = picked["stream"]
    for j, c in enumerate(SHAPE_COLUMNS[1:], 2):
        shape[:, j] = np.ascontiguousarray(picked[c], dtype=np.float64).view(np.int64)
    codes, first = _native.factorize_rows(shape) if len(shape) else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    del shape
    tl.compute_shape = codes.astype(np.uint16 if len(first) <= 1 << 16 else np.int64)
    tl.compute_shapes = {c: picked[c][first] for c in SHAPE_COLUMNS}
    del picked
    tl.compute_shapes["lcode"] = tl.compute_lcode[first]
    tl.compute_lcode = None   # held by the shape (``Timeline.by_lcode``)
    ev, ctas = tl.by_event
    keep = np.isin(ev, tl.comm_events)
    tl.by_event = (ev[keep], ctas[keep])
    tl.cpu_ops = _ops_on_threads(tl.cpu_ops, np.asarray(launch_tids, dtype=np.int64))
    tl.unions = {"comm": tl.unions["comm"]}   # the compute union is made again when used (as large as the kernels)
    tl.nccl_name = None
    tl.meta = _meta_read(tl.meta)
    return tl


def _meta_read(meta):
    """What the analyses read of a rank's metadata (world size, base time,
    device properties): the rest (distributedInfo's group lists, one entry
    per rank of the job in every rank's trace) would make the summaries of
    N ranks O(N^2)."""
    trace = meta.get("trace") if isinstance(meta.get("trace"), dict) else {}
    return {"world_size": meta.get("world_size"),
            "trace": {k: trace[k] for k in ("baseTimeNanoseconds", "deviceProperties") if k in trace}}


def _narrow(a):
    """a as int32 when every value fits (the usual case), else as it is."""
    if len(a) and (a.min() < -(1 << 31) or a.max() >= 1 << 31):
        return a
    return a.astype(np.int32)


def pack_ops(start, end, tid, name):
    """CPU op spans (start, end, tid as int64, name id as uint32; starts
    ascending, as a frame's are) in narrow columns: the first start and
    int32 steps from one start to the next, int32 durations and threads
    (each left int64 when a value does not fit), names as uint16 when
    every id fits: 14 bytes an op instead of 28."""
    return {"first": int(start[0]) if len(start) else 0, "step": _narrow(np.diff(start, prepend=start[:1])),
            "dur": _narrow(end - start), "tid": _narrow(tid),
            "name": name.astype(np.uint16) if len(name) and name.max() < 1 << 16 else name,
            "threads": _threads(tid)}


def _threads(tid):
    """The distinct threads of a part's ops (its runs' first values made
    unique: ops come in runs of one thread, so this sorts few values)."""
    if not len(tid):
        return np.zeros(0, np.int64)
    heads = np.flatnonzero(tid[1:] != tid[:-1]) + 1
    return np.unique(np.concatenate([tid[:1], tid[heads]])).astype(np.int64)


_COLUMNS = ("step", "dur", "tid", "name")


def _squeeze(packed):
    """A packed part's columns zstd-compressed into one bytes object (kept
    for the whole run; runs of near-equal steps and few names compress 2-3x)."""
    import zstandard

    cols = [np.ascontiguousarray(packed[c]) for c in _COLUMNS]
    n = len(cols[0])
    # streamed into one frame that records its size (what ``_unsqueeze``'s
    # one-shot decompress needs), with no joined copy of the columns
    z = zstandard.ZstdCompressor(level=1).compressobj(size=sum(c.nbytes for c in cols))
    data = [z.compress(c.data) for c in cols]
    data.append(z.flush())
    return {"first": packed["first"], "n": n, "dtypes": [c.dtype.str for c in cols], "data": b"".join(data),
            "threads": packed["threads"]}


def _unsqueeze(packed):
    import zstandard

    # the size is the one the part's count and dtypes imply, never the one its
    # zstd frame declares: a part read from a stream may be hostile
    dtypes, size = _squeezed_size(packed)
    try:
        raw = zstandard.ZstdDecompressor().decompress(packed["data"], max_output_size=size)
    except zstandard.ZstdError as exc:
        raise SummaryError(f"a packed part of host ops does not decompress to its {size} bytes ({exc})") from None
    if len(raw) != size:
        raise SummaryError(f"a packed part of host ops holds {len(raw)} bytes, not {size}")
    at = 0
    out = {"first": packed["first"], "threads": packed["threads"]}
    for c, dt in zip(_COLUMNS, dtypes):
        out[c] = np.frombuffer(raw, dtype=dt, count=packed["n"], offset=at)
        at += out[c].nbytes
    return out


def unpack_ops(packed):
    """``pack_ops``' spans again (compressed or not), as (start, end, tid, name id) arrays."""
    if "data" in packed:
        packed = _unsqueeze(packed)
    start = np.cumsum(packed["step"], dtype=np.int64)
    start += packed["first"]
    return start, start + packed["dur"], packed["tid"].astype(np.int64), packed["name"].astype(np.uint32)


def _ops_on_threads(packed_parts, tids):
    """The packed parts' ops on threads ``tids``, in stream order, as
    compressed parts.  A compressed part whose every op is on those threads
    (most: a rank's ops are mostly on the threads that launch its kernels)
    is kept as it is, not unpacked and compressed again; the others are
    unpacked one at a time and their picked ops packed and compressed, so a
    rank's picked spans are never held whole as int64."""
    tids = np.unique(np.asarray(tids, dtype=np.int64))
    out = []
    for packed in packed_parts:
        wanted = np.isin(packed["threads"], tids)
        if not wanted.any():   # also a part with no ops
            continue
        if wanted.all():
            out.append(packed if "data" in packed else _squeeze(packed))
            continue
        start, end, tid, name = unpack_ops(packed)
        on = np.isin(tid, tids)
        out.append(_squeeze(pack_ops(start[on], end[on], tid[on], name[on])))
    return out

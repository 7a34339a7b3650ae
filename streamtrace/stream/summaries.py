"""Per-rank summaries as ``SUMMARY`` frames: what a stage's per-rank map
made of a rank, carried in the stream so that a later stage reads it
instead of collecting the rank's events again.

A summary is a tree of plain values: None, bool, int, float, str, bytes,
lists, tuples, dicts, numpy scalars and numpy arrays (numeric, bool, or
object arrays of plain values).  It is encoded without pickle (a stream may
come from anywhere: decoding builds plain values and numeric arrays only),
as a small JSON header (name, version, sizes), one zstd frame holding the
tree as JSON and every numeric array's bytes, and the ``bytes`` values
after it as they are (they are already compressed parts).
docs/stream-format.md, "SUMMARY frames", gives the layout byte by byte.

The first SUMMARY frame of a rank, written before its events, is the
announcement (``ANNOUNCE``): it names the summaries that follow the rank's
META frame and the version of each, so a stage knows before the rank's
events arrive whether it will need them.
"""
import json
import math
import struct

import numpy as np
import zstandard

from .limits import SUMMARY_ENV, LimitError, admitted, max_summary_bytes, over, single_limit
from .packing import stored_frame

ANNOUNCE = "summaries"   # the name of a rank's first SUMMARY frame
_LENGTH = struct.Struct("<I")
_ALIGN = 8               # every array starts at a multiple of 8 bytes of the packed columns
_KINDS = "biuf"          # numpy kinds an array may have (object arrays are written as JSON)
LEVEL = 1


class SummaryError(ValueError):
    """A SUMMARY payload that does not decode (the caller names the frame)."""


class SummaryLimitError(SummaryError, LimitError):
    """A SUMMARY payload that unpacks to more than its limit."""


# ------------------------------------------------------------------ encoding

class _Encoder:
    def __init__(self):
        self.arrays, self.blobs = [], []

    def value(self, v):
        if v is None or isinstance(v, (bool, str, int)):
            return v
        if isinstance(v, float):
            return v if math.isfinite(v) else {"$float": repr(v)}
        if isinstance(v, np.ndarray):
            return self.array(v)
        if isinstance(v, np.generic):
            return {"$scalar": _dtype_str(v.dtype), "value": self.value(v.item())}
        if isinstance(v, (bytes, bytearray, memoryview)):
            self.blobs.append(bytes(v))
            return {"$bytes": len(self.blobs) - 1}
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, tuple):
            return {"$tuple": [self.value(x) for x in v]}
        if isinstance(v, dict):
            if all(isinstance(k, str) and not k.startswith("$") for k in v):
                return {k: self.value(x) for k, x in v.items()}
            return {"$dict": [[self.value(k), self.value(x)] for k, x in v.items()]}
        raise TypeError(f"a summary cannot hold a {type(v).__name__}")

    def array(self, a):
        if a.dtype.kind == "O":
            return {"$objects": [self.value(x) for x in a.ravel().tolist()], "shape": list(a.shape)}
        if a.dtype.kind not in _KINDS:
            raise TypeError(f"a summary cannot hold an array of {a.dtype}")
        self.arrays.append(a)
        return {"$array": len(self.arrays) - 1}


def _dtype_str(dtype):
    """``dtype``'s type string, little-endian (the stream's byte order)."""
    return (dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype).str


def encode_summary(name, version, value):
    """The SUMMARY payload of ``value`` named ``name``."""
    enc = _Encoder()
    tree = json.dumps(enc.value(value), separators=(",", ":"), allow_nan=False).encode()
    parts, layout, at = [tree], [], len(tree)
    for a in enc.arrays:
        a = np.ascontiguousarray(a, dtype=np.dtype(_dtype_str(a.dtype)))
        delta = _delta_coded(a)
        if delta:   # times and ids: small steps, which zstd packs far better than the values
            a = np.diff(a, prepend=a.dtype.type(0))
        pad = -at % _ALIGN
        if pad:
            parts.append(b"\0" * pad)
            at += pad
        parts.append(a.data.cast("B") if a.nbytes else b"")
        layout.append([a.dtype.str, list(a.shape)] + (["delta"] if delta else []))
        at += a.nbytes
    z = zstandard.ZstdCompressor(level=LEVEL).compressobj(size=at)
    packed = b"".join([z.compress(part) for part in parts] + [z.flush()])
    if not admitted(at, len(packed), summary=True):   # compresses better than readers admit: stored
        packed = stored_frame(b"".join(parts))
    header = json.dumps({"name": name, "version": version, "value_bytes": len(tree), "arrays": layout,
                         "packed": len(packed), "blobs": [len(b) for b in enc.blobs]},
                        separators=(",", ":")).encode()
    return b"".join([_LENGTH.pack(len(header)), header, packed] + enc.blobs)


def _delta_coded(a):
    """Whether array ``a`` is stored as its first value and the steps after it:
    one-dimensional 64-bit integers (in the same width, wrapping around)."""
    return a.ndim == 1 and a.dtype.kind in "iu" and a.dtype.itemsize == 8 and len(a) > 1


# ------------------------------------------------------------------ decoding

def summary_header(payload):
    """(the header object, where the packed part starts) of a SUMMARY payload."""
    if len(payload) < _LENGTH.size:
        raise SummaryError("shorter than its header length")
    (n,) = _LENGTH.unpack_from(payload, 0)
    if n > len(payload) - _LENGTH.size:
        raise SummaryError(f"header of {n} bytes runs past the frame")
    try:
        header = json.loads(bytes(payload[_LENGTH.size:_LENGTH.size + n]))
    except ValueError as exc:
        raise SummaryError(f"header is not JSON ({exc})") from None
    if not isinstance(header, dict) or not isinstance(header.get("name"), str):
        raise SummaryError("header has no name")
    return header, _LENGTH.size + n


def decode_summary(payload):
    """(name, version, value) of a SUMMARY payload.  Arrays come back
    writable and owning their memory (a stage may shift times in place)."""
    header, at = summary_header(payload)
    try:
        layout, packed, blob_sizes = header["arrays"], _count(header["packed"]), header["blobs"]
        version, tree_bytes = header["version"], _count(header["value_bytes"])
        specs = [_array_spec(*entry) for entry in layout]
        sizes = [_count(b) for b in blob_sizes]
    except (KeyError, TypeError, ValueError) as exc:
        raise SummaryError(f"malformed header ({exc})") from None
    if at + packed + sum(sizes) != len(payload):
        raise SummaryError("its parts do not add up to the frame's length")
    total, offsets = tree_bytes, []
    for dtype, shape, _ in specs:
        total += -total % _ALIGN
        offsets.append(total)
        total += dtype.itemsize * math.prod(shape)
    limit = single_limit(max_summary_bytes(), packed)
    if total > limit:   # before anything is allocated: a few KB of zstd can declare gigabytes
        raise SummaryLimitError(*over("unpacks to", total, limit, SUMMARY_ENV).args)
    body = memoryview(payload)[at:at + packed]
    try:
        # the size the zstd frame declares decides the memory decompress()
        # takes: checked against the header's layout first
        declared = zstandard.frame_content_size(body)
        if declared != total:
            raise SummaryError(f"its zstd frame holds {declared} bytes, not the {total} its layout says")
        # decompressed in place, the JSON and the arrays into buffers of
        # their own: json.loads reads the first as it is (no copy of it)
        tree, packed_arrays = bytearray(tree_bytes), bytearray(total - tree_bytes)
        with zstandard.ZstdDecompressor().stream_reader(body) as reader:
            whole = _fill(reader, tree) and _fill(reader, packed_arrays) and not reader.read(1)
    except zstandard.ZstdError as exc:
        raise SummaryError(f"packed part does not decompress ({exc})") from None
    except MemoryError:
        raise SummaryError(f"its layout of {total} bytes does not fit in memory") from None
    if not whole:
        raise SummaryError(f"packed part does not hold the {total} bytes its layout says")
    arrays = []
    for (dtype, shape, delta), at_ in zip(specs, offsets):
        a = np.frombuffer(packed_arrays, dtype=dtype, count=math.prod(shape), offset=at_ - tree_bytes)
        arrays.append(np.cumsum(a, dtype=dtype).reshape(shape) if delta else a.reshape(shape))
    blobs, at = [], at + packed
    for n in sizes:
        blobs.append(bytes(payload[at:at + n]))
        at += n
    try:
        value = _Decoder(arrays, blobs).value(json.loads(tree))
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise SummaryError(f"malformed value ({exc!r})") from None
    return header["name"], version, value


def _fill(reader, buf):
    """Whether ``reader`` filled ``buf`` (a zstd stream reader, read into place)."""
    view, got = memoryview(buf), 0
    while got < len(buf):
        more = reader.readinto(view[got:])
        if not more:
            return False
        got += more
    return True


def _array_spec(dtype, shape, *coding):
    """(dtype, shape, delta-coded) of an array's layout entry."""
    dtype, shape = _checked_dtype(dtype), tuple(_count(x) for x in shape)
    delta = coding == ("delta",)
    if coding not in ((), ("delta",)) or delta and not (len(shape) == 1 and dtype.kind in "iu"):
        raise ValueError(f"unknown array coding {coding!r}")
    return dtype, shape, delta


def _checked_dtype(s):
    dtype = np.dtype(s) if isinstance(s, str) else None
    if dtype is None or dtype.kind not in _KINDS or dtype.byteorder == ">" or dtype.itemsize > 16:
        raise ValueError(f"array type {s!r} is not allowed")
    return dtype


def _count(x):
    if not isinstance(x, int) or isinstance(x, bool) or x < 0:
        raise ValueError(f"{x!r} is not a size")
    return x


class _Decoder:
    def __init__(self, arrays, blobs):
        self.arrays, self.blobs = arrays, blobs

    def value(self, v):
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if not isinstance(v, dict):
            return v
        if len(v) == 1 or "$scalar" in v or "$objects" in v:
            tag = next(iter(v))
            if tag == "$array":
                return self.arrays[v[tag]]
            if tag == "$bytes":
                return self.blobs[v[tag]]
            if tag == "$tuple":
                return tuple(self.value(x) for x in v[tag])
            if tag == "$dict":
                return {_hashable(self.value(k)): self.value(x) for k, x in v[tag]}
            if tag == "$float":
                return float(v[tag])
            if tag == "$scalar":
                return _checked_dtype(v["$scalar"]).type(self.value(v["value"]))
            if tag == "$objects":
                items = [self.value(x) for x in v["$objects"]]
                a = np.empty(len(items), dtype=object)
                for i, x in enumerate(items):   # one by one: a tuple stays one item
                    a[i] = x
                return a.reshape(tuple(_count(x) for x in v["shape"]))
        return {k: self.value(x) for k, x in v.items()}


def _hashable(k):
    return tuple(k) if isinstance(k, list) else k


# ------------------------------------------------------------------ reading them in a stage

class RankSummaries:
    """Which ranks of a stream a stage reads from their summaries: those
    whose announcement lists the stage's summary ``name`` at ``version``
    (``use`` False: none, e.g. align given custom patterns)."""

    def __init__(self, name, version, use=True):
        self.name, self.version, self.use = name, version, use
        self.announced = set()   # ranks whose summary this stage reads, once it comes
        self.read = set()

    def add(self, frame, seen, convert):
        """A SUMMARY frame: an announcement is noted, and this stage's
        summary of an announced rank comes back as ``convert(value)`` (an
        object with a ``rank``); None for any other.  ``seen``: whether the
        stage already has frames of the frame's rank (a rank given twice)."""
        from ..errors import StreamtraceError

        name, r = frame.summary_header()["name"], frame.rank   # a summary decoded only when it is this stage's
        if name == ANNOUNCE:
            if r in self.announced or seen(r):
                raise StreamtraceError(f"rank {r} appears twice in the input (two announcements of its summaries)")
            versions = frame.summary()[2]   # a few bytes
            if self.use and isinstance(versions, dict) and versions.get(self.name) == self.version:
                self.announced.add(r)
            return None
        if name != self.name or r not in self.announced:
            return None
        if r in self.read:
            raise StreamtraceError(f"rank {r} appears twice in the input (two summaries of it)")
        try:
            value = convert(frame.summary()[2])
        except (ValueError, TypeError) as exc:
            raise frame.error(f"corrupt SUMMARY frame ({exc})") from None
        if value.rank != r:
            raise frame.error(f"corrupt SUMMARY frame (it holds rank {value.rank}, in a frame of rank {r})")
        self.read.add(r)
        return value

    def check_complete(self):
        """Every announced summary came (else the stream is not one extract wrote whole)."""
        from ..errors import StreamtraceError

        missing = sorted(self.announced - self.read)
        if missing:
            raise StreamtraceError(f"rank {missing[0]}: the stream announces its summary but holds none "
                                   "(extract the traces again)")

"""Packed payloads of format v3: record frames as compressed columns.

A record frame (EVENTS, KERNELS, COMMS) holds ``count`` fixed-size records
(layouts: csrc/st_records.h).  Packed, it is::

    u32 count, u32 codec (1 = zstd), u64 column_bytes (= count * record size
    less padding), then one zstd frame of the columns

The columns are the records' fields in struct order, each field's ``count``
values back to back (an array field such as ``grid[3]``: record by record),
so equal ids, constant fields and the zero high bytes of small integers sit
next to each other and zstd removes them almost for free.  The fields in
``DELTAS`` are stored as the difference from the previous record's value
(the first keeps its value; arithmetic wraps modulo the field's width): times
and ids that grow through a trace become small numbers.

A STRINGS frame is packed the same way (``pack_bytes``) around the v2
STRINGS layout, ``count`` being the number of strings.

zstd and numpy's copies release the GIL, so packing overlaps the tokenizer.
"""
import struct
import threading

import numpy as np
import zstandard

from .._native import COMM_DTYPE, EVENT_DTYPE, KERNEL_DTYPE
from .limits import admitted

ENVELOPE = struct.Struct("<IIQ")   # count, codec, bytes before compression
CODEC_ZSTD = 1
#: zstd level: 1 compresses a real trace's records as well as 3 does at
#: nearly twice the speed (docs/performance.md, "stream format v3")
LEVEL = 1

#: fields stored as differences from the previous record's value
DELTAS = {
    EVENT_DTYPE: ("ts", "correlation", "external_id"),
    KERNEL_DTYPE: ("event",),
    COMM_DTYPE: ("event",),
}

#: bytes of one record's fields (the record's size less its padding)
FIELD_BYTES = {dtype: sum(dtype.fields[name][0].itemsize for name in dtype.names) for dtype in DELTAS}

#: zstd level of ``Squeezed`` rows (held in memory while a rank is read, not
#: written): on a rank's kernel and launch records -1 gives the size level 1
#: does, compressing ~15 % and decompressing ~45 % faster
#: (docs/performance.md, "Host ops kept as they were compressed")
SQUEEZE_LEVEL = -1

_local = threading.local()   # zstd contexts are not thread-safe: one of each per thread


def _zstd():
    pair = getattr(_local, "pair", None)
    if pair is None:
        pair = _local.pair = (zstandard.ZstdCompressor(level=LEVEL), zstandard.ZstdDecompressor())
    return pair


def _squeezer():
    squeezer = getattr(_local, "squeezer", None)
    if squeezer is None:
        squeezer = _local.squeezer = zstandard.ZstdCompressor(level=SQUEEZE_LEVEL)
    return squeezer


class PackError(ValueError):
    """A packed payload that does not decode (the caller names the frame)."""


def pack_records(records):
    """Packed payload of a numpy record array (one of the st_records dtypes)."""
    dtype = records.dtype
    n = len(records)
    deltas = DELTAS[dtype]
    raw = np.empty(n * FIELD_BYTES[dtype], dtype=np.uint8)   # the columns, each written in place
    pos = 0
    for name in dtype.names:
        col = records[name]
        t = dtype.fields[name][0]
        out = raw[pos:pos + n * t.itemsize].view(t.base).reshape(col.shape)
        pos += n * t.itemsize
        if name in deltas and n:
            out[0] = col[0]
            np.subtract(col[1:], col[:-1], out=out[1:])   # wraps: a running sum undoes it exactly
        else:
            out[...] = col
    return ENVELOPE.pack(n, CODEC_ZSTD, len(raw)) + _zstd()[0].compress(raw)


def envelope(payload, dtype=None):
    """(count, codec, column bytes) of a packed payload; PackError when the
    envelope cannot be right (short, unknown codec, or, for records of
    ``dtype``, a size that is not count records).  A reader compares the
    size with its limit (``limits.py``) before unpacking anything."""
    if len(payload) < ENVELOPE.size:
        raise PackError(f"{len(payload)} bytes is shorter than its {ENVELOPE.size}-byte envelope")
    count, codec, size = ENVELOPE.unpack_from(payload, 0)
    if codec != CODEC_ZSTD:
        raise PackError(f"unknown codec {codec}")
    if dtype is not None and size != count * FIELD_BYTES[dtype]:
        raise PackError(f"{size} column bytes is not {count} records of {FIELD_BYTES[dtype]} bytes")
    return count, codec, size


def _unpack(payload, size):
    body = memoryview(payload)[ENVELOPE.size:]
    try:
        # the size the zstd frame declares is checked first: it decides the
        # memory decompress() takes
        declared = zstandard.frame_content_size(body)
        if declared != size:
            raise PackError(f"its zstd frame holds {declared} bytes, not {size}")
        raw = _zstd()[1].decompress(body, max_output_size=size)
    except zstandard.ZstdError as exc:
        raise PackError(f"does not decompress ({exc})") from None
    if len(raw) != size:
        raise PackError(f"decompresses to {len(raw)} bytes, not {size}")
    return raw


def unpack_records(payload, dtype, out=None):
    """The numpy record array of a packed payload (writable, owns its memory;
    padding bytes zero), or written into ``out`` (zeroed records of the
    payload's count, e.g. a slice of one array for a rank's frames)."""
    count, _, size = envelope(payload, dtype)
    if out is not None and len(out) != count:
        raise PackError(f"holds {count} records, not {len(out)}")
    records = np.zeros(count, dtype=dtype) if out is None else out
    if not count:
        return records
    raw, pos = _unpack(payload, size), 0
    for name in dtype.names:
        t = dtype.fields[name][0]
        col = np.frombuffer(raw, dtype=t.base, count=count * (t.itemsize // t.base.itemsize), offset=pos)
        pos += count * t.itemsize
        if name in DELTAS[dtype]:
            np.cumsum(col, dtype=t, out=records[name])
        else:
            records[name] = col.reshape((count,) + t.shape)
    return records


def pack_bytes(count, raw):
    """Packed payload of opaque bytes (a STRINGS frame's v2 layout, a META
    frame's JSON), stored uncompressed when readers would refuse its
    compression ratio (``limits.admitted``: one item longer than a frame's
    limit that compresses better than the ratio readers admit)."""
    body = _zstd()[0].compress(raw)
    if not admitted(len(raw), len(body)):
        body = stored_frame(raw)
    return ENVELOPE.pack(count, CODEC_ZSTD, len(raw)) + body


_BLOCK = 128 << 10   # the most a zstd block may hold


def stored_frame(data):
    """A zstd frame holding ``data`` uncompressed (raw blocks; its content
    size in its header), which every zstd decoder reads: for an item a
    reader would refuse for compressing too well."""
    data = memoryview(data).cast("B")
    # frame header: 8-byte content size, a 128 KiB window (exponent 7: 2^17)
    out = [struct.pack("<IBBQ", 0xFD2FB528, 0xC0, 7 << 3, len(data))]
    starts = range(0, len(data), _BLOCK) or [0]   # an empty item: one empty last block
    for start in starts:
        block = data[start:start + _BLOCK]
        last = start + _BLOCK >= len(data)
        out += [(last | len(block) << 3).to_bytes(3, "little"), block]   # block type 0: raw
    return b"".join(out)


def unpack_bytes(payload):
    """(count, the bytes) of a payload made by ``pack_bytes``."""
    count, _, size = envelope(payload)
    return count, _unpack(payload, size)


class Squeezed:
    """A record array held zstd-compressed in memory, not in a stream: for
    rows a stage keeps until a rank's end only to look through them once,
    part by part (about a fifth of the bytes; one compression and one
    decompression of each part, ~5 ms per MB)."""

    __slots__ = ("dtype", "count", "data")

    def __init__(self, array):
        array = np.ascontiguousarray(array)
        self.dtype, self.count = array.dtype, len(array)
        # copied out: zstandard's compress() keeps the whole compressBound-sized
        # allocation behind the shorter bytes it returns
        self.data = memoryview(_squeezer().compress(array.data.cast("B"))).tobytes() if array.nbytes else b""

    def __len__(self):
        return self.count

    def array(self):
        """The records again (read-only)."""
        if not self.count:
            return np.empty(0, self.dtype)
        return np.frombuffer(_zstd()[1].decompress(self.data), dtype=self.dtype, count=self.count)


def arrays(parts):
    """The record arrays of ``parts`` (arrays or ``Squeezed``), one at a time."""
    for part in parts:
        yield part.array() if isinstance(part, Squeezed) else part

"""The one module that touches the cffi ``ffi``/``lib`` objects.

It wraps the C tokenizer, the gzip inflater and the interval sweeps in small
Python classes, turns C return codes into exceptions, and derives the numpy
record dtypes from the C structs (``ffi.offsetof`` / ``ffi.sizeof``), so the
record layouts are defined once, in ``csrc/st_records.h``.
"""
import numpy as np

from ._core import ffi, lib

FORMAT_VERSION = lib.ST_FORMAT_VERSION
NONE = np.iinfo(np.int64).min  # absent integer field
NOSTR = lib.ST_NOSTR  # absent string id

OK, OUTPUT_FULL, DONE, TRUNCATED = lib.ST_OK, lib.ST_OUTPUT_FULL, lib.ST_DONE, lib.ST_TRUNCATED

_PRIMITIVES = {
    "int64_t": "<i8", "uint64_t": "<u8", "int32_t": "<i4", "uint32_t": "<u4",
    "uint16_t": "<u2", "int16_t": "<i2", "uint8_t": "u1", "int8_t": "i1",
    "float": "<f4", "double": "<f8",
}


def _dtype_of(struct_name):
    """numpy dtype matching the C struct exactly (names, offsets, itemsize)."""
    ctype = ffi.typeof(struct_name)
    names, formats, offsets = [], [], []
    for name, field in ctype.fields:
        t = field.type
        if t.kind == "array":
            fmt = (_PRIMITIVES[t.item.cname], (t.length,))
        else:
            fmt = _PRIMITIVES[t.cname]
        names.append(name)
        formats.append(fmt)
        offsets.append(field.offset)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets,
                     "itemsize": ffi.sizeof(ctype)})


EVENT_DTYPE = _dtype_of("st_event")
KERNEL_DTYPE = _dtype_of("st_kernel")
COMM_DTYPE = _dtype_of("st_comm")

FLAGS = {name[len("ST_F_"):].lower(): getattr(lib, name) for name in dir(lib) if name.startswith("ST_F_")}


class NativeError(Exception):
    """A C function failed; ``offset`` is the input byte offset when known."""

    def __init__(self, message, offset=None, code=None):
        super().__init__(message)
        self.offset = offset
        self.code = code


class Tokenizer:
    """One rank's incremental tokenizer with its output arrays."""

    def __init__(self, keep_pyfunc=False, capacity=16384, max_depth=0):
        opts = ffi.new("st_tok_options *")
        opts.keep_pyfunc = int(bool(keep_pyfunc))
        opts.max_depth = max_depth
        ptr = ffi.new("st_tok **")
        if lib.st_tok_create(ptr, opts) != OK:
            raise MemoryError("cannot allocate a tokenizer")
        self._tok = ffi.gc(ptr[0], lib.st_tok_destroy)
        self.capacity = capacity
        self._events = ffi.new("st_event[]", capacity)
        self._kernels = ffi.new("st_kernel[]", capacity)
        self._comms = ffi.new("st_comm[]", capacity)
        self._out = ffi.new("st_tok_out *")
        self._out.events, self._out.events_cap = self._events, capacity
        self._out.kernels, self._out.kernels_cap = self._kernels, capacity
        self._out.comms, self._out.comms_cap = self._comms, capacity
        self._consumed = ffi.new("size_t *")
        self.strings_sent = 0

    def feed(self, data, length=None, eof=False):
        """Tokenize the first ``length`` bytes of ``data`` (bytes or bytearray;
        not a memoryview slice, whose export cffi could outlive).

        Returns ``(status, consumed)``; raises NativeError on bad input.
        """
        length = len(data) if length is None else length
        if not 0 <= length <= len(data):
            raise ValueError("length out of range")
        buf = ffi.from_buffer("char[]", data)
        rc = lib.st_tok_feed(self._tok, buf, length, int(eof), self._out, self._consumed)
        del buf
        if rc < 0:
            raise NativeError(ffi.string(lib.st_tok_error(self._tok)).decode("utf-8", "replace"),
                              lib.st_tok_error_offset(self._tok), rc)
        return rc, self._consumed[0]

    @property
    def error(self):
        return ffi.string(lib.st_tok_error(self._tok)).decode("utf-8", "replace")

    def pending(self):
        return self._out.n_events or self._out.n_kernels or self._out.n_comms

    def take_records(self):
        """Copy out and clear the filled records: (events, kernels, comms) bytes."""
        out = self._out
        taken = (
            bytes(ffi.buffer(self._events, out.n_events * EVENT_DTYPE.itemsize)),
            bytes(ffi.buffer(self._kernels, out.n_kernels * KERNEL_DTYPE.itemsize)),
            bytes(ffi.buffer(self._comms, out.n_comms * COMM_DTYPE.itemsize)),
        )
        out.n_events = out.n_kernels = out.n_comms = 0
        return taken

    def take_new_strings(self):
        """Raw (JSON-escaped) bytes of the strings interned since the last call."""
        count = lib.st_tok_string_count(self._tok)
        ptr, length = ffi.new("char **"), ffi.new("size_t *")
        first = self.strings_sent
        raw = []
        for i in range(first, count):
            lib.st_tok_string(self._tok, i, ptr, length)
            raw.append(ffi.unpack(ptr[0], length[0]))
        self.strings_sent = count
        return first, raw

    def take_meta(self):
        """Top-level members seen since the last call, as (key, raw JSON) bytes."""
        key, klen = ffi.new("char **"), ffi.new("size_t *")
        val, vlen = ffi.new("char **"), ffi.new("size_t *")
        members = []
        for i in range(lib.st_tok_meta_count(self._tok)):
            lib.st_tok_meta(self._tok, i, key, klen, val, vlen)
            members.append((ffi.unpack(key[0], klen[0]), ffi.unpack(val[0], vlen[0])))
        lib.st_tok_meta_clear(self._tok)
        return members

    def counts(self):
        c = ffi.new("st_tok_counts *")
        lib.st_tok_get_counts(self._tok, c)
        return {"events_seen": c.events_seen, "events_stored": c.events_stored,
                "pyfunc_skipped": c.pyfunc_skipped, "bad_numbers": c.bad_numbers,
                "bytes_consumed": c.bytes_consumed, "doc_started": bool(c.doc_started),
                "saw_events": bool(c.saw_events), "bare_array": bool(c.bare_array),
                "doc_done": bool(c.doc_done)}


class Inflater:
    """Streaming gzip inflate (zlib), multi-member."""

    def __init__(self):
        ptr = ffi.new("st_inflate **")
        if lib.st_inflate_create(ptr) != OK:
            raise MemoryError("cannot allocate an inflater")
        self._inf = ffi.gc(ptr[0], lib.st_inflate_destroy)
        self._used = ffi.new("size_t *")
        self._made = ffi.new("size_t *")

    def run(self, data, out, out_start=0, out_end=None):
        """Inflate from ``data`` (bytes) into ``out[out_start:out_end]`` (a bytearray).

        Returns ``(input bytes used, output bytes made)``.
        """
        out_end = len(out) if out_end is None else out_end
        if not 0 <= out_start <= out_end <= len(out):
            raise ValueError("output range out of bounds")
        src = ffi.from_buffer("unsigned char[]", data)
        dst = ffi.from_buffer("unsigned char[]", out, require_writable=True)
        rc = lib.st_inflate_run(self._inf, src, len(data), dst + out_start, out_end - out_start,
                                self._used, self._made)
        del src, dst
        if rc < 0:
            raise NativeError(ffi.string(lib.st_inflate_error(self._inf)).decode(), code=rc)
        return self._used[0], self._made[0]

    @property
    def at_member_end(self):
        return bool(lib.st_inflate_at_member_end(self._inf))


def _i64(a):
    return np.ascontiguousarray(a, dtype=np.int64)


def _ptr(a):
    return ffi.cast("int64_t *", ffi.from_buffer(a))


def _check_sweep(rc):
    if rc == lib.ST_SWEEP_UNSORTED:
        raise ValueError("intervals must be sorted by start")
    if rc != lib.ST_SWEEP_OK:
        raise ValueError(f"interval sweep failed ({rc})")


def interval_union(starts, ends):
    """Disjoint sorted union of intervals sorted by start."""
    starts, ends = _i64(starts), _i64(ends)
    out_s, out_e = np.empty_like(starts), np.empty_like(ends)
    n = ffi.new("size_t *")
    _check_sweep(lib.st_union(_ptr(starts), _ptr(ends), len(starts), _ptr(out_s), _ptr(out_e), n))
    return out_s[: n[0]], out_e[: n[0]]


def overlap_with_union(q_starts, q_ends, u_starts, u_ends):
    """Per query interval, its intersection length with a disjoint union."""
    q_starts, q_ends, u_starts, u_ends = map(_i64, (q_starts, q_ends, u_starts, u_ends))
    out = np.empty(len(q_starts), dtype=np.int64)
    _check_sweep(lib.st_overlap_with_union(_ptr(q_starts), _ptr(q_ends), len(q_starts),
                                           _ptr(u_starts), _ptr(u_ends), len(u_starts), _ptr(out)))
    return out


def intersecting_pairs(a_starts, a_ends, b_starts, b_ends, chunk=1 << 16):
    """All (i, j, overlap) with A[i] ∩ B[j] non-empty; B sorted by start.

    Returns three int64 arrays.
    """
    a_starts, a_ends, b_starts, b_ends = map(_i64, (a_starts, a_ends, b_starts, b_ends))
    pmax = np.empty_like(b_starts)
    _check_sweep(lib.st_prefix_max(_ptr(b_starts), _ptr(b_ends), len(b_starts), _ptr(pmax)))
    a_pos, b_pos = ffi.new("size_t *"), ffi.new("size_t *")
    out_a, out_b, out_l = (np.empty(chunk, dtype=np.int64) for _ in range(3))
    parts = []
    while True:
        k = lib.st_pairs(_ptr(a_starts), _ptr(a_ends), len(a_starts), _ptr(b_starts), _ptr(b_ends),
                         _ptr(pmax), len(b_starts), _ptr(out_a), _ptr(out_b), _ptr(out_l), chunk,
                         a_pos, b_pos)
        parts.append((out_a[:k].copy(), out_b[:k].copy(), out_l[:k].copy()))
        if a_pos[0] >= len(a_starts):
            break
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))

"""The one module that touches the cffi ``ffi``/``lib`` objects.

It wraps the C tokenizer, the gzip inflater and the interval sweeps in small
Python classes, turns C return codes into exceptions, and derives the numpy
record dtypes from the C structs (``ffi.offsetof`` / ``ffi.sizeof``), so the
record layouts are defined once, in ``csrc/st_records.h``.
"""
import os

import numpy as np

from ._core import ffi, lib
from .errors import InvalidArgumentError, TraceError

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


class NativeError(TraceError):
    """The C core refused its input: a TraceError naming the input (the
    ``source`` its tokenizer, inflater or rewriter was made for) and the byte
    offset where known.  Raised by ``_input_error``, the one place that turns
    a C error message into an exception."""

    def __init__(self, source, problem, offset=None, code=None):
        super().__init__(source, problem, offset)
        self.code = code


def _input_error(source, message, offset=None, code=None):
    """The exception for a C call that refused its input (``message`` from C)."""
    if isinstance(message, bytes):
        message = message.decode("utf-8", "replace")
    return NativeError(source or "<input>", message, offset, code)


#: arrays the tokenizer fills from the start: zeroing them first would only
#: fault their pages in under the GIL
_new_uncleared = ffi.new_allocator(should_clear_after_alloc=False)

#: the tokenizer's output arrays: their st_tok_out field, C type, record size
_OUTPUTS = (("events", "st_event[]", EVENT_DTYPE.itemsize),
            ("kernels", "st_kernel[]", KERNEL_DTYPE.itemsize),
            ("comms", "st_comm[]", COMM_DTYPE.itemsize))


#: the C scanner's paths (csrc/st_scan.h), by their STREAMTRACE_SIMD names
SIMD_PATHS = {"off": lib.ST_SCAN_OFF, "avx2": lib.ST_SCAN_AVX2, "avx512": lib.ST_SCAN_AVX512}


def simd_paths():
    """The scanner paths this machine can run, slowest first ("off" always)."""
    return [name for name, code in SIMD_PATHS.items() if lib.st_scan_supported(code)]


def simd_path():
    """The scanner path in use."""
    return {code: name for name, code in SIMD_PATHS.items()}[lib.st_scan_get()]


def apply_simd(value=None):
    """Set the C scanner's path (process-wide) from ``value``, by default
    STREAMTRACE_SIMD: off, avx2, avx512, or unset/auto for the best this CPU
    has.  A path the CPU lacks, or an unknown name, raises
    InvalidArgumentError.  Returns the path now in use."""
    if value is None:
        value = os.environ.get("STREAMTRACE_SIMD", "")
    name = value.strip().lower()
    if name in ("", "auto"):
        lib.st_scan_set(lib.ST_SCAN_AUTO)
        return simd_path()
    if name not in SIMD_PATHS:
        raise InvalidArgumentError(f"STREAMTRACE_SIMD={value}: not one of auto, {', '.join(SIMD_PATHS)}")
    if lib.st_scan_set(SIMD_PATHS[name]) != 0:
        raise InvalidArgumentError(f"STREAMTRACE_SIMD={value}: this CPU cannot run it "
                                   f"(it can: {', '.join(simd_paths())})")
    return name


class Tokenizer:
    """One rank's incremental tokenizer with its output arrays."""

    def __init__(self, keep_pyfunc=False, capacity=16384, max_depth=0, drop_flows=False, align_only=False,
                 source=None):
        apply_simd()   # STREAMTRACE_SIMD read again per tokenizer: tests force each path through it
        self.source = source   # named in errors
        opts = ffi.new("st_tok_options *")
        opts.keep_pyfunc = int(bool(keep_pyfunc))
        opts.drop_flows = int(bool(drop_flows))
        opts.align_only = int(bool(align_only))
        self.drop_flows = bool(drop_flows)
        self.align_only = bool(align_only)
        opts.max_depth = max_depth
        ptr = ffi.new("st_tok **")
        if lib.st_tok_create(ptr, opts) != OK:
            raise MemoryError("cannot allocate a tokenizer")
        self._tok = ffi.gc(ptr[0], lib.st_tok_destroy)
        self.capacity = capacity
        self._out = ffi.new("st_tok_out *")
        self._arrays = {}   # st_tok_out field -> the array it points into (owned here)
        for field, ctype, _ in _OUTPUTS:
            self._new_array(field, ctype)
            setattr(self._out, field + "_cap", capacity)
        self._consumed = ffi.new("size_t *")
        self.strings_sent = 0

    def feed(self, data, length=None, eof=False, start=0):
        """Tokenize ``data[start:start + length]`` (bytes, bytearray or mmap;
        not a memoryview slice, whose export cffi could outlive).

        Returns ``(status, consumed)``; raises NativeError on bad input.
        """
        length = len(data) - start if length is None else length
        if not (0 <= start and 0 <= length and start + length <= len(data)):
            raise ValueError("start/length out of range")
        buf = ffi.from_buffer("char[]", data)
        rc = lib.st_tok_feed(self._tok, buf + start, length, int(eof), self._out, self._consumed)
        del buf
        if rc < 0:
            raise _input_error(self.source, ffi.string(lib.st_tok_error(self._tok)),
                               lib.st_tok_error_offset(self._tok), rc)
        return rc, self._consumed[0]

    @property
    def error(self):
        return ffi.string(lib.st_tok_error(self._tok)).decode("utf-8", "replace")

    def pending(self):
        return self._out.n_events or self._out.n_kernels or self._out.n_comms

    def take_records(self):
        """The filled records, (events, kernels, comms), as read-only
        bytes-like objects, and the arrays cleared.

        An array at least half full is handed over as it is, and the
        tokenizer gets a new, uncleared one: copying the records out would
        hold the GIL in the extracting thread and stall the stages consuming
        its frames, while the page faults of a new array are taken in
        ``feed``, GIL released (see docs/performance.md).  A fuller
        array would keep at most twice its records' memory alive; a
        less full one is copied (a small copy), so it keeps none."""
        return tuple(self._take(field, ctype, itemsize) for field, ctype, itemsize in _OUTPUTS)

    def _take(self, field, ctype, itemsize):
        n = getattr(self._out, "n_" + field)
        setattr(self._out, "n_" + field, 0)
        array = self._arrays[field]
        if 2 * n < self.capacity:
            return bytes(ffi.buffer(array, n * itemsize))
        self._new_array(field, ctype)
        return memoryview(ffi.buffer(array, n * itemsize)).toreadonly()

    def _new_array(self, field, ctype):
        """A new output array for ``field`` (the tokenizer writes every byte of a record)."""
        self._arrays[field] = array = _new_uncleared(ctype, self.capacity)
        setattr(self._out, field, array)

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
        if not self._out.n_meta:   # as the last feed left them: most feeds see none (no C calls then)
            return []
        key, klen = ffi.new("char **"), ffi.new("size_t *")
        val, vlen = ffi.new("char **"), ffi.new("size_t *")
        members = []
        for i in range(lib.st_tok_meta_count(self._tok)):
            lib.st_tok_meta(self._tok, i, key, klen, val, vlen)
            members.append((ffi.unpack(key[0], klen[0]), ffi.unpack(val[0], vlen[0])))
        lib.st_tok_meta_clear(self._tok)
        self._out.n_meta = 0
        return members

    def counts(self):
        c = ffi.new("st_tok_counts *")
        lib.st_tok_get_counts(self._tok, c)
        return {"events_seen": c.events_seen, "events_stored": c.events_stored,
                "pyfunc_skipped": c.pyfunc_skipped, "bad_numbers": c.bad_numbers,
                "bytes_consumed": c.bytes_consumed, "doc_started": bool(c.doc_started),
                "saw_events": bool(c.saw_events), "bare_array": bool(c.bare_array),
                "doc_done": bool(c.doc_done), **({"flows_skipped": c.flows_skipped} if self.drop_flows else {}),
                **({"align_skipped": c.align_skipped} if self.align_only else {}),
                **({"string_times": c.string_times} if c.string_times else {})}  # rare: streams stay as they were


class Inflater:
    """Streaming gzip inflate (zlib), multi-member."""

    def __init__(self, source=None):
        self.source = source   # named in errors
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
            raise _input_error(self.source, ffi.string(lib.st_inflate_error(self._inf)), code=rc)
        return self._used[0], self._made[0]

    @property
    def at_member_end(self):
        return bool(lib.st_inflate_at_member_end(self._inf))


# ---------------------------------------------------------------- row selection

def select_rows(records, classes, n_classes, cat_any, name_any=0, flags_all=0, ph=b""):
    """Indices (int64, increasing) of the EVENTS ``records`` whose category
    class has a bit of ``cat_any``, whose name class has one of ``name_any``
    (0: any name), that carry every ST_F_* flag of ``flags_all`` and, when
    ``ph`` is given, have that phase.  ``classes`` (uint16) holds the class
    bits of string ids below ``n_classes``; other ids have none.  One C pass,
    without the GIL."""
    out = np.empty(len(records), dtype=np.int64)
    n = lib.st_select(*_selection(records, classes, n_classes, cat_any, name_any, flags_all, ph), _ptr(out), len(out))
    return out[:n]


def select_spans(records, classes, n_classes, cat_any, name_any=0, flags_all=0, ph=b""):
    """The rows ``select_rows`` picks, as time spans in one C pass: (start,
    end, thread, name) arrays (int64, int64, int64, uint32); a string tid
    comes as -1 - its string id, apart from every integer tid."""
    n_rows = len(records)
    start, end, thread = (np.empty(n_rows, dtype=np.int64) for _ in range(3))
    name = np.empty(n_rows, dtype=np.uint32)
    n = lib.st_select_spans(*_selection(records, classes, n_classes, cat_any, name_any, flags_all, ph),
                            _ptr(start), _ptr(end), _ptr(thread), ffi.cast("uint32_t *", ffi.from_buffer(name)),
                            n_rows)
    for a in (start, end, thread, name):   # kept for the whole rank: shrink in place, no views of the full size
        a.resize(n, refcheck=False)
    return start, end, thread, name


def select_many(records, classes, n_classes, rules):
    """``[select_rows(records, classes, n_classes, **rule) for rule in
    rules]`` in one C pass over the records (a frame is read once, not once
    per rule).  Each rule is a dict of select_rows' keywords ``cat_any``,
    ``name_any``, ``flags_all`` and ``ph``."""
    if not rules:
        return []
    ev, n, cls, n_cls, _ = _selection(records, classes, n_classes, 0, 0, 0, b"")
    c_rules = ffi.new("st_select_rule[]", [_rule(**rule) for rule in rules])
    outs = [np.empty(n, dtype=np.int64) for _ in rules]
    keep = [ffi.from_buffer(o) for o in outs]
    pointers = ffi.new("int64_t *[]", [ffi.cast("int64_t *", b) for b in keep])
    counts = ffi.new("size_t[]", len(rules))
    lib.st_select_many(ev, n, cls, n_cls, c_rules, len(rules), pointers, n, counts)
    return [o[:counts[k]] for k, o in enumerate(outs)]


def gather(records, rows, columns):
    """Fields of ``records[rows]`` written into the caller's arrays in one C
    pass over the rows, without the GIL (per-field numpy gathers pass over
    the frame once per field).  ``columns``: (field name of records' dtype,
    destination) pairs; a destination is a 1-D array of len(rows), a view
    (a field of a structured array, a slice of a column) as well.  An
    integer field may go to an integer destination that holds every value
    of its type (numpy's safe cast: sign- or zero-extended); any other
    field needs a destination of its own dtype."""
    records = np.ascontiguousarray(records)
    rows = _i64(rows)
    specs = []
    for name, dst in columns:
        src = records.dtype.fields[name][0]
        if dst.ndim != 1 or len(dst) != len(rows) or not dst.flags.writeable:
            raise ValueError(f"gather: the destination of {name!r} is not a writable 1-D array of {len(rows)} rows")
        widening = src.kind in "iu" and dst.dtype.kind in "iu" and np.can_cast(src, dst.dtype, "safe")
        if not (widening or dst.dtype == src) or (len(rows) > 1 and dst.strides[0] < dst.dtype.itemsize):
            raise ValueError(f"gather: field {name!r} ({src}) cannot be written to a {dst.dtype} array "
                             f"with stride {dst.strides[0]}")
        specs.append({"src_off": records.dtype.fields[name][1], "dst_stride": dst.strides[0],
                      "dst": ffi.cast("void *", dst.ctypes.data), "src_size": src.itemsize,
                      "dst_size": dst.dtype.itemsize, "src_signed": int(src.kind == "i")})
    fields = ffi.new("st_gather_field[]", specs)
    rc = lib.st_gather(ffi.cast("const void *", ffi.from_buffer(records)), len(records), records.dtype.itemsize,
                       ffi.cast("const int64_t *", ffi.from_buffer(rows)), len(rows), fields, len(specs))
    if rc == lib.ST_GATHER_BAD_ROW:
        raise IndexError(f"gather: a row index outside the {len(records)} records")
    if rc != lib.ST_GATHER_OK:
        raise ValueError(f"gather: a field outside the {records.dtype.itemsize}-byte record ({rc})")


def _rule(cat_any, name_any=0, flags_all=0, ph=b""):
    return {"cat_any": cat_any, "name_any": name_any, "flags_all": flags_all, "ph": ord(ph) if ph else 0}


def _selection(records, classes, n_classes, cat_any, name_any, flags_all, ph):
    """The C arguments (records, count, classes, count, rule) of a selection, checked."""
    if records.dtype != EVENT_DTYPE:
        raise TypeError(f"row selection needs EVENTS records, not {records.dtype}")
    records = np.ascontiguousarray(records)
    classes = np.ascontiguousarray(classes, dtype=np.uint16)
    if not 0 <= n_classes <= len(classes):
        raise ValueError(f"n_classes {n_classes} is outside the {len(classes)} classes given")
    rule = ffi.new("st_select_rule *", _rule(cat_any, name_any, flags_all, ph))
    return (ffi.cast("const st_event *", ffi.from_buffer(records)), len(records),
            ffi.cast("const uint16_t *", ffi.from_buffer(classes)), n_classes, rule)


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


def meeting_union(q_starts, q_ends, u_starts, u_ends):
    """Indices (int64, increasing) of the query intervals that meet a
    disjoint sorted union: some u with u_start < q_end and u_end > q_start
    (an empty query inside a window counts)."""
    q_starts, q_ends, u_starts, u_ends = map(_i64, (q_starts, q_ends, u_starts, u_ends))
    out = np.empty(len(q_starts), dtype=np.int64)
    n = ffi.new("size_t *")
    _check_sweep(lib.st_meeting_union(_ptr(q_starts), _ptr(q_ends), len(q_starts),
                                      _ptr(u_starts), _ptr(u_ends), len(u_starts), _ptr(out), n))
    return out[: n[0]]


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


# ---------------------------------------------------------------- fuse

class Fuser:
    """One rank's streaming rewriter (csrc/st_fuse.h) for ``streamtrace fuse``.

    Passes: ``begin(SCAN)`` + ``feed`` to EOF + ``finish_scan()`` aggregates
    tracks, id ranges and lanes; ``begin(WRITE)`` + ``feed`` writes the kept
    events, rewritten, into the output buffer given to ``feed``;
    ``begin(SPANS)`` reports each event's byte span for a Python predicate.
    """

    SCAN, WRITE, SPANS = lib.ST_FUSE_MODE_SCAN, lib.ST_FUSE_MODE_WRITE, lib.ST_FUSE_MODE_SPANS
    OK, OUTPUT_FULL, DONE, TRUNCATED, NAME, OUTPUT_SMALL = (
        lib.ST_FUSE_OK, lib.ST_FUSE_OUTPUT_FULL, lib.ST_FUSE_DONE, lib.ST_FUSE_TRUNCATED, lib.ST_FUSE_NAME,
        lib.ST_FUSE_OUTPUT_SMALL)
    RUN, MERGE, NEED_RUN = lib.ST_FUSE_RUN, lib.ST_FUSE_MERGE, lib.ST_FUSE_NEED_RUN
    FLAGS = {name[len("ST_FUSE_"):].lower(): getattr(lib, name)
             for name in ("ST_FUSE_KEEP_PYFUNC", "ST_FUSE_KEEP_SPANS", "ST_FUSE_NCCL_ONLY", "ST_FUSE_WINDOW",
                          "ST_FUSE_NAME_FILTER", "ST_FUSE_CAT_FILTER", "ST_FUSE_KEEP_MASK",
                          "ST_FUSE_COMMA_FIRST")}
    TRACK_FLAGS = {name[len("ST_FUSE_T_"):].lower(): getattr(lib, name)
                   for name in ("ST_FUSE_T_PID_INT", "ST_FUSE_T_PID_STR", "ST_FUSE_T_TID_INT",
                                "ST_FUSE_T_TID_STR", "ST_FUSE_T_GPU", "ST_FUSE_T_NAMED", "ST_FUSE_T_SORTED")}

    def __init__(self, rank=0, flags=0, id_offset=0, pid_offset=0, ts_shift_ns=0, window=None,
                 max_depth=0, span_capacity=4096, interval_budget=0, source=None):
        self.source = source   # named in errors
        self._cfg = ffi.new("st_fuse_config *")
        self._cfg.interval_budget = interval_budget
        self._set_cfg(rank, flags, id_offset, pid_offset, ts_shift_ns, window, max_depth)
        ptr = ffi.new("st_fuse **")
        rc = lib.st_fuse_create(ptr, self._cfg)
        if rc == lib.ST_FUSE_ERR_NOMEM:
            raise MemoryError("cannot allocate a fuse context")
        if rc != lib.ST_FUSE_OK:
            raise ValueError(f"bad fuse configuration ({rc})")
        self._f = ffi.gc(ptr[0], lib.st_fuse_destroy)
        self._out = ffi.new("st_fuse_out *")
        self._spans = ffi.new("st_fuse_span[]", span_capacity)
        self._span_cap = span_capacity
        self._consumed = ffi.new("size_t *")
        self._keep = []  # buffers handed to C during a call

    def _set_cfg(self, rank, flags, id_offset, pid_offset, ts_shift_ns, window, max_depth):
        c = self._cfg
        c.rank, c.flags, c.max_depth = rank, flags, max_depth
        c.id_offset, c.pid_offset, c.ts_shift_ns = id_offset, pid_offset, ts_shift_ns
        lo, hi = window if window is not None else (np.iinfo(np.int64).min, np.iinfo(np.int64).max)
        c.window_lo_ns, c.window_hi_ns = lo, hi

    def configure(self, rank, flags, id_offset=0, pid_offset=0, ts_shift_ns=0, window=None, max_depth=0):
        self._set_cfg(rank, flags, id_offset, pid_offset, ts_shift_ns, window, max_depth)
        self._check(lib.st_fuse_configure(self._f, self._cfg))

    def _check(self, rc):
        if rc == lib.ST_FUSE_ERR_NOMEM:
            raise MemoryError(self.error or "out of memory in the fuse scanner")
        if rc < 0:
            raise _input_error(self.source, self.error, lib.st_fuse_error_offset(self._f), rc)
        return rc

    @property
    def error(self):
        return ffi.string(lib.st_fuse_error(self._f)).decode("utf-8", "replace")

    def begin(self, mode):
        self._check(lib.st_fuse_begin(self._f, mode))

    def feed(self, data, eof=False, out=None, out_len=0):
        """Scan/rewrite ``data``.  Returns ``(status, consumed, out_len)``.

        ``out`` (write mode) is a writable buffer; rewritten events are
        appended from ``out_len`` on.  Status OUTPUT_SMALL: one event needs a
        larger ``out`` (grow it, feed again).  Raises NativeError on bad input.
        """
        buf = ffi.from_buffer(data)
        o = self._out
        dst = ffi.from_buffer(out, require_writable=True) if out is not None else ffi.NULL
        o.buf, o.cap = dst, (len(out) if out is not None else 0)
        o.len = out_len
        o.spans, o.spans_cap, o.n_spans = self._spans, self._span_cap, 0
        rc = lib.st_fuse_feed(self._f, buf, len(buf), int(eof), o, self._consumed)
        # released before an error is raised: its traceback would keep them in
        # a reference cycle, and the collector may release a memoryview slice
        # before the cffi buffer made over it (a crash, seen in the fuse tests)
        del dst, buf
        o.buf, o.cap = ffi.NULL, 0
        self._check(rc)
        return rc, self._consumed[0], o.len

    def spans(self):
        """(index, offset, length) of the events reported by the last feed (spans mode)."""
        n = self._out.n_spans
        if not n:
            return np.zeros((0, 3), dtype=np.uint64)
        raw = ffi.buffer(self._spans, n * ffi.sizeof("st_fuse_span"))
        return np.frombuffer(raw, dtype=np.uint64).reshape(n, 3).copy()

    def pending_name(self):
        ptr, length = ffi.new("char **"), ffi.new("size_t *")
        if not lib.st_fuse_pending_name(self._f, ptr, length):
            return None
        return ffi.unpack(ptr[0], length[0])

    def decide_name(self, keep):
        self._check(lib.st_fuse_decide_name(self._f, int(bool(keep))))

    def add_cat(self, raw):
        self._check(lib.st_fuse_add_cat(self._f, raw, len(raw)))

    def set_keep_mask(self, bits, n_events):
        if isinstance(bits, (bytes, bytearray, memoryview)):
            bits = np.frombuffer(bits, dtype=np.uint8)
        bits = np.ascontiguousarray(bits, dtype=np.uint8)
        if len(bits) * 8 < n_events:
            raise ValueError(f"a keep mask of {len(bits)} bytes cannot cover {n_events} events")
        self._check(lib.st_fuse_set_keep_mask(self._f, ffi.cast("uint8_t *", ffi.from_buffer(bits)), n_events))

    def set_pid_map(self, raw, mapped):
        raw, mapped = _i64(raw), _i64(mapped)
        self._check(lib.st_fuse_set_pid_map(self._f, _ptr(raw), _ptr(mapped), len(raw)))

    def set_lane_base(self, track, first_tid):
        self._check(lib.st_fuse_set_lane_base(self._f, track, first_tid))

    def finish_scan(self):
        """OK (lanes assigned), RUN (take the last run, call again) or MERGE."""
        return self._check(lib.st_fuse_finish_scan(self._f))

    def take_run(self):
        """The pending sorted run of intervals: (buffer, records, record size).

        The buffer is C memory, valid until the next call on this object."""
        ptr, n, size = ffi.new("void **"), ffi.new("size_t *"), ffi.new("size_t *")
        self._check(lib.st_fuse_take_run(self._f, ptr, n, size))
        return ffi.buffer(ptr[0], n[0] * size[0]), n[0], size[0]

    def merge_begin(self, n_runs):
        self._merge_refs = [None] * n_runs
        self._check(lib.st_fuse_merge_begin(self._f, n_runs))

    def merge_feed(self, run, data, n_records, last):
        """The next chunk of run ``run``; ``data`` must not change until the
        next chunk of that run is fed or the merge ends."""
        ref = ffi.from_buffer(data)
        self._merge_refs[run] = ref
        self._check(lib.st_fuse_merge_feed(self._f, run, ref, n_records, int(bool(last))))

    def merge(self):
        """Returns (status, run): OK when done, NEED_RUN when ``run`` needs its next chunk."""
        need = ffi.new("size_t *")
        rc = self._check(lib.st_fuse_merge(self._f, need))
        if rc == self.OK:
            self._merge_refs = None
        return rc, need[0]

    def stats(self):
        s = ffi.new("st_fuse_stats *")
        lib.st_fuse_get_stats(self._f, s)
        out = {name: getattr(s, name) for name, _ in ffi.typeof("st_fuse_stats").fields}
        for name in ("doc_started", "saw_events", "bare_array", "doc_done"):
            out[name] = bool(out[name])
        return out

    def tracks(self):
        """Every (pid, tid) track seen by the scan, as dicts (raw JSON-escaped bytes for strings)."""
        t = ffi.new("st_fuse_track *")
        fl = self.TRACK_FLAGS
        out = []
        for i in range(lib.st_fuse_track_count(self._f)):
            lib.st_fuse_get_track(self._f, i, t)
            f = t.flags
            out.append({
                "index": i,
                "pid": t.pid if f & fl["pid_int"] else (ffi.unpack(t.pid_str, t.pid_len) if f & fl["pid_str"] else None),
                "tid": t.tid if f & fl["tid_int"] else (ffi.unpack(t.tid_str, t.tid_len) if f & fl["tid_str"] else None),
                "name": ffi.unpack(t.name, t.name_len) if f & fl["named"] else None,
                "sort_index": t.sort_index if f & fl["sorted"] else None,
                "gpu": bool(f & fl["gpu"]),
                "n_kept": t.n_kept, "n_moved": t.n_moved, "n_lanes": t.n_lanes,
            })
        return out

    def meta(self):
        """Top-level members seen by the scan, as (key, raw JSON) bytes."""
        key, klen = ffi.new("char **"), ffi.new("size_t *")
        val, vlen = ffi.new("char **"), ffi.new("size_t *")
        members = []
        for i in range(lib.st_fuse_meta_count(self._f)):
            lib.st_fuse_meta(self._f, i, key, klen, val, vlen)
            members.append((ffi.unpack(key[0], klen[0]), ffi.unpack(val[0], vlen[0])))
        return members


# ---------------------------------------------------------------- correlate's sweeps

def _check_rc(rc):
    if rc == lib.ST_SWEEP_SMALL:
        raise ValueError("a sweep buffer is too small (internal error)")
    if rc == lib.ST_SWEEP_RANGE:
        raise ValueError("a window or code is out of range")
    _check_sweep(rc)


def factorize_rows(rows):
    """Codes for the rows of a 2-D integer array, numbered in order of first
    appearance (as ``pandas.factorize``), and the index of each code's first
    row: ``(codes, first)``."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    n = rows.shape[0]
    width = rows.shape[1] if rows.ndim == 2 else 1
    cap = 1 << max(1, (2 * n - 1).bit_length()) if n else 2
    table = np.empty(cap, dtype=np.int64)
    codes, first = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    m = ffi.new("size_t *")
    _check_rc(lib.st_factorize_rows(_ptr(rows), n, width, _ptr(table), cap, _ptr(codes), _ptr(first), m))
    return codes, first[: m[0]].copy()


def window_medians(start, end, code, n_codes, q_lo, q_hi, q_t, ref_ptr, r_lo, r_hi, r_t):
    """For each query window, its kernels and their baseline medians over the
    query's reference windows (csrc/st_sweep.h, st_window_medians).

    A window (lo, hi, t) is kernels lo..hi-1 with end > t.  Returns
    ``(ptr, kernel, median)``: query q's kernels are ``kernel[ptr[q]:ptr[q+1]]``.
    """
    start, end, code = map(_i64, (start, end, code))
    q_lo, q_hi, q_t, ref_ptr, r_lo, r_hi, r_t = map(_i64, (q_lo, q_hi, q_t, ref_ptr, r_lo, r_hi, r_t))
    nq, n_refs = len(q_lo), len(r_lo)
    if len(ref_ptr) != nq + 1:
        raise ValueError("ref_ptr needs one entry per query plus one")
    q_size = np.maximum(q_hi - q_lo, 0)
    r_size = np.concatenate([[0], np.cumsum(np.maximum(r_hi - r_lo, 0))])
    per_query = r_size[np.clip(ref_ptr[1:], 0, n_refs)] - r_size[np.clip(ref_ptr[:-1], 0, n_refs)]
    bucket_cap = int(per_query.max()) if nq else 0
    touched_cap = int(q_size.max()) if nq else 0
    out_cap = int(q_size.sum())
    count = np.zeros(max(n_codes, 1), dtype=np.int64)
    slot = np.empty(max(n_codes, 1), dtype=np.int64)
    code_median = np.empty(max(n_codes, 1), dtype=np.float64)
    bucket = np.empty(max(bucket_cap, 1), dtype=np.int64)
    touched = np.empty(max(touched_cap, 1), dtype=np.int64)
    kernel = np.empty(max(out_cap, 1), dtype=np.int64)
    median = np.empty(max(out_cap, 1), dtype=np.float64)
    ptr = np.empty(nq + 1, dtype=np.int64)
    rc = lib.st_window_medians(_ptr(start), _ptr(end), _ptr(code), len(start), n_codes,
                               _ptr(q_lo), _ptr(q_hi), _ptr(q_t), nq, _ptr(ref_ptr), _ptr(r_lo), _ptr(r_hi),
                               _ptr(r_t), n_refs, _ptr(count), _ptr(slot),
                               ffi.cast("double *", ffi.from_buffer(code_median)), _ptr(bucket), bucket_cap,
                               _ptr(touched), touched_cap, _ptr(kernel),
                               ffi.cast("double *", ffi.from_buffer(median)), out_cap, _ptr(ptr))
    _check_rc(rc)
    return ptr, kernel[: ptr[-1]], median[: ptr[-1]]


def innermost_self(start, end, q_a, q_b, q_lo, q_hi):
    """Self time of the innermost interval in windows over intervals sorted by
    start (csrc/st_sweep.h, st_innermost): query q is intervals q_a..q_b-1
    with end > q_lo, window [q_lo, q_hi).  Returns ``(q, i, self_ns,
    first_x)`` for every interval with a non-zero total, by query then index."""
    start, end = _i64(start), _i64(end)
    q_a, q_b, q_lo, q_hi = map(_i64, (q_a, q_b, q_lo, q_hi))
    width = np.maximum(q_b - q_a, 0)
    cap = int(width.max()) if len(width) else 0
    total = int(width.sum())
    sel, heap = np.empty(max(cap, 1), dtype=np.int64), np.empty(max(cap, 1), dtype=np.int64)
    acc, cuts = np.empty(max(2 * cap, 1), dtype=np.int64), np.empty(2 * cap + 2, dtype=np.int64)
    out = [np.empty(max(total, 1), dtype=np.int64) for _ in range(4)]
    n = ffi.new("size_t *")
    _check_rc(lib.st_innermost(_ptr(start), _ptr(end), len(start), _ptr(q_a), _ptr(q_b), _ptr(q_lo), _ptr(q_hi),
                               len(q_a), _ptr(sel), _ptr(heap), _ptr(acc), _ptr(cuts), cap,
                               *(_ptr(o) for o in out), total, n))
    return tuple(o[: n[0]] for o in out)


# ---------------------------------------------------------------- report rows as text

_CELLS_ERRORS = {lib.ST_CELLS_BAD_CODE: "a cell code outside its column's table",
                 lib.ST_CELLS_BAD_TABLE: "cell table offsets out of order or past the table",
                 lib.ST_CELLS_BAD_SCALE: "a number scale other than 0 or 3"}


def format_rows(columns, n_rows, sep=b",", row_open=b"", row_close=b"\n", num_open=b"", num_close=b"",
                buffer_size=1 << 22):
    """The rows of a table as text, in pieces (bytes) of up to ``buffer_size``.

    ``columns`` is a list of ``(values, codes, scale, table)``: ``values`` an
    int64 array (or None) of numbers -- integers (``scale`` 0) or thousandths
    written as ``k / 1000`` (``scale`` 3) --, ``codes`` an int32 array (or
    None) that picks a text of ``table`` (a list of bytes) per row, -1 for
    the row's number.  Each number is written between ``num_open`` and
    ``num_close``; cells are joined by ``sep`` and each row is wrapped in
    ``row_open`` / ``row_close``.  The rows are written in C, without the GIL."""
    keep = []   # the buffers the C structs point into, alive until the last call

    def buffer_of(a, dtype, ctype):
        a = np.ascontiguousarray(a, dtype=dtype)
        if len(a) < n_rows:
            raise ValueError(f"a column has {len(a)} rows, not {n_rows}")
        keep.append(a)
        return ffi.cast(ctype, ffi.from_buffer(a))

    cols = ffi.new("st_cell_column[]", max(1, len(columns)))
    for c, (values, codes, scale, table) in zip(cols, columns):
        if values is not None:
            c.values = buffer_of(values, np.int64, "const int64_t *")
        if codes is not None:
            c.codes = buffer_of(codes, np.int32, "const int32_t *")
        c.scale = scale
        blob = b"".join(table)
        off = np.zeros(len(table) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, table), dtype=np.int64, count=len(table)), out=off[1:])
        keep += [blob, off]
        c.table = ffi.from_buffer(blob) if blob else ffi.NULL
        c.table_len = len(blob)
        c.table_off = ffi.cast("const int64_t *", ffi.from_buffer(off))
        c.table_n = len(table)
    parts = (sep, row_open, row_close, num_open, num_close)
    fmt = ffi.new("st_row_format *")
    texts = [ffi.new("char[]", p) for p in parts]   # (NUL-terminated copies; lengths given)
    for name, text, p in zip(("sep", "row_open", "row_close", "num_open", "num_close"), texts, parts):
        setattr(fmt, name, text)
        setattr(fmt, name + "_len", len(p))
    out = bytearray(buffer_size)
    used = ffi.new("size_t *")
    row = 0
    while row < n_rows:
        rc = lib.st_format_rows(cols, len(columns), row, n_rows, fmt, ffi.from_buffer(out), len(out), used)
        if rc < 0:
            raise ValueError(f"format_rows: {_CELLS_ERRORS.get(rc, rc)}")
        if rc == 0:   # one row longer than the buffer: a larger one
            out = bytearray(2 * len(out))
            continue
        row += rc
        yield bytes(out[:used[0]])


# ---------------------------------------------------------------- pftrace

class PftraceEncoder:
    """One rank's C protobuf encoder (csrc/st_pftrace.h), the twin of
    fuse/pftrace.py's RankEncoder.  ``feed`` returns the chunk's packets, or
    None when the chunk holds something only the Python encoder reproduces
    (then ``export`` gives the state to go on from)."""

    def __init__(self, seq, max_interned):
        ptr = ffi.new("st_pft **")
        if lib.st_pft_create(ptr, seq, max_interned) != lib.ST_PFT_OK:
            raise MemoryError("cannot allocate a pftrace encoder")
        self._p = ffi.gc(ptr[0], lib.st_pft_destroy)
        self._out = ffi.new("const uint8_t **")
        self._len = ffi.new("size_t *")

    def _check(self, rc):
        if rc == lib.ST_PFT_NOMEM:
            raise MemoryError("out of memory in the pftrace encoder")
        if rc == lib.ST_PFT_LIMIT:
            raise TraceError("pftrace encoder", "a limit was hit (over 4,194,304 tracks in one rank, or a 2 GB buffer)")
        return rc

    def add_process(self, key, rest):
        self._check(lib.st_pft_add_process(self._p, key, len(key), rest, len(rest)))

    def add_thread(self, key, name, sort):
        self._check(lib.st_pft_add_thread(self._p, key, len(key), int(name is not None), name or b"",
                                          len(name or b""), int(sort is not None), sort or 0))

    def feed(self, chunk):
        buf = ffi.from_buffer(chunk)
        rc = self._check(lib.st_pft_feed(self._p, buf, len(buf), self._out, self._len))
        if rc == lib.ST_PFT_UNSUPPORTED:
            return None
        return ffi.buffer(self._out[0], self._len[0])[:] if self._len[0] else b""

    def counts(self):
        c = ffi.new("int64_t[4]")
        lib.st_pft_counts(self._p, c)
        return list(c)

    def _blob(self, fn):
        self._check(fn(self._p, self._out, self._len))
        return ffi.buffer(self._out[0], self._len[0])[:] if self._len[0] else b""

    def skipped(self):
        """{reason: count} in first-seen order."""
        out, blob, i = {}, self._blob(lib.st_pft_skipped), 0
        while i < len(blob):
            j = blob.index(b"\0", i)
            out[blob[i:j].decode()] = int.from_bytes(blob[j + 1:j + 9], "little", signed=True)
            i = j + 9
        return out

    def export(self):
        """(cleared, interned, [(table, key bytes, value)]): tables 0-2 the
        interning tables, 3 the track uuids."""
        blob = self._blob(lib.st_pft_export)
        cleared, interned = blob[0], int.from_bytes(blob[1:9], "little", signed=True)
        entries, i = [], 9
        while i < len(blob):
            n = int.from_bytes(blob[i + 1:i + 5], "little")
            entries.append((blob[i], blob[i + 5:i + 5 + n], int.from_bytes(blob[i + 5 + n:i + 13 + n], "little")))
            i += 13 + n
        return bool(cleared), interned, entries

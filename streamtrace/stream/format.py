"""The event stream: framed, versioned, little-endian, concatenable.

Layout (docs/stream-format.md has the full description)::

    stream header  = MAGIC (8 bytes) + u32 format version (3) + u32 header length (16)
    frame          = u32 kind + u32 rank + u64 payload length + u32 crc32 + u32 reserved (0)
                     + payload

META, STRINGS and record payloads are packed: zstd, records as columns (``packing``).

The CRC-32 covers the first 16 bytes of the frame header and the payload, so
a flipped bit anywhere in a frame is an error naming the frame's byte offset,
never a different result.

A header may appear again wherever a frame may start, so ``cat a.stev b.stev``
is a valid stream.  Readers skip frame kinds they do not know.

This module is the only place that reads or writes stream bytes.
"""
import io
import json
import os
import stat
import struct
import sys
from dataclasses import dataclass, field

import numpy as np

from .._native import COMM_DTYPE, EVENT_DTYPE, FLAGS, FORMAT_VERSION, KERNEL_DTYPE, NOSTR
from ..errors import StreamFormatError, TraceError, os_reason
from ..parallel.threads import prefetched
from ..remote import is_url, local_path
from .limits import (FRAME_ENV, LimitError, max_frame_bytes, max_summary_bytes, max_unpack_ratio, over,
                     single_limit, writer_frame_bytes)
from .packing import ENVELOPE, PackError, envelope, pack_bytes, pack_records, unpack_bytes, unpack_records
from .summaries import ANNOUNCE, SummaryError, decode_summary, encode_summary, summary_header

MAGIC = b"\x89STEV\r\n\x1a"
_HEADER = struct.Struct("<8sII")
_FRAME = struct.Struct("<IIQII")     # kind, rank, payload length, crc32, reserved (0)
_CHECKED = struct.Struct("<IIQ")     # the header fields the crc32 covers (then the payload)
MAX_RANK = 2**31 - 1                 # ranks are torch's int32 ranks: 0 .. 2^31-1
_CHUNK = 64 << 20                    # a long payload is read this much at a time: a corrupt
                                     # length never asks for more memory than the input holds

try:
    from isal.isal_zlib import crc32   # ISA-L: several times zlib's speed
except ImportError:  # pragma: no cover - isal is a declared dependency
    from zlib import crc32


def frame_crc(kind, rank, payload):
    """CRC-32 of a frame: its kind, rank and length fields, then its payload."""
    return crc32(payload, crc32(_CHECKED.pack(kind, rank, len(payload))))


class Kind:
    """Frame kinds.  Values are part of the format: never reuse one."""

    META = 1        # packed JSON object: the rank's metadata (written after its events)
    STRINGS = 2     # packed: u32 first id, u32 count, count x u32 byte lengths, UTF-8 bytes
    EVENTS = 3      # packed st_event records
    KERNELS = 4     # packed st_kernel records
    COMMS = 5       # packed st_comm records
    END = 6         # JSON object; closes a stream section: a stream without it is incomplete
    TABLE = 7       # a named column table (stage results): see encode_table
    SUMMARY = 8     # a rank's summary made by a stage's per-rank map: see summaries.py

    RECORDS = {}  # filled below: kind -> numpy dtype


Kind.RECORDS = {Kind.EVENTS: EVENT_DTYPE, Kind.KERNELS: KERNEL_DTYPE, Kind.COMMS: COMM_DTYPE}
KIND_NAMES = {v: k.lower() for k, v in vars(Kind).items() if k.isupper() and isinstance(v, int)}


@dataclass
class Frame:
    kind: int
    rank: int
    payload: bytes   # or another read-only bytes-like object (extract hands over its record arrays)
    source: str = field(default=None, compare=False, repr=False)   # the stream it was read from
    offset: int = field(default=None, compare=False, repr=False)   # byte offset of its header there
    # the crc32 read with it (checked): a writer passing the frame through
    # copies it instead of computing it again.  Frames are not changed once made.
    crc: int = field(default=None, compare=False, repr=False)
    # (strings, events) of its rank before it in the stream read (iter_frames):
    # the ids and event indices its records may hold.  None: not checked
    bounds: tuple = field(default=None, compare=False, repr=False)

    def error(self, problem):
        """A StreamFormatError naming this frame's stream and byte offset."""
        return StreamFormatError(self.source or "<stream>", problem, self.offset)

    def records(self):
        """The payload as a numpy record array (record kinds only), unpacked
        once: a stage that reads it and one in the same process after it
        share the array, which must not be changed."""
        records = self.__dict__.get("_records")
        if records is None:
            try:
                records = unpack_records(self.payload, Kind.RECORDS[self.kind])
            except PackError as exc:
                raise self.error(f"corrupt {KIND_NAMES[self.kind].upper()} frame: {exc}") from None
            self._check_ids(records)
            records.flags.writeable = False
            self.__dict__["_records"] = records
        return records

    def _check_ids(self, records):
        """StreamFormatError, naming the frame, the record and the field,
        when a string id or event index points outside its rank's tables
        as the stream holds them before this frame."""
        if self.bounds is None or not len(records):
            return
        strings, events = self.bounds
        bad = _bad_reference(self.kind, records, strings, events)
        if bad is not None:
            field_name, i, value = bad
            if field_name == "event":
                value, have = f"{value}", f"{events} events"
            else:
                value, have = f"string id {value}", f"{strings} strings"
            raise self.error(f"{KIND_NAMES[self.kind].upper()} frame of rank {self.rank}: record {i}'s {field_name} "
                             f"is {value}, but the rank has {have} before this frame")

    def count(self):
        """Records (or strings) in a packed frame, from its envelope alone."""
        return envelope(self.payload)[0]

    def records_into(self, out):
        """Write the records into ``out`` (zeroed, of the frame's count)."""
        records = self.__dict__.get("_records")
        if records is not None:
            out[...] = records
            return
        try:
            unpack_records(self.payload, Kind.RECORDS[self.kind], out=out)
        except PackError as exc:
            raise self.error(f"corrupt {KIND_NAMES[self.kind].upper()} frame: {exc}") from None
        self._check_ids(out)

    def json(self):
        try:
            obj = json.loads(unpack_bytes(self.payload)[1] if self.kind == Kind.META else self.payload)
        except ValueError as exc:   # also UnicodeDecodeError
            raise self.error(f"corrupt {KIND_NAMES.get(self.kind, 'json').upper()} frame ({exc})") from None
        if not isinstance(obj, dict):
            raise self.error(f"corrupt {KIND_NAMES.get(self.kind, 'json').upper()} frame (not a JSON object)")
        return obj

    def strings(self):
        """(first_id, [str, ...]) of a STRINGS frame."""
        try:
            count, raw = unpack_bytes(self.payload)
            first, strings = decode_strings(raw)
        except (ValueError, struct.error) as exc:
            raise self.error(f"corrupt STRINGS frame ({exc})") from None
        if len(strings) != count:   # the envelope's count is what the readers' id checks go by
            raise self.error(f"corrupt STRINGS frame (it holds {len(strings)} strings, its envelope says {count})")
        if self.bounds is not None and first != self.bounds[0]:
            raise self.error(f"string frame starts at id {first}, expected {self.bounds[0]}")
        return first, strings

    def table(self, columns=None):
        """(name, DataFrame) of a TABLE frame, only ``columns`` of it when
        given (the others are not decoded); StreamFormatError when its
        payload is corrupt."""
        try:
            return decode_table(self.payload, columns)
        except (ValueError, KeyError, TypeError, IndexError, struct.error) as exc:
            raise self.error(f"corrupt TABLE frame ({exc})") from None

    def summary(self):
        """(name, version, value) of a SUMMARY frame."""
        try:
            return decode_summary(self.payload)
        except LimitError as exc:
            raise self.error(f"SUMMARY frame {exc}") from None
        except SummaryError as exc:
            raise self.error(f"corrupt SUMMARY frame ({exc})") from None

    def summary_header(self):
        """The header of a SUMMARY frame ({"name", "version", ...}), its
        value left undecoded."""
        try:
            return summary_header(self.payload)[0]
        except SummaryError as exc:
            raise self.error(f"corrupt SUMMARY frame ({exc})") from None

    def table_name(self):
        """The name of a TABLE frame, from its header alone."""
        try:
            name = _table_header(self.payload)[0]["name"]
        except (ValueError, KeyError, TypeError, IndexError, struct.error) as exc:
            raise self.error(f"corrupt TABLE frame ({exc})") from None
        if not isinstance(name, str):
            raise self.error("corrupt TABLE frame (its name is not a string)")
        return name

    def table_rows(self):
        """The row count of a TABLE frame, from its header alone (no pandas)."""
        try:
            rows = _table_header(self.payload)[0]["nrows"]
        except (ValueError, KeyError, TypeError, IndexError, struct.error) as exc:
            raise self.error(f"corrupt TABLE frame ({exc})") from None
        if not isinstance(rows, int) or rows < 0:
            raise self.error("corrupt TABLE frame (its row count is not a count)")
        return rows


# ------------------------------------------------------------------ encoding

def header_bytes():
    return _HEADER.pack(MAGIC, FORMAT_VERSION, _HEADER.size)


def encode_frame(kind, rank, payload):
    return _FRAME.pack(kind, rank, len(payload), frame_crc(kind, rank, payload), 0) + payload


def json_frame(kind, rank, obj):
    """A META (packed) or END frame holding ``obj`` (JSON values only: the
    frame hands ``obj`` itself to readers in this process)."""
    return JsonFrame(kind, rank, obj)


class _MadeHere(Frame):
    """A frame made in this process: it keeps what it holds and encodes it
    only when its bytes are wanted (a stream being written), so readers in
    the same process (``collective-report``'s maps) skip the encoding and
    the decoding.  What it holds must not change once it is made."""

    def __init__(self, kind, rank):
        self.kind, self.rank, self.source, self.offset, self.crc = kind, rank, None, None, None
        self._payload = None

    @property
    def payload(self):
        if self._payload is None:
            self._payload = self._encode()
        return self._payload


class JsonFrame(_MadeHere):
    """A META or END frame made here: ``json()`` returns its object, shared
    (a dump and a parse per rank of its metadata, which lists the job's
    process groups with all their ranks, were O(ranks) each)."""

    def __init__(self, kind, rank, obj):
        super().__init__(kind, rank)
        self._obj = obj

    def _encode(self):
        text = json.dumps(self._obj, separators=(",", ":"), default=_json_default).encode()
        return pack_bytes(1, text) if self.kind == Kind.META else text

    def json(self):
        return self._obj


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def summary_frame(rank, name, version, value):
    """A SUMMARY frame holding ``value`` (summaries.py says what it may hold)."""
    return SummaryFrame(rank, name, version, value)


class SummaryFrame(_MadeHere):
    """A SUMMARY frame made here: readers in this process get its value
    without an encoding and a decoding."""

    def __init__(self, rank, name, version, value):
        super().__init__(Kind.SUMMARY, rank)
        self._summary = (name, version, value)

    def _encode(self):
        return encode_summary(*self._summary)

    def summary(self):
        return self._summary

    def summary_header(self):
        return {"name": self._summary[0], "version": self._summary[1]}


def strings_frame(rank, first_id, strings):
    """A STRINGS frame for ids first_id.. (strings are str)."""
    return _strings_frame(rank, first_id, [s.encode("utf-8", "surrogatepass") for s in strings])


def _strings_frame(rank, first_id, encoded):
    lengths = np.fromiter((len(b) for b in encoded), dtype="<u4", count=len(encoded))
    raw = struct.pack("<II", first_id, len(encoded)) + lengths.tobytes() + b"".join(encoded)
    return Frame(Kind.STRINGS, rank, pack_bytes(len(encoded), raw))


def strings_frames(rank, first_id, strings):
    """STRINGS frames for ids first_id.. (strings are str), as many as it
    takes for each to unpack to at most what readers admit
    (``limits.writer_frame_bytes``); a string longer than that has a frame
    of its own (readers admit one item by its compression ratio)."""
    encoded = [s.encode("utf-8", "surrogatepass") for s in strings]
    limit = writer_frame_bytes()
    sizes = [4 + len(b) for b in encoded]   # its length, then its bytes
    if 8 + sum(sizes) <= limit:   # the usual case: one frame
        return [_strings_frame(rank, first_id, encoded)]
    frames, start, size = [], 0, 8
    for i, n in enumerate(sizes):
        if i > start and size + n > limit:
            frames.append(_strings_frame(rank, first_id + start, encoded[start:i]))
            start, size = i, 8
        size += n
    frames.append(_strings_frame(rank, first_id + start, encoded[start:]))
    return frames


def record_frame(kind, rank, records):
    """An EVENTS, KERNELS or COMMS frame holding ``records`` (a numpy array
    of the kind's dtype, or bytes-like records of it)."""
    if not isinstance(records, np.ndarray):
        records = np.frombuffer(records, dtype=Kind.RECORDS[kind])
    return RecordFrame(kind, rank, records)


class RecordFrame(_MadeHere):
    """A record frame made here (extract): stages chained in one process
    never pack or unpack its records."""

    def __init__(self, kind, rank, records):
        super().__init__(kind, rank)
        self._records = records

    def _encode(self):
        return pack_records(self._records)

    def records(self):
        return self._records

    def count(self):
        return len(self._records)


#: the string-id fields of each record kind (NOSTR: absent), and the int64
#: event fields that hold a string id when their flag is set
_STRING_IDS = {Kind.EVENTS: ("name", "cat", "label"), Kind.KERNELS: (),
               Kind.COMMS: ("collective_name", "dtype", "pg_name", "pg_desc", "pg_ranks", "in_split", "out_split",
                            "input_dims", "input_type", "comms_id")}
_FLAGGED_IDS = (("pid", FLAGS["pid_str"]), ("tid", FLAGS["tid_str"]), ("id", FLAGS["id_str"]))
_ANY_ID_STR = FLAGS["pid_str"] | FLAGS["tid_str"] | FLAGS["id_str"]


def _bad_reference(kind, records, strings, events):
    """(field, record index, value) of the first string id in ``records``
    that is not below ``strings`` (nor NOSTR), or event index (KERNELS,
    COMMS) not below ``events``; None when there is none.  One numpy
    reduction per field when all is well."""
    suspects = []
    for name in _STRING_IDS[kind]:
        col = records[name]
        if int((col + np.uint32(1)).max()) > strings:   # NOSTR + 1 wraps around to 0
            suspects.append((name, col, None))
    if kind == Kind.EVENTS:
        flags = records["flags"]
        if (flags & _ANY_ID_STR).any():
            suspects += [(name, records[name], (flags & flag) != 0) for name, flag in _FLAGGED_IDS]
    for name, col, flagged in suspects:
        bad = (col >= strings) & (col != NOSTR)
        if flagged is not None:
            bad = flagged & (bad | (col < 0))
        if bad.any():
            i = int(np.argmax(bad))
            return name, i, int(col[i])
    if kind in (Kind.KERNELS, Kind.COMMS) and int(records["event"].max()) >= events:
        i = int(np.argmax(records["event"] >= events))
        return "event", i, int(records["event"][i])
    return None


def decode_strings(payload):
    """(first_id, [str, ...]) from a STRINGS payload."""
    first, count = struct.unpack_from("<II", payload, 0)
    if 8 + 4 * count > len(payload):
        raise ValueError(f"{count} string lengths do not fit in the frame")
    lengths = np.frombuffer(payload, dtype="<u4", count=count, offset=8)
    ends = np.cumsum(lengths, dtype=np.int64)
    start = 8 + 4 * count
    blob = payload[start:]
    if count and ends[-1] != len(blob):
        raise ValueError("string lengths do not match the frame size")
    out, prev = [], 0
    for end in ends.tolist():
        out.append(blob[prev:end].decode("utf-8", "replace"))
        prev = end
    return first, out


def encode_table(name, df):
    """Payload of a TABLE frame: a named DataFrame (or ``Columns``), column by column.

    Layout: u32 JSON-header length, JSON header ``{"name", "nrows", "columns":
    [{"name", "type", "bytes"}]}``, then each column's bytes in order.  Types:
    a numpy dtype string (``<i8``, ``<f8``, ``|b1`` ...: raw little-endian
    values), ``Int64`` (int64 values then one mask byte per row, 1 = missing),
    ``text`` (a column of str and missing values: u32 count of its distinct
    strings, a UTF-8 JSON array of them, then one int32 code per row, -1 =
    missing) or ``json`` (a UTF-8 JSON array: any other object column --
    numbers, nested values).
    """
    if isinstance(df, Columns):
        forms = [(col, *_plain_column_form(values)) for col, values in df.items()]
    else:
        forms = [(col, *_column_form(df[col])) for col in df.columns]
    columns, blobs = [], []
    for col, typ, value in forms:
        if typ == "Int64":
            values, mask = value
            blob = values.tobytes() + mask.astype("u1").tobytes()
        elif typ == "text":
            codes, uniques = value
            texts = json.dumps(uniques).encode()
            blob = struct.pack("<II", len(uniques), len(texts)) + texts + codes.astype("<i4").tobytes()
        elif typ == "json":
            blob = value
        else:
            blob = value.tobytes()
        columns.append({"name": str(col), "type": typ, "bytes": len(blob)})
        blobs.append(blob)
    header = json.dumps({"name": name, "nrows": len(df), "columns": columns}).encode()
    return struct.pack("<I", len(header)) + header + b"".join(blobs)


class Columns(dict):
    """A table as named numpy columns, in order, that ``encode_table`` writes
    without pandas: the small tables a stage writes when it has nothing to
    compute (an empty stream, no collectives), so that such a run never loads
    pandas.  Each column is a numeric or bool array (written as its dtype), a
    ``numpy.ma`` masked int64 array (``Int64``: masked = missing) or an object
    array (``text`` when its present values are all str, else ``json``;
    missing = None or NaN).  The same values as a DataFrame encode to the same
    bytes (tests/project/test_lean_stages.py)."""

    def __init__(self, columns, nrows=None):
        super().__init__(columns)
        lengths = {len(v) for v in self.values()}
        if nrows is not None:
            lengths.add(nrows)
        if len(lengths) > 1:
            raise ValueError(f"columns of different lengths: {sorted(lengths)}")
        self.nrows = lengths.pop() if lengths else 0

    def __len__(self):   # rows, as len() of a DataFrame
        return self.nrows

    def frame(self):
        """The same table as a DataFrame (as decoding its bytes gives it)."""
        return decode_table(encode_table("", self))[1]


def _is_missing(v):
    """None, NaN, or pandas' NA/NaT (met only in values pandas made)."""
    return v is None or (isinstance(v, float) and v != v) or type(v).__name__ in ("NAType", "NaTType")


def _plain_column_form(values):
    """``_column_form`` of a ``Columns`` column, in numpy and Python only (for
    the small tables Columns holds: a Python pass over object columns)."""
    if isinstance(values, np.ma.MaskedArray):
        return "Int64", (np.ma.getdata(values).astype("<i8"), np.ma.getmaskarray(values))
    values = np.asarray(values)
    if values.dtype.kind in "iufb":
        arr = values.astype(values.dtype.newbyteorder("<")) if values.dtype.byteorder == ">" else values
        return arr.dtype.str, arr
    items = values.tolist()
    codes, uniques, index = np.full(len(items), -1, dtype=np.int64), [], {}
    for i, v in enumerate(items):
        if _is_missing(v):
            continue
        if type(v) is not str:
            return "json", json.dumps([None if _is_missing(x) else x for x in items], default=_json_default).encode()
        codes[i] = index.setdefault(v, len(uniques))
        if codes[i] == len(uniques):
            uniques.append(v)
    return "text", (codes, uniques)


def _column_form(s):
    """(type, value) of a Series as encode_table writes it: ``Int64``:
    (int64 values, missing mask); a numpy dtype string: the little-endian
    array; ``text``: (codes, distinct strings); ``json``: the JSON bytes."""
    import pandas as pd  # imported here: extract never needs pandas

    from ..codes import str_codes

    dtype = s.dtype
    if str(dtype) in ("Int64", "Int32"):
        return "Int64", (s.fillna(0).to_numpy(dtype="<i8"), s.isna().to_numpy())
    if dtype.kind in "iufb":
        arr = s.to_numpy()
        arr = arr.astype(arr.dtype.newbyteorder("<")) if arr.dtype.byteorder == ">" else arr
        return arr.dtype.str, arr
    # each distinct string is written once and rows are codes into them, so
    # the reader gets one shared str object per distinct value (a report's
    # 100k rows hold a handful of group names, dtypes, kernel names)
    coded = str_codes(s.to_numpy(dtype=object))
    if coded is not None:
        return "text", coded
    values = s.tolist()
    missing = np.flatnonzero(pd.isna(s.to_numpy()))   # None, NaN, pd.NA: one vectorised pass
    for i in missing.tolist():
        values[i] = None
    return "json", json.dumps(values, default=_json_default).encode()


def _text_values(blob, n):
    count, size = struct.unpack_from("<II", blob, 0)
    texts = json.loads(blob[8:8 + size])
    if len(texts) != count:
        raise ValueError("a text column's string count does not match its list")
    codes = np.frombuffer(blob, dtype="<i4", count=n, offset=8 + size)
    if n and (codes.min() < -1 or codes.max() >= count):
        raise ValueError("a text column's code is outside its strings")
    return np.array(texts + [None], dtype=object)[codes]   # code -1 picks the None


def _table_header(payload):
    """(header dict, offset of the first column's bytes) of a TABLE payload."""
    (hlen,) = struct.unpack_from("<I", payload, 0)
    return json.loads(payload[4:4 + hlen]), 4 + hlen


def decode_table(payload, columns=None):
    """(name, DataFrame) from a TABLE payload; only ``columns`` (those
    present, in the table's order) when given."""
    import pandas as pd

    header, pos = _table_header(payload)
    n, data = header["nrows"], {}
    for col in header["columns"]:
        start, pos = pos, pos + col["bytes"]
        if columns is not None and col["name"] not in columns:
            continue
        blob = payload[start:pos]
        if col["type"] == "text":
            data[col["name"]] = pd.Series(_text_values(blob, n), dtype=object)
        elif col["type"] == "json":
            data[col["name"]] = pd.Series(json.loads(blob), dtype=object)
        elif col["type"] == "Int64":
            values = np.frombuffer(blob, dtype="<i8", count=n)
            mask = np.frombuffer(blob, dtype="u1", count=n, offset=8 * n).astype(bool)
            data[col["name"]] = pd.arrays.IntegerArray(values.copy(), mask)
        else:
            data[col["name"]] = np.frombuffer(blob, dtype=np.dtype(col["type"]), count=n).copy()
    return header["name"], pd.DataFrame(data, index=pd.RangeIndex(n))


def table_frame(name, df, rank=0):
    """A TABLE frame holding ``df`` under ``name`` (e.g. "align.collectives")."""
    return TableFrame(name, df, rank)


class TableFrame(Frame):
    """A TABLE frame made in this process.  It keeps its DataFrame and
    encodes it only when its bytes are wanted (``payload``: a stream being
    written); a stage reading it in the same process (``table()``) gets the
    DataFrame that decoding the bytes would give, without the bytes.  The
    DataFrame must not change once the frame is made (the stages hand over
    results they are done with)."""

    def __init__(self, name, df, rank=0):
        self.kind, self.rank, self.source, self.offset, self.crc = Kind.TABLE, rank, None, None, None
        self._name, self._df, self._payload = name, df, None

    @property
    def payload(self):
        if self._payload is None:
            self._payload = encode_table(self._name, self._df)
        return self._payload

    def table(self, columns=None):
        if isinstance(self._df, Columns):   # small: through its bytes
            return decode_table(self.payload, columns)
        df = self._df if columns is None else self._df[[c for c in self._df.columns if str(c) in columns]]
        return self._name, decoded_form(df)

    def table_rows(self):
        return len(self._df)

    def table_name(self):
        return self._name


def decoded_form(df):
    """``decode_table(encode_table(name, df))[1]`` without the bytes: the same
    columns, dtypes and values (numbers copied, text columns with None where
    missing, other object columns through JSON), on a RangeIndex."""
    import pandas as pd

    data = {}
    for col in df.columns:
        typ, value = _column_form(df[col])
        if typ == "Int64":
            values, mask = value
            column = pd.arrays.IntegerArray(values.copy(), mask.astype(bool))
        elif typ == "text":
            codes, uniques = value
            column = pd.Series(np.array(uniques + [None], dtype=object)[codes], dtype=object)
        elif typ == "json":
            column = pd.Series(json.loads(value), dtype=object)
        else:
            column = value.copy()
        data[str(col)] = column
    return pd.DataFrame(data, index=pd.RangeIndex(len(df)))


class StreamWriter:
    """Writes a header then frames to a binary file object."""

    header = header_bytes()

    def __init__(self, fileobj, write_header=True):
        self._f = fileobj
        if write_header:
            self._f.write(self.header)

    def write(self, frame):
        payload = frame.payload
        crc = frame.crc   # a frame passed through keeps the checksum it was read with
        if crc is None:
            crc = frame_crc(frame.kind, frame.rank, payload)
        self._f.write(_FRAME.pack(frame.kind, frame.rank, len(payload), crc, 0))
        self._f.write(payload)

    def write_all(self, frames):
        for frame in frames:
            self.write(frame)

    def close(self, summary=None):
        """Write the end marker: readers treat a stream without it as incomplete."""
        self.write(json_frame(Kind.END, 0, summary or {}))
        self._f.flush()


# ------------------------------------------------------------------ decoding

def _read_exact(f, n):
    data = f.read(n)
    if len(data) == n:
        return data
    chunks = [data]
    got = len(data)
    while got < n:
        more = f.read(n - got)
        if not more:
            break
        chunks.append(more)
        got += len(more)
    return b"".join(chunks)


def iter_frames(source, name=None):
    """Yield every frame of a stream (file object, path, or '-' for stdin).

    Raises StreamFormatError, naming the stream and the byte offset of the bad
    header or frame, on a file that cannot be opened, a bad header, an unknown
    version, a truncated or corrupt frame (checksum, reserved field, rank).
    Repeated headers (concatenated streams) are accepted.
    """
    if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__"):
        if str(source) == "-":
            yield from iter_frames(sys.stdin.buffer, name="<stdin>")
            return
        if is_url(source):   # ranged reads through fsspec
            from ..remote import open_input, read_error, redact

            try:
                f = open_input(source)
            except TraceError as exc:
                raise StreamFormatError(exc.path, f"cannot open: {exc.problem}") from None
            with f:
                try:
                    yield from iter_frames(f, name=redact(source))
                except StreamFormatError as exc:   # a cut connection: say so
                    cut = read_error(f)
                    if cut is None:
                        raise
                    problem = exc.problem
                    if problem.startswith("empty input"):   # the very first read failed: not an empty stream
                        problem = "incomplete stream: not even its header could be read"
                    raise StreamFormatError(exc.source, f"{problem} ({cut})", exc.offset) from None
            return
        try:
            f = open(local_path(source), "rb")
        except OSError as exc:   # missing, a directory, unreadable: one line naming the file
            raise StreamFormatError(str(source), f"cannot open: {os_reason(exc)}") from None
        with f:
            yield from iter_frames(f, name=str(source))
        return
    f = source
    name = name or getattr(f, "name", "<stream>")
    size = _regular_size(f)   # None for pipes: a frame's length is then checked as it is read
    first = _read_exact(f, _HEADER.size)
    if not first:
        raise StreamFormatError(name, "empty input: expected a streamtrace event stream")
    _check_header(first, name, 0)
    pos = _HEADER.size
    open_section = True  # a header was read and its END frame not yet
    tallies = {}         # rank -> [strings, events] in the frames read so far
    limits = _limits()
    while True:
        head = _read_exact(f, _HEADER.size)   # a stream header or the start of a frame header
        if not head:
            if open_section:
                raise StreamFormatError(name, "incomplete stream: it has no end marker "
                                              "(the command that wrote it failed or was interrupted)", pos)
            return
        if head[:8] == MAGIC:
            if open_section:
                raise StreamFormatError(name, "incomplete stream: a section ends without its end marker", pos)
            _check_header(head, name, pos)
            pos += _HEADER.size
            open_section = True
            continue
        head += _read_exact(f, _FRAME.size - len(head)) if len(head) == _HEADER.size else b""
        if len(head) < _FRAME.size:
            raise StreamFormatError(name, "truncated stream (cut inside a frame header)", pos)
        kind, rank, length, crc, reserved = _FRAME.unpack(head)
        if size is not None and length > size - pos - _FRAME.size:
            raise StreamFormatError(name, f"truncated stream (frame of {length} bytes runs past the end "
                                          f"of the file at byte {size}; or its length is corrupt)", pos)
        limit, env = limits.get(kind, (None, None))
        if limit is not None and length > limit and kind not in _SINGLE:   # before it is read: a pipe's
            # length is not known.  A META or one-string frame may be stored uncompressed: as TABLE frames,
            # it costs what the input holds (read in pieces)
            raise StreamFormatError(name, f"{KIND_NAMES[kind].upper()} frame {over('of', length, limit, env)}", pos)
        try:
            payload = _read_payload(f, length)
        except MemoryError:   # a TABLE or unknown frame as long as the input says (a sparse file)
            raise StreamFormatError(name, f"{KIND_NAMES.get(kind, f'kind {kind}').upper()} frame of {length} "
                                          "bytes does not fit in memory", pos) from None
        if len(payload) < length:
            raise StreamFormatError(name, f"truncated stream (frame of {length} bytes cut at {len(payload)})", pos)
        if frame_crc(kind, rank, payload) != crc:
            raise StreamFormatError(name, "corrupt frame: checksum mismatch (the stream was damaged "
                                          "after it was written)", pos)
        if reserved:
            raise StreamFormatError(name, f"corrupt frame: reserved field is {reserved}, not 0", pos)
        if rank > MAX_RANK:
            raise StreamFormatError(name, f"invalid rank {rank} in a frame header (ranks are 0 to {MAX_RANK})", pos)
        bounds = None
        if kind in Kind.RECORDS or kind in (Kind.STRINGS, Kind.META):
            try:   # the envelope only: the columns are unpacked when the records are wanted
                count, _, unpacked = envelope(payload, Kind.RECORDS.get(kind))
            except PackError as exc:
                raise StreamFormatError(name, f"corrupt {KIND_NAMES[kind].upper()} frame: {exc}", pos) from None
            most = limit
            if kind == Kind.META or kind == Kind.STRINGS and count == 1:   # an item that cannot be split
                most = single_limit(limit, len(payload) - ENVELOPE.size)
            if unpacked > most:   # what it would take once decompressed: refused before anything is
                raise StreamFormatError(
                    name, f"{KIND_NAMES[kind].upper()} frame {over('unpacks to', unpacked, most, env)}", pos)
            if kind != Kind.META:   # the ids its records may hold: those of the frames before it
                tally = tallies.setdefault(rank, [0, 0])
                bounds = tuple(tally)
                if kind == Kind.STRINGS:
                    tally[0] += count
                elif kind == Kind.EVENTS:
                    tally[1] += count
        if kind == Kind.END:
            open_section = False
        yield Frame(kind, rank, payload, name, pos, crc, bounds)
        pos += _FRAME.size + length


#: frames a read-ahead thread reads, checks and unpacks before the consumer
#: wants them: a frame of events is ~1.5 MB unpacked, so a few MB at most
READ_AHEAD_FRAMES = 4


def read_ahead(frames, kinds, depth=READ_AHEAD_FRAMES):
    """``frames`` (e.g. iter_frames's) read in a background thread ``depth``
    frames ahead, the record frames of ``kinds`` unpacked there too: file
    reads, checksums, zstd and numpy's column copies release the GIL, so a
    stage works on one frame while the next ones are read and unpacked.
    The frames and any error come in the same order as reading inline.
    ``STREAMTRACE_READ_AHEAD=0`` reads inline (as for extract's input)."""
    if os.environ.get("STREAMTRACE_READ_AHEAD", "1") == "0":
        return frames
    return prefetched(_unpacked(frames, frozenset(kinds)), depth=depth, name="streamtrace-unpack")


def _unpacked(frames, kinds):
    summarized = set()   # ranks announcing summaries: a stage reads those, not their records
    for frame in frames:
        if frame.kind == Kind.SUMMARY:
            try:
                if frame.summary_header()["name"] == ANNOUNCE:
                    summarized.add(frame.rank)
            except StreamFormatError:
                pass   # the consumer raises it, as above
        elif frame.kind in kinds and frame.rank not in summarized:
            try:
                frame.records()   # cached on the frame
            except StreamFormatError:
                pass   # a corrupt payload: the consumer's own records() raises it, where inline reading would
        yield frame


#: kinds whose frame holds one item when its count is 1 (a META frame: always)
_SINGLE = (Kind.META, Kind.STRINGS)


def _limits():
    """{kind: (the most bytes a frame of it may hold, packed or unpacked;
    the variable that sets it)}.  Not TABLE frames, which are not packed
    (they cost what they hold, and a big run's tables are big), SUMMARY
    frames (their limit is on what their zstd part unpacks to: checked when
    one is decoded), nor unknown kinds: the input's own size bounds those."""
    frame = (max_frame_bytes(), FRAME_ENV)
    max_summary_bytes(), max_unpack_ratio()   # a bad setting is one line at once, not at the first summary
    return {kind: frame for kind in (*Kind.RECORDS, Kind.STRINGS, Kind.META, Kind.END)}


def _regular_size(f):
    """The size of a regular, seekable file object positioned at its start, else None."""
    try:
        st = os.fstat(f.fileno())
        if stat.S_ISREG(st.st_mode) and f.tell() == 0:
            return st.st_size
    except (OSError, AttributeError, ValueError, io.UnsupportedOperation):
        pass
    return None


def _read_payload(f, length):
    """``length`` bytes (fewer at the end of input), read in pieces so that a
    corrupt length on a pipe costs at most what the input holds."""
    if length <= _CHUNK:
        return _read_exact(f, length)
    chunks, got = [], 0
    while got < length:
        want = min(_CHUNK, length - got)
        piece = _read_exact(f, want)
        chunks.append(piece)
        got += len(piece)
        if len(piece) < want:   # end of input
            break
    return b"".join(chunks)


def _check_header(data, name, pos):
    if len(data) < _HEADER.size or data[:8] != MAGIC:
        hint = ""
        if data[:1] in (b"{", b"[") or data[:2] == b"\x1f\x8b":
            hint = " (this looks like a trace: run 'streamtrace extract' on it first)"
        raise StreamFormatError(name, "not a streamtrace event stream" + hint, pos)
    _, version, size = _HEADER.unpack(data[:_HEADER.size])
    if version in (1, 2, 3):
        raise StreamFormatError(name, f"stream format version {version} was written by an older streamtrace; "
                                      "extract the traces again", pos)
    if version != FORMAT_VERSION:
        raise StreamFormatError(
            name, f"stream format version {version} is not supported (this streamtrace reads version {FORMAT_VERSION})",
            pos)
    if size != _HEADER.size:
        raise StreamFormatError(name, f"unexpected stream header size {size}", pos)


def table_names(path):
    """Names of the TABLE frames in a stream file, reading only frame headers
    and table headers (payloads are skipped with seek, unchecked).  It stops
    quietly at anything that does not parse: reading the frames afterwards
    (iter_frames, which checks every frame) reports the problem."""
    names = set()
    if is_url(path):   # seeking means a request per frame: iter_frames reads the stream once instead
        return {f.table_name() for f in iter_frames(path) if f.kind == Kind.TABLE}
    with open(local_path(path), "rb") as f:
        size = f.seek(0, 2)
        pos = _HEADER.size   # concatenated stream headers are _HEADER.size bytes too
        while pos + _HEADER.size <= size:
            f.seek(pos)
            head = f.read(_FRAME.size)
            if head[:8] == MAGIC:
                pos += _HEADER.size
                continue
            if len(head) < _FRAME.size:
                break
            kind, _, length, _, _ = _FRAME.unpack(head)
            if kind == Kind.TABLE:
                try:
                    (hlen,) = struct.unpack("<I", f.read(4))   # a header lists columns: a few KB
                    names.add(json.loads(f.read(min(hlen, length, max_frame_bytes())))["name"])
                except (struct.error, ValueError, KeyError, TypeError):
                    break
            pos += _FRAME.size + length
    return {n for n in names if isinstance(n, str)}


# ------------------------------------------------------------------ the API

@dataclass
class RankData:
    """Everything the stream holds for one rank.

    ``events``, ``kernels`` and ``comms`` are numpy record arrays with the
    layouts of csrc/st_records.h; string ids index ``strings``.
    """

    rank: int
    meta: dict = field(default_factory=dict)
    strings: list = field(default_factory=list)
    events: np.ndarray = None
    kernels: np.ndarray = None
    comms: np.ndarray = None
    extra: list = field(default_factory=list)  # frames of other kinds, in order

    def string(self, sid):
        return None if sid == NOSTR else self.strings[sid]

    def names(self, ids):
        """Vector of strings for an array of string ids (None for absent)."""
        table = self.__dict__.get("_names")
        if table is None or len(table) != len(self.strings) + 1:   # made again only when strings were added
            table = self.__dict__["_names"] = np.array(self.strings + [None], dtype=object)
        ids = np.asarray(ids, dtype=np.int64)
        return table[np.where(ids == NOSTR, len(self.strings), ids)]

    @property
    def base_time_ns(self):
        return int(self.meta.get("trace", {}).get("baseTimeNanoseconds") or 0)

    def events_df(self):
        """Events as a DataFrame with names resolved and times in ns."""
        from .records import events_frame

        return events_frame(self)

    def kernels_df(self):
        from .records import kernels_frame

        return kernels_frame(self)

    def comms_df(self):
        from .records import comms_frame

        return comms_frame(self)


class _RankBuilder:
    def __init__(self, rank):
        self.data = RankData(rank)
        self.parts = {Kind.EVENTS: [], Kind.KERNELS: [], Kind.COMMS: []}

    def add(self, frame):
        if frame.kind == Kind.END:
            return
        if frame.kind in self.parts:
            self.parts[frame.kind].append(frame)   # unpacked in finish(), straight into the rank's array
        elif frame.kind == Kind.STRINGS:
            first, strings = frame.strings()
            if first != len(self.data.strings):
                raise frame.error(f"string frame starts at id {first}, expected {len(self.data.strings)}")
            self.data.strings.extend(strings)
        elif frame.kind == Kind.META:
            if self.data.meta:
                raise frame.error("two metadata frames (the same rank appears twice in the input)")
            self.data.meta = frame.json()
        else:
            self.data.extra.append(frame)

    def finish(self, pool):
        """The RankData, each record kind one array that the frames are
        unpacked into by ``pool``'s threads (zstd and numpy's copies run
        without the GIL)."""
        d = self.data
        d.events, d.kernels, d.comms = (_joined(self.parts[kind], Kind.RECORDS[kind], pool)
                                        for kind in (Kind.EVENTS, Kind.KERNELS, Kind.COMMS))
        return d


def _joined(frames, dtype, pool):
    """One array of a rank's record frames of one kind."""
    if len(frames) == 1:
        return frames[0].records()
    counts = [frame.count() for frame in frames]
    out = np.zeros(sum(counts), dtype=dtype)
    ends = np.cumsum(counts).tolist()
    jobs = [pool.submit(frame.records_into, out[end - n:end]) for frame, n, end in zip(frames, counts, ends)]
    for job in jobs:
        job.result()
    return out


def read_tables(source):
    """All TABLE frames of a stream as ``{name: DataFrame}`` (later frames of
    the same name are appended to earlier ones)."""
    import pandas as pd

    tables = {}
    for frame in iter_frames(source):
        if frame.kind == Kind.TABLE:
            name, df = frame.table()
            tables[name] = pd.concat([tables[name], df], ignore_index=True) if name in tables else df
    return tables


def read_stream(source):
    """Read a whole stream into ``{rank: RankData}`` (sorted by rank).

    ``source`` is a path, '-' for stdin, a binary file object or bytes.
    """
    if isinstance(source, (bytes, bytearray)):
        source = io.BytesIO(source)
    name = getattr(source, "name", str(source))
    builders = {}
    try:
        for frame in iter_frames(source):
            if frame.kind == Kind.END:
                continue
            b = builders.get(frame.rank)
            if b is None:
                b = builders[frame.rank] = _RankBuilder(frame.rank)
            b.add(frame)
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="streamtrace-unpack") as pool:
            return {r: builders[r].finish(pool) for r in sorted(builders)}
    except ValueError as exc:
        raise StreamFormatError(name, str(exc)) from None

"""The event stream: framed, versioned, little-endian, concatenable.

Layout (docs/stream-format.md has the full description)::

    stream header  = MAGIC (8 bytes) + u32 format version + u32 header length (16)
    frame          = u32 kind + u32 rank + u64 payload length + payload

A header may appear again wherever a frame may start, so ``cat a.stev b.stev``
is a valid stream.  Readers skip frame kinds they do not know.

This module is the only place that reads or writes stream bytes.
"""
import io
import json
import struct
import sys
from dataclasses import dataclass, field

import numpy as np

from .._native import COMM_DTYPE, EVENT_DTYPE, FORMAT_VERSION, KERNEL_DTYPE, NOSTR
from ..errors import StreamFormatError

MAGIC = b"\x89STEV\r\n\x1a"
_HEADER = struct.Struct("<8sII")
_FRAME = struct.Struct("<IIQ")


class Kind:
    """Frame kinds.  Values are part of the format: never reuse one."""

    META = 1        # JSON object: the rank's metadata (written after its events)
    STRINGS = 2     # u32 first id, u32 count, count x u32 byte lengths, UTF-8 bytes
    EVENTS = 3      # st_event records
    KERNELS = 4     # st_kernel records
    COMMS = 5       # st_comm records
    END = 6         # JSON object; closes a stream section: a stream without it is incomplete
    TABLE = 7       # a named column table (stage results): see encode_table

    RECORDS = {}  # filled below: kind -> numpy dtype


Kind.RECORDS = {Kind.EVENTS: EVENT_DTYPE, Kind.KERNELS: KERNEL_DTYPE, Kind.COMMS: COMM_DTYPE}
KIND_NAMES = {v: k.lower() for k, v in vars(Kind).items() if k.isupper() and isinstance(v, int)}


@dataclass
class Frame:
    kind: int
    rank: int
    payload: bytes   # or another read-only bytes-like object (extract hands over its record arrays)
    source: str = field(default=None, compare=False, repr=False)   # the stream it was read from

    def records(self):
        """The payload as a numpy record array (record kinds only)."""
        return np.frombuffer(self.payload, dtype=Kind.RECORDS[self.kind])

    def json(self):
        return json.loads(self.payload)

    def table(self, columns=None):
        """(name, DataFrame) of a TABLE frame, only ``columns`` of it when
        given (the others are not decoded); StreamFormatError when its
        payload is corrupt."""
        try:
            return decode_table(self.payload, columns)
        except (ValueError, KeyError, TypeError, IndexError, struct.error) as exc:
            raise StreamFormatError(self.source or "<stream>", f"corrupt TABLE frame ({exc})") from None

    def table_name(self):
        """The name of a TABLE frame, from its header alone."""
        try:
            return _table_header(self.payload)[0]["name"]
        except (ValueError, KeyError, TypeError, IndexError, struct.error) as exc:
            raise StreamFormatError(self.source or "<stream>", f"corrupt TABLE frame ({exc})") from None


# ------------------------------------------------------------------ encoding

def header_bytes():
    return _HEADER.pack(MAGIC, FORMAT_VERSION, _HEADER.size)


def encode_frame(kind, rank, payload):
    return _FRAME.pack(kind, rank, len(payload)) + payload


def json_frame(kind, rank, obj):
    return Frame(kind, rank, json.dumps(obj, separators=(",", ":"), default=_json_default).encode())


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def strings_frame(rank, first_id, strings):
    """A STRINGS frame for ids first_id.. (strings are str)."""
    encoded = [s.encode("utf-8", "surrogatepass") for s in strings]
    lengths = np.fromiter((len(b) for b in encoded), dtype="<u4", count=len(encoded))
    payload = struct.pack("<II", first_id, len(encoded)) + lengths.tobytes() + b"".join(encoded)
    return Frame(Kind.STRINGS, rank, payload)


def decode_strings(payload):
    """(first_id, [str, ...]) from a STRINGS payload."""
    first, count = struct.unpack_from("<II", payload, 0)
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
    """Payload of a TABLE frame: a named DataFrame, column by column.

    Layout: u32 JSON-header length, JSON header ``{"name", "nrows", "columns":
    [{"name", "type", "bytes"}]}``, then each column's bytes in order.  Types:
    a numpy dtype string (``<i8``, ``<f8``, ``|b1`` ...: raw little-endian
    values), ``Int64`` (int64 values then one mask byte per row, 1 = missing),
    ``text`` (a column of str and missing values: u32 count of its distinct
    strings, a UTF-8 JSON array of them, then one int32 code per row, -1 =
    missing) or ``json`` (a UTF-8 JSON array: any other object column --
    numbers, nested values).
    """
    columns, blobs = [], []
    for col in df.columns:
        typ, value = _column_form(df[col])
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
        self.kind, self.rank, self.source = Kind.TABLE, rank, None
        self._name, self._df, self._payload = name, df, None

    @property
    def payload(self):
        if self._payload is None:
            self._payload = encode_table(self._name, self._df)
        return self._payload

    def table(self, columns=None):
        df = self._df if columns is None else self._df[[c for c in self._df.columns if str(c) in columns]]
        return self._name, decoded_form(df)

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
        self._f.write(_FRAME.pack(frame.kind, frame.rank, len(frame.payload)))
        self._f.write(frame.payload)

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

    Raises StreamFormatError on a file that cannot be opened, a bad header,
    an unknown version or a truncated frame.  Repeated headers (concatenated streams) are accepted.
    """
    if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__"):
        if str(source) == "-":
            yield from iter_frames(sys.stdin.buffer, name="<stdin>")
            return
        try:
            f = open(source, "rb")
        except OSError as exc:   # missing, a directory, unreadable: one line naming the file
            raise StreamFormatError(str(source), f"cannot open: {exc.strerror or exc}") from None
        with f:
            yield from iter_frames(f, name=str(source))
        return
    f = source
    name = name or getattr(f, "name", "<stream>")
    first = _read_exact(f, _HEADER.size)
    if not first:
        raise StreamFormatError(name, "empty input: expected a streamtrace event stream")
    _check_header(first, name)
    open_section = True  # a header was read and its END frame not yet
    while True:
        head = _read_exact(f, _FRAME.size)
        if not head:
            if open_section:
                raise StreamFormatError(name, "incomplete stream: it has no end marker "
                                              "(the command that wrote it failed or was interrupted)")
            return
        if head[:8] == MAGIC:
            if open_section:
                raise StreamFormatError(name, "incomplete stream: a section ends without its end marker")
            _check_header(head, name)
            open_section = True
            continue
        if len(head) < _FRAME.size:
            raise StreamFormatError(name, "truncated stream (cut inside a frame header)")
        kind, rank, length = _FRAME.unpack(head)
        payload = _read_exact(f, length)
        if len(payload) < length:
            raise StreamFormatError(name, f"truncated stream (frame of {length} bytes cut at {len(payload)})")
        if kind == Kind.END:
            open_section = False
        yield Frame(kind, rank, payload, name)


def _check_header(data, name):
    if len(data) < _HEADER.size or data[:8] != MAGIC:
        hint = ""
        if data[:1] in (b"{", b"[") or data[:2] == b"\x1f\x8b":
            hint = " (this looks like a trace: run 'streamtrace extract' on it first)"
        raise StreamFormatError(name, "not a streamtrace event stream" + hint)
    _, version, size = _HEADER.unpack(data[:_HEADER.size])
    if version != FORMAT_VERSION:
        raise StreamFormatError(
            name, f"stream format version {version} is not supported (this streamtrace reads version {FORMAT_VERSION})")
    if size != _HEADER.size:
        raise StreamFormatError(name, f"unexpected stream header size {size}")


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
        table = np.array(self.strings + [None], dtype=object)
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
            self.parts[frame.kind].append(frame.payload)
        elif frame.kind == Kind.STRINGS:
            first, strings = decode_strings(frame.payload)
            if first != len(self.data.strings):
                raise ValueError(f"string frame starts at id {first}, expected {len(self.data.strings)}")
            self.data.strings.extend(strings)
        elif frame.kind == Kind.META:
            if self.data.meta:
                raise ValueError("two metadata frames (the same rank appears twice in the input)")
            self.data.meta = frame.json()
        else:
            self.data.extra.append(frame)

    def finish(self):
        d = self.data
        d.events = np.frombuffer(b"".join(self.parts[Kind.EVENTS]), dtype=EVENT_DTYPE)
        d.kernels = np.frombuffer(b"".join(self.parts[Kind.KERNELS]), dtype=KERNEL_DTYPE)
        d.comms = np.frombuffer(b"".join(self.parts[Kind.COMMS]), dtype=COMM_DTYPE)
        return d


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
        return {r: builders[r].finish() for r in sorted(builders)}
    except ValueError as exc:
        raise StreamFormatError(name, str(exc)) from None

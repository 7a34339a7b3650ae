"""A minimal protobuf writer: varints, tags and length-delimited fields, the
three wire types Perfetto's trace format (perfetto_trace.proto) needs here.
Hand-written so the encoder has no dependency and costs one bytes join per
message; the field numbers live with their use (pftrace.py)."""

import struct

_U64 = (1 << 64) - 1
_DOUBLE = struct.Struct("<d")
_TABLE = 1 << 14
_SMALL = [bytes((i,)) if i < 128 else bytes(((i & 0x7F) | 0x80, i >> 7)) for i in range(_TABLE)]


_CONTINUED = [bytes(((i & 0x7F) | 0x80, (i >> 7) | 0x80)) for i in range(_TABLE)]


def varint(value):
    """An unsigned varint; a negative int is written as its 64-bit two's
    complement (as protobuf writes int64 and int32 fields)."""
    if 0 <= value < _TABLE:
        return _SMALL[value]   # one or two bytes, made once
    value &= _U64
    parts = []
    while value >= _TABLE:     # 14 bits at a time: two bytes, both continued
        parts.append(_CONTINUED[value & 0x3FFF])
        value >>= 14
    parts.append(_SMALL[value])
    return b"".join(parts)


def key(field, wire_type):
    """The tag of a field: (number << 3) | wire type (0 varint, 1 fixed64, 2 bytes)."""
    return _SMALL[(field << 3) | wire_type] if field < 2048 else varint((field << 3) | wire_type)


def field_varint(field, value):
    return key(field, 0) + varint(value)


def field_bytes(field, payload):
    """A length-delimited field: a string (str is UTF-8 encoded) or an embedded message."""
    if isinstance(payload, str):
        payload = payload.encode("utf-8", "replace")   # a lone surrogate: "?" (the rewriter repairs them before)
    return key(field, 2) + varint(len(payload)) + payload


def field_fixed64(field, value):
    return key(field, 1) + (value & _U64).to_bytes(8, "little")


def field_double(field, value):
    return key(field, 1) + _DOUBLE.pack(value)

"""A minimal protobuf writer: varints, tags and length-delimited fields, the
three wire types Perfetto's trace format (perfetto_trace.proto) needs here.
Hand-written so the encoder has no dependency and costs one bytes join per
message; the field numbers live with their use (pftrace.py)."""

import struct

_U64 = (1 << 64) - 1
_DOUBLE = struct.Struct("<d")
_SMALL = [bytes((i,)) for i in range(128)]


def varint(value):
    """An unsigned varint; a negative int is written as its 64-bit two's
    complement (as protobuf writes int64 and int32 fields)."""
    if 0 <= value < 128:
        return _SMALL[value]
    value &= _U64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def key(field, wire_type):
    """The tag of a field: (number << 3) | wire type (0 varint, 1 fixed64, 2 bytes)."""
    return varint((field << 3) | wire_type)


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

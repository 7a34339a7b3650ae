"""Size limits of the stream's decoders (docs/limits.md, "Stream frames").

A few kilobytes of zstd can declare gigabytes: every decoder compares the
size a frame declares with its limit before it reads, allocates or
decompresses anything, so a hostile stream costs what its bytes cost, not
what they claim.  The defaults are far above what ``extract`` writes (an
EVENTS frame of 16,384 records is 1.5 MiB unpacked) and low enough that a
frame at the limit, read ahead a few frames deep, stays within a few
hundred MB.

A frame holding one item that cannot be split (a META object, a single
string, a SUMMARY) may also unpack to up to ``max_unpack_ratio()`` times
the bytes of its zstd frame: an honest rank's summary grows with its events
(~2.5 bytes each) past any fixed limit, but never compresses more than ~40
to 1, while a bomb's ratio is in the thousands.  Writers keep their frames
within what readers admit (``admitted``): they split STRINGS frames, and
store an item uncompressed in the rare case it compresses better than the
ratio (docs/limits.md, docs/stream-format.md).
"""
import os

from ..errors import StreamtraceError

#: EVENTS, KERNELS, COMMS, STRINGS, META and END frames: payload and unpacked size
FRAME_ENV, FRAME_DEFAULT = "STREAMTRACE_MAX_FRAME_BYTES", 16 << 20
#: SUMMARY frames: the size their zstd part unpacks to (about 2.5 bytes per
#: event of the rank: ~20 million events; a JSON value of that size takes
#: three times as much to parse).  Their other parts are stored as they
#: are: they cost what the input holds, as TABLE frames do
SUMMARY_ENV, SUMMARY_DEFAULT = "STREAMTRACE_MAX_SUMMARY_BYTES", 48 << 20
#: a single item's unpacked size over its zstd frame's, beyond the limits
#: above: the summaries of the real traces compress 3 to 39 times, those of
#: a generated rank of 20 million events (51 MB unpacked) 2.9 and 16.5 times
RATIO_ENV, RATIO_DEFAULT = "STREAMTRACE_MAX_UNPACK_RATIO", 64

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class LimitError(ValueError):
    """A frame over a size limit (the caller names the stream and frame)."""


def parse_size(env, text):
    """Bytes of a size such as ``16M``, ``2G`` or ``1048576``."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in _UNITS else ""
    try:
        value = int(t[:len(t) - len(unit)]) * _UNITS[unit]
    except ValueError:
        value = -1
    if value <= 0:
        raise StreamtraceError(f"{env}={text!r}: expected a size in bytes such as 16M or 1G")
    return value


def _limit(env, default):
    text = os.environ.get(env)
    return parse_size(env, text) if text else default


def max_frame_bytes():
    return _limit(FRAME_ENV, FRAME_DEFAULT)


def max_summary_bytes():
    return _limit(SUMMARY_ENV, SUMMARY_DEFAULT)


def max_unpack_ratio():
    text = os.environ.get(RATIO_ENV)
    if not text:
        return RATIO_DEFAULT
    try:
        ratio = int(text)
    except ValueError:
        ratio = 0
    if ratio < 1:
        raise StreamtraceError(f"{RATIO_ENV}={text!r}: expected a whole number of 1 or more, such as 64")
    return ratio


def single_limit(limit, packed):
    """The most bytes a frame of one item may unpack to: its kind's
    ``limit``, or more for an item whose zstd frame is ``packed`` bytes."""
    return max(limit, max_unpack_ratio() * packed)


def admitted(size, packed, summary=False):
    """Whether one item unpacking to ``size`` bytes from a zstd frame of
    ``packed`` bytes is read both with the default limits and with this
    process's settings (the stricter of each): a writer stores the item
    uncompressed otherwise (its ratio is then below 1)."""
    limit = min(max_summary_bytes(), SUMMARY_DEFAULT) if summary else min(max_frame_bytes(), FRAME_DEFAULT)
    return size <= max(limit, min(max_unpack_ratio(), RATIO_DEFAULT) * packed)


def writer_frame_bytes():
    """The most a splittable frame a writer makes may unpack to: within the
    default limit and this process's setting."""
    return min(max_frame_bytes(), FRAME_DEFAULT)


def over(what, size, limit, env):
    """The LimitError for ``what`` (e.g. "unpacks to") of ``size`` bytes."""
    return LimitError(f"{what} {size} bytes, over the limit of {limit} bytes (raise it with {env})")

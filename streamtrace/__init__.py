"""streamtrace: fast, bounded-memory analysis of multi-rank PyTorch profiler traces.

Each pipeline stage is a Python function over the event stream as well as a
command (``streamtrace --help``).
"""
from .errors import StreamFormatError, StreamtraceError, TraceError
from .extract import VERSION as __version__
from .extract import extract, extract_rank, peek_metadata
from .sources import RankInput, resolve_inputs
from .stream import Frame, Kind, RankData, StreamWriter, iter_frames, read_stream

__all__ = [
    "StreamtraceError", "TraceError", "StreamFormatError",
    "extract", "extract_rank", "peek_metadata", "RankInput", "resolve_inputs",
    "Frame", "Kind", "RankData", "StreamWriter", "iter_frames", "read_stream",
]

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

# collective report (issue #3): align stage, report stage, one-shot API
from . import collectives  # noqa: E402
from .align import align_frames, match_ranks  # noqa: E402
from .report import build_report, generate_collective_report, write_csvs, write_xlsx  # noqa: E402

__all__ += ["collectives", "align_frames", "match_ranks", "build_report", "generate_collective_report",
            "write_xlsx", "write_csvs"]

# trace fusion (issue #5): one Perfetto file from many ranks
from .fuse import TraceFuse, fuse  # noqa: E402

__all__ += ["TraceFuse", "fuse"]

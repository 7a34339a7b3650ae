"""streamtrace: fast, bounded-memory analysis of multi-rank PyTorch profiler traces.

Each pipeline stage is a Python function over the event stream as well as a
command (``streamtrace --help``).  The stages that need pandas (align, report,
correlate) are imported on first use, so ``extract`` and the CLI start
quickly.
"""
import importlib
import os

# streamtrace parallelises across ranks (processes) and reading (one thread);
# OpenBLAS's idle worker threads would only spin on the cores those need.
# setdefault: a user's own setting wins.  (Takes effect only when numpy is
# not imported yet.)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from .errors import StreamFormatError, StreamtraceError, TraceError
from .extract import VERSION as __version__
from .extract import extract_rank, peek_metadata
from .chain import extract   # events and per-rank summaries (no pandas at import)
from .io.ranks import RankInput, resolve_inputs
from .stream.format import Frame, Kind, RankData, StreamWriter, iter_frames, read_stream
from .fuse import TraceFuse, fuse  # light (no pandas); eager so the function, not the module, is 'fuse'

#: public names that live in heavier modules, imported when first used
_LAZY = {
    "collectives": ("collectives", None),
    "align_frames": ("align.stage", "align_frames"),
    "match_ranks": ("align.stage", "match_ranks"),
    "build_report": ("report.sheets", "build_report"),
    "generate_collective_report": ("chain", "generate_collective_report"),
    "blockers": ("chain", "blockers"),
    "whatif": ("chain", "whatif"),   # the critical path and what-if replays (docs/critical-path.md)
    "diff": ("diff", "diff"),   # two runs compared; the CI gate (docs/diff.md)
    "confidence": ("confidence", None),   # assess(tables), clock_rule(tables); results carry .confidence
    "write_xlsx": ("report.writers", "write_xlsx"),
    "write_csvs": ("report.writers", "write_csvs"),
    "correlate_frames": ("correlate.stage", "correlate_frames"),
    "tracelens": ("tracelens", None),   # TraceLens's public API (docs/tracelens.md)
    "plots": ("plots", None),
    "write_html": ("html_report", "write_html"),
}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'streamtrace' has no attribute {name!r}")
    module, attr = _LAZY[name]
    mod = importlib.import_module(f".{module}", __name__)
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value
    return value


__all__ = [
    "StreamtraceError", "TraceError", "StreamFormatError",
    "extract", "extract_rank", "peek_metadata", "RankInput", "resolve_inputs",
    "Frame", "Kind", "RankData", "StreamWriter", "iter_frames", "read_stream", "TraceFuse", "fuse",
] + list(_LAZY)

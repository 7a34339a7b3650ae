"""The output formats behind one interface: a writer gives the file's first
bytes (``head``), a sink for each rank's rewritten events (``rank_sink``:
the write pass's JSON chunks in, the format's bytes out to the rank's
segment) and the last bytes (``tail``, from the run's metadata).  The
per-rank passes, the segments (compression, parallel ranks, one gzip
member) and the atomic target are shared.

- JsonWriter: Chrome-trace JSON, the rewriter's output as is (docs/fuse.md).
- PftraceWriter: Perfetto's protobuf trace (pftrace.py).
"""
import json
from types import SimpleNamespace

from ..errors import StreamtraceError
from .pftrace import META_SEQUENCE, encoder_for, meta_packets

MARKS_SEQUENCE = META_SEQUENCE - 1
from .trailer import _meta, _trailer

FORMATS = ("json", "pftrace")


class JsonWriter:
    name = "json"

    def head(self, plan):
        return b'{"traceEvents":[' + b",".join(json.dumps(e, separators=(",", ":")).encode() for e in plan.labels)

    def rank_sink(self, rk, write):
        """(feed, finish): feed takes the rewriter's output chunks."""
        return write, None

    def tail(self, ranks_, plan, warnings, seconds, extra):
        return _trailer(ranks_, plan.opts, warnings, plan.id_stride, plan.pid_stride, plan.dense,
                        plan.common_base, plan.clocks, seconds, extra)


class PftraceWriter:
    name = "pftrace"

    def head(self, plan):
        """The marks (--mark), a sequence of their own; every other track is
        declared by the rank that uses it."""
        if not plan.marks:
            return b""
        parts = []
        marks = SimpleNamespace(rank=MARKS_SEQUENCE - 1, tracks=[], pid_map={})
        encoder_for(marks, parts.append).feed(b"," + b",".join(
            json.dumps(e, separators=(",", ":")).encode() for e in plan.marks))
        return b"".join(parts)

    def rank_sink(self, rk, write):
        enc = encoder_for(rk, write)

        def finish():
            rk.encoded = enc.stats
        return enc.feed, finish

    def tail(self, ranks_, plan, warnings, seconds, extra):
        meta = _meta(ranks_, plan.opts, warnings, plan.id_stride, plan.pid_stride, plan.dense,
                     plan.common_base, plan.clocks, seconds, extra)
        meta["format"] = "pftrace"
        meta["encoded"] = {str(rk.rank): rk.encoded for rk in ranks_}
        starts = [rk.stats["ts_min_ns"] for rk in ranks_ if rk.stats["ts_max_ns"] >= rk.stats["ts_min_ns"]]
        focus = (extra or {}).get("focus")
        window = (focus["window_ns"][0], focus["window_ns"][1], focus["label"]) if focus else None
        return meta_packets(meta, min(starts, default=0), window)


def format_for(output, fmt=None):
    """The output's format: ``fmt`` when given (it must agree with the
    suffix), else from the suffix (``.pftrace``, ``.pftrace.gz``), else JSON."""
    name = str(output).lower()
    by_suffix = None
    if name.endswith((".pftrace", ".pftrace.gz")):
        by_suffix = "pftrace"
    elif name.endswith((".pftrace.zst", ".pftrace.zstd")):
        raise StreamtraceError(f"{output}: Perfetto reads a .pftrace plain or gzipped; write .pftrace.gz")
    elif name.endswith((".json", ".json.gz", ".json.zst", ".json.zstd")):
        by_suffix = "json"
    if fmt is not None and fmt not in FORMATS:
        raise StreamtraceError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if fmt is not None and by_suffix is not None and fmt != by_suffix:
        raise StreamtraceError(f"{output}: the name says {by_suffix}, --format says {fmt}")
    return fmt or by_suffix or "json"


def writer_for(fmt):
    return PftraceWriter() if fmt == "pftrace" else JsonWriter()

"""fuse's two per-rank passes on a cluster (an executor whose workers may not
share this machine's files or memory: ``parallel.dask``).

* The scan (pass 1) runs on the workers; each rank's scan summary comes back
  (its ``_Rank`` without the C rewriter: event counts, tracks and lanes,
  top-level metadata, warnings) -- what the layout needs from every rank.
* The layout is decided here, from all the summaries, as for a local run.
* The write (pass 2) runs on the workers: the rewriter's state from the scan
  (lane assignments, kept-event decisions) lives in C and does not travel,
  so a worker scans its rank again, configures the rewriter with the layout,
  and sends back the rank's segment of the output, compressed as the output
  is (a gzip segment with its CRC and length, a zstd frame, plain bytes).
  This side writes the segments in rank order.  Each trace is therefore read
  three times in all (twice locally), and one rank's compressed segment at a
  time is held here.

The clock offsets of ``--align_clocks`` and the ``--time_base`` prepass with
``--window`` (both before the scan) still run here.
"""
import io

from .layout import configure_rank
from .passes import _scan, _write_rank
from .spill import _SpillBudget


class _Piece:
    """A segment made on a worker, as the gzip joiner reads it."""

    def __init__(self, crc, size):
        self.crc, self.size = crc, size


def scan_ranks(ranks_, opts, executor):
    """Pass 1 of every rank on ``executor``'s workers; each ``_Rank`` gets its scan's results."""
    for rk, scanned in zip(ranks_, executor.map(_scan_task, [(rk, opts) for rk in ranks_])):
        for name in ("stats", "tracks", "trace", "warnings", "base_ns", "truncated_at", "source_truncated",
                     "spilled_runs"):
            setattr(rk, name, getattr(scanned, name))


def write_ranks(ranks_, opts, f, compression, executor):
    """Pass 2 of every rank on the workers, written into ``f`` in rank order:
    the segments (for the gzip joiner)."""
    segments = []
    items = [(rk, opts, compression) for rk in ranks_]
    # one rank's segment on this side at a time: it is the size of the rank's output
    for rk, (data, crc, size, stats) in zip(ranks_, executor.map(_write_task, items, fetch_ahead=1)):
        f.write(data)
        rk.write_stats = stats
        segments.append(_Piece(crc, size))
    return segments


def _scan_task(item):
    rk, opts = item
    _scan(rk, opts, None, _SpillBudget())
    rk.fz = None   # the C rewriter stays here
    return rk


def _write_task(item):
    rk, opts, compression = item
    warnings = list(rk.warnings)
    _scan(rk, opts, None, _SpillBudget())   # the rewriter's scan state, made again here
    rk.warnings = warnings
    configure_rank(rk, opts)
    out = io.BytesIO()
    seg = _write_rank(rk, opts, out, compression)
    return out.getvalue(), seg.crc, seg.size, rk.write_stats

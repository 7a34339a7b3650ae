"""``fuse``: every rank's trace on one timeline, as one Perfetto/Chrome JSON file.

The events are never parsed into Python objects on this path.  Each rank goes
through the C rewriter (csrc/st_fuse.h) twice, in fixed-size chunks:

1. **scan**: filters every event and aggregates, per rank, the id ranges, the
   (pid, tid) tracks with their thread names and whether they are GPU rows,
   the top-level members (``deviceProperties``, ``distributedInfo``,
   ``baseTimeNanoseconds``, ...) and the X intervals of each track.  At the
   end it assigns sibling lanes to X events that overlap without nesting
   (Perfetto drops those): intervals sorted by (track, ts, longest first),
   each put in the first lane where it nests.  Only the moved events are
   remembered (their index in the file).
2. **write**: with the strides, pid maps and lane tids computed from all
   ranks' scans, each kept event is rewritten (ids, pids, ts, lane tid,
   ``args.rank`` and the ``*_raw`` originals) and streamed to the output.

Ranks run in parallel threads (``jobs``): the C calls and the compressors
release the GIL.  Output: ``.json`` plain, ``.json.gz`` one gzip member
(ISA-L level 1; ranks compressed in parallel as raw deflate segments, joined
with a combined CRC, because Perfetto stops at the end of the first member),
``.json.zst`` zstd frames, ``-`` stdout.  Written atomically.

Memory per rank in flight: the read buffer (1 MiB, grown for one huge event),
the output buffer, the compressor, and during the scan a bounded buffer of X
intervals (sorted runs beyond it are spilled to a temporary file and merged
back in C: an external sort), so memory does not grow with the trace.

``TraceFuse`` is the TraceLens-compatible API over the same machinery; its
``filter_fn`` is the slow path (each event parsed into a dict).

Modules: ``options`` (FuseOptions, ``--window``, compression), ``inputs``
(which file is which rank), ``passes`` (the chunk loop, scan, prepass, write),
``spill`` (the scan's external sort and its budget), ``clocks`` (offsets and
time bases), ``layout`` (strides, pid maps, labels, lanes), ``segments`` (the
output's compressed bytes), ``trailer``, ``run`` (``fuse()`` itself) and
``compat`` (``TraceFuse``).  Light: nothing here imports pandas.
"""
from .compat import TraceFuse
from .options import FuseOptions, FuseResult, compression_for, parse_window
from .layout import rank_pid_string
from .run import fuse

__all__ = ["FuseOptions", "FuseResult", "TraceFuse", "compression_for", "fuse", "parse_window", "rank_pid_string"]

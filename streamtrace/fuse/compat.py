"""``TraceFuse``: TraceLens's API over the streaming fuse; its ``filter_fn`` is
the slow path (each event parsed into a dict, in a SPANS pass that yields a
keep mask per rank)."""
import contextlib
import json
import os
import tempfile

from .. import _native
from ..errors import StreamtraceError
from .options import compression_for
from .passes import _feed_file
from .run import fuse


def _spans_mask(args):
    """Run ``filter_fn`` on every event of one file; return (bits, n_events)."""
    path, rank, filter_fn = args
    fz = _native.Fuser(rank=rank, flags=0)
    fz.begin(fz.SPANS)
    bits = bytearray()
    state = {"n": 0}

    def on_spans(view, spans):
        if not len(spans):
            return
        top = int(spans[-1, 0]) + 1
        if len(bits) * 8 < top:
            bits.extend(bytes((top + 7) // 8 - len(bits)))
        for idx, off, length in spans.tolist():
            event = json.loads(bytes(view[off:off + length]))
            if filter_fn(event):
                bits[idx >> 3] |= 1 << (idx & 7)

    _feed_file(fz, path, fz.SPANS, on_spans=on_spans)
    state["n"] = fz.stats()["events_seen"]
    if len(bits) * 8 < state["n"]:
        bits.extend(bytes((state["n"] + 7) // 8 - len(bits)))
    return bytes(bits), state["n"]


class TraceFuse:
    """TraceLens's ``TraceFuse`` API over streamtrace's streaming fuse.

    ``TraceFuse(files, use_multiprocessing=False, max_workers=None)``:
    ``files`` is a list of per-rank paths (rank = position) or a
    ``{rank: path}`` dict (e.g. rank 0 of each node).  ``merge_and_save``
    writes the fused trace and returns its path; ``merge`` returns the event
    list.  Without ``filter_fn``, ``cat == "Trace"`` and (unless
    ``include_pyfunc``) ``python_function`` events are dropped, as in
    TraceLens; a ``filter_fn`` alone decides which events are kept (it sees
    each event as a dict: the slow path).  ``use_multiprocessing`` processes
    ranks in parallel (threads over the C core; worker processes for a
    ``filter_fn``, which must then be picklable).

    Beyond TraceLens: ids never collide across ranks, process names are
    TraceLens's ``RANK r - CPU``/``RANK r - GPU`` with the device in a
    ``process_labels`` record, overlapping X events get sibling
    lanes, and each rank's top-level metadata is kept under ``streamtrace``
    (see docs/fuse.md).
    """

    def __init__(self, files, use_multiprocessing=False, max_workers=None):
        if isinstance(files, dict):
            self.rank2file = {int(r): str(p) for r, p in files.items()}
        else:
            self.rank2file = {i: str(p) for i, p in enumerate(files)}
        if not self.rank2file:
            raise StreamtraceError("TraceFuse needs at least one trace file")
        self.rank2filepath = self.rank2file   # TraceLens's name for it
        self.files = list(self.rank2file.values())
        self.ranks = list(self.rank2file)
        self.use_multiprocessing = bool(use_multiprocessing)
        self.max_workers = max_workers
        self.last_result = None

    def _jobs(self):
        if not self.use_multiprocessing:
            return 1
        return max(1, self.max_workers or os.cpu_count() or 1)

    def _masks(self, filter_fn):
        items = [(p, r, filter_fn) for r, p in self.rank2file.items()]
        if self.use_multiprocessing and len(items) > 1:
            from concurrent.futures import ProcessPoolExecutor  # here: multiprocessing is slow to import

            with ProcessPoolExecutor(max_workers=min(self._jobs(), len(items))) as pool:
                results = list(pool.map(_spans_mask, items))
        else:
            results = [_spans_mask(x) for x in items]
        return {r: res for (_, r, _), res in zip(items, results)}

    def _fuse(self, output, filter_fn, include_pyfunc, compression=None):
        masks = self._masks(filter_fn) if filter_fn is not None else None
        self.last_result = fuse(dict(self.rank2file), output, include_pyfunc=include_pyfunc,
                                jobs=self._jobs(), compression=compression, _masks=masks)
        return self.last_result

    def merge_and_save(self, output_file="merged_trace.json", filter_fn=None, include_pyfunc=False):
        """Write the fused trace; returns the path written.

        Like TraceLens, a name that does not end in ``.gz`` (or ``.zst``) gets
        ``.gz`` appended and gzip output; a ``.gz``/``.zst`` name is used as given.
        """
        path = str(output_file)
        if compression_for(path) == "none":
            path += ".gz"
        self._fuse(path, filter_fn, include_pyfunc)
        return path

    def merge(self, filter_fn=None, include_pyfunc=False):
        """The fused events as a list of dicts (holds them all in memory)."""
        fd, tmp = tempfile.mkstemp(prefix="streamtrace-fuse-", suffix=".json")
        os.close(fd)
        try:
            self._fuse(tmp, filter_fn, include_pyfunc, compression="none")
            with open(tmp, "rb") as fh:
                return json.load(fh)["traceEvents"]
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

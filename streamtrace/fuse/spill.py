"""The scan's external sort: sorted runs of X intervals spilled to a temporary
file and merged back in C, so a scan's memory does not grow with the trace;
and the budget all ranks' spills share (``$STREAMTRACE_SPILL_LIMIT`` and the
spill folder's free space)."""
import os
import shutil
import tempfile
import threading

from ..errors import StreamtraceError

#: environment variable: the most bytes of sorted intervals one fuse run may
#: spill to $TMPDIR, all ranks together (e.g. 500M, 2G; unset: no limit but
#: the folder's free space)
SPILL_LIMIT_ENV = "STREAMTRACE_SPILL_LIMIT"
SPILL_RESERVE = 64 << 20   # bytes a spill always leaves free in its folder


def _parse_bytes(text):
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("B")
    unit = t[-1:] if t[-1:] in units else ""
    try:
        value = int(t[: len(t) - len(unit)]) * units[unit]
    except ValueError:
        value = -1
    if value < 0:
        raise StreamtraceError(f"{SPILL_LIMIT_ENV}={text!r}: expected a size in bytes such as 500M or 2G")
    return value


class _SpillBudget:
    """What the scans of one fuse run may spill, all ranks together: at most
    ``$STREAMTRACE_SPILL_LIMIT`` bytes, and never so much that the spill
    folder keeps less than ``SPILL_RESERVE`` free (checked before each run
    is written, so a bomb fails early, naming the folder, instead of filling
    the disk)."""

    def __init__(self):
        text = os.environ.get(SPILL_LIMIT_ENV)
        self.limit = _parse_bytes(text) if text else None
        self.folder = tempfile.gettempdir()
        self.used = 0
        self._lock = threading.Lock()

    def claim(self, nbytes):
        with self._lock:
            if self.limit is not None and self.used + nbytes > self.limit:
                raise StreamtraceError(
                    f"{self.folder}: the sorted intervals fuse spills there would exceed {SPILL_LIMIT_ENV}="
                    f"{self.limit} bytes (the traces hold too many X events; select fewer with --ranks, "
                    f"--cat, --window or --name, or raise the limit)")
            free = shutil.disk_usage(self.folder).free
            if free - nbytes < SPILL_RESERVE:
                raise StreamtraceError(
                    f"{self.folder}: not enough free space for fuse's sorted intervals ({nbytes >> 20} MiB "
                    f"more needed, {free >> 20} MiB free; {self.used >> 20} MiB spilled so far): "
                    f"point TMPDIR at a larger folder")
            self.used += nbytes


class _Runs:
    """Sorted runs of X intervals spilled by a scan (an external sort, so the
    scan's memory does not grow with the trace), merged back in C.  A run
    holds one fixed-size record per kept X event (each one also written to
    the output), so the spill is at most about the output's size; the
    ``budget`` bounds it further."""

    MERGE_RECORDS = 1 << 18  # records held while merging, all runs together

    def __init__(self, fz, budget=None):
        self.fz, self.file, self.runs, self.size = fz, None, [], 0
        self.budget = budget

    def take(self):
        buf, n, size = self.fz.take_run()
        if self.budget is not None:
            self.budget.claim(len(buf))
        if self.file is None:
            self.file = tempfile.TemporaryFile(prefix="streamtrace-fuse-runs-")
        offset = self.file.seek(0, os.SEEK_END)
        self.file.write(buf)
        self.runs.append((offset, n))
        self.size = size

    def merge(self):
        fz, k = self.fz, len(self.runs)
        chunk = max(1024, self.MERGE_RECORDS // max(k, 1))
        bufs = [bytearray(chunk * self.size) for _ in range(k)]
        done = [0] * k
        fz.merge_begin(k)
        self.file.flush()
        fd = self.file.fileno()
        while True:
            status, run = fz.merge()
            if status == fz.OK:
                break
            offset, n = self.runs[run]
            take = min(chunk, n - done[run])
            got = os.preadv(fd, [memoryview(bufs[run])[: take * self.size]], offset + done[run] * self.size)
            if got != take * self.size:
                raise StreamtraceError("the temporary file of sorted intervals was cut short")
            done[run] += take
            fz.merge_feed(run, bufs[run], take, done[run] >= n)

    def close(self):
        if self.file is not None:
            self.file.close()
            self.file = None

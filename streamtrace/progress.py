"""How far a long run is, on stderr.

On a terminal: a bar (tqdm) over the inputs' size as stored -- compressed
bytes for .gz/.zst, a URL's size from its first request -- with the percent,
the ranks done of the ranks, the rate, the time left and the phase
(reading, matching, writing sheets).  When stderr is not a terminal (a log
file, CI, Slurm): a plain line every STREAMTRACE_PROGRESS_SECONDS (10 s by
default; a shorter run prints none), the totals in words.  With ``-q``:
nothing (the commands make no Progress).

tqdm rather than escape codes of our own: it sizes the bar to the
terminal, computes the rate and the time left, and is small, pure Python
and has no dependencies.
"""
import contextlib
import functools
import os
import sys
import threading
import time

from .remote import is_url

#: seconds between two plain progress lines when stderr is not a terminal
LINE_SECONDS_ENV = "STREAMTRACE_PROGRESS_SECONDS"
DEFAULT_LINE_SECONDS = 10.0

MIB = 1 << 20


def line_seconds():
    """STREAMTRACE_PROGRESS_SECONDS (>= 0), else the default."""
    raw = os.environ.get(LINE_SECONDS_ENV, "").strip()
    if not raw:
        return DEFAULT_LINE_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = -1
    if not value >= 0:   # also NaN
        from .errors import InvalidArgumentError

        raise InvalidArgumentError(f"{LINE_SECONDS_ENV}={raw!r}: expected seconds >= 0")
    return value


def input_size(path):
    """A local file's size (compressed, as stored); None for stdin and URLs
    (Progress asks for those apart, and the readers report them too)."""
    path = str(path)
    if path == "-" or is_url(path):
        return None
    try:
        return os.path.getsize(path)
    except OSError:
        return None


class Progress:
    """The progress of one command over its ranks' inputs.  ``ranks(inputs)``
    gives one reporter per rank (called from reading threads with the
    tokenizer's counts and ``input_read``/``input_size``); ``phase(name)``
    names what follows the reading; ``close(ok)`` ends the display."""

    def __init__(self, phases=("reading",), stream=None, tty=None):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.phases = phases
        self.phase_name = phases[0]
        self.every = line_seconds()
        self._lock = threading.Lock()
        self._sizes, self._read, self._events, self._done = [], [], [], set()
        self._bar = None
        self._passes = 0   # fuse's passes over the inputs (passes()); 0: ranks read once, counted each
        self._last_line = time.monotonic()
        self._last_text = None
        self.lines = 0   # plain lines printed
        self.sizing = None   # the thread asking for the URLs' sizes

    # ------------------------------------------------------------ reporting

    def ranks(self, inputs):
        """One reporter per input (a RankInput or a path), in input order."""
        paths = [str(getattr(inp, "path", inp)) for inp in inputs]
        with self._lock:
            self._sizes = [input_size(p) for p in paths]
            self._read = [0] * len(paths)
            self._events = [0] * len(paths)
            self._done = set()
        self._size_urls(paths)
        return [functools.partial(self._report, i) for i in range(len(paths))]

    def _size_urls(self, paths):
        """Ask for the URLs' sizes (Content-Length, an object's size) in a
        thread of its own, so the bar has its total before every rank is
        opened and the run does not wait for the requests."""
        from .remote import filesystem

        urls = []
        for i, p in enumerate(paths):
            if is_url(p):
                # made here, not in the thread: no module may be half imported
                # when the command forks its worker processes
                try:
                    urls.append((i, *filesystem(p)))
                except Exception:   # reading the URL says what is wrong with it
                    pass
        if urls:
            self.sizing = threading.Thread(target=self._url_sizes, args=(urls,), daemon=True,
                                           name="streamtrace-progress-sizes")
            self.sizing.start()

    def _url_sizes(self, urls):
        from .remote import _call, net_timeouts

        for i, fs, path in urls:
            try:
                size = _call(fs, "info", net_timeouts()[1], path).get("size")
            except Exception:   # reading the URL says what is wrong with it
                continue
            except BaseException:   # a stop signal: the main thread ends the run
                return
            with self._lock:
                if self._sizes[i] is None and isinstance(size, int):
                    self._sizes[i] = size

    def _report(self, i, counts):
        with self._lock:
            size = counts.get("input_size")
            if size is not None:
                self._sizes[i] = size
            size = self._sizes[i]
            read = counts.get("input_read")
            if read is None:
                read = counts.get("bytes_consumed", 0)
            self._read[i] = min(read, size) if size is not None else read
            self._events[i] = counts.get("events_stored", self._events[i])
            if counts.get("doc_done"):
                self._rank_finished(i)
            self._show()

    def passes(self, paths, names):
        """For a run that reads ``paths`` once per pass (fuse: scanning, then
        writing): a callback taking the bytes read so far over all passes."""
        paths = [str(p) for p in paths]
        with self._lock:
            self._sizes = [input_size(p) for p in paths]
            self._read = [0] * len(paths)
            self._events = [0] * len(paths)
            self.phases = tuple(names)
            self.phase_name = names[0]
            self._passes = len(names)
        self._size_urls(paths)

        def advance(done):
            with self._lock:
                one = sum(self._sizes) if None not in self._sizes else None
                if one:   # the pass the bytes are in; each pass counts from 0 to the inputs' size
                    k = min(max(done - 1, 0) // one, self._passes - 1)
                    self.phase_name = self.phases[k]
                    done -= k * one
                self._read = [min(done, one) if one is not None else done] + [0] * (len(self._sizes) - 1)
                self._show()

        return advance

    def rank_done(self, i):
        """Rank ``i`` is read (for maps whose workers cannot report as they go)."""
        with self._lock:
            self._rank_finished(i)
            self._show()

    def _rank_finished(self, i):
        self._done.add(i)
        if self._sizes[i] is not None:
            self._read[i] = self._sizes[i]
        if len(self._done) == len(self._sizes) and len(self.phases) > 1 and self.phase_name == self.phases[0]:
            self.phase_name = self.phases[1]

    def phase(self, name):
        """Every rank is read; ``name`` is what the run does now."""
        with self._lock:
            for i in range(len(self._sizes)):
                if i not in self._done:
                    self._rank_finished(i)
            self.phase_name = name
            self._show(force=True)

    # ------------------------------------------------------------ display

    def _totals(self):
        sizes = self._sizes
        total = sum(sizes) if sizes and None not in sizes else None
        return sum(self._read), total, len(self._done), len(sizes), sum(self._events)

    def _ranks_text(self, done, n):
        """"3 of 8 ranks" (done of all); "8 ranks" for passes, which count no rank as done."""
        return f"{n} ranks" if self._passes else f"{done} of {n} ranks"

    def text(self):
        """The plain line: "reading: 1953 of 4000 MiB read, 3 of 8 ranks, 1,405,620 events"."""
        read, total, done, n, events = self._totals()
        # whole MiB, but a tenth for small inputs (0 of 0 MiB says nothing)
        mib = (lambda b: f"{b / MIB:.1f}") if max(read, total or 0) < 10 * MIB else (lambda b: f"{b // MIB}")
        of = f" of {mib(total)}" if total is not None else ""
        events = "" if self._passes else f", {events:,} events"
        return f"{self.phase_name}: {mib(read)}{of} MiB read, {self._ranks_text(done, n)}{events}"

    def _show(self, force=False):
        if self.tty:
            self._draw_bar()
            return
        now = time.monotonic()
        if not force and now - self._last_line < self.every:
            return
        text = self.text()
        if text == self._last_text or (force and self.lines == 0 and self.every > 0):
            return   # a phase change alone opens no log of a short run
        self._last_line, self._last_text = now, text
        self.lines += 1
        print(f"  {text}", file=self.stream, flush=True)

    def _draw_bar(self):
        read, total, done, n, _ = self._totals()
        if self._bar is None:
            from tqdm import tqdm

            try:
                columns = os.get_terminal_size(self.stream.fileno()).columns
            except (OSError, ValueError, AttributeError):
                columns = 0
            # a terminal that reports no size (a new pty) would get no bar at all
            width = dict(dynamic_ncols=True) if columns else dict(ncols=80, nrows=24)
            self._bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, file=self.stream,
                             mininterval=0.2, leave=True, desc=self.phase_name, **width)
            _BARS.add(self)
        bar = self._bar
        changed = False
        if total != bar.total:
            bar.total, changed = total, True
        postfix = self._ranks_text(done, n)
        if bar.postfix != postfix or bar.desc != self.phase_name:
            bar.set_description_str(self.phase_name, refresh=False)
            bar.set_postfix_str(postfix, refresh=False)
            changed = True
        if read < bar.n:   # the next pass: it counts from 0 again, with its own rate
            bar.reset(total=total)
        if read > bar.n:
            bar.update(read - bar.n)   # redraws at most every mininterval
        if changed:
            bar.refresh()

    def close(self, ok=True):
        """End the display: the bar's last state stays on a success, and is
        cleared after a failure (the error's line follows); a log that had
        lines gets the last one."""
        with self._lock:
            if ok:   # every rank read: the bar reaches 100 %
                for i in range(len(self._sizes)):
                    if i not in self._done:
                        self._rank_finished(i)
                if self._bar is not None:
                    self._draw_bar()
            if self._bar is not None:
                if not ok:
                    self._bar.leave = False
                self._bar.close()
                self._bar = None
                _BARS.discard(self)
            elif ok and self.lines:
                self._show(force=True)


#: the bars drawn now: messages go above them (echo)
_BARS = set()


def echo(text, stream=None):
    """A message line on stderr (``stream``), above the progress bar when one is drawn."""
    stream = stream if stream is not None else sys.stderr
    if _BARS:
        from tqdm import tqdm

        tqdm.write(text, file=stream)
    else:
        print(text, file=stream, flush=True)


@contextlib.contextmanager
def shown(progress):
    """Close ``progress`` (None: nothing) when the block ends: its last state
    stays after a success, a bar is cleared after a failure."""
    ok = False
    try:
        yield progress
        ok = True
    finally:
        if progress is not None:
            progress.close(ok)


def progress_for(quiet, phases=("reading",)):
    """A command's Progress on stderr; None with -q."""
    return None if quiet else Progress(phases)


def rank_reporters(progress, inputs):
    """One progress callback per input (None each without ``progress``).  A
    Progress counts each rank; a plain callable (the Python API's
    ``progress=``) gets the sums over the ranks, as the ranks may be read in
    parallel threads."""
    if progress is None:
        return [None] * len(inputs)
    if isinstance(progress, Progress):
        return progress.ranks(inputs)
    latest = [{} for _ in inputs]
    lock = threading.Lock()

    def report(i, counts):
        with lock:
            latest[i] = counts
            progress({key: sum(c.get(key, 0) for c in latest) for key in ("bytes_consumed", "events_stored")})

    return [functools.partial(report, i) for i in range(len(inputs))]


def fuse_progress(progress, paths):
    """fuse's callback of the input bytes read over its two passes: a
    Progress shows each pass over ``paths``; a plain callable gets the bytes."""
    if isinstance(progress, Progress):
        return progress.passes(paths, ("scanning", "writing"))
    return progress


def rank_done(progress, i):
    """Rank ``i`` is read, when ``progress`` is a Progress."""
    if isinstance(progress, Progress):
        progress.rank_done(i)


def phase(progress, name):
    """The run moves on to ``name`` ("matching", "writing sheets"), when ``progress`` is a Progress."""
    if isinstance(progress, Progress):
        progress.phase(name)

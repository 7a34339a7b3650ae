"""Iterating in background threads, a few items ahead.

Used where the producer spends its time in code that releases the GIL (the C
tokenizer, file reads, decompression), so the consumer works meanwhile:
``chain.trace_frames`` (extraction ahead of align/correlate; with several
ranks at once, ``interleaved``) and ``io.reading.ReadAhead`` (reading and
decompressing ahead of the tokenizer).  ``in_thread`` runs one call in the
background (align finishing a rank while correlate finishes its own).
"""
import collections
import queue
import threading


_END = object()


class interleaved:
    """The items of several iterators, produced by ``workers`` background
    threads at once: each thread takes the next iterator not yet started
    (in the given order) and runs it to its end.  Items come in the order
    they are made: each iterator's own order is kept, iterators interleave.
    At most ``depth`` items wait.  An iterator's exception is raised by
    ``next`` (after the items queued before it) and stops every thread;
    ``close()`` (also on garbage collection) stops them and closes the
    iterators they were running."""

    def __init__(self, iterators, workers=2, depth=8, name="streamtrace-prefetch"):
        self._queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        pending = collections.deque(iterators)   # popleft is atomic: the threads share it
        self._running = max(1, min(workers, len(pending)))
        self._threads = [threading.Thread(target=_produce_from, args=(pending, self._queue, self._stop),
                                          name=name, daemon=True) for _ in range(self._running)]
        for t in self._threads:
            t.start()

    def __iter__(self):
        return self

    def __next__(self):
        while not self._done:
            item, exc = self._queue.get()
            if exc is not None:
                self.close()
                raise exc
            if item is not _END:
                return item
            self._running -= 1
            if not self._running:
                self.close()
        raise StopIteration

    def close(self):
        self._done = True
        self._stop.set()
        for t in self._threads:
            while t.is_alive():   # a producer blocked on a full queue sees the stop
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    t.join(0.05)

    def __del__(self):
        self.close()


def _produce_from(pending, q, stop):
    """A thread of ``interleaved``: iterators from ``pending`` until none is
    left, each run to its end; then (_END, None), or (None, exception)."""
    items = None
    try:
        while not stop.is_set():
            try:
                items = pending.popleft()
            except IndexError:
                break
            for item in items:
                if not _put(q, stop, (item, None)):
                    return
            items = None
        _put(q, stop, (_END, None))
    except BaseException as exc:  # re-raised in the consumer
        _put(q, stop, (None, exc))
    finally:
        close = getattr(items, "close", None)   # the one stopped midway, if any
        if close is not None:
            close()
        if stop.is_set():   # never started: close them all (a generator not started just ends)
            while True:
                try:
                    rest = pending.popleft()
                except IndexError:
                    break
                close = getattr(rest, "close", None)
                if close is not None:
                    close()


def _put(q, stop, item):
    """Put item unless stopped meanwhile; False when stopped."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


class prefetched(interleaved):
    """An iterator over ``items`` whose items are produced in a background
    thread, started at once and at most ``depth`` items ahead: ``interleaved``
    with one iterator.  An exception of the producer is raised by ``next``
    after the items before it; ``close()`` (also on garbage collection) stops
    the producer, which then closes ``items``."""

    def __init__(self, items, depth=8, name="streamtrace-prefetch"):
        super().__init__([items], workers=1, depth=depth, name=name)


class in_thread:
    """``fn(*args)`` started at once in a background thread; ``result()``
    waits for it and returns its value, or raises its exception."""

    def __init__(self, fn, *args, name="streamtrace-background"):
        self._outcome = None
        self._thread = threading.Thread(target=self._run, args=(fn, args), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn, args):
        try:
            self._outcome = (fn(*args), None)
        except BaseException as exc:  # re-raised by result()
            self._outcome = (None, exc)

    def result(self):
        self._thread.join()
        value, exc = self._outcome
        if exc is not None:
            raise exc
        return value

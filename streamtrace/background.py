"""Iterating in a background thread, a few items ahead.

Used where the producer spends its time in code that releases the GIL (the C
tokenizer, file reads, decompression), so the consumer works meanwhile:
``pipeline.trace_frames`` (extraction ahead of align/correlate) and
``inputs.ReadAhead`` (reading and decompressing ahead of the tokenizer).
"""
import queue
import threading


class prefetched:
    """An iterator over ``items`` whose items are produced in a background
    thread, started at once and at most ``depth`` items ahead.  An exception
    of the producer is raised by ``next`` after the items before it;
    ``close()`` (also on garbage collection) stops the producer, which then
    closes ``items``."""

    def __init__(self, items, depth=8, name="streamtrace-prefetch"):
        self._queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        # the thread holds no reference to self, so dropping the iterator stops it
        self._thread = threading.Thread(target=_produce, args=(items, self._queue, self._stop),
                                        name=name, daemon=True)
        self._thread.start()

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        item, exc = self._queue.get()
        if exc is not None or item is _END:
            self.close()
            if exc is not None:
                raise exc
            raise StopIteration
        return item

    def close(self):
        self._done = True
        self._stop.set()
        while self._thread.is_alive():  # a producer blocked on a full queue sees the stop
            try:
                self._queue.get_nowait()
            except queue.Empty:
                self._thread.join(0.05)

    def __del__(self):
        self.close()


_END = object()


def _produce(items, q, stop):
    """The producer of ``prefetched``: (item, None) per item, then (_END, None),
    or (None, exception)."""

    def put(item):
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    try:
        for item in items:
            if not put((item, None)):
                return
        put((_END, None))
    except BaseException as exc:  # re-raised in the consumer
        put((None, exc))
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()

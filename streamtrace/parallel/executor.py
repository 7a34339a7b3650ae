"""The one interface that runs a stage's per-rank map.

Every rank-parallel stage has the same shape: a **map** that reads one rank
(wherever its trace lives) and returns a compact, picklable summary, and a
**reduce** over the summaries in rank order.  The stage hands its map to an
``Executor``; which kind runs it (threads here, processes here, a cluster) is
the caller's choice and changes no result.

``Executor.map(fn, items, finish=None)`` yields ``finish(fn(item))`` for each
item, in the order of ``items``:

* ``fn`` runs where the executor runs work (a thread, a process, a worker);
  it must be a picklable top-level function for the executors that ship it.
* ``finish`` (optional) turns ``fn``'s result into the summary.  Executors
  that share memory with the caller run it on the consuming thread, as the
  results arrive, so the workers go straight on to the next ranks; executors
  that ship results run it in the worker, so that only the summary travels.
* Work starts when ``map`` is called, so the caller can do other work
  (import pandas) meanwhile.  Pool executors keep at most
  ``WINDOW_PER_WORKER`` items per worker submitted and not yet consumed:
  results waiting for a slow consumer (a reading thread's whole rank
  collection, before ``finish``) are bounded, not one per rank of the job.
* The first failure, in item order, is raised; items not started by then
  are not run.  Executors that share memory wait for those running (they
  cannot be stopped from outside); those that ship work leave them to
  ``close(wait=False)``, which ends their workers at once.  Closing the
  generator early does the same.  After a signal (``Interrupted``,
  ``KeyboardInterrupt``) nothing is waited for.
"""
import abc
import collections
import concurrent.futures as cf
import itertools
import os

from ..errors import Interrupted
from .cpus import available_cpus

#: exceptions after which running work is not waited for
_STOP_NOW = (Interrupted, KeyboardInterrupt)

#: items per worker submitted ahead of the consumer, at most: one running
#: and one done and waiting keeps every worker busy while the consumer
#: finishes a result; more only holds memory (4,096 one-MB ranks read in
#: threads while the consuming thread finished them: ~0.8 GB of waiting
#: collections when every item was submitted at once)
WINDOW_PER_WORKER = 2


class Executor(abc.ABC):
    """Runs per-item work; ``workers`` items at a time."""

    workers = 1
    shares_memory = True   # results need not be picklable; ``finish`` runs on the consuming thread

    @abc.abstractmethod
    def submit(self, fn, item):
        """A concurrent.futures.Future of ``fn(item)``."""

    def map(self, fn, items, finish=None):
        if not (self.shares_memory or finish is None):
            fn, finish = _Finished(fn, finish), None
        items = iter(items)
        futures = collections.deque()
        self._submit_ahead(fn, items, futures)   # work starts now, not at the first next()
        return self._results(fn, items, futures, finish)

    def _submit_ahead(self, fn, items, futures):
        for item in itertools.islice(items, max(0, WINDOW_PER_WORKER * self.workers - len(futures))):
            futures.append(self.submit(fn, item))

    def _results(self, fn, items, futures, post):
        try:
            while futures:
                result = _result(futures[0])
                futures.popleft()
                self._submit_ahead(fn, items, futures)
                yield post(result) if post is not None else result
        except BaseException as exc:
            for future in futures:
                future.cancel()
            if self.shares_memory and not stopping(exc):
                cf.wait(futures)
            raise

    def close(self, wait=True):
        """Release the workers: after the running work ends, or (not
        ``wait``) now, as far as this kind of executor can."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close(wait=exc_type is None)


def stopping(exc=None):
    """Whether a stop is under way: ``exc`` is one, or a stop signal was
    received (``Interrupted.pending``) though its exception was swallowed or
    replaced on the way (a library's bare ``except:`` during an import).
    Waiting on workers then could wait forever on a blocked reader."""
    return isinstance(exc, _STOP_NOW) or Interrupted.pending is not None


#: how often a wait on a worker looks for a stop signal received meanwhile
STOP_POLL_SECONDS = 0.25


def _result(future):
    """``future.result()``, but a stop signal received while waiting
    (``Interrupted.pending``) is raised here even when its handler's
    exception was lost: found as a report waiting on a blocked reader until
    the CLI's watchdog, about once in 180 signalled runs under load."""
    while not cf.wait([future], timeout=STOP_POLL_SECONDS).done:
        if Interrupted.pending is not None:
            raise Interrupted(Interrupted.pending)
    return future.result()


class _Finished:
    """``finish(fn(item))`` as one picklable callable (for executors that ship work)."""

    def __init__(self, fn, finish):
        self.fn, self.finish = fn, finish

    def __call__(self, item):
        return self.finish(self.fn(item))


class Serial(Executor):
    """Each item on the calling thread, when its result is asked for."""

    def map(self, fn, items, finish=None):
        return (finish(fn(item)) if finish is not None else fn(item) for item in items)

    def submit(self, fn, item):
        future = cf.Future()
        try:
            future.set_result(fn(item))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
            future.set_exception(exc)
        return future


class Threads(Executor):
    """A pool of threads in this process: the C core releases the GIL while it
    tokenizes, so ranks read in threads run in parallel and share one copy of
    the interpreter and its imports."""

    def __init__(self, workers, name="streamtrace-rank"):
        self.workers = max(1, int(workers))
        self._pool = cf.ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=name)

    def submit(self, fn, item):
        return self._pool.submit(fn, item)

    def close(self, wait=True):
        # not waiting: threads cannot be stopped; those running end with the process
        self._pool.shutdown(wait=wait and not stopping(), cancel_futures=True)


class Processes(Executor):
    """A pool of worker processes: for maps that hold the GIL or write their
    own files.  ``fn``, the items and the summaries are pickled.  The workers
    die with this process however it ends (``parallel.fork.become_worker``)."""

    shares_memory = False

    def __init__(self, workers):
        self.workers = max(1, int(workers))
        self._pool = cf.ProcessPoolExecutor(max_workers=self.workers, initializer=_start_worker,
                                            initargs=(os.getpid(),))

    def submit(self, fn, item):
        return self._pool.submit(fn, item)

    def close(self, wait=True):
        if wait and not stopping():
            self._pool.shutdown(wait=True, cancel_futures=True)
            return
        # the pool's own shutdown would wait for the running items; its worker
        # processes are reachable only through ``_processes`` (no public way
        # before Python 3.14)
        processes = list((getattr(self._pool, "_processes", None) or {}).values())
        self._pool.shutdown(wait=False, cancel_futures=True)
        for p in processes:
            try:
                p.kill()
                p.join()
            except (OSError, ValueError, AttributeError):
                pass


def _start_worker(parent_pid):
    from .fork import become_worker

    become_worker(parent_pid)


def worker_count(jobs, items):
    """How many ranks to run at once: ``jobs`` (None: the CPUs available),
    never more than there are ranks or CPUs (extra workers would only wait
    for a CPU and hold memory)."""
    limit = max(1, min(int(items), available_cpus()))
    return limit if jobs is None else max(1, min(int(jobs), limit))


def local_executor(jobs, items, kind="threads"):
    """The executor for a local run, sized by ``worker_count``: a pool of
    threads (one thread included: the work still runs beside the caller), or
    of processes (``kind`` "processes"; one worker runs ``Serial``ly here)."""
    workers = worker_count(jobs, items)
    if kind == "threads":
        return Threads(workers)
    return Serial() if workers <= 1 else Processes(workers)

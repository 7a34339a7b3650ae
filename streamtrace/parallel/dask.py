"""The per-rank map on a Dask (``distributed``) cluster.

``DaskExecutor`` runs each item as a Dask task on the cluster's workers.  The
workers read the traces themselves, by the paths (or URLs) as given, so the
cluster must see them where the client does (shared storage).  ``finish``
runs in the worker too (``shares_memory`` is false): only the compact
per-rank summary travels back, and the reduce runs on the client.

Where the cluster is (``open_executor``'s ``scheduler``):

* ``tcp://host:port`` (any address ``distributed.Client`` takes): that
  scheduler, connected with a short timeout;
* ``auto``: the scheduler Dask's own configuration names
  (``DASK_SCHEDULER_ADDRESS``, or ``scheduler-address`` in a dask config
  file); an error when it names none;
* ``local``: a ``LocalCluster`` of worker processes started for the run
  and stopped after it.

``distributed`` is an optional dependency (``pip install streamtrace[dask]``),
imported only here and only when a cluster is asked for.
"""
import concurrent.futures as cf
import socket
import uuid

from ..errors import StreamtraceError
from .executor import Executor, _Finished, worker_count

#: seconds to wait for a scheduler to answer before giving up
CONNECT_TIMEOUT_S = 5

#: tasks whose results are fetched in one request, at most (see DaskExecutor.map)
FETCH_AHEAD = 64

#: items in one task, at most, and tasks per worker, at least (items_per_task)
MAX_ITEMS_PER_TASK, TASKS_PER_WORKER = 16, 4

#: the ``scheduler`` values that are not addresses
LOCAL, AUTO = "local", "auto"


class DaskError(StreamtraceError):
    """The cluster could not be reached or could not run the work."""


def _distributed():
    try:
        import distributed
    except ImportError:
        raise DaskError("running on a Dask cluster needs the 'distributed' package: "
                        "pip install 'streamtrace[dask]'") from None
    return distributed


class DaskExecutor(Executor):
    """Items as tasks of a ``distributed.Client``.  ``owned``: other things
    to close with it (the client this executor made, its LocalCluster)."""

    shares_memory = False
    #: the workers may not see this machine's files: results come back as values
    remote = True

    def __init__(self, client, owned=()):
        self.client = client
        self._owned = list(owned)
        self._pending = []   # the running map's futures not yet consumed (cancelled by close)
        self._submitted = 0
        self.address = getattr(client.scheduler, "address", None) or "the Dask scheduler"
        try:
            self.workers = max(1, sum(w.get("nthreads", 1) for w in client.scheduler_info()["workers"].values()))
        except Exception:  # noqa: BLE001 - only a sizing hint
            self.workers = 1

    def submit(self, fn, item):
        # a key of our own: unique (two equal items are two tasks, and nothing
        # is hashed), and readable in the dashboard and in errors
        key = f"streamtrace-{_name(fn)}-{self._submitted}-{uuid.uuid4().hex[:12]}"
        self._submitted += 1
        return self.client.submit(fn, item, key=key)

    def map(self, fn, items, finish=None, fetch_ahead=FETCH_AHEAD):
        """As ``Executor.map``.  Consecutive items go together in one task
        (``items_per_task``), and the results are fetched in item order, each
        task's with those after it that are done already, up to
        ``fetch_ahead`` tasks in one request: a task, and a request, per rank
        would cost the scheduler and this side milliseconds of CPU per rank.
        ``fetch_ahead`` 1: one item per task, one result held here at a
        time (for results the size of a rank's events)."""
        items = list(items)
        fetch_ahead = max(1, int(fetch_ahead))
        size = 1 if fetch_ahead == 1 else items_per_task(len(items), self.workers)
        task = _Batch(_Finished(fn, finish) if finish is not None else fn)
        futures = [self.submit(task, items[i:i + size]) for i in range(0, len(items), size)]
        self._pending = futures
        return (result for batch in self._in_order(futures, fetch_ahead) for result in batch)

    def _in_order(self, futures, fetch_ahead):
        try:
            i = 0
            while i < len(futures):
                # the next item's result is waited for (its failure raised as
                # itself); those after it that are done come along
                batch = [futures[i]]
                if batch[0].status == "finished":
                    for f in futures[i + 1:i + fetch_ahead]:
                        if f.status != "finished":
                            break
                        batch.append(f)
                results = self._fetch(batch)
                for j, result in enumerate(results):
                    futures[i + j] = None   # released: the worker may drop its copy
                    yield result
                i += len(results)
        except BaseException:
            self.cancel_pending()
            raise
        finally:
            self._pending = []

    def _fetch(self, futures):
        distributed = _distributed()
        try:
            return self.client.gather(futures)
        except distributed.client.FutureCancelledError as exc:
            raise DaskError(f"{self.address}: the task was cancelled ({_reason(exc)})") from None
        except cf.CancelledError:
            raise DaskError(f"{self.address}: the task was cancelled (lost the scheduler?)") from None
        except _killed_worker():
            raise DaskError(f"{self.address}: the workers running task {futures[0].key} died; Dask gave up "
                            "on it (its allowed-failures); see the workers' logs") from None
        except (OSError, TimeoutError) as exc:
            if isinstance(exc, StreamtraceError) or getattr(exc, "filename", None):
                raise   # the task's own, e.g. a trace it could not open
            raise DaskError(f"{self.address}: lost the connection to the scheduler ({_reason(exc)})") from None

    def cancel_pending(self):
        """Cancel the running map's tasks not consumed yet, on the workers too."""
        pending, self._pending = [f for f in self._pending if f is not None], []
        if pending:
            try:
                self.client.cancel(pending)
            except Exception:  # noqa: BLE001 - the connection may be gone already
                pass

    def close(self, wait=True):
        """Cancel what has not finished, then close what this executor
        opened (its client, its LocalCluster)."""
        self.cancel_pending()
        for thing in reversed(self._owned):
            try:
                thing.close()
            except Exception:  # noqa: BLE001 - closing a lost connection
                pass
        self._owned = []


def items_per_task(n, workers):
    """Items in one task: enough that the scheduler's cost per task is small
    beside the task's, few enough that every worker gets at least
    ``TASKS_PER_WORKER`` tasks (a slow rank, or a lost worker, holds up one
    small task, not a worker's whole share)."""
    return max(1, min(MAX_ITEMS_PER_TASK, n // (max(1, workers) * TASKS_PER_WORKER)))


class _Batch:
    """``fn`` over a list of items, as one task: the list of results."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, items):
        return [self.fn(item) for item in items]


def _name(fn):
    """What a task runs, for its key: the function's name."""
    fn = getattr(fn, "fn", fn)             # _Batch
    fn = getattr(fn, "fn", fn)             # executor._Finished
    fn = getattr(fn, "func", fn)           # functools.partial
    return getattr(fn, "__name__", type(fn).__name__).strip("_")


def _killed_worker():
    try:
        from distributed.scheduler import KilledWorker
    except ImportError:  # pragma: no cover - older layouts
        return ()
    return KilledWorker


def _reason(exc):
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def quiet_logs():
    """Dask's client logs what it recovers from (a lost worker's results
    computed again) as warnings; a command that reports failures in one
    line of its own keeps only Dask's errors."""
    import logging

    _distributed()
    for name in ["distributed", *logging.root.manager.loggerDict]:
        if name == "distributed" or name.startswith("distributed."):
            logging.getLogger(name).setLevel(logging.ERROR)


def as_executor(executor):
    """``executor`` as an Executor: a ``distributed.Client`` is wrapped in a
    DaskExecutor (the caller keeps and closes the client)."""
    if executor is None or isinstance(executor, Executor):
        return executor
    if type(executor).__module__.split(".")[0] == "distributed":
        return DaskExecutor(executor)
    raise StreamtraceError(f"executor: expected a streamtrace Executor or a distributed.Client, "
                           f"got {type(executor).__name__}")


def scheduler_address(scheduler):
    """The address ``scheduler`` stands for (``auto``: Dask's configuration),
    or ``local``."""
    if scheduler == LOCAL:
        return LOCAL
    if scheduler == AUTO:
        import dask

        address = dask.config.get("scheduler-address", None) or dask.config.get("scheduler_address", None)
        if not address:
            raise DaskError("--scheduler auto: no scheduler configured (set DASK_SCHEDULER_ADDRESS, or "
                            "scheduler-address in a dask config file)")
        return address
    return scheduler


def open_executor(scheduler, jobs=None, items=None):
    """A DaskExecutor for ``scheduler`` (see the module's docstring); the
    caller closes it.  ``local``: ``jobs`` worker processes (None: the CPUs
    available, at most one per item), one thread each."""
    distributed = _distributed()
    address = scheduler_address(scheduler)
    if address == LOCAL:
        n = worker_count(jobs, items if items else 1 << 30)
        try:
            cluster = distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                               dashboard_address=None, host="127.0.0.1")
        except Exception as exc:  # noqa: BLE001 - one line, whatever Dask raised
            raise DaskError(f"could not start a local Dask cluster: {_reason(exc)}") from None
        try:
            client = distributed.Client(cluster, set_as_default=False)
        except BaseException:
            cluster.close()
            raise
        return DaskExecutor(client, owned=[cluster, client])
    _check_reachable(address)
    try:
        client = distributed.Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise DaskError(f"{address}: cannot reach the Dask scheduler ({_reason(exc)})") from None
    return DaskExecutor(client, owned=[client])


def _check_reachable(address):
    """Connect once to a ``tcp://`` scheduler before making a Client: a
    Client that cannot connect leaves its event-loop thread running in this
    process (which then can no longer fork safely)."""
    if not address.startswith("tcp://"):
        return
    host, _, port = address[len("tcp://"):].rpartition(":")
    try:
        port = int(port.split("/")[0])
    except ValueError:
        return   # Dask's own parsing says what is wrong with it
    try:
        socket.create_connection((host.strip("[]"), port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise DaskError(f"{address}: cannot reach the Dask scheduler ({_reason(exc)})") from None

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
import uuid

from ..errors import StreamtraceError
from .executor import Executor, worker_count

#: seconds to wait for a scheduler to answer before giving up
CONNECT_TIMEOUT_S = 5

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
        self._futures = []
        self.address = getattr(client.scheduler, "address", None) or "the Dask scheduler"
        try:
            self.workers = max(1, sum(w.get("nthreads", 1) for w in client.scheduler_info()["workers"].values()))
        except Exception:  # noqa: BLE001 - only a sizing hint
            self.workers = 1

    def submit(self, fn, item):
        # a key of our own: unique (two equal items are two tasks, and nothing
        # is hashed), and readable in the dashboard and in errors
        key = f"streamtrace-{_name(fn)}-{len(self._futures)}-{uuid.uuid4().hex[:12]}"
        future = self.client.submit(fn, item, key=key)
        self._futures.append(future)
        return _ClusterFuture(future, self.address)

    def close(self, wait=True):
        """Cancel what has not finished (on the workers too), then close
        what this executor opened (its client, its LocalCluster)."""
        futures, self._futures = self._futures, []
        if futures and not wait:
            try:
                self.client.cancel(futures)
            except Exception:  # noqa: BLE001 - the connection may be gone already
                pass
        for thing in reversed(self._owned):
            try:
                thing.close()
            except Exception:  # noqa: BLE001 - closing a lost connection
                pass
        self._owned = []


class _ClusterFuture:
    """A Dask future with the ``result``/``cancel`` the base map uses; the
    cluster's own failures (a task whose workers kept dying, a lost
    scheduler) become one DaskError naming the address.  The task's own
    exception (a TraceError, say) comes back as itself."""

    def __init__(self, future, address):
        self._future, self._address = future, address

    def result(self):
        distributed = _distributed()
        try:
            return self._future.result()
        except distributed.client.FutureCancelledError as exc:
            raise DaskError(f"{self._address}: the task was cancelled ({_reason(exc)})") from None
        except cf.CancelledError:
            raise DaskError(f"{self._address}: the task was cancelled (lost the scheduler?)") from None
        except _killed_worker():
            raise DaskError(f"{self._address}: the workers running task {self._future.key} died; Dask gave up "
                            "on it (its allowed-failures); see the workers' logs") from None
        except (OSError, TimeoutError) as exc:
            if isinstance(exc, StreamtraceError) or getattr(exc, "filename", None):
                raise   # the task's own, e.g. a trace it could not open
            raise DaskError(f"{self._address}: lost the connection to the scheduler ({_reason(exc)})") from None

    def cancel(self):
        try:
            self._future.cancel()
        except Exception:  # noqa: BLE001 - the connection may be gone already
            pass


def _name(fn):
    """What a task runs, for its key: the function's name."""
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
    try:
        client = distributed.Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise DaskError(f"{address}: cannot reach the Dask scheduler ({_reason(exc)})") from None
    return DaskExecutor(client, owned=[client])

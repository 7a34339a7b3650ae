"""The per-rank map on a Dask (``distributed``) cluster.

``DaskExecutor`` runs each item as a Dask task on the cluster's workers.  The
workers read the traces themselves, by the paths (or URLs) as given, so the
cluster must see them where the client does (shared storage).  ``finish``
runs in the worker too (``shares_memory`` is false): only the compact
per-rank summary travels back, and the reduce runs on the client.

Where the cluster is (``open_executor``'s ``scheduler``):

* ``tcp://host:port`` (or ``host:port``), ``tls://host:port``: that
  scheduler.  Before a Client is made, the scheduler's greeting (the first
  message of Dask's protocol, which a scheduler sends unasked) is read here
  within ``connect_timeout()``: a service that is not a Dask scheduler (an
  HTTP server, a silent one) is one line, never a hang or a reply read as a
  message length;
* ``auto``: the scheduler Dask's own configuration names
  (``DASK_SCHEDULER_ADDRESS``, or ``scheduler-address`` in a dask config
  file); an error when it names none;
* ``local``: a ``LocalCluster`` of worker processes started for the run
  and stopped after it.

``distributed`` is an optional dependency (``pip install streamtrace[dask]``),
imported only here and only when a cluster is asked for.
"""
import asyncio
import concurrent.futures as cf
import socket
import struct
import time
import uuid

from ..errors import StreamtraceError
from ..settings import env_seconds
from .executor import Executor, _Finished, worker_count

#: seconds for the whole connection to a scheduler (TCP, its greeting, the
#: client's registration), and for any one call to it; env STREAMTRACE_DASK_CONNECT_TIMEOUT
CONNECT_TIMEOUT_S = 5

#: seconds a run waits while the scheduler has no running worker (none yet,
#: or all lost mid-run) before it fails; env STREAMTRACE_DASK_NO_WORKER_TIMEOUT
NO_WORKER_TIMEOUT_S = 30

#: seconds between two looks at the cluster while a result is awaited
POLL_S = 1

#: a scheduler's greeting is ~60 bytes: anything far larger is not one
MAX_GREETING_BYTES = 64 << 10

#: the port Dask's scheduler listens on when an address names none
DEFAULT_PORT = 8786

#: tasks whose results are fetched in one request, at most (see DaskExecutor.map)
FETCH_AHEAD = 64

#: items in one task, at most, and tasks per worker, at least (items_per_task)
MAX_ITEMS_PER_TASK, TASKS_PER_WORKER = 16, 4

#: the ``scheduler`` values that are not addresses
LOCAL, AUTO = "local", "auto"


class DaskError(StreamtraceError):
    """The cluster could not be reached or could not run the work."""


def connect_timeout():
    return env_seconds("STREAMTRACE_DASK_CONNECT_TIMEOUT", CONNECT_TIMEOUT_S, DaskError)


def no_worker_timeout():
    return env_seconds("STREAMTRACE_DASK_NO_WORKER_TIMEOUT", NO_WORKER_TIMEOUT_S, DaskError)


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
        self.connect_timeout, self.no_worker_timeout = connect_timeout(), no_worker_timeout()
        try:
            self.workers = max(1, sum(self._running_workers().values()))
        except Exception:  # noqa: BLE001 - only a sizing hint
            self.workers = 1

    def _call(self, make, timeout):
        """The awaitable ``make()`` returns (a call of the client's with
        ``asynchronous=True``, or of its ``scheduler``), run on the client's
        event loop and given up on after ``timeout`` s (TimeoutError).  The
        wait here is a plain wait of this thread's: a stop signal ends it."""
        running = self._start(make)
        try:
            return running.result(timeout)
        finally:
            running.cancel()

    def _start(self, make):
        async def call():
            return await make()
        return asyncio.run_coroutine_threadsafe(call(), self.client.loop.asyncio_loop)

    def _running_workers(self):
        """{worker address: threads} of the scheduler's running workers."""
        return self._call(lambda: self.client.scheduler.ncores_running(), self.connect_timeout)

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
            return self._gather(futures)
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

    def _gather(self, futures):
        """``client.gather(futures)``, looking at the cluster every ``POLL_S``
        while it waits: Dask itself waits for a worker forever when the
        scheduler has none (never started, or all lost), and for a scheduler
        that stopped answering."""
        gathering = self._start(lambda: self.client.gather(futures, asynchronous=True))
        idle_since = None   # when the scheduler was last seen without a running worker
        try:
            while True:
                try:
                    return gathering.result(POLL_S)
                except cf.TimeoutError:
                    if gathering.done():
                        raise   # the gather's own
                try:
                    workers = self._running_workers()
                except (OSError, TimeoutError, cf.CancelledError):
                    workers = None   # the scheduler did not answer in time
                if workers:
                    idle_since = None
                    continue
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > self.no_worker_timeout:
                    state = "had no running Dask worker" if workers is not None else "not answered"
                    raise DaskError(f"{self.address}: the scheduler has {state} for {self.no_worker_timeout:g} s "
                                    "(STREAMTRACE_DASK_NO_WORKER_TIMEOUT)")
        finally:
            gathering.cancel()

    def cancel_pending(self, timeout=None):
        """Cancel the running map's tasks not consumed yet, on the workers too."""
        pending, self._pending = [f for f in self._pending if f is not None], []
        if pending:
            try:
                self._call(lambda: self.client.cancel(pending, asynchronous=True), timeout or self.connect_timeout)
            except Exception:  # noqa: BLE001 - the connection may be gone already
                pass

    def close(self, wait=True):
        """Cancel what has not finished, then close what this executor
        opened (its client, its LocalCluster).  ``wait`` False (an error, a
        stop signal): a second at most for each, the scheduler may be gone."""
        timeout = self.connect_timeout if wait else 1
        self.cancel_pending(timeout)
        for thing in reversed(self._owned):
            try:
                # a LocalCluster's close stops its worker processes: not cut short
                thing.close(timeout=timeout) if thing is self.client else thing.close()
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
    computed again) as warnings, and what it cannot (a lost scheduler) as
    errors with their tracebacks; a command that reports every failure in
    one line of its own keeps only Dask's critical messages."""
    import logging

    _distributed()
    for name in ["distributed", *logging.root.manager.loggerDict]:
        if name == "distributed" or name.startswith("distributed."):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, _NoDaskTaskErrors) for f in asyncio_log.filters):
        asyncio_log.addFilter(_NoDaskTaskErrors())


class _NoDaskTaskErrors:
    """Drops asyncio's "Task exception was never retrieved" for an exception
    of Dask's: the inner tasks of a gather given up on (a stop signal, a lost
    cluster) end so, after this command has said what happened."""

    def filter(self, record):
        exc = record.exc_info[1] if record.exc_info else None
        return not type(exc).__module__.startswith("distributed")


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
    if not scheduler.strip():
        raise DaskError(f"--scheduler {scheduler!r}: an empty scheduler address (give tcp://host:port, auto or local)")
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
    timeout = connect_timeout()
    deadline = time.monotonic() + timeout
    _check_greeting(address, timeout)
    try:
        # the rest of the same time for the client's own connection and registration
        client = distributed.Client(address, timeout=max(1.0, deadline - time.monotonic()), set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise DaskError(f"{address}: cannot reach the Dask scheduler ({_reason(exc)})") from None
    return DaskExecutor(client, owned=[client])


def _check_greeting(address, timeout):
    """Connect to a scheduler and read its greeting (the handshake a Dask
    scheduler sends as soon as it accepts a connection) within ``timeout``
    s, before a Client is made: Dask's own client waits for the greeting
    without a limit, and reads an HTTP reply's first bytes as a message
    length.  Also, a Client that cannot connect leaves its event-loop thread
    running in this process (which then can no longer fork safely)."""
    import ssl

    from distributed.comm.addressing import parse_address, parse_host_port

    scheme, location = parse_address(address)   # no scheme: tcp
    if scheme not in ("tcp", "tls"):
        raise DaskError(f"{address}: the {scheme}:// protocol is not supported (use tcp:// or tls://)")
    try:
        host, port = parse_host_port(location, DEFAULT_PORT)
    except ValueError as exc:
        raise DaskError(f"{address}: not a scheduler address ({_reason(exc)})") from None
    context = None
    if scheme == "tls":
        args = _distributed().Security().get_connection_args("client")
        context = args["ssl_context"]
        if context is None:
            raise DaskError(f"{address}: tls:// needs a client certificate and CA in dask's configuration "
                            "(distributed.comm.tls); none is set")
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise DaskError(f"{address}: cannot reach the Dask scheduler ({_reason(exc)})") from None
    try:
        if context is not None:
            hostname = args.get("server_hostname") or (host if context.check_hostname else None)
            sock = context.wrap_socket(sock, server_hostname=hostname)
        _read_greeting(sock, deadline)
    except TimeoutError:
        raise DaskError(f"{address} does not answer as a Dask scheduler (no greeting within {timeout:g} s; "
                        "STREAMTRACE_DASK_CONNECT_TIMEOUT)") from None
    except (OSError, ValueError, ssl.SSLError) as exc:
        raise DaskError(f"{address} does not answer as a Dask scheduler ({_reason(exc)})") from None
    finally:
        sock.close()


def _read_greeting(sock, deadline):
    """Read a Dask message (a little-endian 8-byte length, then frames whose
    first is msgpack) and check it is a greeting; ValueError if not."""
    import msgpack
    from distributed.protocol.utils import unpack_frames

    header = _recv(sock, 8, deadline)
    (size,) = struct.unpack("<Q", header)
    if not 0 < size <= MAX_GREETING_BYTES:
        raise ValueError(f"its reply begins {header!r}, not Dask's protocol")
    try:
        greeting = msgpack.loads(unpack_frames(_recv(sock, size, deadline))[0])
    except Exception:  # noqa: BLE001 - whatever fails to decode is not a greeting
        greeting = None
    if not isinstance(greeting, dict) or "compression" not in greeting:
        raise ValueError("its first message is not a Dask scheduler's greeting")


def _recv(sock, n, deadline):
    """``n`` bytes from ``sock`` by ``deadline`` (time.monotonic()): TimeoutError after it."""
    data = bytearray()
    while len(data) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ValueError("it closed the connection")
        data += chunk
    return bytes(data)

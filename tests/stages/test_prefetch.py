"""background.prefetched (used by chain.trace_frames): order, producer exceptions, early close, garbage collection."""
import gc
import threading
import time

import pytest

from streamtrace.chain import prefetched


def items(n, fail_at=None, closed=None):
    try:
        for i in range(n):
            if i == fail_at:
                raise ValueError(f"boom at {i}")
            yield i
    finally:
        if closed is not None:
            closed.set()


def test_all_items_in_order():
    assert list(prefetched(items(100), depth=3)) == list(range(100))


def test_producer_exception_after_the_items_before_it():
    got = []
    with pytest.raises(ValueError, match="boom at 5"):
        for i in prefetched(items(20, fail_at=5)):
            got.append(i)
    assert got == [0, 1, 2, 3, 4]


def first_then_stopped(make, how):
    """Start a background iterator, take its first item, then end it early:
    close it, or drop the only reference.  (first item, its threads)"""
    it = make()
    first, threads = next(it), list(it._threads)
    if how == "close":
        it.close()
        assert next(it, None) is None
    else:
        del it
        gc.collect()
    return first, threads


@pytest.mark.parametrize("how", ["close", "drop"])
def test_early_stop_closes_the_source(how):
    closed = threading.Event()
    first, (thread,) = first_then_stopped(lambda: prefetched(items(10_000, closed=closed), depth=2), how)
    assert first == 0
    thread.join(5)
    assert not thread.is_alive() and closed.wait(5)


def test_trace_frames_prefetched_equals_serial(tmp_path):
    import generate_fixture
    from streamtrace.chain import trace_frames
    from streamtrace.io.ranks import resolve_inputs

    generate_fixture.generate(str(tmp_path), ranks=2)
    inputs = resolve_inputs(trace_dir=str(tmp_path), world_size=2)
    serial = [(f.kind, f.rank, f.payload) for f in trace_frames(inputs, world_size=2, prefetch=False)]
    ahead = [(f.kind, f.rank, f.payload) for f in trace_frames(inputs, world_size=2)]
    assert ahead == serial
    time.sleep(0)  # nothing left running
    assert not any(t.name == "streamtrace-extract" and t.is_alive() for t in threading.enumerate())


# ---------------------------------------------------------------- interleaved

def labelled(label, n, fail_at=None, closed=None):
    try:
        for i in range(n):
            if i == fail_at:
                raise ValueError(f"boom in {label} at {i}")
            yield label, i
    finally:
        if closed is not None:
            closed.add(label)


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_interleaved_keeps_each_iterator_in_order(workers):
    from streamtrace.parallel.threads import interleaved

    sizes = {"a": 300, "b": 0, "c": 1000, "d": 7}
    got = list(interleaved([labelled(k, n) for k, n in sizes.items()], workers=workers, depth=4))
    assert sorted(got) == sorted((k, i) for k, n in sizes.items() for i in range(n))
    for k in sizes:
        assert [i for label, i in got if label == k] == list(range(sizes[k]))


def test_interleaved_raises_an_iterators_exception_and_stops_the_others():
    from streamtrace.parallel.threads import interleaved

    closed = set()
    it = interleaved([labelled("a", 10**6, closed=closed), labelled("b", 100, fail_at=50, closed=closed),
                      labelled("c", 10, closed=closed)], workers=2, depth=4)
    with pytest.raises(ValueError, match="boom in b at 50"):
        for _ in it:
            pass
    for t in it._threads:
        t.join(5)
        assert not t.is_alive()
    assert {"a", "b"} <= closed       # "c", never started, has nothing to close


@pytest.mark.parametrize("how", ["close", "drop"])
def test_interleaved_early_stop_closes_the_iterators(how):
    from streamtrace.parallel.threads import interleaved

    closed = set()
    first, threads = first_then_stopped(
        lambda: interleaved([labelled(k, 10**6, closed=closed) for k in "abc"], workers=2, depth=2), how)
    assert first[1] == 0
    for t in threads:
        t.join(5)
        assert not t.is_alive()
    assert closed == {"a", "b"}


def test_trace_frames_in_two_threads_keeps_each_rank_in_order(tmp_path):
    import generate_fixture
    from streamtrace.chain import trace_frames
    from streamtrace.io.ranks import resolve_inputs

    generate_fixture.generate(str(tmp_path), ranks=3)
    inputs = resolve_inputs(trace_dir=str(tmp_path), world_size=3)
    serial = [(f.kind, f.rank, f.payload) for f in trace_frames(inputs, world_size=3)]
    threads = [(f.kind, f.rank, f.payload) for f in trace_frames(inputs, world_size=3, jobs=2)]
    assert sorted(threads, key=lambda f: f[1]) == serial   # sorted() is stable: per rank, the order made


def test_in_thread_runs_at_once_and_returns_the_value():
    from streamtrace.parallel.threads import in_thread

    started = threading.Event()
    go_on = threading.Event()

    def work(x):
        started.set()
        assert go_on.wait(5)
        return x * 2

    job = in_thread(work, 21)
    assert started.wait(5)   # running before anyone asks for the result
    go_on.set()
    assert job.result() == 42
    assert job.result() == 42


def test_in_thread_raises_the_exception_in_result():
    from streamtrace.parallel.threads import in_thread

    def fail():
        raise ValueError("bad rank")

    job = in_thread(fail)
    with pytest.raises(ValueError, match="bad rank"):
        job.result()


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_a_pool_map_runs_a_bounded_window_ahead_of_its_consumer(workers):
    """Threads.map starts work at once, but keeps at most WINDOW_PER_WORKER
    items per worker started and not yet consumed (a slow consumer does not
    let every rank's whole collection pile up), and still yields every item
    in order; an early stop leaves the rest unstarted."""
    from streamtrace.parallel.executor import WINDOW_PER_WORKER, Threads

    started, lock = [], threading.Lock()

    def work(i):
        with lock:
            started.append(i)
        return i * i

    window = WINDOW_PER_WORKER * workers
    with Threads(workers) as pool:
        results = pool.map(work, range(50), finish=lambda r: r + 1)
        deadline = time.monotonic() + 5
        while len(started) < window and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        assert len(started) == window   # started before the first next(), and no more
        got = []
        for consumed, value in enumerate(results, 1):
            got.append(value)
            time.sleep(0.002)
            with lock:
                assert len(started) <= consumed + window
            if consumed == 20:
                results.close()
                break
    assert got == [i * i + 1 for i in range(20)]
    assert max(started) < 20 + window


def test_a_wait_on_a_blocked_worker_raises_a_stop_signal_whose_exception_was_lost(monkeypatch):
    """A stop signal's handler records the signal before it raises; should its
    ``Interrupted`` be swallowed on the way (a library's bare ``except:``),
    the consumer waiting on a worker that never ends (a reader blocked on a
    FIFO) raises it all the same, within a poll, instead of waiting for the
    CLI's watchdog."""
    import signal

    from streamtrace.errors import Interrupted
    from streamtrace.parallel.executor import STOP_POLL_SECONDS, Threads

    release = threading.Event()
    outcome = {}

    def consume(pool):
        try:
            list(pool.map(lambda i: release.wait(30), range(2)))
        except Interrupted as exc:
            outcome["signum"], outcome["at"] = exc.signum, time.monotonic()

    monkeypatch.setattr(Interrupted, "pending", None)
    with Threads(2) as pool:
        consumer = threading.Thread(target=consume, args=(pool,))
        consumer.start()
        time.sleep(3 * STOP_POLL_SECONDS)
        assert consumer.is_alive()   # no signal yet: it waits
        sent = time.monotonic()
        Interrupted.pending = signal.SIGTERM   # as the handler records it, its exception lost
        consumer.join(timeout=5)
        release.set()
        assert not consumer.is_alive() and outcome["signum"] == signal.SIGTERM
        assert outcome["at"] - sent < 4 * STOP_POLL_SECONDS


def test_after_a_stop_signal_closing_a_pool_does_not_wait_on_a_blocked_worker(monkeypatch):
    """The stop's exception replaced by another on the way (a module left
    half-imported by a swallowed ``Interrupted``): closing the pool as after
    any error must not wait on a worker that never ends."""
    import signal

    from streamtrace.errors import Interrupted
    from streamtrace.parallel.executor import Threads

    release = threading.Event()
    monkeypatch.setattr(Interrupted, "pending", signal.SIGHUP)
    pool = Threads(1)
    pool.submit(release.wait, 30)
    t0 = time.monotonic()
    pool.close(wait=True)
    took = time.monotonic() - t0
    release.set()
    assert took < 1


def test_after_a_stop_signal_any_error_of_a_command_is_the_signals(monkeypatch):
    import signal

    from streamtrace.cli import handle_errors
    from streamtrace.errors import Interrupted

    @handle_errors
    def command():
        raise AttributeError("partially initialized module")

    with pytest.raises(AttributeError):
        command()
    monkeypatch.setattr(Interrupted, "pending", signal.SIGTERM)
    with pytest.raises(Interrupted) as caught:
        command()
    assert caught.value.signum == signal.SIGTERM

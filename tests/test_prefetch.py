"""background.prefetched (used by pipeline.trace_frames): order, producer exceptions, early close, garbage collection."""
import gc
import threading
import time

import pytest

from streamtrace.pipeline import prefetched


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


@pytest.mark.parametrize("how", ["close", "drop"])
def test_early_stop_closes_the_source(how):
    closed = threading.Event()
    p = prefetched(items(10_000, closed=closed), depth=2)
    assert next(p) == 0
    thread = p._thread
    if how == "close":
        p.close()
        assert next(p, None) is None
    else:
        del p
        gc.collect()
    thread.join(5)
    assert not thread.is_alive() and closed.wait(5)


def test_trace_frames_prefetched_equals_serial(tmp_path):
    import generate_fixture
    from streamtrace.pipeline import trace_frames
    from streamtrace.sources import resolve_inputs

    generate_fixture.generate(str(tmp_path), ranks=2)
    inputs = resolve_inputs(trace_dir=str(tmp_path), world_size=2)
    serial = [(f.kind, f.rank, f.payload) for f in trace_frames(inputs, world_size=2, prefetch=False)]
    ahead = [(f.kind, f.rank, f.payload) for f in trace_frames(inputs, world_size=2)]
    assert ahead == serial
    time.sleep(0)  # nothing left running
    assert not any(t.name == "streamtrace-extract" and t.is_alive() for t in threading.enumerate())

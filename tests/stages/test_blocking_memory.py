"""What the blocking analysis' map holds at once (issue #26's bounded
memory): ranks are summarized by the worker that read them, so no more than
``jobs`` ranks are held whole; a summary's host ops are picked and packed a
part at a time."""
import threading
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import generate_fixture
from streamtrace import chain
from streamtrace.correlate import summary
from streamtrace.io.ranks import resolve_inputs


def test_a_rank_is_summarized_before_its_worker_reads_another(tmp_path, monkeypatch):
    """With 2 workers and 4 ranks, a read rank is never left waiting while
    the others are read: the first rank's finish waits (up to a second) for
    a third rank to start, which it may only do when a worker is free."""
    generate_fixture.generate(str(tmp_path), ranks=4, steps=2)
    read, finish = chain._read_rank_for_blocking, chain._finish_rank_for_blocking
    lock, third_started = threading.Lock(), threading.Event()
    held, most, started = [0], [0], [0]

    def reading(*args, **kwargs):
        with lock:
            started[0] += 1
            held[0] += 1
            most[0] = max(most[0], held[0])
            if started[0] >= 3:
                third_started.set()
        return read(*args, **kwargs)

    def finishing(pair):
        third_started.wait(1.0)   # a waiting rank, if the map lets one wait, is read meanwhile
        out = finish(pair)
        with lock:
            held[0] -= 1
        return out

    monkeypatch.setattr(chain, "_read_rank_for_blocking", reading)
    monkeypatch.setattr(chain, "_finish_rank_for_blocking", finishing)
    inputs = resolve_inputs(trace_dir=str(tmp_path), world_size=4)
    chain._correlated_tables(inputs, 4, 2, None, None, False, None)
    assert started[0] == 4 and held[0] == 0
    assert most[0] <= 2


def _parts(n_parts, per_part, wide=False, seed=0):
    rng = np.random.default_rng(seed)
    parts, at = [], 0
    for k in range(n_parts):
        start = at + np.cumsum(rng.integers(0, 1000, per_part))
        at = int(start[-1])
        end = start + rng.integers(0, 500, per_part)
        tid = rng.choice(np.array([1, 2, 3, (1 << 40) if wide and k == 1 else 4]), per_part)
        name = rng.integers(0, (1 << 20) if wide and k == 2 else 300, per_part).astype(np.uint32)
        parts.append((start, end, tid, name))
    return parts


def _joined(parts):
    """The ops of packed parts, one array per column, in order."""
    cols = list(zip(*(summary.unpack_ops(p) for p in parts)))
    return [np.concatenate(c) for c in cols]


@pytest.mark.parametrize("wide", [False, True])
def test_ops_on_threads_are_the_parts_ops_on_those_threads(wide):
    """Threads and names past int32/uint16 in some parts only: the picked
    spans come back exactly, in stream order."""
    parts = _parts(5, 2000, wide)
    tids = np.array([2, 4, 1 << 40])
    got = summary._ops_on_threads([summary._squeeze(summary.pack_ops(*p)) for p in parts], tids)
    want = [np.concatenate(c) for c in zip(*parts)]
    on = np.isin(want[2], tids)
    for a, b in zip(_joined(got), want):
        np.testing.assert_array_equal(a, b[on])
        assert a.dtype == b.dtype


def test_a_part_wholly_on_those_threads_is_kept_as_it_is_and_one_on_none_is_dropped():
    """The common case costs nothing at the rank's end: a compressed part
    whose every op is on a launching thread is the same object afterwards
    (not unpacked and compressed again); a part with none is left out; a
    mixed part is cut down to its ops on those threads."""
    rng = np.random.default_rng(3)
    spans = []
    for threads in ([1, 2], [7], [1, 7]):
        start = np.cumsum(rng.integers(1, 100, 500)) + (spans[-1][0][-1] if spans else 0)
        spans.append((start, start + 5, rng.choice(np.array(threads), 500), rng.integers(0, 50, 500).astype(np.uint32)))
    parts = [summary._squeeze(summary.pack_ops(*p)) for p in spans]
    got = summary._ops_on_threads(parts, np.array([2, 1]))
    assert len(got) == 2 and got[0] is parts[0]
    np.testing.assert_array_equal(got[1]["threads"], [1])
    want = [np.concatenate(c) for c in zip(*spans)]
    on = np.isin(want[2], [1, 2])
    for a, b in zip(_joined(got), want):
        np.testing.assert_array_equal(a, b[on])


def test_plain_parts_come_back_compressed():
    """Parts kept uncompressed while the rank streamed (the stage's
    correlate) are compressed at its end like the others."""
    parts = _parts(2, 300)
    got = summary._ops_on_threads([summary.pack_ops(*p) for p in parts], np.array([1, 2, 3, 4]))
    assert all("data" in p for p in got)
    for a, b in zip(_joined(got), [np.concatenate(c) for c in zip(*parts)]):
        np.testing.assert_array_equal(a, b)


@given(st.lists(st.integers(0, 40), min_size=0, max_size=6), st.integers(0, 3))
@settings(max_examples=50, deadline=None)
def test_ops_on_threads_of_any_parts(sizes, seed):
    parts = [p for n in sizes if n for p in _parts(1, n, seed=seed + n)]
    parts.sort(key=lambda p: p[0][0])
    order_ok = all(a[0][-1] <= b[0][0] for a, b in zip(parts, parts[1:]))
    if not order_ok:   # parts of one rank follow each other
        return
    tids = np.array([1, 3])
    got = summary._ops_on_threads([summary.pack_ops(*p) for p in parts], tids)
    want = [np.concatenate(c) for c in zip(*parts)] if parts else None
    if want is None or not np.isin(want[2], tids).any():
        assert got == []
        return
    on = np.isin(want[2], tids)
    for a, b in zip(_joined(got), want):
        np.testing.assert_array_equal(a, b[on])


def test_ops_on_threads_hold_little_more_than_the_packed_ops():
    """Picking a rank's host ops (most on the launching thread) holds them
    narrow, about 14 bytes each, and one part's spans at a time: not the
    whole rank's spans as int64 (28 bytes each) copied several times."""
    parts = _parts(16, 60_000)
    packed = [summary.pack_ops(*p) for p in parts]
    n = sum(len(p[0]) for p in parts)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        got = summary._ops_on_threads(packed, np.array([1, 2, 3, 4]))
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert sum(p["n"] for p in got) == n
    assert peak < 40 * n


def test_host_ops_in_gaps_unpack_one_part_of_a_rank_at_a_time():
    """The late rank's host ops are read part by part: a rank's compressed
    parts are never all unpacked (28 bytes an op as int64) at once, and the
    self times found are those of the ops in the window."""
    from types import SimpleNamespace

    from streamtrace.correlate.late_rank import _host_ops_in_gaps

    spans = _parts(16, 60_000)
    n = sum(len(p[0]) for p in spans)
    tl = SimpleNamespace(shift=0, names=[f"op{i}" for i in range(300)],
                         cpu_ops=[summary._squeeze(summary.pack_ops(*p)) for p in spans])
    lo, hi = int(spans[3][0][0]), int(spans[3][0][100])   # a window inside one part
    args = ({0: tl}, np.array([0]), np.array([1]), np.array([lo]), np.array([hi]), np.array([True]))
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        got = _host_ops_in_gaps(*args)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert peak < 28 * n / 4
    start, end, tid, name = spans[3]
    assert got[0] and {op for op, _ in got[0]} <= {f"op{i}" for i in name[(tid == 1) & (start < hi) & (end > lo)]}

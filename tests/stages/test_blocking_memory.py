"""What the blocking analysis' map holds at once (issue #26's bounded
memory): ranks are summarized by the worker that read them, so no more than
``jobs`` ranks are held whole."""
import threading

import numpy as np

import generate_fixture
from streamtrace import chain
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


"""steps.StreamSteps on a stream whose ranks are summarized: each rank's
profiler steps come from align's summary (align.rank), not from its EVENTS
frames, which are never unpacked -- the same steps as read from the events;
a stream without summaries (or of the older summary version) is still read
from its events; an announced summary that never comes is one error."""
import io

import numpy as np
import pandas as pd
import pytest

import generate_fixture
import streamtrace.align.describe as describe
from streamtrace import extract, resolve_inputs
from streamtrace.chain import correlated_tables
from streamtrace.errors import StreamtraceError
from streamtrace.steps import TABLE as STEPS, StepCollector, StreamSteps
from streamtrace.stream.format import Frame, Kind, iter_frames


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("stream_steps")
    generate_fixture.generate(str(d / "traces"), ranks=4, steps=3, seed=3, window_shift_steps=[0, 1, 0, 0])
    return str(d / "traces")


def _stream(trace_dir, summaries=True):
    buf = io.BytesIO()
    extract(resolve_inputs(trace_dir=trace_dir), buf, summaries=summaries)
    return buf.getvalue()


def _steps(data):
    s = StreamSteps()
    for _ in s.watch(iter_frames(io.BytesIO(data))):
        pass
    return sorted(s.finish(), key=lambda x: x[0])


def _from_events(data):
    collectors = {}
    for f in iter_frames(io.BytesIO(data)):
        if f.kind in (Kind.STRINGS, Kind.EVENTS):
            collectors.setdefault(f.rank, StepCollector(f.rank)).add(f)
    return sorted((c.finish() for c in collectors.values()), key=lambda x: x[0])


def _same(a, b):
    assert [x[0] for x in a] == [x[0] for x in b]
    for x, y in zip(a, b):
        for u, v in zip(x[1:], y[1:]):
            np.testing.assert_array_equal(u, v)


@pytest.fixture
def no_unpacking(monkeypatch):
    def refuse(self):
        if self.kind == Kind.EVENTS:
            raise AssertionError("an EVENTS frame was unpacked")
        return real(self)
    real = Frame.records
    monkeypatch.setattr(Frame, "records", refuse)


def test_summarized_ranks_give_their_steps_without_unpacking_events(run, no_unpacking):
    data = _stream(run)
    steps = _steps(data)
    assert [len(n) for _, n, _, _ in steps] == [3, 3, 3, 3]
    assert steps[1][1].tolist() != steps[0][1].tolist()   # rank 1's window is shifted by a step


def test_the_steps_equal_those_read_from_the_events(run):
    data = _stream(run)
    _same(_steps(data), _from_events(data))
    _same(_steps(_stream(run, summaries=False)), _from_events(data))


def test_correlated_tables_of_a_summarized_stream_unpack_no_events(run, tmp_path, no_unpacking):
    path = tmp_path / "run.stev"
    path.write_bytes(_stream(run))
    tables = correlated_tables([str(path)], critical=True)
    assert tables[STEPS]["step"].tolist() == sorted(set(tables[STEPS]["step"]))
    assert len(tables[STEPS])


def test_the_step_table_is_the_same_with_and_without_summaries(run, tmp_path):
    a, b = tmp_path / "a.stev", tmp_path / "b.stev"
    a.write_bytes(_stream(run))
    b.write_bytes(_stream(run, summaries=False))
    pd.testing.assert_frame_equal(correlated_tables([str(a)])[STEPS], correlated_tables([str(b)])[STEPS])


def test_a_stream_with_version_1_summaries_is_read_from_its_events(run, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(describe, "SUMMARY_VERSION", "1")
        m.setattr(describe, "_SUMMARY_FIELDS", ("rank", "rows", "quality", "events", "p2p"))
        old = _stream(run)
    s = StreamSteps()
    for _ in s.watch(iter_frames(io.BytesIO(old))):
        pass
    assert not s.announced
    _same(sorted(s.finish(), key=lambda x: x[0]), _from_events(old))


def test_an_announced_summary_that_never_comes_is_an_error(run):
    frames = [f for f in iter_frames(io.BytesIO(_stream(run)))
              if not (f.kind == Kind.SUMMARY and f.rank == 2 and f.summary_header()["name"] == describe.SUMMARY_NAME)]
    s = StreamSteps()
    for _ in s.watch(iter(frames)):
        pass
    with pytest.raises(StreamtraceError, match="rank 2: the stream announces its summary but holds none"):
        s.finish()

"""align's per-rank summary carries the rank's ProfilerStep ops (summary
version 2): a summarized rank pairs within steps as a collected one does;
a stream of the older version is still read (its ranks collected from their
events); a summary whose steps are not three integer arrays is refused."""
import io

import numpy as np
import pandas as pd
import pytest

import generate_fixture
import streamtrace.align.describe as describe
from streamtrace import extract, resolve_inputs
from streamtrace.align.stage import align_frames
from streamtrace.steps import STEPS_TABLE
from streamtrace.stream.format import Kind, iter_frames


@pytest.fixture(scope="module")
def shifted(tmp_path_factory):
    d = tmp_path_factory.mktemp("shifted")
    truth = generate_fixture.generate(str(d), ranks=4, steps=2, layout="old", fill_ops=12, seed=11,
                                      window_shift_steps=[0, 1, 0, 1])
    return str(d), truth


def _stream(trace_dir, summaries=True):
    buf = io.BytesIO()
    extract(resolve_inputs(trace_dir=trace_dir, allow_missing_ranks=True), buf, summaries=summaries)
    return buf.getvalue()


def _align(data):
    tables = {}
    for f in align_frames(iter_frames(io.BytesIO(data))):
        if f.kind == Kind.TABLE:
            name, df = f.table()
            tables[name] = df
    return tables


def _same(a, b):
    for name in ("align.collectives", "align.clocks", "align.quality", STEPS_TABLE):
        pd.testing.assert_frame_equal(a[name], b[name], obj=name)


def test_summarized_ranks_pair_within_steps(shifted):
    d, truth = shifted
    data = _stream(d)
    assert b"align.rank" in data
    with_summaries, collected = _align(data), _align(_stream(d, summaries=False))
    steps = with_summaries[STEPS_TABLE]
    assert sorted(set(steps.loc[~steps["shared"], "step"])) == truth["messy"]["left_out_steps"]
    assert "steps_not_shared" in set(with_summaries["align.quality"]["category"])
    _same(with_summaries, collected)


def test_a_stream_with_version_1_summaries_is_still_read(shifted, monkeypatch):
    """Its announcement names align.rank version 1: align collects those ranks from their events."""
    d, _ = shifted
    with monkeypatch.context() as m:
        m.setattr(describe, "SUMMARY_VERSION", "1")
        m.setattr(describe, "_SUMMARY_FIELDS", ("rank", "rows", "quality", "events", "p2p"))
        old = _stream(d)
    assert b'"name":"align.rank","version":"1"' in old
    _same(_align(old), _align(_stream(d)))


def test_a_summary_without_proper_steps_is_refused():
    value = {"rank": 0, "rows": {}, "quality": [], "events": 0, "p2p": None,
             "steps": (np.array([1, 2]), np.array([0, 5]), np.array([4]))}
    with pytest.raises(ValueError, match="ProfilerSteps"):
        describe.result_from_summary(value, {})
    value["steps"] = (np.array([1]), np.array([0]), np.array([4]))
    assert describe.result_from_summary(value, {}).steps[0].tolist() == [1]
    del value["steps"]   # a version 1 value under the version 2 name
    with pytest.raises(ValueError):
        describe.result_from_summary(value, {})

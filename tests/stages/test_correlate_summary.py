"""The blocking analysis' per-rank summaries (correlate/summary.py): the
cross-rank reduce over them gives exactly the sheets of the whole timelines
(and of the streamed chain, which keeps them whole), finds the injected
truths, and a summary pickles into a fraction of its rank's events."""
import itertools
import json
import pickle

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import generate_fixture
from streamtrace import _native, chain
from streamtrace.align.stage import CLOCK_RULE, align_frames
from streamtrace.correlate import summary
from streamtrace.correlate.stage import TABLE_PREFIX, correlate_frames, sheets_from_tables
from streamtrace.extract import extract_rank
from streamtrace.io.ranks import resolve_inputs
from streamtrace.stream.format import Kind


def _summarized(directory, n):
    """Sheets of collective-report --blocking_analysis' map and reduce."""
    inputs = resolve_inputs(trace_dir=str(directory), world_size=n)
    return sheets_from_tables(chain._correlated_tables(inputs, n, 2, None, None, False, None))


def _streamed(directory, truth):
    """Sheets of extract | align | correlate over one stream (whole timelines)."""
    paths = {int(r): str(directory / f) for r, f in truth["files"].items()}
    frames = itertools.chain.from_iterable(extract_rank(p, r) for r, p in sorted(paths.items()))
    out = {}
    for f in correlate_frames(align_frames(frames, align_clocks=CLOCK_RULE)):
        if f.kind == Kind.TABLE and f.table_name().startswith(TABLE_PREFIX):
            name, df = f.table()
            out[name[len(TABLE_PREFIX):]] = df
    return out


def _assert_same(got, want):
    assert got.keys() == want.keys()
    for name in want:
        pd.testing.assert_frame_equal(got[name], want[name], check_exact=True)


def _whole(monkeypatch):
    """The map and the stream's collection without summaries: every rank's
    Timeline kept whole (the reference)."""
    from streamtrace.correlate import collect

    monkeypatch.setattr(summary, "compact", lambda tl, linked, tids: tl)
    monkeypatch.setattr(collect, "compact", lambda tl, linked, tids: tl)


CASES = {
    "slow": dict(ranks=4, steps=4, slow_kernel_rank=2, slow_kernel_factor=3.0),
    "host": dict(ranks=4, steps=4, host_delay_rank=1, host_delay_us=800),
    "inflated": dict(ranks=4, steps=6, inflate_kernel_factor=1.5, clock_offsets_us="random"),
    "straggler": dict(ranks=3, steps=3, straggler_rank=1, straggler_us=500),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    truth = generate_fixture.generate(str(out), **CASES[request.param])
    return request.param, out, truth


def test_summaries_give_the_sheets_of_whole_timelines(case, monkeypatch):
    """Exactly the same sheets from the summaries as from whole timelines
    (the map before summaries) and as from the streamed chain."""
    name, out, truth = case
    got = _summarized(out, truth["ranks"])
    _assert_same(got, _streamed(out, truth))
    _whole(monkeypatch)
    _assert_same(got, _summarized(out, truth["ranks"]))
    _assert_same(got, _streamed(out, truth))
    assert len(got["collective_blockers"]) and len(got["collective_overlap"])


def test_a_stream_is_collected_into_summaries(tmp_path):
    """correlate on a stream keeps each rank as its summary from the rank's
    end on (align's collection of the rank beside it says what may be linked)."""
    from streamtrace.correlate.collect import collect

    truth = generate_fixture.generate(str(tmp_path), ranks=2, steps=3, host_delay_rank=1)
    frames = itertools.chain.from_iterable(extract_rank(str(tmp_path / f), int(r))
                                           for r, f in sorted(truth["files"].items()))
    timelines, _ = collect(frames)
    assert sorted(timelines) == [0, 1]
    assert all(tl.gpu is None and len(tl.cpu_ops) == 1 and "data" in tl.cpu_ops[0] for tl in timelines.values())


def test_summaries_find_the_injected_truths(case):
    name, out, truth = case
    sheets = _summarized(out, truth["ranks"])
    if name == "slow":
        sk = truth["slow_kernel"]
        top = sheets["blocking_kernels"].iloc[0]
        assert (top["kernel"], top["ranks"]) == (sk["kernel_name"], str(sk["rank"]))
        assert top["mean_excess_us"] == pytest.approx(np.mean([i["excess_us"] for i in sk["instances"]]), rel=0.05)
    elif name == "host":
        assert sheets["blocking_host_ops"].iloc[0]["op"] == truth["host_delay"]["op_name"]
    elif name == "inflated":
        ik = truth["inflated_kernel"]
        ci = sheets["compute_inflation"]
        row = ci[ci["kernel"] == ik["name"]].iloc[0]
        assert row["inflation"] + 1 == pytest.approx(ik["factor"], rel=0.05)
    else:
        b = sheets["collective_blockers"]
        assert (b["late_rank"] == truth["straggler"]["rank"]).mean() > 0.5


def _rank_pair(directory, n, rank):
    inputs = resolve_inputs(trace_dir=str(directory), world_size=n)
    return chain._read_rank_for_blocking((inputs[rank], None), n, False)


def test_a_summary_holds_what_the_whole_timeline_says(case, monkeypatch):
    """Brute force against the whole Timeline of the same rank: every
    compute kernel's times, stream and launch shape, the buckets and compute
    union made again, the CTAs of the comm kernels and the CPU ops on the
    launching threads (in stream order)."""
    name, out, truth = case
    rows, timeline = _rank_pair(out, truth["ranks"], 1)
    result = chain._finish_rank_for_blocking((rows, timeline))[0]
    compact = summary.compact
    _whole(monkeypatch)
    whole = chain._finish_rank_for_blocking(_rank_pair(out, truth["ranks"], 1))[1]
    small = pickle.loads(pickle.dumps(compact(
        pickle.loads(pickle.dumps(whole)), result.rows["event"], result.rows["launch_tid"])))
    assert small.gpu is None and whole.gpu is not None
    j = np.arange(len(whole.compute_start))
    np.testing.assert_array_equal(small.compute_start, whole.compute_start)
    np.testing.assert_array_equal(small.compute_end, whole.compute_end)
    for c in summary.SHAPE_COLUMNS:
        np.testing.assert_array_equal(small.compute_column(c, j), whole.gpu[c][whole.compute_rows])
    table, index = small.by_lcode(np.arange(len(small.lkeys)))
    np.testing.assert_array_equal(table[index], whole.compute_lcode)
    # the union of the whole timeline's compute kernels, from its GPU rows
    compute = whole.gpu["compute"]
    want_union = _native.interval_union(whole.gpu["start"][compute], whole.gpu["end"][compute])
    np.testing.assert_array_equal(np.stack(small.compute_union()), np.stack(want_union))
    want_buckets, got_buckets = whole.buckets(), small.buckets()
    assert want_buckets.keys() == got_buckets.keys()
    for k, (n, hi, lo) in want_buckets.items():
        assert got_buckets[k][0] == n
        for a, b in zip(got_buckets[k][1:], (hi, lo)):
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])
    events = result.rows["event"]
    np.testing.assert_array_equal(small.ctas_of_events(events), whole.ctas_of_events(events))
    tids = set(result.rows["launch_tid"].tolist())
    want_ops = [(s, e, t, n) for part in whole.cpu_ops for s, e, t, n in zip(*(a.tolist() for a in
                                                                              summary.unpack_ops(part)))
                if t in tids]
    got_ops = [op for part in small.cpu_ops for op in zip(*(a.tolist() for a in summary.unpack_ops(part)))]
    assert got_ops == want_ops and want_ops


def test_a_summary_is_a_fraction_of_its_rank(tmp_path):
    """A summary keeps no GPU activity but the compute kernels (about 18
    bytes each), and the CPU ops of the launching threads compressed, in a
    few bytes each; the whole Timeline keeps about 100 bytes per GPU activity and 14
    per CPU op on every thread."""
    truth = generate_fixture.generate(str(tmp_path), ranks=2, steps=6, fill_ops=400)
    rows, timeline = _rank_pair(tmp_path, 2, 0)
    result, small = chain._finish_rank_for_blocking((rows, timeline))
    kernels = len(small.compute_start)
    ops = small.cpu_ops[0]["n"]
    assert kernels > 1000 and ops > 1000
    assert len(pickle.dumps(small)) < 20 * kernels + 8 * ops + 64 * 1024


def test_a_rank_whose_collectives_may_be_linked_out_of_compute_is_kept_whole(tmp_path, monkeypatch):
    """A collective kernel whose name no pattern knows is compute until
    align links it: its rank is kept whole, classified again in the reduce,
    and the sheets are those of whole timelines."""
    truth = generate_fixture.generate(str(tmp_path), ranks=2, steps=3)
    path = tmp_path / truth["files"]["1"]
    doc = json.loads(path.read_text())
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and "nccl" in e.get("name", "").lower():
            e["name"] = "custom_collective_kernel"
    path.write_text(json.dumps(doc))
    kept, compact = {}, summary.compact

    def recording(tl, linked, tids):
        tl = compact(tl, linked, tids)
        kept[tl.rank] = tl.gpu is None
        return tl

    monkeypatch.setattr(summary, "compact", recording)
    got = _summarized(tmp_path, 2)
    assert kept == {0: True, 1: False}
    _assert_same(got, _streamed(tmp_path, truth))
    assert "custom_collective_kernel" not in set(got["collective_overlap"]["top_kernel"].dropna())


@given(st.lists(st.tuples(st.integers(0, 1 << 40), st.integers(0, 1 << 34), st.integers(-(1 << 40), 1 << 40),
                          st.sampled_from([0, 7, 65535, 65536, 0xFFFFFFFF])), max_size=40))
@settings(max_examples=200, deadline=None)
def test_packed_ops_unpack_to_the_same_spans(ops):
    """Narrow columns where the values fit, int64 where they do not: the
    spans come back exactly (steps, durations and threads past int32 too)."""
    ops.sort(key=lambda o: o[0])
    start = np.array([o[0] for o in ops], dtype=np.int64)
    end = start + np.array([o[1] for o in ops], dtype=np.int64)
    tid = np.array([o[2] for o in ops], dtype=np.int64)
    name = np.array([o[3] for o in ops], dtype=np.uint32)
    packed = summary.pack_ops(start, end, tid, name)
    for got in (summary.unpack_ops(packed), summary.unpack_ops(summary._squeeze(packed))):
        for a, b in zip(got, (start, end, tid, name)):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)


def _ops_part(n=10):
    start = np.arange(n, dtype=np.int64) * 1000
    return summary._squeeze(summary.pack_ops(start, start + 500, np.ones(n, np.int64), np.zeros(n, np.uint32)))


def _timeline_value(parts):
    value = {k: None for k in summary._REQUIRED}
    value.update(rank=0, meta={}, cpu_ops=parts)
    return value


def test_a_packed_part_that_inflates_past_its_count_is_refused_before_unpacking():
    """A correlate summary read from a stream may be hostile: a part of host
    ops whose zstd frame declares (and holds) far more than its count and
    column types imply is refused when the summary is read, and unpacking
    it never allocates what the frame declares."""
    import zstandard

    bomb = dict(_ops_part())
    bomb["data"] = zstandard.ZstdCompressor(level=1).compress(bytes(64 << 20))
    with pytest.raises(ValueError, match="declares 67108864 bytes"):
        summary.timeline_from_summary(_timeline_value([bomb]))
    with pytest.raises(ValueError, match="a packed part of host ops"):
        summary.unpack_ops(bomb)
    summary.timeline_from_summary(_timeline_value([_ops_part()]))   # an honest part passes


@pytest.mark.parametrize("change", [{"dtypes": ["|O"] * 4}, {"dtypes": ["<i4"]}, {"n": -1}, {"data": b"not zstd"}])
def test_a_malformed_packed_part_is_a_value_error(change):
    bad = dict(_ops_part(), **change)
    with pytest.raises(ValueError):
        summary.timeline_from_summary(_timeline_value([bad]))

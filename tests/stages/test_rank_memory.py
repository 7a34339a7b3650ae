"""What the per-rank map holds: kernels and launches kept compressed while a
rank is read for the blocking analysis describe the rank exactly as the
plain arrays do, and a job's process-group configs (every rank's trace lists
every group's ranks) are held once, not once per rank, also when results
arrive pickled from worker processes."""
import pickle

import numpy as np
import pytest

import generate_fixture
from pipeline import generate_pipeline
from streamtrace import chain
from streamtrace.align.collect import RankCollector
from streamtrace.align.describe import finish_rank
from streamtrace.correlate.collect import RankTimeline
from streamtrace.extract import extract_rank
from streamtrace.io.ranks import resolve_inputs
from streamtrace.report.nodes import _Nodes
from streamtrace.stream.packing import Squeezed, arrays


def _collected(path, rank, squeeze):
    rows, timeline = RankCollector(rank, squeeze=squeeze), RankTimeline(rank, squeeze=squeeze)
    for frame in extract_rank(path, rank, batch_events=256, drop_flows=True):
        rows.add(frame)
        timeline.add(frame)
    return rows, timeline


def _assert_same_result(a, b):
    assert a.rank == b.rank and a.meta == b.meta and a.events == b.events and a.quality == b.quality
    assert a.rows.keys() == b.rows.keys()
    for k in a.rows:
        np.testing.assert_array_equal(a.rows[k], b.rows[k], err_msg=k)
    assert (a.p2p is None) == (b.p2p is None)
    if a.p2p is not None:
        assert pickle.dumps(a.p2p) == pickle.dumps(b.p2p)


@pytest.mark.parametrize("kind", ["collectives", "pipeline"])
def test_squeezed_rows_describe_the_rank_as_plain_ones(tmp_path, kind):
    """Kernels, launches and CPU ops kept compressed (many frames: small
    batches) give the same RankResult, P2P stage work included, and the same
    CPU op spans; and they are held in a fraction of the bytes."""
    if kind == "pipeline":
        generate_pipeline(str(tmp_path), stages=2, microbatches=4, steps=2)
    else:
        generate_fixture.generate(str(tmp_path), ranks=2, steps=4, fill_ops=200)
    path = str(tmp_path / "rank1_trace.json")
    plain_rows, plain_tl = _collected(path, 1, squeeze=False)
    rows, tl = _collected(path, 1, squeeze=True)
    assert len(rows.kernels) > (3 if kind == "collectives" else 0) and all(isinstance(p, Squeezed) for p in rows.kernels + rows.launches)
    held = sum(len(p.data) for p in rows.kernels + rows.launches)
    assert held < 0.5 * sum(p.nbytes for p in plain_rows.kernels + plain_rows.launches)
    for squeezed, plain in ((rows.kernels, plain_rows.kernels), (rows.launches, plain_rows.launches)):
        for got, want in zip(arrays(squeezed), plain, strict=True):
            np.testing.assert_array_equal(got, want)
    _assert_same_result(finish_rank(rows), finish_rank(plain_rows))
    from streamtrace.correlate.summary import unpack_ops
    got, want = tl.finish(), plain_tl.finish()
    for a, b in zip(got.cpu_ops, want.cpu_ops, strict=True):
        for x, y in zip(unpack_ops(a), unpack_ops(b)):
            np.testing.assert_array_equal(x, y)


def test_an_empty_squeezed_part_is_an_empty_array():
    empty = np.zeros(0, dtype=[("a", "<i8"), ("b", "<u4")])
    assert Squeezed(empty).array().dtype == empty.dtype and len(Squeezed(empty).array()) == 0


def test_a_jobs_process_group_config_is_held_once(tmp_path):
    """Every rank's distributedInfo.pg_config lists all 40 ranks; the ranks'
    results share one text of it, in this process and after a pickle round
    trip (worker processes, Dask), and the blocking summaries keep none."""
    truth = generate_fixture.generate(str(tmp_path), ranks=40, steps=1, fill_ops=0)
    inputs = resolve_inputs(trace_dir=str(tmp_path), world_size=truth["ranks"])
    results = chain.RankReading(inputs, truth["ranks"], jobs=2).results()
    texts = [r.meta["pg_config"] for r in results]
    assert isinstance(texts[0], str) and '"ranks":[0,1,2' in texts[0]
    assert all(t is texts[0] for t in texts)
    arrived = [pickle.loads(pickle.dumps(r)) for r in results]
    assert all(r.meta["pg_config"] is texts[0] for r in arrived)
    result, timeline = chain._summarize_rank_for_blocking((inputs[3], None), truth["ranks"], False)
    assert result.meta["pg_config"] is texts[0]
    assert "distributedInfo" not in timeline.meta["trace"] and timeline.meta["world_size"] == truth["ranks"]


def test_a_config_equal_to_a_recent_one_is_not_encoded_again(monkeypatch):
    """Ranks listing the same pg_config take its text without a JSON
    encoding (O(ranks) per rank); a different config gets its own text, and
    one not seen recently is encoded again, to the same interned text."""
    import json

    from streamtrace.align import describe

    monkeypatch.setattr(describe, "_RECENT_PG_CONFIGS", describe.collections.deque(maxlen=4))
    encoded = []
    real_dumps = json.dumps
    monkeypatch.setattr(describe.json, "dumps", lambda *a, **k: encoded.append(a[0]) or real_dumps(*a, **k))

    def config(n, name="0"):
        return [{"pg_name": name, "pg_size": n, "ranks": list(range(n))}]

    first = describe.pg_config_text(config(64))
    assert [describe.pg_config_text(config(64)) for _ in range(5)] == [first] * 5 and len(encoded) == 1
    assert all(describe.pg_config_text(config(64)) is first for _ in range(3))
    other = describe.pg_config_text(config(64, name="1"))
    assert other != first and '"pg_name":"1"' in other and len(encoded) == 2
    for n in range(1, 5):   # four other configs push the first out
        describe.pg_config_text(config(n))
    assert describe.pg_config_text(config(64)) is first and len(encoded) == 7
    assert describe.pg_config_text({"0": 1}) != describe.pg_config_text([{"0": 1}])


def test_node_spans_read_each_distinct_config_once():
    """The report's node columns parse each distinct pg_config text once and
    keep each group once (a 4,096-rank job repeats its configs 4,096 times)."""
    import pandas as pd

    text = '[{"pg_name":"0","ranks":[0,1,2,3,4,5,6,7]},{"pg_name":"1","ranks":[0,2,4,6]}]'
    other = '[{"pg_name":"1","ranks":[1,3,5,7]}]'
    nodes = _Nodes(4, pd.DataFrame({"pg_config": [text] * 1000 + [other, None, "not json"]}))
    assert nodes.groups == [("0", (0, 1, 2, 3, 4, 5, 6, 7)), ("1", (0, 2, 4, 6)), ("1", (1, 3, 5, 7))]
    assert nodes.span("[0, 1, 2, ...]", "0") == nodes.span("[0, 1, 2, 3, 4, 5, 6, 7]", "0")


def test_readers_that_write_no_stream_count_no_dump_summary(tmp_path):
    """extract counts dump's summary into each rank's META (for streams);
    the reports' readers, which write no stream, skip that pass, and get
    the same frames otherwise."""
    from streamtrace.stream.format import Kind

    truth = generate_fixture.generate(str(tmp_path), ranks=1, steps=2)
    path = str(tmp_path / truth["files"]["0"])
    counted = list(extract_rank(path, 0))
    uncounted = list(extract_rank(path, 0, summarize=False))
    assert counted[-1].kind == uncounted[-1].kind == Kind.META
    summary = counted[-1].json()["summary"]
    assert summary["kernels"] == sum(len(f.records()) for f in counted if f.kind == Kind.KERNELS) > 0
    assert "summary" not in uncounted[-1].json()
    assert [f.payload for f in counted[:-1]] == [f.payload for f in uncounted[:-1]]


def test_a_metadata_frame_made_here_is_read_without_a_dump_and_a_parse(tmp_path):
    """extract's META frame hands its object to readers in this process
    (both collectors of the blocking map share it), and its bytes, when a
    stream is written, decode to the same object."""
    from streamtrace.stream.format import Frame, Kind, json_frame

    truth = generate_fixture.generate(str(tmp_path), ranks=2, steps=1)
    meta_frame = list(extract_rank(str(tmp_path / truth["files"]["1"]), 1))[-1]
    assert meta_frame.kind == Kind.META and meta_frame.json() is meta_frame.json()
    assert Frame(Kind.META, 1, bytes(meta_frame.payload)).json() == meta_frame.json()
    frame = json_frame(Kind.META, 3, {"a": [1, 2.5, None], "b": {"c": "d"}, "n": np.int64(7)})
    assert Frame(Kind.META, 3, frame.payload).json() == {"a": [1, 2.5, None], "b": {"c": "d"}, "n": 7}


def test_gpu_rows_are_held_narrow_and_widened_to_the_kernels_geometry_at_the_ranks_end(tmp_path):
    """While a rank streams past, its GPU rows are held in the trace's own
    widths (69 bytes a row, not 121); at its end every kernel's CTAs,
    threads, registers and shared memory, and its identity's grid and
    block, are those of its KERNELS record (NaN or -1 where it has none)."""
    from streamtrace.stream.format import Kind

    generate_fixture.generate(str(tmp_path), ranks=2, steps=3, fill_ops=50)
    path = str(tmp_path / "rank1_trace.json")
    _, timeline = _collected(path, 1, squeeze=True)
    row = sum(a.dtype.itemsize * int(np.prod(a.shape[1:])) for a in timeline.gpu.cols.values())
    assert row == 69
    geometry = {}
    for frame in extract_rank(path, 1, batch_events=256, drop_flows=True):
        if frame.kind == Kind.KERNELS:
            for k in frame.records():
                geometry[int(k["event"])] = k
    tl = timeline.finish()
    g = tl.gpu
    assert len(g["event"]) and g["event"].dtype == np.int64 and g["name"].dtype == np.int64
    joined = 0
    for i, event in enumerate(g["event"].tolist()):
        dims = tl.lkeys[g["lcode"][i]][1:7]
        k = geometry.get(event)
        if k is None:
            assert (dims == -1).all() and np.isnan([g[c][i] for c in ("ctas", "threads", "regs", "smem")]).all()
            continue
        joined += 1
        np.testing.assert_array_equal(dims, np.r_[k["grid"], k["block"]])
        whole = k["grid"][0] >= 0 and k["block"][0] >= 0
        for c, d in (("ctas", k["grid"]), ("threads", k["block"])):
            want = float(np.prod(d.astype(np.int64))) if whole else np.nan
            np.testing.assert_equal(g[c][i], want)
        for c, v in (("regs", k["registers_per_thread"]), ("smem", k["shared_memory"])):
            np.testing.assert_equal(g[c][i], float(v) if v >= 0 else np.nan)
    assert joined == len(geometry) > 0

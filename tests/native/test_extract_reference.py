"""extract == the pure-Python reference, on every real trace and on fixtures,
whichever way the bytes reach the tokenizer (``reading_backend``)."""
import pytest

from conftest import real_id, real_traces
from helpers import assert_matches_reference, extract_one
from reference import reference_extract


@pytest.mark.parametrize("path", real_traces(), ids=real_id)
def test_real_trace_matches_reference(path, reading_backend):
    data = assert_matches_reference(path)
    doc, _ = reference_extract(path)
    if isinstance(doc, dict):
        for key in ("deviceProperties", "distributedInfo", "baseTimeNanoseconds", "schemaVersion", "traceName"):
            if key in doc:
                assert data.meta["trace"][key] == _plain(doc[key]), key
        assert data.meta["layout"] == "object"
    else:
        assert data.meta["layout"] == "array"


def _plain(v):
    """Decimal -> float, recursively (metadata is parsed with plain json)."""
    import json

    return json.loads(json.dumps(v, default=float))


@pytest.mark.parametrize("path", real_traces()[:1] + [p for p in real_traces() if "tracelens" in p], ids=real_id)
def test_keep_pyfunc_matches_reference(path):
    assert_matches_reference(path, keep_pyfunc=True)


def test_pyfunc_skipped_and_counted(real_dir):
    path = f"{real_dir}/tracelens/resnet_act_checkpoint.json.gz"
    data = extract_one(path)
    assert data.meta["counts"]["pyfunc_skipped"] == 34405
    assert "python_function" not in set(data.events_df()["cat"])


@pytest.fixture(scope="module")
def fixture_sets(tmp_path_factory):
    import generate_fixture

    base = tmp_path_factory.mktemp("fx")
    sets = {}
    for name, opts in {
        "new_json": dict(format="json", layout="new", ranks=2, tp=1, straggler_rank=1, straggler_us=200),
        "new_gz_tp": dict(format="json.gz", layout="new", ranks=4, tp=2, clock_offsets_us="random"),
        "old_zst": dict(format="json.zst", layout="old", ranks=2),
    }.items():
        out = base / name
        truth = generate_fixture.generate(str(out), **opts)
        sets[name] = (out, truth)
    return sets


@pytest.mark.parametrize("name", ["new_json", "new_gz_tp", "old_zst"])
def test_fixture_matches_reference_and_truth(fixture_sets, name, reading_backend):
    out, truth = fixture_sets[name]
    for rank, filename in truth["files"].items():
        path = out / filename
        data = assert_matches_reference(path)
        assert data.rank == int(rank)
        # every written event is seen; python_function ones are counted, not stored
        counts = truth["event_counts"][rank]
        assert data.meta["counts"]["events_seen"] == sum(counts.values())
        pyfunc = sum(n for k, n in counts.items() if k.endswith("/python_function"))
        assert data.meta["counts"]["pyfunc_skipped"] == pyfunc
        assert len(data.events) == sum(counts.values()) - pyfunc
        if truth["layout"] == "new":
            assert data.meta["trace"]["baseTimeNanoseconds"] == truth["base_time_ns"]


def test_fixture_nccl_kernels_have_truth_times(fixture_sets):
    """ts/dur of every NCCL kernel equal the decimal text written (exact ns)."""
    out, truth = fixture_sets["new_gz_tp"]
    from decimal import Decimal

    for rank, filename in truth["files"].items():
        ev = extract_one(out / filename).events_df()
        kernels = ev[(ev["cat"] == "kernel") & ev["name"].str.startswith("nccl")]
        got = sorted(zip(kernels["ts"].astype(int), kernels["dur"].astype(int)))
        want = sorted((int(Decimal(p["ts_us"]) * 1000), int(Decimal(p["dur_us"]) * 1000))
                      for c in truth["collectives"] for r, p in c["per_rank"].items() if r == rank)
        assert got == want


def test_peer_rank_args_match_reference(tmp_path, reading_backend):
    """``Dst Rank`` / ``Src Rank`` (c10d send/recv record_param_comms) are
    kept as int32, -1 when absent, out of int32 or not a number; a record
    with only one of them has the other at -1."""
    import json

    def rpc(i, **args):
        return {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 10 * i,
                "dur": 5, "args": {"Collective name": "send", "Rank": 1, **args}}

    events = [rpc(0, **{"Dst Rank": 3}), rpc(1, **{"Src Rank": 0}), rpc(2), rpc(3, **{"Dst Rank": 2**40}),
              rpc(4, **{"Dst Rank": "5"}), rpc(5, **{"Dst Rank": -7, "Src Rank": 2**31 - 1}),
              rpc(6, **{"Src Rank": 1.0}), rpc(7, **{"Dst Rank": None}),
              {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 90, "dur": 1,
               "args": {"Dst Rank": 4}}]
    path = tmp_path / "rank0_trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    data = assert_matches_reference(str(path))
    assert data.comms["dst_rank"].tolist() == [3, -1, -1, -1, -1, -7, -1, -1, 4]
    assert data.comms["src_rank"].tolist() == [-1, 0, -1, -1, -1, 2**31 - 1, 1, -1, -1]

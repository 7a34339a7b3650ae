"""Process groups of more than 30 ranks, as PyTorch's profiler writes them:
``Process Group Ranks`` and the all_to_allv split lists keep their first 30
entries, then ``...``.  The fixture generator writes them so, and the report
takes the group's size from ``Group size`` and its ranks list as known in part."""
import json
import os

import pytest

import generate_fixture
from streamtrace.chain import generate_collective_report
from streamtrace.collectives import parse_rank_list

WORLD = 40


@pytest.fixture(scope="module")
def job40(tmp_path_factory):
    d = tmp_path_factory.mktemp("ranks40")
    truth = generate_fixture.generate(str(d), ranks=WORLD, steps=1, fill_ops=4, straggler_rank=33, seed=7)
    return str(d), truth


def _comm_args(path):
    """The args of every record_param_comms event with a ``Group size`` (its comm metadata)."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    return [e["args"] for e in events if e.get("name") == "record_param_comms" and "Group size" in e.get("args", {})]


def test_generator_writes_large_groups_lists_as_pytorch_does(job40):
    d, truth = job40
    # PyTorch: the first 30 entries, ", "-joined, then ", ..." inside the brackets
    world = "[" + ", ".join(str(r) for r in range(30)) + ", ...]"
    # (the generator's one-rank setup record aside)
    args = [a for a in _comm_args(os.path.join(d, truth["files"]["0"])) if a["Group size"] != 1]
    assert len(args) == len(truth["collectives"]) and all(a["Group size"] == WORLD for a in args)
    assert {a["Process Group Ranks"] for a in args} == {world}
    a2av = [a for a in args if a["Collective name"] == "all_to_allv"]
    assert a2av, "the fixture has an all_to_allv"
    for a in a2av:
        for key in ("In split size", "Out split size"):
            assert a[key].endswith(", ...]") and a[key].count(",") == 30
    # small groups keep their whole list
    small = generate_fixture._pytorch_list(range(30))
    assert small == "[" + ", ".join(str(r) for r in range(30)) + "]"


def test_truncated_rank_list_parses_as_a_known_prefix():
    ranks, truncated = parse_rank_list(generate_fixture._pytorch_list(range(64)))
    assert ranks == tuple(range(30)) and truncated


def test_report_of_a_40_rank_job_matches_the_truth(job40):
    d, truth = job40
    sheets = generate_collective_report(trace_dir=d, world_size=WORLD, jobs=2)
    implicit = sheets["nccl_implicit_sync"]
    long = sheets["nccl_long"]
    # every collective, every rank: the truncated lists still match the ranks' rows
    assert long["collective_id"].nunique() == len(truth["collectives"])
    assert len(long) == len(truth["collectives"]) * WORLD
    assert set(implicit["Group size"]) == {WORLD}
    assert set(long["rank"]) == set(range(WORLD))
    # the all_to_allv figures need the per-rank nelems, not the (truncated) split lists
    a2av = sheets["nccl_all2allv"]
    (want,) = [c for c in truth["collectives"] if c["collective_name"] == "all_to_allv"]
    expected = want["expected"]
    assert a2av["total data communicated (MB)"].iloc[0] == pytest.approx(expected["total_data_mb"])
    assert a2av["size_imbalance"].iloc[0] == pytest.approx(expected["size_imbalance"])
    # the straggler, and each rank's waiting, as injected
    straggler = sheets["straggler_summary"].set_index("rank")
    assert sheets["straggler_summary"]["rank"].iloc[0] == truth["straggler_summary"]["straggler_rank"]
    for rank, row in truth["straggler_summary"]["rows"].items():
        assert straggler.loc[int(rank), "times_arrived_last"] == row["times_arrived_last"]
        assert straggler.loc[int(rank), "total_wait_time_us"] == pytest.approx(row["total_wait_time_us"], abs=0.2)

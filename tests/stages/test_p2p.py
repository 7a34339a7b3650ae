"""Point-to-point matching and the p2p / p2p_unmatched / pipeline sheets,
checked against the truths fixtures/pipeline.py derives from its simulated
1F1B schedule (an injected slow stage and a slow link)."""
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from pipeline import generate_pipeline
from streamtrace.chain import generate_collective_report
from streamtrace.cli import main

SLOW_STAGE, SLOW_LINK = 2, (0, 1)


def _report(d, ranks=4, **kw):
    return generate_collective_report(trace_dir=str(d), world_size=ranks, write_files=False,
                                      allow_missing_ranks=True, **kw)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    d = tmp_path_factory.mktemp("pp")
    truth = generate_pipeline(str(d), slow_stage=SLOW_STAGE, slow_link=SLOW_LINK)
    return d, truth, _report(d)


@pytest.fixture(scope="module")
def batched(tmp_path_factory):
    d = tmp_path_factory.mktemp("pp_batched")
    truth = generate_pipeline(str(d), slow_stage=SLOW_STAGE, slow_link=SLOW_LINK, batched=True)
    return d, truth, _report(d)


def _close(got, want, rel=0.05):
    return abs(got - want) <= rel * abs(want) + 1e-6


def _links(p2p):
    return {f"{a}->{b}": int(n) for (a, b), n in p2p.groupby(["sender", "receiver"]).size().items()}


@pytest.mark.parametrize("which", ["plain", "batched"])
def test_waits_bubbles_and_peers_per_stage_and_step(which, request):
    _, truth, sheets = request.getfixturevalue(which)
    pipe = sheets["pipeline"].set_index(["rank", "step"])
    assert len(pipe) == len(truth["per_rank_step"])
    for want in truth["per_rank_step"]:
        row = pipe.loc[(want["rank"], want["step"])]
        assert row["stage"] == want["stage"]
        assert _close(row["p2p_wait_us"] * 1000, want["p2p_wait_ns"]), (want, row.to_dict())
        assert _close(row["bubble_us"] * 1000, want["bubble_ns"]), (want, row.to_dict())
        assert row["waited_for"] == want["waited_for"]


@pytest.mark.parametrize("which", ["plain", "batched"])
def test_matched_pairs_per_link_exact_and_nothing_unmatched(which, request):
    _, truth, sheets = request.getfixturevalue(which)
    assert _links(sheets["p2p"]) == truth["matched_pairs_per_link"]
    assert len(sheets["p2p_unmatched"]) == 0
    # stages 1 and 2 send to both neighbours, interleaved in the 1F1B order
    assert {"1->0", "1->2", "2->1", "2->3"} <= set(truth["matched_pairs_per_link"])
    if which == "batched":
        assert sheets["p2p"]["send_batched"].any() and sheets["p2p"]["recv_batched"].any()


def test_slow_stage_bounds_the_pipeline_with_its_extra_time(plain):
    _, truth, sheets = plain
    pipe = sheets["pipeline"]
    bound = pipe[pipe["bounds_pipeline"]]
    assert set(bound["rank"]) == {truth["slow_stage"]["rank"]}
    assert _close(bound["extra_work_us"].iloc[0] * 1000, truth["slow_stage"]["extra_ns_per_step"])


def test_slow_link_bandwidth(plain):
    _, truth, sheets = plain
    p2p = sheets["p2p"]
    a, b = truth["slow_link"]["ranks"]
    slow = p2p[((p2p["sender"] == a) & (p2p["receiver"] == b)) | ((p2p["sender"] == b) & (p2p["receiver"] == a))]
    want_gbps = truth["slow_link"]["bandwidth_bytes_per_s"] / 1e9
    assert _close(slow["bandwidth_GBps"].median(), want_gbps)
    fast = p2p.drop(slow.index)
    assert _close(fast["bandwidth_GBps"].median(), truth["bandwidth_bytes_per_s"] / 1e9)
    # both sides of every pair: sizes, post times, who waited
    assert (p2p["send_bytes"] == truth["bytes_per_transfer"]).all()
    assert (p2p["recv_bytes"] == truth["bytes_per_transfer"]).all()
    assert p2p[["send_post_us", "recv_post_us"]].notna().all().all()
    waited = p2p[p2p["wait_us"] > 0]
    assert set(waited["waiter"]) <= {"sender", "receiver"}
    assert ((waited["waiter"] == "sender") == (waited["waited_for"] == waited["receiver"])).all()


def test_window_starting_mid_pipeline(tmp_path):
    truth = generate_pipeline(str(tmp_path), late_start_rank=1, late_start_ops=7)
    sheets = _report(tmp_path)
    assert _links(sheets["p2p"]) == truth["matched_pairs_per_link"]
    unmatched = sheets["p2p_unmatched"]
    assert (unmatched["kind"] == "send").sum() == truth["unmatched_sends"] > 0
    assert (unmatched["kind"] == "recv").sum() == truth["unmatched_recvs"] > 0
    assert set(unmatched["peer"]) == {1}


def test_missing_rank_lists_its_partners_halves(tmp_path):
    truth = generate_pipeline(str(tmp_path), missing_rank=3)
    sheets = _report(tmp_path)
    assert _links(sheets["p2p"]) == truth["matched_pairs_per_link"]
    unmatched = sheets["p2p_unmatched"]
    sends = unmatched[unmatched["kind"] == "send"]
    assert len(sends) == truth["unmatched_sends"] > 0
    assert (unmatched["rank"] == 2).all() and (unmatched["peer"] == 3).all()
    assert unmatched["reason"].str.contains("rank 3 is not in the input").all()


def test_runs_without_p2p_have_no_p2p_sheets(tmp_path):
    import generate_fixture

    generate_fixture.generate(str(tmp_path), ranks=2, steps=1, seed=3)
    sheets = _report(tmp_path, ranks=2)
    assert not {"p2p", "p2p_unmatched", "pipeline"} & set(sheets)


def test_collective_report_and_stream_chain_write_the_sheets(plain, tmp_path):
    d, truth, sheets = plain
    out = tmp_path / "csvs"
    res = CliRunner().invoke(main, ["collective-report", "--trace_dir", str(d), "--world_size", "4",
                                    "--output_csvs_dir", str(out)])
    assert res.exit_code == 0, res.output
    for name in ("p2p", "p2p_unmatched", "pipeline"):
        assert (out / f"{name}.csv").exists()
    # extract | align | report through real pipes gives the same sheets
    exe = [os.path.join(os.path.dirname(sys.executable), "streamtrace")]
    streamed = tmp_path / "streamed"
    ex = subprocess.Popen(exe + ["extract", "--trace_dir", str(d), "--world_size", "4"], stdout=subprocess.PIPE)
    al = subprocess.Popen(exe + ["align"], stdin=ex.stdout, stdout=subprocess.PIPE)
    ex.stdout.close()
    rp = subprocess.run(exe + ["report", "--output_csvs_dir", str(streamed)], stdin=al.stdout,
                        capture_output=True, text=True)
    al.stdout.close()
    assert ex.wait() == 0 and al.wait() == 0 and rp.returncode == 0, rp.stderr
    for name in ("p2p", "p2p_unmatched", "pipeline"):
        assert (streamed / f"{name}.csv").read_bytes() == (out / f"{name}.csv").read_bytes(), name


def test_fixture_generator_pipeline_mode(tmp_path):
    gen = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "generate_fixture.py")
    r = subprocess.run([sys.executable, gen, "--out", str(tmp_path), "--pipeline", "--ranks", "3", "--steps", "1",
                        "--microbatches", "4", "--slow_stage", "1", "--slow_link", "1,2"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    truth = json.loads((tmp_path / "truth.json").read_text())
    assert truth["mode"] == "pipeline" and truth["stages"] == 3
    assert truth["slow_stage"]["rank"] == 1 and truth["slow_link"]["ranks"] == [1, 2]
    # every forward and backward crosses each link once per microbatch
    assert truth["matched_pairs_per_link"] == {"0->1": 4, "1->0": 4, "1->2": 4, "2->1": 4}
    assert sorted(os.listdir(tmp_path)) == ["rank0_trace.json", "rank1_trace.json", "rank2_trace.json",
                                           "truth.json"]


def test_blockers_names_the_slow_stage_and_link(plain):
    d, truth, _ = plain
    res = CliRunner().invoke(main, ["blockers", str(d)])
    assert res.exit_code == 0, res.output
    confidence, first = res.output.splitlines()[:2]   # the answer's confidence first
    assert confidence.startswith("Confidence: high (4 of 4 ranks; point-to-point transfers only")
    stage = truth["slow_stage"]["stage"]
    assert f"stage {stage} (rank {truth['slow_stage']['rank']}) bounds it" in first
    a, b = truth["slow_link"]["ranks"]
    assert f"Slowest link: ranks {a} <-> {b} at 5.00 GB/s" in res.output
    # the same through a real process
    exe = os.path.join(os.path.dirname(sys.executable), "streamtrace")
    r = subprocess.run([exe, "blockers", str(d)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.splitlines()[1] == first


def test_blocking_analysis_explains_late_halves(plain):
    d, truth, _ = plain
    sheets = _report(d, blocking_analysis=True)
    b = sheets["p2p_blockers"]
    pairs = sheets["p2p"]
    late = pairs[pairs["wait_us"] > 0]
    assert len(b) == len(pairs) and len(late) > 0
    # the late half is the one that started later; the split adds up to its delay
    want = dict(zip("p2p_" + late["pair"].astype(str), late["wait_us"]))
    got = b.set_index("collective_id")
    for cid, wait in want.items():
        row = got.loc[cid]
        assert _close(row["delta_us"], wait)
        parts = row["host_launch_lateness_us"] + row["gpu_dependency_wait_us"] + row["gpu_backlog_us"]
        assert _close(parts, row["delta_us"])


def test_peer_from_the_rank_arg_or_a_two_rank_group():
    from streamtrace._native import NONE
    from streamtrace.align.p2p import _global_peer

    # PyTorch's "Rank" on send/recv is the peer's rank in the op's group
    assert _global_peer(1, "[4, 6]", 4) == 6
    assert _global_peer(2, None, 0) == 2            # no ranks listed: the default group
    assert _global_peer(NONE, "[4, 6]", 4) == 6     # no Rank arg: the other rank of a pair's group
    assert _global_peer(NONE, "[4, 6, 7]", 4) == -1


def test_pipeline_times_data_parallel_replicas(tmp_path):
    truth = generate_pipeline(str(tmp_path), stages=3, microbatches=4, steps=1, slow_stage=1, dp=2)
    sheets = _report(tmp_path, ranks=6)
    assert _links(sheets["p2p"]) == truth["matched_pairs_per_link"]
    pipe = sheets["pipeline"].set_index(["rank", "step"])
    for want in truth["per_rank_step"]:
        row = pipe.loc[(want["rank"], want["step"])]
        assert (row["pipeline"], row["stage"]) == (want["pipeline"], want["stage"])
        assert _close(row["p2p_wait_us"] * 1000, want["p2p_wait_ns"])
        assert _close(row["bubble_us"] * 1000, want["bubble_ns"])
    bound = sheets["pipeline"][sheets["pipeline"]["bounds_pipeline"]]
    assert sorted(set(bound["rank"])) == truth["slow_stage"]["ranks"]


# ------------------------------------------------ send/recv rows are not collectives (issue 28 follow-up)
#: findings that only a cross-rank match of collective instances produces:
#: none may come from point-to-point kernels
_MATCH_FINDINGS = {"seq_contradictory", "sequence_aligned", "unmatched", "partial_instances", "metadata_mismatch",
                   "unknown_kind", "duplicate_seq"}


@pytest.mark.parametrize("which", ["plain", "batched"])
def test_p2p_kernels_are_not_matched_as_collectives(which, request):
    _, truth, sheets = request.getfixturevalue(which)
    assert not _MATCH_FINDINGS & set(sheets["data_quality"]["category"])
    long = sheets["nccl_long"]
    # every point-to-point kernel stays listed, each an instance of its own
    # (a send and a recv are paired by the p2p sheet, never by align)
    assert set(long["match_method"]) == {"p2p"}
    assert long["instance"].is_unique
    assert (long["Process Group Name"].astype(str) == "0").all()
    assert not long["flags"].fillna("").str.contains("unmatched|aligned|mismatch").any()
    for sheet in ("nccl_implicit_sync", "nccl_summary_implicit_sync"):
        assert not len(sheets[sheet])
    halves = 2 * sum(truth["matched_pairs_per_link"].values())
    if which == "plain":   # one kernel per half
        assert len(long) == halves
    else:                  # a batched kernel carries a send and a recv
        assert len(long) < halves


@pytest.mark.parametrize("which", ["plain", "batched"])
def test_blockers_on_a_pipeline_has_no_collective_straggler(which, request):
    d, truth, _ = request.getfixturevalue(which)
    res = CliRunner().invoke(main, ["blockers", str(d)])
    assert res.exit_code == 0, res.output
    stage, (a, b) = truth["slow_stage"], truth["slow_link"]["ranks"]
    assert f"stage {stage['stage']} (rank {stage['rank']}) bounds it" in res.output.splitlines()[1]
    assert f"Slowest link: ranks {a} <-> {b}" in res.output
    assert "Straggler" not in res.output and "Dominant cause of waiting" not in res.output
    blocked = _report(d, blocking_analysis=True)
    assert not len(blocked["collective_blockers"]) and len(blocked["p2p_blockers"]) == len(blocked["p2p"])
    exe = os.path.join(os.path.dirname(sys.executable), "streamtrace")
    r = subprocess.run([exe, "blockers", str(d)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == res.output.strip()


# ------------------------------------------------ hostile point-to-point input (issue #40 items 6 and 10)
def _write_p2p_rank(path, rank, world, halves, compute=0, pg_ranks=None):
    """A rank's trace with one ProfilerStep and ``halves``: dicts of ``kind``
    (send/recv), ``peer`` (the Rank arg), optional ``kernel`` (default True:
    its SendRecv kernel, 10 us), ``t`` (us; default: 30 us apart); then
    ``compute`` GEMM kernels of 100 us on stream 7 (stage work)."""
    pg_ranks = list(range(world)) if pg_ranks is None else pg_ranks
    pid, ev, corr = 100 + rank, [], 0
    end = 40 + 30 * len(halves) + 200 * compute + 100
    ev.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": pid, "tid": pid, "ts": 1,
               "dur": end, "args": {}})
    for i, h in enumerate(halves):
        t = h.get("t", 10 + 30 * i)
        corr += 1
        args = {"External id": corr, "Collective name": h["kind"], "dtype": "Float", "In msg nelems": 256,
                "Out msg nelems": 256, "Group size": len(pg_ranks), "Process Group Name": "0",
                "Process Group Ranks": json.dumps(pg_ranks), "Rank": h["peer"],
                "Dst Rank" if h["kind"] == "send" else "Src Rank": h.get("global", h["peer"]), "Seq": i + 1}
        ev.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": pid, "tid": pid, "ts": t,
                   "dur": 8, "args": args})
        if h.get("kernel", True):
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": pid,
                       "ts": t + 1, "dur": 4, "args": {"External id": corr, "correlation": corr}})
            ev.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv", "pid": 0, "tid": 20,
                       "ts": t + 5, "dur": 10, "args": {"External id": corr, "correlation": corr, "stream": 20,
                                                        "device": rank}})
    for j in range(compute):
        corr += 1
        t = 40 + 30 * len(halves) + 200 * j
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": pid, "ts": t, "dur": 5,
                   "args": {"External id": corr}})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": pid,
                   "ts": t + 1, "dur": 4, "args": {"External id": corr, "correlation": corr}})
        ev.append({"ph": "X", "cat": "kernel", "name": "sm90_gemm", "pid": 0, "tid": 7, "ts": t + 5, "dur": 100,
                   "args": {"External id": corr, "correlation": corr, "stream": 7, "device": rank}})
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
           "traceEvents": ev}
    with open(path, "w") as fh:
        json.dump(doc, fh)


def _quality(sheets, category):
    dq = sheets["data_quality"]
    return dq[dq["category"] == category]


def test_self_send_is_a_data_quality_row_not_a_pair(tmp_path):
    _write_p2p_rank(tmp_path / "rank0_trace.json", 0, 2, [{"kind": "send", "peer": 0}, {"kind": "recv", "peer": 0}])
    _write_p2p_rank(tmp_path / "rank1_trace.json", 1, 2, [])
    sheets = _report(tmp_path, ranks=2)
    assert len(sheets["p2p"]) == 0
    un = sheets["p2p_unmatched"]
    assert len(un) == 2 and (un["rank"] == 0).all() and un["reason"].str.contains("itself").all()
    row = _quality(sheets, "p2p_self_peer")
    assert len(row) == 1 and int(row["rank"].iloc[0]) == 0 and int(row["count"].iloc[0]) == 2


@pytest.mark.parametrize("peer", [999, 2**40])
def test_peer_outside_the_world_is_a_data_quality_row(tmp_path, peer):
    _write_p2p_rank(tmp_path / "rank0_trace.json", 0, 2,
                    [{"kind": "send", "peer": peer}, {"kind": "send", "peer": 1}])
    _write_p2p_rank(tmp_path / "rank1_trace.json", 1, 2, [{"kind": "recv", "peer": 0}])
    sheets = _report(tmp_path, ranks=2)
    assert len(sheets["p2p"]) == 1
    un = sheets["p2p_unmatched"]
    assert len(un) == 1 and un["reason"].str.contains("outside the world").all(), un["reason"].tolist()
    row = _quality(sheets, "p2p_peer_out_of_range")
    assert len(row) == 1 and int(row["count"].iloc[0]) == 1 and str(peer) in row["message"].iloc[0]
    # the bogus peer is no stage of the pipeline
    assert set(sheets["pipeline"]["rank"]) == {0, 1} and (sheets["pipeline"]["stage"] >= 0).all()
    assert sheets["pipeline"]["stage"].max() == 1


def test_rank_arg_disagreeing_with_dst_or_src_rank_is_a_data_quality_row(tmp_path):
    """PyTorch writes the peer twice on c10d send/recv: ``Rank`` (its rank in
    the group) and ``Dst Rank``/``Src Rank`` (global).  Ops where the two
    disagree are one data_quality row per rank, through a real process and
    through a stream (extract, report); the pairing by Rank is unchanged."""
    import pandas as pd

    # group [4, 6] of a world of 8: Rank 1 is global rank 6, Rank 0 is 4
    _write_p2p_rank(tmp_path / "rank4_trace.json", 4, 8,
                    [{"kind": "send", "peer": 1, "global": 6}, {"kind": "send", "peer": 1, "global": 5},
                     {"kind": "send", "peer": 1, "global": 1}], pg_ranks=[4, 6])
    _write_p2p_rank(tmp_path / "rank6_trace.json", 6, 8,
                    [{"kind": "recv", "peer": 0, "global": 4}, {"kind": "recv", "peer": 0, "global": 4},
                     {"kind": "recv", "peer": 0, "global": 0}], pg_ranks=[4, 6])
    exe = os.path.join(os.path.dirname(sys.executable), "streamtrace")
    out = tmp_path / "out"
    r = subprocess.run([exe, "collective-report", "--trace_dir", str(tmp_path), "--world_size", "8",
                        "--allow_missing_ranks", "--output_csvs_dir", str(out), "-q"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert len(pd.read_csv(out / "p2p.csv")) == 3   # paired by Rank, as before
    stream = tmp_path / "run.stev"
    r = subprocess.run([exe, "extract", str(tmp_path / "rank4_trace.json"), str(tmp_path / "rank6_trace.json"),
                        "--world_size", "8", "-o", str(stream), "-q"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([exe, "report", str(stream), "--output_csvs_dir", str(tmp_path / "via_stream"), "-q"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for where in (out, tmp_path / "via_stream"):
        dq = pd.read_csv(where / "data_quality.csv")
        rows = dq[dq["category"] == "p2p_rank_disagrees"].set_index("rank")
        assert sorted(rows.index) == [4, 6], dq
        assert int(rows.loc[4, "count"]) == 2 and int(rows.loc[6, "count"]) == 1
        assert "Seq 2, Rank gives rank 6, Dst/Src Rank 5" in rows.loc[4, "message"], rows.loc[4, "message"]
        assert "Seq 3, Rank gives rank 4, Dst/Src Rank 0" in rows.loc[6, "message"]
        assert (rows["severity"] == "warning").all()


def test_rank_args_that_agree_give_no_row(tmp_path):
    _write_p2p_rank(tmp_path / "rank0_trace.json", 0, 2, [{"kind": "send", "peer": 1}] * 2)
    _write_p2p_rank(tmp_path / "rank1_trace.json", 1, 2, [{"kind": "recv", "peer": 0}] * 2)
    sheets = _report(tmp_path, ranks=2)
    assert len(sheets["p2p"]) == 2 and _quality(sheets, "p2p_rank_disagrees").empty


def test_no_pair_matched_names_no_bounding_stage(tmp_path):
    """Two ranks that only send (no receive anywhere): nothing bounds
    anything on this evidence, and blockers says so instead of naming a stage."""
    _write_p2p_rank(tmp_path / "rank0_trace.json", 0, 2, [{"kind": "send", "peer": 1}] * 3, compute=2)
    _write_p2p_rank(tmp_path / "rank1_trace.json", 1, 2, [{"kind": "send", "peer": 0}] * 3, compute=4)
    sheets = _report(tmp_path, ranks=2)
    assert len(sheets["p2p"]) == 0 and len(sheets["p2p_unmatched"]) == 6
    assert not sheets["pipeline"]["bounds_pipeline"].any()
    exe = os.path.join(os.path.dirname(sys.executable), "streamtrace")
    r = subprocess.run([exe, "blockers", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "bounds" not in r.stdout and "no send/recv pair was matched" in r.stdout, r.stdout


def test_halves_without_kernels_are_listed_with_a_reason(tmp_path):
    """Send/recv ops whose kernels are missing (no collective kernel in the
    whole run): listed in p2p_unmatched, never dropped."""
    _write_p2p_rank(tmp_path / "rank0_trace.json", 0, 2, [{"kind": "send", "peer": 1, "kernel": False}] * 2)
    _write_p2p_rank(tmp_path / "rank1_trace.json", 1, 2, [{"kind": "recv", "peer": 0, "kernel": False}] * 2)
    sheets = _report(tmp_path, ranks=2)
    assert len(sheets["p2p"]) == 0
    un = sheets["p2p_unmatched"]
    assert sorted(un["rank"]) == [0, 0, 1, 1] and un["reason"].str.contains("no GPU kernel").all(), un
    assert un["start_us"].isna().all()
    exe = os.path.join(os.path.dirname(sys.executable), "streamtrace")
    r = subprocess.run([exe, "collective-report", "--trace_dir", str(tmp_path), "--world_size", "2",
                        "--output_csvs_dir", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "only the point-to-point sheets have rows" in r.stderr and "the report is empty" not in r.stderr
    assert len((tmp_path / "out" / "p2p_unmatched.csv").read_text().splitlines()) == 5


def test_a_pair_with_one_kernel_missing_is_listed_not_timed(tmp_path):
    _write_p2p_rank(tmp_path / "rank0_trace.json", 0, 2, [{"kind": "send", "peer": 1},
                                                          {"kind": "send", "peer": 1, "kernel": False}])
    _write_p2p_rank(tmp_path / "rank1_trace.json", 1, 2, [{"kind": "recv", "peer": 0}, {"kind": "recv", "peer": 0}])
    sheets = _report(tmp_path, ranks=2)
    assert len(sheets["p2p"]) == 1
    un = sheets["p2p_unmatched"].set_index("rank")
    assert "no GPU kernel" in un.loc[0, "reason"]
    assert "rank 0" in un.loc[1, "reason"] and "no GPU kernel" in un.loc[1, "reason"]


def _write_many(path, n, name="send", kernels=True):
    """Rank 0 of 2 posting ``n`` ops of Collective name ``name`` to rank 1,
    each with its kernel (written as it goes: the file, not a list of dicts)."""
    with open(path, "w") as fh:
        fh.write('{"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2}, '
                 '"traceEvents": [\n')
        for i in range(n):
            t = 10 + 20 * i
            fh.write(("" if i == 0 else ",\n")
                     + f'{{"ph":"X","cat":"cpu_op","name":"record_param_comms","pid":1,"tid":1,"ts":{t},"dur":8,'
                       f'"args":{{"External id":{i + 1},"Collective name":"{name}","dtype":"Float",'
                       f'"In msg nelems":1024,"Out msg nelems":1024,"Group size":2,"Process Group Name":"0",'
                       f'"Process Group Ranks":"[0, 1]","Rank":1,"Dst Rank":1,"Seq":{i + 1}}}}}')
            if kernels:
                fh.write(f',\n{{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":1,"ts":{t + 1},'
                         f'"dur":4,"args":{{"External id":{i + 1},"correlation":{i + 1}}}}},\n'
                         f'{{"ph":"X","cat":"kernel","name":"ncclDevKernel_SendRecv","pid":0,"tid":20,"ts":{t + 5},'
                         f'"dur":10,"args":{{"External id":{i + 1},"correlation":{i + 1},"stream":20,"device":0}}}}')
        fh.write("\n]}\n")


def _collective_report(d, out, env=None):
    exe = os.path.join(os.path.dirname(sys.executable), "streamtrace")
    return subprocess.run([exe, "collective-report", "--trace_dir", str(d), "--world_size", "2",
                           "--allow_missing_ranks", "--output_csvs_dir", str(out), "-q"],
                          capture_output=True, text=True, timeout=300, env=env)


def test_unmatched_rows_are_capped_and_the_rest_counted(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    _write_many(d / "rank0_trace.json", 50)
    env = dict(os.environ, STREAMTRACE_P2P_UNMATCHED_ROWS="10")
    r = _collective_report(d, tmp_path / "out", env)
    assert r.returncode == 0, r.stderr
    import pandas as pd

    un = pd.read_csv(tmp_path / "out" / "p2p_unmatched.csv")
    assert len(un) == 10 and list(un["seq"]) == list(range(1, 11))   # the first ten posted
    dq = pd.read_csv(tmp_path / "out" / "data_quality.csv")
    row = dq[dq["category"] == "p2p_unmatched_capped"]
    assert len(row) == 1 and int(row["count"].iloc[0]) == 40
    assert "10 of the 50" in row["message"].iloc[0] and "rank 1 is not in the input: 50" in row["message"].iloc[0]
    # without the variable: the default cap, far above 50
    r = _collective_report(d, tmp_path / "all")
    assert r.returncode == 0 and len(pd.read_csv(tmp_path / "all" / "p2p_unmatched.csv")) == 50
    # a bad setting: one line, exit 1, nothing written
    for bad in ("-1", "many"):
        r = _collective_report(d, tmp_path / f"bad{bad}", dict(os.environ, STREAMTRACE_P2P_UNMATCHED_ROWS=bad))
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "STREAMTRACE_P2P_UNMATCHED_ROWS" in r.stderr and not (tmp_path / f"bad{bad}").exists()


def _peak_rss_mb(argv, env=None):
    """Peak RSS (MB) of ``argv`` run as the only child of a small parent."""
    script = ("import resource, subprocess, sys\n"
              "p = subprocess.run(sys.argv[1:], capture_output=True)\n"
              "sys.stderr.buffer.write(p.stderr)\n"
              "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)\n")
    proc = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, env=env,
                          timeout=600)
    code, rss = proc.stdout.split()
    return int(code), int(rss), proc.stderr


def test_unmatched_halves_cost_little_beyond_their_kernels(tmp_path):
    """200,000 sends with no receiver against the same trace of allreduces:
    what the point-to-point halves add (matching, tables, sheets) stays under
    150 bytes a half (it was ~460: whole records copied, a Python object per
    half, every unmatched row written)."""
    n = 200_000
    exe = os.path.join(os.path.dirname(sys.executable), "streamtrace")
    rss = {}
    for name in ("send", "allreduce"):
        d = tmp_path / name
        d.mkdir()
        _write_many(d / "rank0_trace.json", n, name)
        code, rss[name], err = _peak_rss_mb([exe, "collective-report", "--trace_dir", str(d), "--world_size", "2",
                                             "--allow_missing_ranks", "--output_csvs_dir", str(tmp_path / f"o{name}"),
                                             "-q", "-j", "1"])
        assert code == 0, err
    extra = (rss["send"] - rss["allreduce"]) * 2**20 / n
    assert extra < 150, (rss, extra)


def test_halves_with_kernels_peak_in_proportion(tmp_path):
    """300,000 sends with their kernels and no receiver (every half is also
    a collective kernel row, through align's tables and the report): the
    peak RSS of collective-report beyond that of 1,000 sends stays under
    1.5 KB a half (it was ~1.8 KB: whole comm records gathered four times
    per row, the rows and the halves copied when one rank held them all,
    every column of align.collectives copied to put rows in the order they
    were already in, the heap's freed pages kept resident under the report)."""
    exe = os.path.join(os.path.dirname(sys.executable), "streamtrace")
    rss = {}
    for n in (1_000, 300_000):
        d = tmp_path / f"s{n}"
        d.mkdir()
        _write_many(d / "rank0_trace.json", n)
        code, rss[n], err = _peak_rss_mb([exe, "collective-report", "--trace_dir", str(d), "--world_size", "2",
                                          "--allow_missing_ranks", "--output_csvs_dir", str(tmp_path / f"o{n}"),
                                          "-q"])
        assert code == 0, err
    per_half = (rss[300_000] - rss[1_000]) * 2**20 / 299_000
    assert per_half < 1536, (rss, per_half)


def test_a_long_link_is_lined_up_in_proportionate_time():
    """One link of 400,000 transfers whose kernel ends never agree exactly:
    every shift up to MAX_SHIFT is tried, each on a bounded sample (a median
    over every pair per shift took ~12 s here, 30 s at a million)."""
    import time

    import numpy as np

    from streamtrace.align.p2p_match import _best_shift

    n = 400_000
    rng = np.random.default_rng(0)
    ends = np.cumsum(rng.integers(1_000, 100_000, n))
    noisy = ends + rng.integers(-40_000, 40_000, n)
    nbytes = np.full(n, 4096.0)
    t0 = time.perf_counter()
    assert _best_shift(ends, noisy, nbytes, nbytes) == 0
    assert time.perf_counter() - t0 < 3.0
    # the receiver's window starts 5 transfers late: found on the sample too
    late = noisy[5:]
    assert _best_shift(ends, late, nbytes, nbytes[5:]) == -5

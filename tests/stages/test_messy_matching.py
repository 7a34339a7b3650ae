"""Matching on messy runs (issue #41 items 0 and 4): partial samples of the
same collectives, windows that cover different steps, ranks sampled from a
larger world.  Every case is a fixture with known true pairs
(truth.json's ``messy``)."""
import io
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import generate_fixture
from streamtrace import extract, resolve_inputs
from streamtrace.align.sequences import vote_pairs
from streamtrace.align.stage import align_frames
from streamtrace.steps import STEPS_TABLE, clock_step_findings
from streamtrace.stream.format import Kind, iter_frames

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")


def _gen(tmp_path_factory, name, **options):
    d = tmp_path_factory.mktemp(name)
    return str(d), generate_fixture.generate(str(d), **options)


def _align(trace_dir, summaries=False, **kw):
    """The align tables of a fixture, through extract | align (without
    summaries: align collects the ranks itself, step markers included)."""
    buf = io.BytesIO()
    extract(resolve_inputs(trace_dir=trace_dir, allow_missing_ranks=True), buf, summaries=summaries)
    buf.seek(0)
    tables = {}
    for f in align_frames(iter_frames(buf), **kw):
        if f.kind == Kind.TABLE:
            name, df = f.table()
            tables[name] = df
    return tables


def _collective_of(truth):
    """(rank, written start ns) -> index of the truth collective."""
    return {(int(r), int(p["written_start_ns"])): col["index"]
            for col in truth["collectives"] for r, p in col["per_rank"].items()}


def _pairing(c, truth):
    """{instance: sorted [(rank, truth collective index)]} of align.collectives."""
    who = _collective_of(truth)
    out = {}
    for r, ts, base, inst in zip(c["rank"], c["ts_ns"], c["base_ns"], c["instance"]):
        key = (int(r), int(ts)) if (int(r), int(ts)) in who else (int(r), int(ts) + int(base))
        out.setdefault(int(inst), []).append((int(r), who[key]))
    return {k: sorted(v) for k, v in out.items()}


def assert_true_pairs(c, truth):
    """Every true pair is one instance holding exactly its ranks, and no
    instance holds two different collectives."""
    pairing = _pairing(c, truth)
    for inst, members in pairing.items():
        assert len({idx for _, idx in members}) == 1, f"instance {inst} pairs different collectives: {members}"
    by_index = {}
    for inst, members in pairing.items():
        by_index.setdefault(members[0][1], []).append(sorted(r for r, _ in members))
    for pair in truth["messy"]["pairs"]:
        assert by_index.get(pair["index"]) == [pair["ranks"]], (pair, by_index.get(pair["index"]))


def _offsets(tables):
    clocks = tables["align.clocks"].set_index("rank")
    return {int(r): int(v) for r, v in clocks["offset_ns"].items()}


# ---------------------------------------------------------------------- issue #41's pair


@pytest.fixture(scope="module")
def issue41(tmp_path_factory):
    return _gen(tmp_path_factory, "issue41", **generate_fixture.ISSUE41_SHAPE)


@pytest.mark.parametrize("summaries", [False, True], ids=["steps", "summaries"])
def test_issue41_shape_recovers_the_true_pairs_at_zero_offset(issue41, summaries):
    """Two of 128 ranks, old layout, two steps, each rank a different sample:
    the five true pairs, not same-kind collectives of the other step, and no
    clock offset.  With summaries the step markers come in each rank's
    summary (test_issue41_shape_without_step_markers: the vote alone)."""
    d, truth = issue41
    assert len(truth["messy"]["pairs"]) == 5
    tables = _align(d, summaries=summaries)
    assert_true_pairs(tables["align.collectives"], truth)
    assert all(abs(o) < 50_000 for o in _offsets(tables).values()), _offsets(tables)
    q = tables["align.quality"]
    assert not q["category"].isin(["clock_offsets_change_results", "clock_offsets_unreliable"]).any(), \
        q["message"].tolist()


def _strip_step_markers(src, dst):
    """A copy of a fixture without its ProfilerStep annotations."""
    os.makedirs(dst)
    for name in os.listdir(src):
        text = open(os.path.join(src, name)).read()
        if name != "truth.json":
            doc = json.loads(text)
            doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
            text = json.dumps(doc)
        with open(os.path.join(dst, name), "w") as fh:
            fh.write(text)


def test_issue41_shape_without_step_markers(issue41, tmp_path):
    d, truth = issue41
    bare = str(tmp_path / "bare")
    _strip_step_markers(d, bare)
    tables = _align(bare)
    assert STEPS_TABLE not in tables
    assert_true_pairs(tables["align.collectives"], truth)
    assert all(abs(o) < 50_000 for o in _offsets(tables).values())


def test_issue41_shape_collective_report_says_no_clock_disagreement(issue41, tmp_path):
    """Through the command a user runs: no 'CLOCKS DISAGREE' advice, no clock offset finding."""
    d, _ = issue41
    out = tmp_path / "csvs"
    proc = subprocess.run([BIN, "collective-report", "--trace_dir", d,
                           "--world_size", "128", "--allow_missing_ranks", "--output_csvs_dir", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "CLOCKS DISAGREE" not in proc.stderr and "CLOCK OFFSETS UNRELIABLE" not in proc.stderr
    quality = (out / "data_quality.csv").read_text()
    assert "clock_offset" not in quality and "appears offset" not in quality


# ---------------------------------------------------------------------- true offsets are still found


@pytest.mark.parametrize("markers", [True, False], ids=["steps", "no_steps"])
@pytest.mark.parametrize("offset_us", [10, 1_000, 100_000, 1_000_000])
def test_true_clock_offset_recovered_from_partial_samples(tmp_path_factory, tmp_path, offset_us, markers):
    """A real clock offset (10 us to 1 s) of ranks 1 and 3, each rank a
    different 80 % sample of three steps (old layout: no Seq): the offsets
    and the true pairs, with the step markers and without them."""
    d, truth = _gen(tmp_path_factory, f"off{offset_us}", ranks=4, steps=3, layout="old", fill_ops=12, seed=7,
                    sample_fraction=0.8, clock_offsets_us=[0, offset_us, 0, offset_us])
    if not markers:
        _strip_step_markers(d, str(tmp_path / "bare"))
        d = str(tmp_path / "bare")
    tables = _align(d)
    assert_true_pairs(tables["align.collectives"], truth)
    off = _offsets(tables)
    for r, true in truth["clock_offsets_ns"].items():
        assert abs((off[int(r)] - off[0]) - true) <= 2_000, (r, off, true)
    # the steps start as far apart as the clocks are: no contradiction
    assert "clock_offset_steps_disagree" not in set(tables["align.quality"]["category"])


def test_step_starts_contradicting_an_offset_are_a_finding():
    """Issue #41's wrong estimate: 617 ms from 4 pairs, while the two ranks'
    steps start 0.2 ms apart on the clocks as recorded."""
    import pandas as pd

    clocks = pd.DataFrame({"rank": [0, 1], "offset_ns": [0, 617_000_000], "reference_rank": [0, 0],
                           "collectives": [4, 4]})
    step_ns = 600_000_000
    per_rank = [(r, np.array([7, 8]), np.array([0, step_ns]) + 200_000 * r, np.array([step_ns, 2 * step_ns]))
                for r in (0, 1)]
    found = clock_step_findings(clocks, per_rank, {0: 0, 1: 0})
    assert [f["rank"] for f in found] == [1] and found[0]["category"] == "clock_offset_steps_disagree"
    assert "617000.0 us" in found[0]["message"] and "start 200.0 us" in found[0]["message"]
    clocks.loc[1, "offset_ns"] = 150_000   # within the steps' agreement: no finding
    assert clock_step_findings(clocks, per_rank, {0: 0, 1: 0}) == []


def test_a_straggler_late_into_its_steps_is_no_clock_contradiction(tmp_path_factory):
    """Rank 2 starts every step 5 ms late (its steps end with the others'): clocks equal, no finding."""
    d, truth = _gen(tmp_path_factory, "late", ranks=4, steps=3, layout="old", fill_ops=12, seed=4,
                    straggler_rank=2, straggler_us=5000, sample_fraction=0.9)
    tables = _align(d)
    assert_true_pairs(tables["align.collectives"], truth)
    assert "clock_offset_steps_disagree" not in set(tables["align.quality"]["category"])


def test_vote_prefers_the_offset_most_pairs_agree_on():
    """Four pairs agree on 617 ms, five on 0: zero wins; with six at 617 ms, 617 ms wins."""
    step = 617_000_000
    c_sig = np.array([1, 2, 3, 4, 5, 1, 2, 3, 4, 5])
    c_end = np.array([0, 10, 20, 30, 40, step, step + 10, step + 20, step + 30, step + 40]) * 1 + 10**12
    c_end = c_end + np.arange(10) * 1_000_000
    s_idx = np.array([5, 6, 7, 8, 9])   # S holds the second step's collectives, clocks equal
    si, ci, d, _ = vote_pairs(c_sig[s_idx], c_end[s_idx] + 300, c_sig, c_end)
    assert (ci == s_idx[si]).all() and len(si) == 5 and abs(d - 300) < 1


# ---------------------------------------------------------------------- windows that cover different steps


@pytest.fixture(scope="module")
def shifted(tmp_path_factory):
    """Old layout, identical steps: ranks 1 and 3 start one whole step later."""
    return _gen(tmp_path_factory, "shifted", ranks=4, steps=2, layout="old", fill_ops=12, seed=11,
                window_shift_steps=[0, 1, 0, 1])


def test_shifted_windows_pair_only_within_a_step(shifted):
    d, truth = shifted
    assert truth["messy"]["left_out_steps"] == [12, 14]
    tables = _align(d)
    assert_true_pairs(tables["align.collectives"], truth)
    assert all(abs(o) < 50_000 for o in _offsets(tables).values())
    steps = tables[STEPS_TABLE]
    assert sorted(set(steps.loc[~steps["shared"], "step"])) == truth["messy"]["left_out_steps"]
    assert sorted(set(steps.loc[steps["shared"], "step"])) == truth["messy"]["shared_steps"]
    q = tables["align.quality"]
    row = q[q["category"] == "steps_not_shared"]
    assert len(row) == 1 and int(row["count"].iloc[0]) == 2
    assert "#12 (only ranks 0, 2)" in row["message"].iloc[0] and "#14 (only ranks 1, 3)" in row["message"].iloc[0]


def test_shifted_windows_through_collective_report(shifted, tmp_path):
    """The one-shot path (its own step collection): the steps left out are a data_quality row."""
    d, _ = shifted
    out = tmp_path / "csvs"
    proc = subprocess.run([BIN, "collective-report", "--trace_dir", d, "--world_size", "4",
                           "--output_csvs_dir", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    quality = (out / "data_quality.csv").read_text()
    assert "steps_not_shared" in quality and re.search(r"2 step\(s\) left out", quality)
    assert "CLOCKS DISAGREE" not in proc.stderr and "CLOCK OFFSETS UNRELIABLE" not in proc.stderr


def test_windows_without_a_shared_step_pair_nothing(tmp_path_factory):
    """Rank 0 holds step 12 only, rank 1 step 13 only: the same collectives in
    the same order, so a plain ordinal match would pair them all across the
    steps and read the step's length as a clock offset."""
    d, truth = _gen(tmp_path_factory, "disjoint", ranks=2, steps=1, layout="old", fill_ops=12, seed=5,
                    window_shift_steps=[0, 1])
    assert truth["messy"]["pairs"] == [] and truth["messy"]["shared_steps"] == []
    tables = _align(d)
    c = tables["align.collectives"]
    assert (c["participants"] == 1).all()
    assert all(o == 0 for o in _offsets(tables).values())
    q = tables["align.quality"]
    assert "they share no step" in q.loc[q["category"] == "steps_not_shared", "message"].iloc[0]


def test_clean_run_has_every_step_shared(tmp_path_factory):
    d, truth = _gen(tmp_path_factory, "clean", ranks=4, steps=2, layout="old", fill_ops=12, seed=11)
    tables = _align(d)
    assert tables[STEPS_TABLE]["shared"].all()
    assert "steps_not_shared" not in set(tables["align.quality"]["category"])


# ---------------------------------------------------------------------- thin evidence still answers


@pytest.mark.parametrize("mode", [dict(max_collectives=1), dict(no_collectives_rank=2),
                                  dict(present_ranks=[0, 3, 5], ranks=8), dict(truncate_rank=1)],
                         ids=["too_few", "no_collectives", "sampled_world", "truncated"])
def test_messy_modes_still_align(tmp_path_factory, mode):
    options = dict(ranks=4, steps=2, layout="old", fill_ops=12, seed=2, sample_fraction=0.9)
    options.update(mode)
    d, truth = _gen(tmp_path_factory, "mode", **options)
    tables = _align(d)
    c = tables["align.collectives"]
    if "truncate_rank" not in mode:
        assert_true_pairs(c, truth)
    assert sorted(tables["align.ranks"]["rank"]) == truth["messy"]["present_ranks"]

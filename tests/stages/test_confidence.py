"""The confidence model (streamtrace.confidence): its level and reasons on
fixtures with injected problems, the clock rule applying or refusing the
offsets as docs/confidence.md says, ties said as ties, and a clean run
"high" with no caveat lines."""
import os
import re
import shutil

import pandas as pd
import pytest

import generate_fixture
from conftest import needs_real, SHARED_REAL
from streamtrace import confidence as conf
from streamtrace.chain import blockers, correlated_tables, generate_collective_report

OFFSETS_US = "0,2000,-1500,700"   # ms-scale offsets, against a median skew of about 14 us


def _run(tmp_path_factory, name, **options):
    d = tmp_path_factory.mktemp(name)
    truth = generate_fixture.generate(str(d), **options)
    return str(d), truth


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return _run(tmp_path_factory, "clean", ranks=4, steps=3, seed=1, straggler_rank=2)


@pytest.fixture(scope="module")
def offsets(tmp_path_factory):
    return _run(tmp_path_factory, "offsets", ranks=4, steps=3, seed=1, straggler_rank=2,
                clock_offsets_us=OFFSETS_US)


def _partial(src, keep, dst):
    """A partial job: only the trace files of the ranks ``keep`` of a fixture."""
    os.makedirs(dst)
    truth = generate_fixture.json.load(open(os.path.join(src, "truth.json")))
    for r in keep:
        shutil.copy(os.path.join(src, truth["files"][str(r)]), dst)
    return dst


def test_a_clean_run_is_high_with_no_caveat_lines(clean):
    d, _ = clean
    c = conf.assess(correlated_tables([d]))
    assert c.level == "high" and c.reasons == []
    assert c.lines() == ["Confidence: high (4 of 4 ranks; 21 of 21 collectives matched on all their members; "
                         "clocks as recorded)"]
    table = c.table()
    assert table.iloc[0].tolist()[:2] == ["overall", "high"] and set(table["level"]) == {"high"}


def test_a_partial_job_names_the_absent_ranks_and_phrases_the_straggler_over_those_present(clean, tmp_path):
    d, truth = clean
    three = _partial(d, [0, 1, 2], str(tmp_path / "three"))
    text = blockers([three])
    assert text.confidence.level == "medium"
    assert text.splitlines()[0].startswith("Confidence: medium (3 of 4 ranks; ")
    assert "  - medium: only 3 of 4 ranks are present (absent: 3); every figure is over the ranks present" in text
    assert "Straggler: rank 2 (" in text and "among the 3 of 4 ranks present" in text
    one = _partial(d, [2], str(tmp_path / "one"))
    c = blockers([one]).confidence
    assert c.level == "low" and c.absent == [0, 1, 3]


def test_collectives_mostly_absent_are_no_evidence_of_who_arrived_last(tmp_path_factory, tmp_path):
    d, truth = _run(tmp_path_factory, "eight", ranks=8, steps=2, seed=4, straggler_rank=1, straggler_us=2000)
    full = blockers([d])
    assert "Straggler: rank 1 (" in full   # the injected straggler, when every rank is there
    two = blockers([_partial(d, [0, 1], str(tmp_path / "two"))])
    assert two.confidence.level == "low"
    assert "2 of 8 ranks" in two.splitlines()[0]
    assert "14 of 14 collectives have most of their members absent: they are not counted as evidence of who " \
           "arrived last" in two
    assert "Straggler" not in two and "no evidence of who arrived last" in two


def test_the_clock_rule_applies_large_well_determined_offsets(clean, offsets):
    rule = conf.clock_rule(correlated_tables([offsets[0]]))
    assert rule.state == "apply" and rule.spread_ns == pytest.approx(3_500_000, rel=0.01)
    assert rule.collectives >= conf.CLOCK_MIN_COLLECTIVES and rule.residual_ns <= conf.CLOCK_MAX_RESIDUAL_NS
    shifted, plain = blockers([offsets[0]]), blockers([clean[0]])
    assert shifted.confidence.level == "high" and "clock offsets of up to 3.5 ms applied" in shifted.splitlines()[0]
    # applied, the shifted clocks give the clean run's straggler and figures (within the offsets'
    # residual: each of the 21 waits may move by ~0.1 us)
    for a, b in zip(shifted.splitlines()[1:3], plain.splitlines()[1:3]):
        assert a.split("(")[0] == b.split("(")[0]
        assert [float(x) for x in re.findall(r"[0-9]+\.[0-9]", a)] == pytest.approx(
            [float(x) for x in re.findall(r"[0-9]+\.[0-9]", b)], abs=1.0)
    assert conf.clock_rule(correlated_tables([clean[0]])).state == "small"


def test_the_clock_rule_keeps_offsets_it_is_told_to(offsets):
    kept = blockers([offsets[0]], align_clocks=False)
    assert kept.confidence.level == "medium" and "clocks as recorded" in kept.splitlines()[0]
    assert "are well determined" in kept and "but not applied" in kept


def test_the_clock_rule_refuses_offsets_resting_on_too_few_collectives(tmp_path_factory):
    d, _ = _run(tmp_path_factory, "thin", ranks=4, steps=1, seed=1, clock_offsets_us=OFFSETS_US)
    tables = correlated_tables([d])
    rule = conf.clock_rule(tables)
    assert rule.state == "unreliable" and rule.collectives < conf.CLOCK_MIN_COLLECTIVES
    assert not tables["align.clocks"]["applied"].any()   # kept as recorded
    text = blockers([d])
    assert text.confidence.level == "low"
    assert "kept as recorded, so the waiting figures are not reliable" in text


def test_a_truncated_rank_is_named(tmp_path_factory):
    d, _ = _run(tmp_path_factory, "cut", ranks=4, steps=3, seed=1, truncate_rank=3, truncate_at_fraction=0.7)
    c = blockers([d]).confidence
    assert c.level == "medium"
    assert any(r.check == "truncated inputs" and r.text.startswith("1 rank(s) truncated (3)") for r in c.reasons)


def test_ranks_without_collectives_and_windows_over_different_steps(clean):
    tables = correlated_tables([clean[0]])
    col = tables["align.collectives"]
    tables["align.collectives"] = col[col["rank"] != 3]
    # the last step held by ranks 0 and 1 only (align.steps; without it, the report's steps table)
    coverage = tables["align.steps"]
    last = coverage["step"].max()
    coverage = coverage[(coverage["step"] != last) | (coverage["rank"] < 2)].copy()
    coverage.loc[coverage["step"] == last, "shared"] = False
    steps = tables["steps"].copy()
    steps.loc[steps.index[-1], "ranks"] = 2
    for given in ({"align.steps": coverage}, {"align.steps": None, "steps": steps}):
        c = conf.assess(dict(tables, **given))
        checks = {r.check: r for r in c.reasons}
        assert checks["ranks without collectives"].text.startswith("1 of 4 ranks present hold no collective "
                                                                   "kernels (3)")
        assert checks["profiled windows"].value == 1
        assert checks["profiled windows"].text.startswith(f"step #{last} left out: not in every rank's window")
        assert c.level == "medium"


def test_the_python_api_carries_the_confidence(clean):
    sheets = generate_collective_report(trace_dir=clean[0], world_size=4, write_files=False,
                                        blocking_analysis=True)
    assert sheets.confidence.level == "high"
    assert sheets["confidence"].iloc[0]["level"] == "high"
    plain = generate_collective_report(trace_dir=clean[0], world_size=4, write_files=False)
    assert plain.confidence.level == "high" and "confidence" not in plain   # TraceLens's sheets only
    import streamtrace

    answer = streamtrace.blockers([clean[0]])
    assert answer.confidence.table().equals(sheets.confidence.table())
    assert streamtrace.confidence.assess(correlated_tables([clean[0]])).level == "high"


def test_ties_are_said_as_ties():
    assert conf.most_often_last([4, 5, 7]) == ([4, 5, 7], 1)
    assert conf.most_often_last([4, 5, 5, float("nan")]) == ([5], 2)
    assert conf.tie_words([7, 4, 5]) == "ranks 4, 5 and 7" and conf.tie_words([3]) == "rank 3"


@needs_real
def test_param_dlrm_html_header_and_heatmap_name_the_same_tie():
    pytest.importorskip("plotly")
    from streamtrace.html_report import render_html

    d = os.path.join(SHARED_REAL, "param-dlrm")
    sheets = generate_collective_report(trace_dir=d, world_size=8, write_files=False)
    page = render_html(sheets, confidence=sheets.confidence)
    tie = "a tie: ranks 4, 5 and 7 each arrived last at 1 of the 3"
    header = page[page.index("<header>"):page.index("</header>")]
    assert f"<dt>straggler</dt><dd>{tie} implicit-sync collectives (8 of 8 ranks present)" in header
    assert "<dt>confidence</dt><dd>high</dd>" in header
    body = page[page.index("</header>"):]
    assert f"{tie.capitalize()} collectives of process group" in body
    assert "rank 4 arrived last" not in page and "rank 5: arrived last" not in page


@needs_real
def test_a_cpu_only_gloo_run_has_no_gpu_collectives():
    text = blockers([os.path.join(SHARED_REAL, "hta", "cpu_only")])
    assert "No GPU collectives in these traces" in text and "nothing waited on anything" not in text
    assert text.splitlines()[0] == "Confidence: low (1 of 300 ranks; no GPU collectives in these traces)"


def test_reasons_name_their_numbers():
    ranks = pd.DataFrame({"rank": [0, 1], "world_size": [128, 128], "truncated_at_byte": pd.array([None, None],
                                                                                                    dtype="Int64")})
    c = conf.assess({"align.ranks": ranks})
    assert c.level == "low" and c.ranks_words() == "2 of 128 ranks"
    assert "only 2 of 128 ranks are present (absent: 2-127)" in c.reasons[0].text


def test_blockers_says_a_tie_as_one():
    from streamtrace.correlate.stage import blockers_text

    rows = [dict(collective_id=str(i), late_rank=r, delta_us=100.0, blame_us=50.0, host_launch_lateness_us=100.0,
                 gpu_dependency_wait_us=0.0, gpu_backlog_us=0.0) for i, r in enumerate([4, 5, 7])]
    c = conf.Confidence("high", ranks_present=8, world_size=8, collectives=3, matched_full=3)
    text = blockers_text({"collective_blockers": pd.DataFrame(rows)}, confidence=c)
    assert ("Straggler: a tie: ranks 4, 5 and 7 were each last to arrive at 1 of 3 collectives, among the 8 of 8 "
            "ranks present; others waited 100.0 us for each") in text.splitlines()


def test_collectives_of_steps_left_out_are_not_counted_as_missing_members(tmp_path_factory):
    """Windows shifted by a step (ranks 1 and 3 one step later): the 12 collectives of steps #12
    and #14 are held by half the ranks by construction, not for lack of matching: the matched
    share is over the shared step's 6, and the steps left out are said as such."""
    d, truth = _run(tmp_path_factory, "shifted", ranks=4, steps=2, layout="old", fill_ops=12, seed=11,
                    window_shift_steps=[0, 1, 0, 1])
    assert truth["messy"]["left_out_steps"] == [12, 14]
    text = blockers([d])
    c = text.confidence
    assert text.splitlines()[0] == ("Confidence: medium (4 of 4 ranks; 6 of 6 collectives matched on all their "
                                    "members; clocks as recorded)")
    checks = {r.check: r for r in c.reasons}
    assert "matched on all members" not in checks, c.reasons
    assert checks["profiled windows"].text.startswith("steps #12, #14 left out: not in every rank's window")
    assert "their 12 collectives are counted neither as matched nor as missing" in checks["profiled windows"].text
    assert c.level == "medium"
    straggler = [line for line in text.splitlines() if line.startswith("Straggler:")]
    assert len(straggler) == 1 and "last to arrive at 6 of 6 collectives" in straggler[0], text


def test_step_words_say_runs_as_ranges():
    assert conf._step_words([3, 4, 5, 9]) == "steps #3..#5, #9"
    assert conf._step_words([12, 14]) == "steps #12, #14" and conf._step_words([7]) == "step #7"


def test_windows_sharing_no_step_leave_nothing_to_compare(tmp_path_factory):
    """Rank 0 holds step #12 only, rank 1 step #13 only: every collective is in a step left out."""
    d, _ = _run(tmp_path_factory, "disjoint", ranks=2, steps=1, layout="old", fill_ops=12, seed=5,
                window_shift_steps=[0, 1])
    text = blockers([d])
    assert text.splitlines()[0] == ("Confidence: low (2 of 2 ranks; no collective in a step every rank's window "
                                    "holds; clocks as recorded)")
    reason = {r.check: r for r in text.confidence.reasons}["profiled windows"]
    assert reason.level == "low" and reason.text.startswith("steps #12..#13 left out: not in every rank's window")
    assert "no step held by all 2 ranks" in reason.text
    assert "nothing waited" not in text and "no wait at a collective can be measured" in text

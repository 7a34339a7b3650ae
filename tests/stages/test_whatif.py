"""What-if replays checked against counterfactual runs: the fixture
generator writes each run with its injected cause and again without it
(same seed, program and windows: every other duration identical), and the
replay of the scenario that removes the cause must land within 5 % of the
clean run's MEASURED step time, step by step.  On a clean run no scenario
that removes a cause claims more than the run-to-run noise."""
import os
import statistics

import pytest

from generate_fixture import generate, generate_counterfactual
from pipeline import generate_pipeline
from streamtrace import critical
from streamtrace.chain import correlated_tables

TOLERANCE = 0.05


def _measured(d):
    tables = correlated_tables([str(d)], critical=True)
    return tables, {step: g.step_time() / 1e3 for step, g in critical.graphs(tables)}


def _check(d, scenario):
    tables, measured = _measured(d)
    _, clean = _measured(os.path.join(str(d), "counterfactual"))
    w = critical.whatif(tables, scenarios=[scenario])["whatif"]
    assert sorted(w["step"]) == sorted(clean)
    saved = 0.0
    for row in w.itertuples():
        want = clean[row.step]
        assert abs(row.estimated_step_us - want) <= TOLERANCE * want, (row, want)
        saved += row.saving_us
    return saved, sum(measured.values()) - sum(clean.values())


COLLECTIVE_CASES = {
    # the cause, the scenario that removes it, whether it costs step time in this run
    "straggler": (dict(straggler_rank=2), "rank:2", True),
    "host_lateness": (dict(host_delay_rank=1), "rank:1", True),
    "gpu_backlog": (dict(slow_kernel_rank=3, slow_kernel_factor=10, slow_kernel_at_end=True), "rank:3", True),
}


@pytest.mark.parametrize("case", sorted(COLLECTIVE_CASES))
def test_removing_the_cause_matches_the_counterfactual_run(case, tmp_path):
    options, scenario, costs = COLLECTIVE_CASES[case]
    generate_counterfactual(str(tmp_path), ranks=4, steps=3, **options)
    saved, true_saving = _check(tmp_path, scenario)
    assert costs and true_saving > 0.05 * saved > 0   # the cause cost step time, and the replay saw it


def test_contended_kernel_matches_the_counterfactual_run(tmp_path):
    """The kernel slowed beside NCCL: its scenario is suggested, and its
    estimate matches the run without the contention (here the host-bound
    windows hide it: both say it costs the step almost nothing)."""
    generate_counterfactual(str(tmp_path), ranks=4, steps=3, inflate_kernel_factor=3)
    tables, _ = _measured(tmp_path)
    names = set(critical.whatif(tables)["whatif"]["scenario"])
    kernel = next(n for n in names if n.startswith("contention:") and "overlap_gemm_kernel" in n)
    _check(tmp_path, kernel)


@pytest.mark.parametrize("case,kw,scenario", [
    ("slow_stage", dict(slow_stage=2), "rank:2"),
    ("slow_link", dict(slow_link=(0, 1)), "link:0-1"),
    ("slow_link_mid", dict(slow_link=(1, 2)), "link:1-2"),
    ("slow_stage_batched", dict(slow_stage=1, batched=True), "rank:1"),
    ("slow_link_batched", dict(slow_link=(1, 2), batched=True), "link:1-2"),
])
def test_pipeline_cause_matches_the_counterfactual_run(case, kw, scenario, tmp_path):
    batched = kw.get("batched", False)
    generate_pipeline(str(tmp_path), **kw)
    generate_pipeline(os.path.join(str(tmp_path), "counterfactual"), batched=batched)
    saved, true_saving = _check(tmp_path, scenario)
    assert true_saving > 0 and saved > 0


def test_the_top_scenario_names_the_cause(tmp_path):
    generate_pipeline(str(tmp_path), slow_link=(0, 1))
    tables, _ = _measured(tmp_path)
    top = critical.ranked(critical.whatif(tables)["whatif"]).iloc[0]
    assert top["scenario"] == "link:0-1"


def test_a_clean_run_claims_no_more_than_its_noise(tmp_path):
    """Scenarios that remove a cause (a rank's lateness, its host gaps,
    contention, a slow link) claim at most the run-to-run noise: the
    spread of the clean run's step times (and under 1 % of a step)."""
    generate(str(tmp_path), ranks=4, steps=4)
    tables, measured = _measured(tmp_path)
    noise = statistics.pstdev(measured.values())
    ranked = critical.ranked(critical.whatif(tables)["whatif"])
    causes = ranked[ranked["scenario"].str.match(r"(rank|host|contention|link):")]
    assert len(causes) >= 4
    assert (causes["saving_us"] <= noise).all(), (causes, noise)
    assert (causes["saving_pct"] < 1.0).all()


def test_python_api_returns_the_sheets_as_dataframes(tmp_path):
    import pandas as pd

    import streamtrace

    generate_pipeline(str(tmp_path), slow_link=(0, 1))
    sheets = streamtrace.whatif([str(tmp_path)], scenario="link:0-1")
    assert set(sheets) == {"whatif", "critical_path", "critical_path_summary"}
    assert all(isinstance(df, pd.DataFrame) for df in sheets.values())
    assert sheets.confidence.level == "high"
    assert sheets.text.splitlines()[0].startswith("Confidence: high")
    w = sheets["whatif"]
    assert list(w["scenario"].unique()) == ["link:0-1"] and (w["saving_pct"] > 30).all()


def test_counterfactual_flag_writes_the_run_and_its_clean_twin(tmp_path):
    """`generate_fixture.py --counterfactual`: OUT is byte for byte the run
    without the flag; OUT/counterfactual is the same run without the cause
    (rank 2's steps start on time; every collective's transfer unchanged)."""
    import filecmp
    import json
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "fixtures",
                          "generate_fixture.py")
    args = ["--ranks", "4", "--steps", "2", "--straggler_rank", "2"]
    for out, extra in ((tmp_path / "plain", []), (tmp_path / "cf", ["--counterfactual"])):
        subprocess.run([sys.executable, script, "--out", str(out), *args, *extra], check=True, timeout=300,
                       capture_output=True)
    names = sorted(os.listdir(tmp_path / "plain"))
    _, mismatch, errors = filecmp.cmpfiles(tmp_path / "plain", tmp_path / "cf", names, shallow=False)
    assert not mismatch and not errors
    with open(tmp_path / "cf" / "truth.json") as f:
        truth = json.load(f)
    with open(tmp_path / "cf" / "counterfactual" / "truth.json") as f:
        clean = json.load(f)
    assert clean["counterfactual"] == {"removed": ["straggler_rank"]}
    assert [c["transfer_ns"] for c in clean["collectives"]] == [c["transfer_ns"] for c in truth["collectives"]]
    late = [s["per_rank"]["2"]["true_start_ns"] - s["per_rank"]["0"]["true_start_ns"] for s in truth["profiler_steps"]]
    on_time = [s["per_rank"]["2"]["true_start_ns"] - s["per_rank"]["0"]["true_start_ns"]
               for s in clean["profiler_steps"]]
    assert all(a - b >= 900_000 for a, b in zip(late, on_time))   # the 1 ms straggler delay, gone

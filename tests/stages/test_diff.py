"""streamtrace.diff on pairs of generated runs: the same seed and options,
one injected change; the change is recovered and ranked first.  Identical
runs, and runs differing only by their seed's noise, show no change beyond
the run-to-run spread.  (The generator has no option for a slower
collective or another bucket size: those runs are made by wrapping its
plan's transfer time or program while it runs.)"""
import pytest

import generate_fixture as gf
from pipeline import generate_pipeline
from streamtrace.diff import diff, parse_condition
from streamtrace.diff.compare import compare
from streamtrace.errors import InvalidArgumentError

RUN = dict(ranks=4, steps=4, seed=1)
BIG = 8_388_608 * 4   # grad_allreduce_B's bytes: the >=32 MiB all-reduce


def _slower_allreduce(factor):
    real = gf._Plan._transfer

    def transfer(self, kind, n, traffic_bytes_full):
        t = real(self, kind, n, traffic_bytes_full)
        return self._quant(t * factor) if kind == "allreduce" and traffic_bytes_full == BIG else t
    return transfer


def _smaller_bucket(self, step, _real=gf._Plan._program):
    """grad_allreduce_B at 16 MiB instead of 32 MiB: another size bucket."""
    out = []
    for it in _real(self, step):
        if it[0] == "coll" and it[2].get("label") == "grad_allreduce_B":
            it = (it[0], it[1], dict(it[2], n=4_194_304))
        out.append(it)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("diff_runs")
    made = {}

    def make(name, **options):
        made[name] = str(root / name)
        gf.generate(made[name], **{**RUN, **options})

    make("base")
    make("seed2", seed=2)
    make("straggler", straggler_rank=2)
    make("slow_kernel_base", slow_kernel_rank=1, slow_kernel_factor=1.05)
    make("slow_kernel", slow_kernel_rank=1, slow_kernel_factor=3.0)
    make("host_delay", host_delay_rank=3)
    make("more_ranks", ranks=8, steps=3)
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(gf._Plan, "_transfer", _slower_allreduce(1.6))
        make("slow_allreduce")
        mp.undo()
        mp.setattr(gf._Plan, "_program", _smaller_bucket)
        make("bucket")
    finally:
        mp.undo()
    for name, options in (("pipe", {}), ("pipe_stage", dict(slow_stage=2)), ("pipe_link", dict(slow_link=(1, 2))),
                          ("pipe_seed", dict(seed=5))):
        made[name] = str(root / name)
        generate_pipeline(made[name], stages=4, steps=3, **{"seed": 1, **options})
    return made


@pytest.fixture(scope="module")
def base_tables(runs):
    from streamtrace.diff import side_tables

    return side_tables(runs["base"])


def _first(d):
    ch = d["diff_changes"]
    assert len(ch), d.text
    return ch.iloc[0]


def test_identical_runs_no_change(runs):
    d = diff(runs["base"], runs["base"], fail_if=["step_time:+1%", "busbw:-1%", "new_straggler", "new_blocker"])
    assert len(d["diff_changes"]) == 0, d.text
    assert "No change beyond the run-to-run spread." in d.text
    assert not d.violations
    assert d.text.splitlines()[0].startswith("Baseline confidence: high")
    assert d.text.splitlines()[1].startswith("Candidate confidence: high")


def test_seed_noise_is_no_change(runs):
    d = diff(runs["base"], runs["seed2"], fail_if=["step_time:+1%", "busbw:-5%", "transfer:+5%", "new_straggler",
                                                   "new_blocker"])
    assert len(d["diff_changes"]) == 0, d.text
    assert not d.violations, d.text


def test_pipeline_seed_noise_is_no_change(runs):
    d = diff(runs["pipe"], runs["pipe_seed"])
    assert len(d["diff_changes"]) == 0, d.text


def test_slower_allreduce_in_one_bucket(runs):
    d = diff(runs["base"], runs["slow_allreduce"], fail_if=["busbw:-10%", "transfer:+20%"])
    top = _first(d)
    assert (top["area"], top["metric"]) == ("collectives", "transfer"), d.text
    assert top["item"].startswith("allreduce") and top["item"].endswith(">=32 MiB"), d.text
    assert 50 < top["change_pct"] < 70
    c = d["diff_collectives"]
    others = c[(c["metric"] == "transfer") & ~c["item"].str.endswith(">=32 MiB")]
    assert not others["beyond_spread"].any(), others
    assert {v.condition.metric for v in d.violations} == {"busbw", "transfer"}
    assert all(">=32 MiB" in v.detail for v in d.violations)


def test_new_straggler(runs):
    d = diff(runs["base"], runs["straggler"], fail_if=["new_straggler", "step_time:+5%", "step_time:+50%"])
    top = _first(d)
    assert top["status"] == "new straggler" and top["item"] == "rank 2", d.text
    assert "rank 2 is the new straggler" in d.text.split("Biggest changes")[1].splitlines()[1]
    assert [v.condition.text for v in d.violations] == ["new_straggler", "step_time:+5%"]


def test_slower_kernel_on_one_rank(runs):
    d = diff(runs["slow_kernel_base"], runs["slow_kernel"], fail_if=["kernel_time:+50%"])
    top = _first(d)
    assert "slow_gemm_kernel" in top["words"] and "rank 1" in top["words"], d.text
    assert top["status"] in ("slower", "new")
    k = d["diff_gpu_time"]
    moved = k[(k["area"] == "kernels") & k["beyond_spread"]]
    assert set(moved["rank"]) == {1} and moved["kernel"].str.contains("slow_gemm_kernel").all(), moved
    assert [v.condition.metric for v in d.violations] == ["kernel_time"]


def test_host_delay(runs):
    d = diff(runs["base"], runs["host_delay"], fail_if=["new_blocker"])
    top = _first(d)
    assert top["area"] == "blocking_host_ops" and "aten::host_heavy_op" in top["item"], d.text
    assert top["status"] == "new"
    assert d.violations and "host_heavy_op" in d.violations[0].detail


def test_slower_pipeline_stage(runs):
    d = diff(runs["pipe"], runs["pipe_stage"], fail_if=["stage_work:+20%"])
    top = _first(d)
    assert (top["area"], top["item"], top["metric"]) == ("pipeline", "pipeline 0 stage 2", "stage work"), d.text
    assert [v.condition.metric for v in d.violations] == ["stage_work"]


def test_slower_link(runs):
    d = diff(runs["pipe"], runs["pipe_link"], fail_if=["link_bandwidth:-50%"])
    top = _first(d)
    assert top["area"] == "p2p" and top["item"] in ("link 1->2", "link 2->1"), d.text
    assert d.violations and all(v.detail.startswith(("link 1->2", "link 2->1")) for v in d.violations)


def test_changed_bucket_size(runs):
    d = diff(runs["base"], runs["bucket"])
    top = _first(d)
    assert top["item"].startswith("allreduce") and top["item"].endswith(">=32 MiB"), d.text
    assert top["status"] == "gone"
    c = d["diff_collectives"]
    small = c[c["item"].str.startswith("allreduce") & c["item"].str.endswith("<32 MiB") & (c["metric"] == "per_step")]
    assert len(small) == 1 and small.iloc[0]["candidate"] == small.iloc[0]["baseline"] + 1


def test_rank_and_step_counts_differ(runs):
    d = diff(runs["base"], runs["more_ranks"])
    notes = " | ".join(d.notes)
    assert "steps: the baseline has 4, the candidate 3" in notes
    assert "ranks: the baseline has 4, the candidate 8; only in the candidate: 4,5,6,7" in notes
    assert any(line.startswith("Note: ranks:") for line in d.text.splitlines())
    assert any(n.startswith("collective groups of another size") and "4 -> 8 ranks" in n for n in d.notes), notes
    per_rank = d["diff_steps"]
    assert set(per_rank["item"]) == {"run", "rank 0", "rank 1", "rank 2", "rank 3"}


def test_missing_sheets_are_noted(base_tables):
    cand = {k: v for k, v in base_tables.items() if k not in ("correlate.blocking_kernels",
                                                              "correlate.exposed_comm")}
    sheets, comparison = compare(base_tables, cand)
    notes = list(sheets["diff_notes"]["note"])
    assert "blocking_kernels: missing from the candidate; not compared" in notes
    assert "exposed_comm: missing from the candidate; not compared" in notes
    assert len(sheets["diff_changes"]) == 0


def test_pipeline_in_one_run_only_is_noted(runs):
    d = diff(runs["base"], runs["pipe"], critical=False)
    assert any("pipeline: only the candidate" in n for n in d.notes), d.notes


def test_critical_path_explains_the_step_first(runs):
    d = diff(runs["base"], runs["straggler"])
    lines = d.text.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith("Step time:"))
    assert "beyond the run-to-run spread" in lines[i]
    assert lines[i + 1].strip().startswith("step +") and "rank 2" in lines[i + 1], d.text
    assert "diff_critical_path" in d


@pytest.mark.parametrize("text,metric,sign,amount,unit", [
    ("step_time:+5%", "step_time", 1, 5.0, "%"), ("busbw:-10%", "busbw", -1, 10.0, "%"),
    ("transfer:+200us", "transfer", 1, 200.0, "us"), ("waiting:+2ms", "waiting", 1, 2.0, "ms"),
    ("link_bandwidth:-5GB/s", "link_bandwidth", -1, 5.0, "GB/s"), ("new_straggler", "new_straggler", 0, 0.0, ""),
])
def test_conditions_parse(text, metric, sign, amount, unit):
    c = parse_condition(text)
    assert (c.metric, c.sign, c.amount, c.unit) == (metric, sign, amount, unit)


@pytest.mark.parametrize("text,words", [
    ("step_tim:+5%", "unknown metric 'step_tim'"), ("step_time:5%", "signed amount"),
    ("step_time", "signed amount"), ("busbw:-10ms", "measured in GB/s"), ("step_time:+5GB/s", "us, ms or s"),
    ("new_straggler:+1%", "takes no threshold"), ("step_time:+x%", "signed amount"),
])
def test_malformed_conditions(text, words):
    with pytest.raises(InvalidArgumentError) as e:
        parse_condition(text)
    assert repr(text) in str(e.value) and words in str(e.value)


def test_gate_thresholds_pass_and_fail(runs):
    """Each metric's condition fails when the change exceeds its threshold, passes when it does not."""
    from streamtrace.diff.gate import evaluate

    d = diff(runs["base"], runs["straggler"], critical=False)
    step = d["diff_steps"].iloc[0]
    assert step["item"] == "run" and step["beyond_spread"]
    pct = step["change_pct"]
    assert evaluate([parse_condition(f"step_time:+{pct - 1:.1f}%")], d)
    assert not evaluate([parse_condition(f"step_time:+{pct + 1:.1f}%")], d)
    assert not evaluate([parse_condition("step_time:-1%")], d)     # it got slower, not faster
    assert evaluate([parse_condition(f"step_time:+{step['change'] - 10:.0f}us")], d)
    assert not evaluate([parse_condition(f"step_time:+{(step['change'] + 10) / 1e3:.3f}ms")], d)
    assert evaluate([parse_condition("rank_step_time:+5%")], d)
    assert evaluate([parse_condition("new_straggler")], d)
    assert evaluate([parse_condition("waiting:+1000%")], d)
    assert not evaluate([parse_condition("busbw:-10%")], d)
    d = diff(runs["base"], runs["slow_allreduce"], critical=False)
    assert evaluate([parse_condition("busbw:-30%")], d) and not evaluate([parse_condition("busbw:-45%")], d)
    assert evaluate([parse_condition("transfer:+150us")], d) and not evaluate([parse_condition("transfer:+250us")], d)
    assert evaluate([parse_condition("busbw:+1%")], d) == []        # it got slower, not faster
    assert not evaluate([parse_condition("step_time:+1%")], d)      # the step did not move beyond its spread
    assert not evaluate([parse_condition("new_straggler")], d)
    assert not evaluate([parse_condition("new_blocker")], d)
    assert not evaluate([parse_condition("waiting:+50%")], d)


def test_percentage_conditions_fail_on_something_new(runs):
    """A kernel identity new on a rank grew from nothing: beyond any percentage."""
    d = diff(runs["base"], runs["slow_kernel"], fail_if=["kernel_time:+1000%"])
    assert d.violations and all("slow_gemm_kernel" in v.detail and v.detail.endswith("(new)")
                                for v in d.violations), d.text


def test_streamtrace_diff_is_the_function_whatever_was_imported_first(runs):
    """``streamtrace.diff(...)`` after ``import streamtrace.diff.gate`` (which
    makes the package the parent's attribute) still runs the diff."""
    import subprocess
    import sys

    code = ("import streamtrace.diff.gate, streamtrace, sys; d = streamtrace.diff(sys.argv[1], sys.argv[1]); "
            "print(type(d).__name__, len(d['diff_changes']))")
    out = subprocess.run([sys.executable, "-c", code, runs["base"]], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["Diff", "0"]


def test_many_violations_of_one_condition_are_cut(runs, monkeypatch):
    """A condition broken on more rows than VIOLATIONS_SHOWN prints that many
    and how many more (diff_gate holds them all)."""
    import streamtrace.diff.summary as summary

    monkeypatch.setattr(summary, "VIOLATIONS_SHOWN", 2)
    d = diff(runs["base"], runs["slow_kernel"], fail_if=["rank_step_time:-1000%", "kernel_time:+0.1%"])
    lines = [line for line in d.text.splitlines() if line.startswith("  kernel_time:+0.1%")]
    broken = [v for v in d.violations if v.condition.text == "kernel_time:+0.1%"]
    assert len(broken) > 2, d.text
    assert len(lines) == 3 and lines[-1] == f"  kernel_time:+0.1%: ... and {len(broken) - 2} more"
    gate = d["diff_gate"].set_index("condition")
    assert gate.loc["kernel_time:+0.1%", "detail"].count("; ") == len(broken) - 1
    assert gate.loc["rank_step_time:-1000%", "passed"]


def test_profiler_step_ops_are_one_op_whatever_their_number(runs):
    """Runs that number their steps differently: ProfilerStep#12 in one,
    #112 in the other is the same host op, not one gone and one new."""
    from streamtrace.diff import side_tables
    from streamtrace.diff.metrics import Run

    base_tables = side_tables(runs["straggler"], critical=False)
    ops = base_tables["correlate.blocking_host_ops"]
    assert ops["op"].str.startswith("ProfilerStep#").sum() >= 2
    renumbered = ops.assign(op=ops["op"].str.replace(r"^ProfilerStep#(\d+)$",
                                                     lambda m: f"ProfilerStep#{int(m[1]) + 100}", regex=True))
    cand = dict(base_tables, **{"correlate.blocking_host_ops": renumbered})
    sheets, _ = compare(base_tables, cand)
    rows = sheets["diff_blocking_host_ops"]
    assert not rows["beyond_spread"].any(), rows
    assert Run(base_tables, "b").blockers("correlate.blocking_host_ops", ("op",)).keys() == \
        Run(cand, "c").blockers("correlate.blocking_host_ops", ("op",)).keys()


def test_critical_graph_made_only_when_the_step_time_changed(runs, monkeypatch):
    """Each run's critical-path graph (critical.node_tables) is made only
    when the critical paths are compared: the step time changed beyond its
    spread.  Otherwise the step line says it did not change, and no
    critical-path line or sheet follows."""
    import streamtrace.critical as critical

    made = []
    real = critical.node_tables
    monkeypatch.setattr(critical, "node_tables", lambda *a, **k: made.append(1) or real(*a, **k))
    d = diff(runs["base"], runs["seed2"])
    assert made == [], "the graph was made though the step time did not change"
    step = next(line for line in d.text.splitlines() if line.startswith("Step time:"))
    assert "within the run-to-run spread: no change" in step, d.text
    assert "on the critical path" not in d.text and "diff_critical_path" not in d
    assert len(d["diff_gpu_time"].query("area == 'kernels'")), "the per-kernel GPU time is compared all the same"
    d = diff(runs["base"], runs["straggler"])
    assert made == [1, 1]   # once per run
    assert "on the critical path" in d.text and len(d["diff_critical_path"])


def test_kernel_time_from_the_timelines_is_the_graphs(runs):
    """The per-kernel GPU time read from correlate's timelines (no graph
    made) is the one the critical graph's compute nodes give, to the bit,
    on a trace directory and on a summarized stream."""
    from streamtrace.chain import correlated_tables
    from streamtrace.diff.metrics import CORRELATED, Correlated, Run

    for run in ("slow_kernel", "pipe_stage"):
        held = []
        tables = correlated_tables([runs[run]], critical=True, finished=held.append)
        from_graph = Run(tables, "g").kernel_time()
        from_timelines = Run({**tables, CORRELATED: Correlated(held[0])}, "t").kernel_time()
        assert from_graph and from_timelines == from_graph


def test_correlated_tables_hands_on_the_timelines_without_the_graph(runs, tmp_path):
    """``finished`` gets correlate's timelines and the align tables it read;
    without ``critical`` no critical.* table is made.  A correlated stream's
    correlate runs again for them (its tables are the same)."""
    import subprocess
    import sys

    from streamtrace.chain import correlated_tables

    bin_ = [sys.executable, "-m", "streamtrace.cli"]
    stream = tmp_path / "run.stev"
    staged = subprocess.run(" | ".join([" ".join(bin_ + ["extract", "--trace_dir", runs["base"], "-q"]),
                                        " ".join(bin_ + ["align"]), " ".join(bin_ + ["correlate"])])
                            + f" > {stream}", shell=True, capture_output=True, text=True, timeout=300)
    assert staged.returncode == 0, staged.stderr
    for source in (runs["base"], str(stream)):
        held = []
        tables = correlated_tables([source], finished=held.append)
        assert not any(n.startswith("critical.") for n in tables)
        (timelines, used), = held
        assert sorted(timelines) == [0, 1, 2, 3] and "align.collectives" in used
    plain = correlated_tables([str(stream)])
    assert plain.keys() == tables.keys()
    for name in plain:
        assert plain[name].equals(tables[name]), name

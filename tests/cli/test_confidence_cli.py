"""The answers' confidence as a user meets it, through real processes:
``blockers`` prints it first on every real set and every messy-run fixture,
``collective-report`` closes with it and writes the ``confidence`` sheet
with the blocking analysis, and the clock rule applies or refuses the
offsets as docs/confidence.md says (``--align_clocks/--no-align_clocks``)."""
import csv
import os
import subprocess
import sys

import pytest

import generate_fixture
from conftest import SHARED_REAL, needs_real

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")
OFFSETS_US = "0,2000,-1500,700"


def run(*args, timeout=300):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def _fixture(tmp_path_factory, name, **options):
    d = tmp_path_factory.mktemp(name)
    generate_fixture.generate(str(d), ranks=options.pop("ranks", 4), seed=options.pop("seed", 2), **options)
    return str(d)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return _fixture(tmp_path_factory, "clean", steps=3)


@pytest.fixture(scope="module")
def offsets(tmp_path_factory):
    return _fixture(tmp_path_factory, "offsets", steps=3, clock_offsets_us=OFFSETS_US)


def _real_sets():
    if not os.path.isdir(SHARED_REAL):
        return []
    return sorted(os.path.relpath(root, SHARED_REAL) for root, _, files in os.walk(SHARED_REAL)
                  if any(".json" in f for f in files))


@needs_real
@pytest.mark.parametrize("name", _real_sets() or ["none"])
def test_blockers_prints_its_confidence_first_on_every_real_set(name):
    res = run("blockers", os.path.join(SHARED_REAL, name))
    assert res.returncode == 0, res.stderr   # every set is answered, if only to say what it lacks
    lines = res.stdout.splitlines()
    assert lines[0].startswith("Confidence: ") and " ranks" in lines[0]
    level = lines[0].split()[1]
    caveats = [line for line in lines[1:] if line.startswith("  - ")]
    assert (level == "high") == (not caveats)
    if name == "param-dlrm":
        assert lines[0] == ("Confidence: high (8 of 8 ranks; 8 of 8 collectives matched on all their members; "
                            "clocks as recorded)")
        assert lines[1].startswith("Straggler: rank 7 (") and "among the 8 of 8 ranks present" in lines[1]


# each messy-run mode, and the words its confidence must say
MESSY = {
    "partial": (dict(present_ranks="0,1", ranks=8), "low", ["2 of 8 ranks", "absent: 2-7", "not counted as evidence"]),
    "issue41": (dict(generate_fixture.ISSUE41_SHAPE), "low", ["2 of 128 ranks", "absent: 2-127",
                                                               "not counted as evidence"]),
    "no_collectives": (dict(no_collectives_rank=2), "medium", ["ranks present hold no collective kernels (2)"]),
    "shifted_windows": (dict(window_shift_steps="0,0,1,1", steps=4), "medium", ["cover different steps"]),
    "few": (dict(max_collectives=3), "medium", ["rests on 3 collective(s)"]),
    "truncated": (dict(truncate_rank=3, truncate_at_fraction=0.7, steps=3), "medium", ["1 rank(s) truncated (3)"]),
    "thin_offsets": (dict(steps=1, clock_offsets_us=OFFSETS_US), "low", ["waiting figures are not reliable"]),
}


@pytest.mark.parametrize("mode", sorted(MESSY))
def test_blockers_on_a_messy_run_names_the_injected_problem(mode, tmp_path_factory):
    options, worst, words = MESSY[mode]
    d = _fixture(tmp_path_factory, mode, **options)
    res = run("blockers", d)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("Confidence: ")
    level = lines[0].split()[1]
    assert ("high", "medium", "low").index(level) >= ("high", "medium", "low").index(worst), lines[:6]
    head = "\n".join(line for line in lines if line.startswith(("Confidence", "  - ")))
    for w in words:
        assert w in head, head


def test_a_clean_run_is_high_with_no_caveat_lines(clean, tmp_path):
    res = run("blockers", clean)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == ("Confidence: high (4 of 4 ranks; 21 of 21 collectives matched on all their members; "
                        "clocks as recorded)")
    assert lines[1].startswith("Straggler: ") and not any(line.startswith("  - ") for line in lines)
    out = tmp_path / "csvs"
    rep = run("collective-report", "--trace_dir", clean, "--world_size", 4, "--output_csvs_dir", out,
              "--blocking_analysis")
    assert rep.returncode == 0, rep.stderr
    assert rep.stderr.splitlines()[-1] == lines[0]   # the closing line: the same confidence
    rows = list(csv.DictReader(open(out / "confidence.csv")))
    assert rows[0]["check"] == "overall" and {r["level"] for r in rows} == {"high"}
    quiet = run("collective-report", "--trace_dir", clean, "--world_size", 4, "--output_csvs_dir",
                tmp_path / "q", "-q")
    assert quiet.returncode == 0 and "Confidence" not in quiet.stderr
    assert not (tmp_path / "q" / "confidence.csv").exists()   # no blocking analysis: TraceLens's sheets only


def test_the_clock_rule_applies_large_well_determined_offsets_and_the_flags_override_it(offsets):
    rule = run("blockers", offsets)
    assert rule.returncode == 0, rule.stderr
    assert rule.stdout.splitlines()[0] == ("Confidence: high (4 of 4 ranks; 21 of 21 collectives matched on all "
                                           "their members; clock offsets of up to 3.5 ms applied)")
    on = run("blockers", offsets, "--align_clocks")
    assert on.stdout.splitlines()[1:] == rule.stdout.splitlines()[1:]
    off = run("blockers", offsets, "--no-align_clocks")
    first, reason = off.stdout.splitlines()[:2]
    assert first.startswith("Confidence: medium (") and first.endswith("clocks as recorded)")
    assert reason.startswith("  - medium: clock offsets of up to 3.5 ms") and "but not applied" in reason


def test_collective_report_says_which_clocks_each_sheet_used(offsets, tmp_path):
    out = tmp_path / "csvs"
    res = run("collective-report", "--trace_dir", offsets, "--world_size", 4, "--output_csvs_dir", out,
              "--blocking_analysis")
    assert res.returncode == 0, res.stderr
    words = "TraceLens's sheets: clocks as recorded; blocking and p2p sheets: clock offsets applied"
    assert words in res.stderr.splitlines()[-1]
    assert "CLOCKS DISAGREE" in res.stderr   # TraceLens's sheets keep their warning
    rows = {r["check"]: r for r in csv.DictReader(open(out / "confidence.csv"))}
    assert rows["clocks used"]["value"] == words
    # the rule leaves TraceLens's sheets as recorded: the same as without the blocking analysis
    plain = tmp_path / "plain"
    assert run("collective-report", "--trace_dir", offsets, "--world_size", 4, "--output_csvs_dir", plain,
               "-q").returncode == 0
    for sheet in ("nccl_implicit_sync.csv", "straggler_summary.csv", "nccl_long.csv"):
        assert (out / sheet).read_bytes() == (plain / sheet).read_bytes(), sheet


def test_a_stream_aligned_already_keeps_its_clocks_and_says_so(offsets, tmp_path):
    aligned = tmp_path / "aligned.stev"
    ext = subprocess.run(f"'{BIN}' extract --trace_dir '{offsets}' --world_size 4 -q | '{BIN}' align -q -o '{aligned}'",
                         shell=True, capture_output=True, text=True, timeout=300)
    assert ext.returncode == 0, ext.stderr
    res = run("blockers", aligned, "--align_clocks")
    assert res.returncode == 0, res.stderr
    assert "the stream was aligned already: --align_clocks/--no-align_clocks has no effect on it" in res.stderr
    # align's own default (on across nodes; one node here) kept the clocks: the confidence says what that costs
    first, reason = res.stdout.splitlines()[:2]
    assert first.startswith("Confidence: medium (") and first.endswith("clocks as recorded)")
    assert "are well determined" in reason and "but not applied" in reason


# ---------------------------------------------------------------------- point-to-point evidence


def _pipeline(tmp_path_factory, name, **options):
    from pipeline import generate_pipeline

    d = tmp_path_factory.mktemp(name)
    generate_pipeline(str(d), stages=2, steps=2, **options)
    return d


def _without_p2p(trace):
    """A trace without its send/recv ops, annotations and kernels (its other events kept)."""
    import json

    doc = json.loads(trace.read_text())

    def p2p(e):
        name, args = str(e.get("name", "")), e.get("args") or {}
        return ("SendRecv" in name or name.startswith(("c10d::send", "c10d::recv", "nccl:send", "nccl:recv"))
                or args.get("Collective name") in ("send", "recv"))

    doc["traceEvents"] = [e for e in doc["traceEvents"] if not p2p(e)]
    trace.write_text(json.dumps(doc))


def test_send_recv_ops_none_of_which_pair_make_the_answer_low(tmp_path_factory):
    """Both stages present, but rank 1's send/recv ops are not in its trace: rank 0's 32 halves
    have no partner. The answer must not be 'high'."""
    d = _pipeline(tmp_path_factory, "unpaired")
    _without_p2p(d / "rank1_trace.json")
    res = run("blockers", d)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("Confidence: low (2 of 2 ranks; "), lines[:4]
    assert ("  - low: none of the 32 send/recv halves was paired with its peer's (32 listed in p2p_unmatched): "
            "the point-to-point figures rest on no matched transfer") in lines
    assert "nothing waited" not in res.stdout


def test_send_recv_halves_without_a_partner_are_counted(tmp_path_factory):
    """Rank 1's window starts 4 ops into the pipeline: 2 of 62 halves have no partner."""
    d = _pipeline(tmp_path_factory, "late", late_start_rank=1, late_start_ops=4)
    res = run("blockers", d)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("Confidence: medium (2 of 2 ranks; point-to-point transfers only"), lines[:4]
    assert ("  - medium: 60 of 62 send/recv halves paired with their peer's; 2 without a partner (listed in "
            "p2p_unmatched)") in lines
    clean = run("blockers", _pipeline(tmp_path_factory, "clean_pipe"))
    assert clean.stdout.splitlines()[0] == ("Confidence: high (2 of 2 ranks; point-to-point transfers only; "
                                            "clocks as recorded)")


# ---------------------------------------------------------------------- the clock advice follows the rule


def test_offsets_resting_on_too_few_collectives_get_no_align_clocks_advice(tmp_path_factory, tmp_path):
    """One step: the offsets (3.5 ms apart) rest on 5 collectives, fewer than the rule's 8: the
    warning says so and that the waiting figures are not reliable, and nowhere advises
    --align_clocks. TraceLens's sheets keep the clocks as recorded."""
    d = _fixture(tmp_path_factory, "thin", steps=1, seed=1, clock_offsets_us=OFFSETS_US)
    out = tmp_path / "csvs"
    res = run("collective-report", "--trace_dir", d, "--world_size", 4, "--output_csvs_dir", out)
    assert res.returncode == 0, res.stderr
    assert "--align_clocks" not in res.stderr, res.stderr
    warning = [line for line in res.stderr.splitlines() if "CLOCK OFFSETS UNRELIABLE" in line]
    assert len(warning) == 1, res.stderr
    assert "rest on as few as 5 collectives" in warning[0] and "waiting figures are not reliable" in warning[0]
    assert "CLOCKS DISAGREE" not in res.stderr
    for sheet in ("data_quality.csv", "clock_alignment.csv"):
        text = (out / sheet).read_text()
        assert "--align_clocks" not in text, (sheet, text)
    assert "too few collectives" in (out / "clock_alignment.csv").read_text()
    rows = list(csv.DictReader(open(out / "clock_alignment.csv")))
    assert {r["applied"] for r in rows} == {"False"}   # TraceLens's sheets: clocks as recorded


def test_well_determined_offsets_keep_the_align_clocks_advice(offsets, tmp_path):
    res = run("collective-report", "--trace_dir", offsets, "--world_size", 4, "--output_csvs_dir", tmp_path / "c")
    assert res.returncode == 0, res.stderr
    line = next(line for line in res.stderr.splitlines() if "CLOCKS DISAGREE" in line)
    assert "rerun with --align_clocks for the aligned view" in line

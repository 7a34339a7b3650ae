"""Every messy-run mode of the fixture generator through the commands a user
runs (issue #41 item 5): each still answers, its confidence comes first and
names the injected problem, and no clock disagreement is made up."""
import os
import subprocess
import sys

import pytest

import generate_fixture

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")
BASE = dict(ranks=4, steps=2, layout="old", fill_ops=12, seed=2)

#: mode -> (generator options, world size, words the confidence lines must hold)
MODES = {
    "sampled_world": (dict(ranks=8, present_ranks=[0, 3, 5]), 8, ["3 of 8 ranks"]),
    "partial_samples": (dict(sample_fraction=0.7), 4, ["4 of 4 ranks", "miss some of their members"]),
    "shifted_windows": (dict(window_shift_steps=[0, 1, 0, 1]), 4, ["different steps", "#12, #14"]),
    # clock offsets from 10 us (kept: small against the skew) to 1 s (applied: well determined)
    "offset_10us": (dict(clock_offsets_us=[0, 10, 0, 10]), 4, ["Confidence: high", "clocks as recorded"]),
    "offset_1ms": (dict(clock_offsets_us=[0, 1_000, 0, 1_000]), 4, ["Confidence: high", "offsets of up to 1 ms applied"]),
    "offset_1s": (dict(clock_offsets_us=[0, 1_000_000, 0, 1_000_000]), 4, ["Confidence: high", "applied"]),
    "truncated_rank": (dict(truncate_rank=1), 4, ["truncated"]),
    "no_collectives_rank": (dict(no_collectives_rank=2), 4, ["no collective kernels (2)"]),
    "too_few": (dict(max_collectives=1), 4, ["rests on 1 collective"]),
    "issue41": (generate_fixture.ISSUE41_SHAPE, 128, ["2 of 128 ranks"]),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for name, (options, world, _) in MODES.items():
        d = tmp_path_factory.mktemp(name)
        generate_fixture.generate(str(d), **(options if name == "issue41" else dict(BASE, **options)))
        out[name] = (str(d), world)
    return out


def _confidence_lines(text):
    lines = text.splitlines()
    assert lines and lines[0].startswith("Confidence:"), text
    return "\n".join([lines[0]] + [line for line in lines[1:] if line.startswith("  - ")])


@pytest.mark.parametrize("mode", list(MODES))
def test_blockers_answers_with_its_confidence_first(runs, mode):
    d, _ = runs[mode]
    proc = subprocess.run([BIN, "blockers", d], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    head = _confidence_lines(proc.stdout)
    for words in MODES[mode][2]:
        assert words in head, (words, head)
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("mode", list(MODES))
def test_collective_report_answers_without_made_up_clock_disagreement(runs, mode, tmp_path):
    d, world = runs[mode]
    out = tmp_path / "csvs"
    proc = subprocess.run([BIN, "collective-report", "--trace_dir", d, "--world_size", str(world),
                           "--allow_missing_ranks", "--output_csvs_dir", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # injected offsets are real ones, not applied to TraceLens's sheets: their warning is right there
    assert "CLOCKS DISAGREE" not in proc.stderr or mode.startswith("offset_")
    assert "CLOCK OFFSETS UNRELIABLE" not in proc.stderr
    quality = (out / "data_quality.csv").read_text()
    assert "clock_offset_steps_disagree" not in quality
    if mode == "shifted_windows":
        assert "steps_not_shared" in quality


def test_issue41_blockers_claims_no_straggler(runs):
    """Both collectives' other 126 members are absent: no 'last to arrive' claim, no 617 ms offset."""
    proc = subprocess.run([BIN, "blockers", runs["issue41"][0]], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert not any(line.startswith("Straggler: rank") for line in proc.stdout.splitlines()), proc.stdout

"""The step rule in staged runs (issue #41 items 0 and 4): a rank whose trace
``extract`` summarized (STREAMTRACE_SUMMARIES_MIN_BYTES, 0 in the tests)
reaches ``align`` as a summary, not as events; its ProfilerStep ops must come
with it, so that ``extract | align | report`` pairs within steps and reports
the steps left out exactly as the one-shot ``collective-report`` does."""
import os
import subprocess
import sys

import pytest

import generate_fixture

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")

#: fixture -> (generator options, world size)
RUNS = {
    "shifted_windows": (dict(ranks=4, steps=2, layout="old", fill_ops=12, seed=11, window_shift_steps=[0, 1, 0, 1]),
                        4),
    "issue41": (generate_fixture.ISSUE41_SHAPE, 128),
    "issue41_shifted": (dict(generate_fixture.ISSUE41_SHAPE, window_shift_steps=[0, 1] + [0] * 126), 128),
}


def _sh(cmd, env):
    return subprocess.run(["bash", "-c", "set -o pipefail; " + cmd], capture_output=True, text=True, timeout=300,
                          env=env)


@pytest.mark.parametrize("name", list(RUNS))
def test_staged_pipes_pair_within_steps_like_the_one_shot(tmp_path, name):
    options, world = RUNS[name]
    d = tmp_path / "run"
    truth = generate_fixture.generate(str(d), **options)
    env = dict(os.environ, STREAMTRACE_SUMMARIES_MIN_BYTES="0")   # every rank summarized
    pipe, one = tmp_path / "pipe", tmp_path / "one"
    stream = tmp_path / "raw.stev"
    r = _sh(f"'{BIN}' extract --trace_dir '{d}' --world_size {world} --allow_missing_ranks -o '{stream}'", env)
    assert r.returncode == 0, r.stderr
    assert b"align.rank" in stream.read_bytes()   # the ranks were summarized: the path under test
    r = _sh(f"'{BIN}' extract --trace_dir '{d}' --world_size {world} --allow_missing_ranks | '{BIN}' align "
            f"| '{BIN}' report --output_csvs_dir '{pipe}' -q", env)
    assert r.returncode == 0, r.stderr
    r = _sh(f"'{BIN}' collective-report --trace_dir '{d}' --world_size {world} --allow_missing_ranks "
            f"--output_csvs_dir '{one}' -q", env)
    assert r.returncode == 0, r.stderr
    names = sorted(os.listdir(one))
    assert names == sorted(os.listdir(pipe)) and "nccl_long.csv" in names
    for n in names:
        assert (pipe / n).read_text() == (one / n).read_text(), n
    quality = (pipe / "data_quality.csv").read_text()
    left_out = truth["messy"].get("left_out_steps")
    if left_out:
        assert "steps_not_shared" in quality and f"{len(left_out)} step(s) left out" in quality
    assert "CLOCKS DISAGREE" not in quality and "CLOCK OFFSETS UNRELIABLE" not in quality

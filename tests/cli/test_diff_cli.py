"""``streamtrace diff`` as a user runs it: through the installed command,
on trace directories, discovery flags and streams; the gate's exit codes;
its workbook, CSVs and HTML page (drawn in chromium); bad input is one
line, exit 1, and nothing written."""
import os
import subprocess
import sys

import pandas as pd
import pytest

import browser
import generate_fixture as gf

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")


def run(*args, timeout=300):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A baseline, a run with a straggler (rank 2), and the baseline as a stream."""
    root = tmp_path_factory.mktemp("diff_cli")
    base, strag = root / "base", root / "straggler"
    gf.generate(str(base), ranks=4, steps=3, seed=3)
    gf.generate(str(strag), ranks=4, steps=3, seed=3, straggler_rank=2)
    stream = root / "base.stev"
    res = run("extract", "--trace_dir", base, "--world_size", 4, "-o", stream, "-q")
    assert res.returncode == 0, res.stderr
    return dict(root=root, base=base, straggler=strag, stream=stream)


def test_gate_fails_with_exit_3_and_names_the_conditions(runs):
    res = run("diff", runs["stream"], runs["straggler"], "--fail_if", "new_straggler", "--fail_if", "step_time:+5%",
              "--fail_if", "busbw:-50%")
    assert res.returncode == 3, res.stdout + res.stderr
    out = res.stdout.splitlines()
    assert out[0].startswith("Baseline confidence: high (4 of 4 ranks")
    assert out[1].startswith("Candidate confidence: high (4 of 4 ranks")
    assert "1. rank 2 is the new straggler" in res.stdout
    gate = out[out.index(next(line for line in out if line.startswith("Gate: FAILED"))):]
    assert gate[0] == "Gate: FAILED (2 violations):"
    assert gate[1].startswith("  new_straggler: rank 2 is the new straggler")
    assert gate[2].startswith("  step_time:+5%: run step_time")
    assert len(gate) == 3   # busbw:-50% passed


def test_gate_passes_with_exit_0(runs):
    res = run("diff", runs["base"], runs["stream"], "--fail_if", "new_straggler", "--fail_if", "step_time:+1%")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "No change beyond the run-to-run spread." in res.stdout
    assert res.stdout.rstrip().endswith("Gate: passed (2 conditions)")


def test_discovery_flags_per_side(runs):
    pattern = str(runs["straggler"] / "rank*_trace.json")
    res = run("diff", "--baseline_dir", runs["base"], "--candidate_pattern", pattern, "--candidate_world_size", 4,
              "--fail_if", "new_straggler")
    assert res.returncode == 3, res.stdout + res.stderr
    assert "rank 2 is the new straggler" in res.stdout


def test_malformed_condition_is_a_usage_error_naming_it(runs, tmp_path):
    out = tmp_path / "d.xlsx"
    res = run("diff", runs["base"], runs["straggler"], "--fail_if", "step_time:5%", "--output_xlsx_path", out)
    assert res.returncode == 2
    assert "'step_time:5%'" in res.stderr and "signed amount" in res.stderr
    assert not out.exists()


@pytest.mark.parametrize("args,words", [
    (["BASE"], "no candidate"),
    (["BASE", "BASE", "BASE"], "unexpected extra argument"),
    (["--baseline_dir", "BASE", "--baseline_glob", "x*", "BASE"], "give one of --baseline_dir"),
    (["BASE", "BASE", "--candidate_world_size", "4"], "--candidate_world_size goes with"),
])
def test_usage_errors(runs, args, words):
    res = run("diff", *[str(runs["base"]) if a == "BASE" else a for a in args])
    assert res.returncode == 2 and words in res.stderr, res.stderr


def _bad_inputs(root):
    (root / "not_a_trace.json").write_text("hello, I am not a trace\n")
    data = (root / "base.stev").read_bytes()
    (root / "truncated.stev").write_bytes(data[: len(data) // 2])
    return {"missing": root / "nowhere", "not a trace": root / "not_a_trace.json",
            "truncated stream": root / "truncated.stev"}


@pytest.mark.parametrize("which", ["missing", "not a trace", "truncated stream"])
@pytest.mark.parametrize("side", ["baseline", "candidate"])
def test_bad_input_is_one_line_exit_1_nothing_written(runs, tmp_path, which, side):
    bad = _bad_inputs(runs["root"])[which]
    pair = [bad, runs["base"]] if side == "baseline" else [runs["base"], bad]
    outs = dict(xlsx=tmp_path / "d.xlsx", csvs=tmp_path / "csvs", html=tmp_path / "d.html")
    res = run("diff", *pair, "--output_xlsx_path", outs["xlsx"], "--output_csvs_dir", outs["csvs"],
              "--output_html_path", outs["html"], "--fail_if", "new_straggler")
    assert res.returncode == 1, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0], res.stderr
    assert res.stdout == ""
    assert not any(p.exists() for p in outs.values())
    assert sorted(os.listdir(tmp_path)) == []


def test_sheets_and_page(runs, tmp_path):
    xlsx, csvs, page = tmp_path / "diff.xlsx", tmp_path / "csvs", tmp_path / "diff.html"
    res = run("diff", runs["base"], runs["straggler"], "--output_xlsx_path", xlsx, "--output_csvs_dir", csvs,
              "--output_html_path", page, "--fail_if", "new_straggler")
    assert res.returncode == 3, res.stderr
    assert {f"wrote {p}" for p in (xlsx, csvs, page)} <= set(res.stderr.splitlines())
    names = {f[:-4] for f in os.listdir(csvs)}
    assert {"diff_changes", "diff_steps", "diff_collectives", "diff_stragglers", "diff_blocking_kernels",
            "diff_blocking_host_ops", "diff_gpu_time", "diff_notes", "diff_confidence", "diff_gate",
            "diff_critical_path"} <= names
    changes = pd.read_csv(csvs / "diff_changes.csv")
    assert changes.iloc[0]["status"] == "new straggler" and changes.iloc[0]["item"] == "rank 2"
    workbook = pd.read_excel(xlsx, sheet_name=None)
    assert set(workbook) == names
    assert workbook["diff_gate"].iloc[0]["passed"] == False   # noqa: E712
    loaded = browser.load(str(page))
    assert loaded.errors() == []
    divs = loaded.chart_divs()
    assert "changes" in divs
    base = {k[len("baseline-"):] for k in divs if k.startswith("baseline-")}
    cand = {k[len("candidate-"):] for k in divs if k.startswith("candidate-")}
    assert base and base == cand, divs.keys()
    for key, inner in divs.items():
        assert 'class="main-svg"' in inner, f"chart {key} has no plot"
    png = browser.screenshot(str(page), os.path.join(browser.artifacts_dir(), "diff.png"))
    browser.assert_not_blank(png)


def test_the_documented_ci_job(runs, tmp_path):
    """docs/diff.md's CI script as written: the first run becomes the baseline,
    a regression exits 3 and keeps the baseline, a clean run passes and is promoted."""
    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "diff.md")).read()
    start = doc.index("#!/bin/sh")
    script = doc[start:doc.index("\nexit $status\n", start) + len("\nexit $status")]
    script = script.replace("/ci/streamtrace", str(tmp_path / "kept"))
    (tmp_path / "kept").mkdir()
    (tmp_path / "gate.sh").write_text(script + "\n")
    env = dict(os.environ, PATH=os.path.dirname(BIN) + os.pathsep + os.environ["PATH"])

    def job(run_dir, ident):
        return subprocess.run(["sh", str(tmp_path / "gate.sh"), str(run_dir)], capture_output=True, text=True,
                              env=dict(env, CI_PIPELINE_ID=ident), cwd=tmp_path, timeout=300)

    baseline = tmp_path / "kept" / "baseline.stev"
    first = job(runs["base"], "1")
    assert first.returncode == 0 and "no baseline yet" in first.stdout, first.stdout + first.stderr
    kept = baseline.read_bytes()
    slow = job(runs["straggler"], "2")
    assert slow.returncode == 3, slow.stdout + slow.stderr
    assert "new_straggler: rank 2" in slow.stdout and "performance regression: see diff-2.html" in slow.stdout
    assert (tmp_path / "diff-2.html").exists() and baseline.read_bytes() == kept
    clean = job(runs["base"], "3")
    assert clean.returncode == 0 and "Gate: passed (3 conditions)" in clean.stdout, clean.stdout + clean.stderr
    assert baseline.read_bytes() == (tmp_path / "kept" / "run-3.stev").read_bytes()


def test_no_output_holds_a_url_credential(runs, tmp_path):
    """Runs read from a real HTTP server on 127.0.0.1 through URLs with a user,
    a password and a query string: neither the text, stderr, the workbook,
    the CSVs nor the page holds any of them."""
    import http.server
    import threading

    from test_secrets import PASSWORD, TOKEN, USER, _Files, _free_port, _secrets_in

    if not (runs["root"] / "straggler.stev").exists():
        res = run("extract", "--trace_dir", runs["straggler"], "--world_size", 4, "-o", runs["root"] / "straggler.stev",
                  "-q")
        assert res.returncode == 0, res.stderr
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", _free_port()), _Files)
    srv.root = str(runs["root"])
    srv.daemon_threads = False
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        host = f"127.0.0.1:{srv.server_address[1]}"
        stream = f"http://{USER}:{PASSWORD}@{host}/base.stev?token={TOKEN}"
        candidate = f"http://{USER}:{PASSWORD}@{host}/straggler.stev?token={TOKEN}"
        xlsx, csvs, page = tmp_path / "d.xlsx", tmp_path / "csvs", tmp_path / "d.html"
        res = subprocess.run([BIN, "diff", stream, candidate, "--fail_if", "new_straggler", "--output_xlsx_path",
                              str(xlsx), "--output_csvs_dir", str(csvs), "--output_html_path", str(page)],
                             capture_output=True, timeout=300)
        assert res.returncode == 3, res.stderr
        assert b"rank 2 is the new straggler" in res.stdout
        found = _secrets_in(res.stdout) + _secrets_in(res.stderr)
        for path in [xlsx, page] + [csvs / f for f in os.listdir(csvs)]:
            found += _secrets_in(path.read_bytes())
        assert not found
        assert f"http://{host}/base.stev".encode() in page.read_bytes()
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(60)

"""``streamtrace fuse`` through the CLI: CliRunner (checked through the API) and
real processes (stdout pipe, exit codes)."""
import json
import os
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

import generate_fixture as gen
from fuse_reference import check_rank, input_events, load_strict, select
from streamtrace.cli import main
from streamtrace.fuse import fuse


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuse_cli")
    truth = gen.generate(str(d), ranks=4, format="json.gz", seed=11)
    return str(d), truth


def paths(run):
    d, truth = run
    return [os.path.join(d, truth["files"][str(r)]) for r in range(truth["ranks"])]


def run(*args):
    return CliRunner().invoke(main, list(map(str, args)), catch_exceptions=False)


def _events(path):
    doc = load_strict(str(path))
    return doc, doc["traceEvents"]


def test_cli_trace_dir_matches_api(tmp_path, run_dir):
    out = tmp_path / "merged.json.gz"
    res = run("fuse", "--trace_dir", run_dir[0], "--world_size", 4, "-o", out, "-j", 2)
    assert res.exit_code == 0, res.output
    assert "wrote" in res.stderr and "from 4 rank(s)" in res.stderr
    doc, events = _events(out)
    api = tmp_path / "api.json"
    fuse(paths(run_dir), str(api))
    assert events == load_strict(str(api))["traceEvents"]
    for r, p in enumerate(paths(run_dir)):
        check_rank(doc, r, select(input_events(p)[0]))


@pytest.mark.parametrize("flags,opts", [
    (["--ranks", "0,2-3"], {"ranks": [0, 2, 3]}),
    (["--cat", "kernel,gpu_memcpy"], {"cats": ["kernel", "gpu_memcpy"]}),
    (["--name", "^aten::(mm|addmm)$"], {"name_regex": "^aten::(mm|addmm)$"}),
    (["--nccl_only"], {"nccl_only": True}),
    (["--include-pyfunc", "--keep_spans"], {"include_pyfunc": True, "keep_spans": True}),
    (["--window", "5000000200:5000010000.5"], {"window": "5000000200:5000010000.5"}),
    (["--time_base"], {"time_base": True}),
], ids=["ranks", "cat", "name", "nccl_only", "pyfunc+spans", "window", "time_base"])
def test_cli_flags_are_the_api_options(tmp_path, run_dir, flags, opts):
    out = tmp_path / "cli.json"
    res = run("fuse", *paths(run_dir), "-o", out, "-q", *flags)
    assert res.exit_code == 0, res.output
    api = tmp_path / "api.json"
    fuse(paths(run_dir), str(api), **opts)
    assert _events(out)[1] == _events(api)[1]


def test_cli_other_discovery_flags(tmp_path, run_dir):
    d = run_dir[0]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert run("fuse", "--trace_pattern", os.path.join(d, "rank*_trace.json.gz"), "--world_size", 4,
               "-o", a, "-q").exit_code == 0
    assert run("fuse", "--trace_glob", os.path.join(d, "*.json.gz"), "--rank_regex", r"rank(?P<rank>\d+)_",
               "-o", b, "-q").exit_code == 0
    assert _events(a)[1] == _events(b)[1]
    assert sorted(_events(a)[0]["streamtrace"]["inputs"]) == ["0", "1", "2", "3"]


def test_cli_errors(tmp_path, run_dir):
    p = paths(run_dir)
    out = tmp_path / "x.json"
    assert run("fuse", *p).exit_code == 2                                    # -o is required
    assert run("fuse", *p, "-o", out, "--ranks", "a").exit_code == 2
    res = run("fuse", *p, "-o", out, "--window", "9:1")
    assert res.exit_code == 1 and "END is before START" in res.stderr and "Traceback" not in res.output
    res = run("fuse", "--trace_dir", tmp_path / "nope", "-o", out)
    assert res.exit_code == 1 and "not a directory" in res.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X" "name": 1}]}')
    res = run("fuse", p[0], bad, "-o", out)
    assert res.exit_code == 1 and "bad.json" in res.stderr and "byte" in res.stderr
    res = run("fuse", *p, "-o", tmp_path / "missing" / "x.json")
    assert res.exit_code == 1 and "output directory" in res.stderr
    assert not out.exists() and not [f for f in os.listdir(tmp_path) if f.startswith(".streamtrace")]


def test_cli_truncated_input_warns_and_succeeds(tmp_path):
    d = tmp_path / "run"
    truth = gen.generate(str(d), ranks=2, format="json", truncate_rank=0, seed=12)
    out = tmp_path / "m.json"
    res = run("fuse", "--trace_dir", d, "-o", out)
    assert res.exit_code == 0
    assert "warning:" in res.stderr and truth["files"]["0"] in res.stderr and "truncated" in res.stderr
    load_strict(str(out))


def _streamtrace():
    exe = shutil.which("streamtrace", path=os.path.dirname(sys.executable))
    return [exe] if exe else [sys.executable, "-m", "streamtrace.cli"]


def test_real_process_to_stdout_and_zstd(tmp_path, run_dir):
    proc = subprocess.run(_streamtrace() + ["fuse", *paths(run_dir), "-o", "-", "-j", "2", "--nccl_only"],
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    doc = load_strict(proc.stdout)
    assert all(e["cat"] == "kernel" and "nccl" in e["name"].lower()
               for e in doc["traceEvents"] if "rank" in e.get("args", {}) and e["ph"] != "M")
    out = tmp_path / "m.json.zst"
    proc = subprocess.run(_streamtrace() + ["fuse", "--trace_dir", run_dir[0], "-o", str(out), "-j", "2"],
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(json.dumps(load_strict(str(out))["traceEvents"], default=str)) == \
        json.loads(json.dumps(load_strict(proc_json(run_dir, tmp_path))["traceEvents"], default=str))
    proc = subprocess.run(_streamtrace() + ["fuse", str(tmp_path / "nope.json"), "-o", "-"],
                          capture_output=True, timeout=60)
    assert proc.returncode == 1 and b"no such file" in proc.stderr and proc.stdout == b""


def proc_json(run_dir, tmp_path):
    out = tmp_path / "ref.json"
    fuse(paths(run_dir), str(out), jobs=1)
    return str(out)


def test_help_documents_every_flag():
    res = run("fuse", "--help")
    for flag in ("--trace_dir", "--trace_pattern", "--trace_glob", "--rank_regex", "--world_size", "--output",
                 "--ranks", "--include_pyfunc", "--cat", "--name", "--window", "--nccl_only", "--align_clocks",
                 "--time_base", "--jobs", "--keep_spans"):
        assert flag in res.output, flag


def test_cli_output_has_unique_keys_at_every_depth(tmp_path):
    """Duplicate keys nested in args, and keys equal only once their escapes
    are decoded: the output parses strictly, each object holding the last value."""
    trace = tmp_path / "rank0_trace.json"
    trace.write_bytes(
        b'{"traceEvents": [\n'
        b' {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 10, "dur": 5,'
        b'  "\\u0061rgs": {"Input Dims": [[2, 3]], "a": 1, "\\u0061": 2,'
        b'   "cfg": {"k": 1, "k": {"x": 1, "\\u0078": 2}, "k\\/v": [{"s": 1, "s": 2}], "k/v": [{"s": 3}]}}},\n'
        b' {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 12, "dur": 2,'
        b'  "args": {"grid": [1, 1, 1], "n\\u0061me": "first", "name": "second"}, "n\\u0061me": "gemm2"}\n'
        b']}\n')
    out = tmp_path / "fused.json"
    res = run("fuse", trace, "-o", out, "-q")
    assert res.exit_code == 0, res.output
    doc = load_strict(str(out))  # raises on a duplicate key at any depth
    ev = {e["name"]: e for e in doc["traceEvents"] if e.get("args", {}).get("rank") == 0}
    assert set(ev) == {"op", "gemm2"}
    op = ev["op"]["args"]
    assert op["a"] == 2 and op["Input Dims"] == [[2, 3]]
    assert op["cfg"] == {"k": {"x": 2}, "k/v": [{"s": 3}]}
    assert ev["gemm2"]["args"]["name"] == "second"

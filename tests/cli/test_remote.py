"""Traces and outputs at URLs, against real servers on 127.0.0.1 started here:
moto's S3 server (as s3fs's own tests run it) and an HTTP server with Range
support that can refuse (403) or cut a response in the middle of its body.

Every result is compared with the same command on the local copies; every
fault must give one line naming the URL (without its credentials), exit 1,
and leave nothing at the output."""
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import urllib.parse

import fsspec
import pandas as pd
import pytest
from click.testing import CliRunner
from moto.server import ThreadedMotoServer

import generate_fixture
from http_ranges import send_range_headers
from streamtrace import read_stream
from streamtrace.cli import main
from streamtrace.remote import is_url, local_path, normalised, redact, redact_text

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")
BUCKET = "traces"
#: small ranged requests, so that a cut trace still has whole blocks before the cut
SMALL_BLOCKS = "16384"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ servers

@pytest.fixture(scope="module", autouse=True)
def _fsspec_thread_stopped():
    """fsspec runs its I/O on an event loop in a thread it starts once per
    process; later tests fork and need no thread but the main one, so stop
    it (and its resolver pool) after this module; fsspec starts anew if needed."""
    yield
    import asyncio

    from fsspec import asyn

    for cls in (type(fsspec.filesystem("s3")), type(fsspec.filesystem("http"))):
        cls.clear_instance_cache()
    loop, thread = asyn.loop[0], asyn.iothread[0]
    if loop is not None:
        asyncio.run_coroutine_threadsafe(loop.shutdown_default_executor(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(60)
        asyn.loop[0] = asyn.iothread[0] = None


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto S3 server, the environment pointing at it (AWS_ENDPOINT_URL, as
    a user of an S3-compatible store sets it), and the fixture run uploaded
    under s3://traces/run/."""
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        fs = fsspec.filesystem("s3", skip_instance_cache=True, use_listings_cache=False)
        fs.mkdir(BUCKET)
        fs.mkdir("empty-bucket")
        yield fs
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("remote_run")
    truth = generate_fixture.generate(str(d), ranks=4, steps=2, fill_ops=12, tp=2, straggler_rank=1,
                                      slow_kernel_rank=2, seed=31)
    os.unlink(d / "truth.json")   # the traces only, as a run's folder holds them
    return str(d), truth


@pytest.fixture(scope="module")
def s3_run(s3, run_dir):
    d, _ = run_dir
    for name in sorted(os.listdir(d)):
        s3.put_file(os.path.join(d, name), f"{BUCKET}/run/{name}")
    return f"s3://{BUCKET}/run"


class _Handler(http.server.BaseHTTPRequestHandler):
    """GET and HEAD with single byte ranges (fsspec's HTTP file system needs
    Content-Length from HEAD and 206 answers to random access); /forbidden/...
    answers 403; a file in ``cuts`` has its body cut at that byte."""

    protocol_version = "HTTP/1.1"
    timeout = 2   # an idle kept-alive connection ends its thread, so the server's close can join it

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self._serve(body=False)

    def do_GET(self):
        self._serve(body=True)

    def _serve(self, body):
        path = urllib.parse.urlsplit(self.path).path
        self.server.requests.append((self.command, path, self.headers.get("Range")))
        if path.startswith("/forbidden/"):
            return self._status(403)
        full = os.path.join(self.server.root, path.lstrip("/"))
        if not os.path.isfile(full):
            return self._status(404)
        with open(full, "rb") as f:
            data = f.read()
        start, end = send_range_headers(self, data)
        if not body:
            return
        stall = self.server.stalls.get(path)
        if stall is not None:   # [GETs to let through, event set when stalled, event that releases]
            if self.command == "GET":
                stall[0] -= 1
                if stall[0] < 0:
                    stall[1].set()
                    stall[2].wait(60)
        cut = self.server.cuts.get(path)
        if cut is not None and end >= cut:   # the connection dies mid-body
            self.wfile.write(data[start:max(start, cut)])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(data[start:end + 1])

    def _status(self, code):
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture(scope="module")
def http_root(tmp_path_factory, run_dir):
    """An HTTP server on 127.0.0.1 serving a copy of the run under /run/."""
    root = tmp_path_factory.mktemp("http_root")
    shutil.copytree(run_dir[0], root / "run")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", _free_port()), _Handler)
    server.root, server.cuts, server.requests, server.stalls = str(root), {}, [], {}
    server.daemon_threads = False   # server_close joins every request's thread: none outlives the module
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def run(*args, env=None):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def one_line_error(output, url_fragment):
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, output
    assert lines[0].startswith("Error: ") and url_fragment in lines[0], output
    assert "Traceback" not in output
    return lines[0]


def without_sources(stream_bytes):
    """The ranks of a stream with each META's ``source`` dropped (a URL there,
    a local path here: the one field allowed to differ)."""
    ranks = read_stream(stream_bytes)
    out = {}
    for r, data in ranks.items():
        meta = dict(data.meta)
        meta.pop("source")
        out[r] = (meta, data.events.tobytes(), data.kernels.tobytes(), data.comms.tobytes(), data.strings)
    return out


# ------------------------------------------------------------------ the URL helpers

def test_url_helpers():
    assert is_url("s3://b/k") and is_url("gs://b/k") and is_url("https://h/x.json")
    assert is_url("simplecache::s3://b/k")
    assert not is_url("/tmp/x.json") and not is_url("run/x.json") and not is_url("-")
    assert not is_url("file:///tmp/x.json")   # a local path, taken locally
    assert local_path("file:///tmp/a%20b.json") == "/tmp/a b.json"
    assert local_path("/tmp/x") == "/tmp/x"
    assert redact("https://user:pw@host:9/p/x.json?X-Amz-Signature=abc#f") == "https://host:9/p/x.json"
    assert redact("/local/path?x") == "/local/path?x"
    assert redact_text("s3://k:s@b/x: no such object, see https://h/y?token=t") == \
        "s3://b/x: no such object, see https://h/y"
    assert normalised("S3://B/run//x/../y.json") == normalised("s3://b/run/y.json")


def test_local_runs_do_not_import_fsspec(run_dir, tmp_path):
    """A local run keeps its code path: fsspec (and s3fs, aiohttp) never load."""
    d, _ = run_dir
    code = ("import sys\nfrom click.testing import CliRunner\nfrom streamtrace.cli import main\n"
            f"r = CliRunner().invoke(main, ['extract', '--trace_dir', {d!r}, '--world_size', '4', "
            f"'-o', {str(tmp_path / 'x.stev')!r}])\n"
            "assert r.exit_code == 0, r.output\n"
            "print(sorted(m for m in ('fsspec', 's3fs', 'aiohttp', 'botocore') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_file_url_is_a_local_path(run_dir, tmp_path):
    d, _ = run_dir
    local = invoke("extract", "--trace_dir", d, "--world_size", 4, "-o", tmp_path / "a.stev")
    via_url = invoke("extract", "--trace_dir", "file://" + d, "--world_size", 4, "-o", "file://" + str(tmp_path / "b.stev"))
    assert local.exit_code == 0 and via_url.exit_code == 0, via_url.output
    assert (tmp_path / "a.stev").read_bytes() == (tmp_path / "b.stev").read_bytes()


# ------------------------------------------------------------------ S3: same results as local

def test_extract_from_s3_equals_local(s3, s3_run, run_dir, tmp_path):
    d, _ = run_dir
    assert invoke("extract", "--trace_dir", d, "--world_size", 4, "-o", tmp_path / "local.stev").exit_code == 0
    res = invoke("extract", "--trace_dir", s3_run, "--world_size", 4, "-o", f"s3://{BUCKET}/out/run.stev")
    assert res.exit_code == 0, res.output
    remote = s3.cat_file(f"{BUCKET}/out/run.stev")
    assert without_sources(remote) == without_sources((tmp_path / "local.stev").read_bytes())
    assert read_stream(remote)[0].meta["source"] == f"{s3_run}/rank0_trace.json"


@pytest.mark.parametrize("how", ["--trace_glob", "--trace_pattern", "paths"])
def test_s3_discovery_modes(s3, s3_run, run_dir, tmp_path, how):
    d, _ = run_dir
    local = [os.path.join(d, f"rank{r}_trace.json") for r in range(4)] if how == "paths" else \
        ["--trace_dir", d, "--world_size", 4]
    assert invoke("extract", *local, "-o", tmp_path / "local.stev").exit_code == 0
    if how == "--trace_glob":
        args = ["--trace_glob", f"{s3_run}/rank*_trace.json", "--world_size", 4]
    elif how == "--trace_pattern":
        args = ["--trace_pattern", f"{s3_run}/rank*_trace.json", "--world_size", 4]
    else:
        args = [f"{s3_run}/rank{r}_trace.json" for r in range(4)]
    res = invoke("extract", *args, "-o", tmp_path / "remote.stev")
    assert res.exit_code == 0, res.output
    assert without_sources((tmp_path / "remote.stev").read_bytes()) == \
        without_sources((tmp_path / "local.stev").read_bytes())


def test_collective_report_blocking_from_s3_equals_local(s3, s3_run, run_dir, tmp_path):
    """--trace_dir s3://... with --blocking_analysis, CSVs and workbook written
    to S3: the sheets equal the local run's, byte for byte."""
    d, _ = run_dir
    local = invoke("collective-report", "--trace_dir", d, "--world_size", 4, "--blocking_analysis",
                   "--output_csvs_dir", tmp_path / "csv", "--output_xlsx_path", tmp_path / "r.xlsx")
    assert local.exit_code == 0, local.output
    res = run("collective-report", "--trace_dir", s3_run, "--world_size", 4, "--blocking_analysis",
              "--output_csvs_dir", f"s3://{BUCKET}/out/csv", "--output_xlsx_path", f"s3://{BUCKET}/out/r.xlsx")
    assert res.returncode == 0, res.stderr
    names = sorted(os.listdir(tmp_path / "csv"))
    assert "collective_blockers.csv" in names
    assert sorted(os.path.basename(p) for p in s3.ls(f"{BUCKET}/out/csv")) == names
    for name in names:
        assert s3.cat_file(f"{BUCKET}/out/csv/{name}") == (tmp_path / "csv" / name).read_bytes(), name
    s3.get_file(f"{BUCKET}/out/r.xlsx", str(tmp_path / "remote.xlsx"))
    ours = pd.read_excel(tmp_path / "remote.xlsx", sheet_name=None)
    theirs = pd.read_excel(tmp_path / "r.xlsx", sheet_name=None)
    assert list(ours) == list(theirs)
    for sheet in ours:
        pd.testing.assert_frame_equal(ours[sheet], theirs[sheet])


def test_collective_report_default_output_beside_s3_traces(s3, s3_run, run_dir, tmp_path):
    """No output named: nccl_analysis_report.xlsx beside the traces, as for a
    local --trace_dir; and TraceLens's Python entry point takes the URL too."""
    from streamtrace.tracelens import generate_collective_report

    res = run("collective-report", "--trace_dir", s3_run, "--world_size", 4)
    assert res.returncode == 0, res.stderr
    assert s3.exists(f"{BUCKET}/run/nccl_analysis_report.xlsx")
    s3.rm_file(f"{BUCKET}/run/nccl_analysis_report.xlsx")
    sheets = generate_collective_report(trace_dir=s3_run, world_size=4, output_csvs_dir=str(tmp_path / "csv"))
    local = generate_collective_report(trace_dir=run_dir[0], world_size=4, output_csvs_dir=str(tmp_path / "lcsv"))
    assert list(sheets) == list(local)
    for name in os.listdir(tmp_path / "lcsv"):
        assert (tmp_path / "csv" / name).read_bytes() == (tmp_path / "lcsv" / name).read_bytes(), name


def test_blockers_from_s3_equals_local(s3, s3_run, run_dir):
    d, truth = run_dir
    local = invoke("blockers", d)
    remote = run("blockers", s3_run + "/")
    assert local.exit_code == 0 and remote.returncode == 0, remote.stderr
    assert remote.stdout == local.stdout
    assert f"rank {truth['straggler_summary']['straggler_rank']}" in remote.stdout


def _normalised_fused(data, d, url):
    """A fused trace with its per-run fields evened out: the sources named
    (local path vs URL) and the seconds the run took."""
    import gzip

    text = gzip.decompress(data).decode()
    text = text.replace(url, "SRC").replace(d, "SRC")
    return re.sub(r'"seconds":[0-9.e+-]+', '"seconds":0', text)


def test_fuse_to_s3_equals_local(s3, s3_run, run_dir, tmp_path):
    d, _ = run_dir
    local = run("fuse", "--trace_dir", d, "--world_size", 4, "-o", tmp_path / "fused.json.gz")
    remote = run("fuse", "--trace_dir", s3_run, "--world_size", 4, "-o", f"s3://{BUCKET}/out/fused.json.gz")
    assert local.returncode == 0 and remote.returncode == 0, remote.stderr
    ours = _normalised_fused(s3.cat_file(f"{BUCKET}/out/fused.json.gz"), d, s3_run)
    assert ours == _normalised_fused((tmp_path / "fused.json.gz").read_bytes(), d, s3_run)
    assert '"seconds"' in ours and "SRC/rank0_trace.json" in ours


def test_stream_stages_read_s3(s3, s3_run, run_dir, tmp_path):
    """align/correlate/report/dump take a stream at a URL as they take a file."""
    d, _ = run_dir
    stev = tmp_path / "run.stev"
    assert invoke("extract", "--trace_dir", d, "--world_size", 4, "-o", stev).exit_code == 0
    s3.put_file(str(stev), f"{BUCKET}/streams/run.stev")
    url = f"s3://{BUCKET}/streams/run.stev"
    for cmd in (["align"], ["correlate"]):
        a = invoke(*cmd, stev, "-o", tmp_path / "l.stev")
        b = invoke(*cmd, url, "-o", tmp_path / "r.stev")
        assert a.exit_code == 0 and b.exit_code == 0, b.output
        assert (tmp_path / "l.stev").read_bytes() == (tmp_path / "r.stev").read_bytes(), cmd
    a = invoke("report", stev, "--output_csvs_dir", tmp_path / "lcsv")
    b = invoke("report", url, "--output_csvs_dir", tmp_path / "rcsv")
    assert a.exit_code == 0 and b.exit_code == 0, b.output
    for name in os.listdir(tmp_path / "lcsv"):
        assert (tmp_path / "lcsv" / name).read_bytes() == (tmp_path / "rcsv" / name).read_bytes(), name
    a = invoke("dump", "--what", "events", stev)
    b = invoke("dump", "--what", "events", url)
    assert a.exit_code == 0 and a.output == b.output


# ------------------------------------------------------------------ HTTP inputs

def test_extract_and_report_over_http(http_root, run_dir, tmp_path):
    base, _ = http_root
    d, _ = run_dir
    urls = [f"{base}/run/rank{r}_trace.json" for r in range(4)]
    local = invoke("extract", *[os.path.join(d, f"rank{r}_trace.json") for r in range(4)], "-o", tmp_path / "l.stev")
    remote = run("extract", *urls, "-o", tmp_path / "r.stev")
    assert local.exit_code == 0 and remote.returncode == 0, remote.stderr
    assert without_sources((tmp_path / "r.stev").read_bytes()) == without_sources((tmp_path / "l.stev").read_bytes())
    a = invoke("collective-report", *[os.path.join(d, f"rank{r}_trace.json") for r in range(4)],
               "--output_csvs_dir", tmp_path / "lcsv")
    b = invoke("collective-report", *urls, "--output_csvs_dir", tmp_path / "rcsv")
    assert a.exit_code == 0 and b.exit_code == 0, b.output
    names = sorted(os.listdir(tmp_path / "lcsv"))
    assert names == sorted(os.listdir(tmp_path / "rcsv"))
    for name in names:
        assert (tmp_path / "lcsv" / name).read_bytes() == (tmp_path / "rcsv" / name).read_bytes(), name


def test_gzip_over_http_is_sniffed(http_root, tmp_path):
    """The compression is still known from the magic bytes, whatever the name."""
    base, server = http_root
    d = tmp_path / "gz"
    generate_fixture.generate(str(d), ranks=1, steps=1, fill_ops=4, format="json.gz", seed=5)
    shutil.copy(d / "rank0_trace.json.gz", os.path.join(server.root, "renamed.bin"))
    local = invoke("extract", d / "rank0_trace.json.gz", "-o", tmp_path / "l.stev")
    remote = invoke("extract", f"{base}/renamed.bin", "-o", tmp_path / "r.stev")
    assert local.exit_code == 0 and remote.exit_code == 0, remote.output
    ours = without_sources((tmp_path / "r.stev").read_bytes())
    assert ours == without_sources((tmp_path / "l.stev").read_bytes())
    assert ours[0][0]["compression"] == "gzip"


def test_reads_are_ranged_blocks_not_a_download(http_root, run_dir, tmp_path, monkeypatch):
    """Every GET asks for a range of about one block (the read-ahead cache's
    block plus the read), never the whole object."""
    base, server = http_root
    d, _ = run_dir
    monkeypatch.setenv("STREAMTRACE_REMOTE_BLOCK_SIZE", SMALL_BLOCKS)
    size = os.path.getsize(os.path.join(d, "rank2_trace.json"))
    del server.requests[:]
    res = invoke("extract", f"{base}/run/rank2_trace.json", "-o", tmp_path / "x.stev")
    assert res.exit_code == 0, res.output
    gets = [r for r in server.requests if r[0] == "GET" and r[1] == "/run/rank2_trace.json"]
    assert len(gets) >= size // (3 * int(SMALL_BLOCKS)), gets
    spans = []
    for _, _, rng in gets:
        m = re.match(r"bytes=(\d+)-(\d+)$", rng or "")
        assert m, f"an unranged GET: {rng!r}"
        spans.append(int(m.group(2)) - int(m.group(1)) + 1)
    assert max(spans) <= 2 * int(SMALL_BLOCKS)


def test_html_report_to_s3(s3, s3_run, run_dir, tmp_path):
    d, _ = run_dir
    res = run("blockers", s3_run + "/", "--html", f"s3://{BUCKET}/out/blockers.html")
    assert res.returncode == 0, res.stderr
    page = s3.cat_file(f"{BUCKET}/out/blockers.html")
    assert page.startswith(b"<!DOCTYPE html>") or page.lower().startswith(b"<!doctype html>"), page[:80]
    assert not [p for p in s3.ls(f"{BUCKET}/out") if ".streamtrace" in p]


# ------------------------------------------------------------------ faults

def test_missing_object_on_s3(s3, s3_run, tmp_path):
    out = tmp_path / "out.stev"
    res = invoke("extract", f"{s3_run}/rank9_trace.json", "-o", out)
    assert res.exit_code == 1
    assert "no such object" in one_line_error(res.output, f"{s3_run}/rank9_trace.json")
    assert not out.exists() and os.listdir(tmp_path) == []


def test_missing_input_leaves_nothing_at_s3_output(s3, s3_run):
    res = run("fuse", f"{s3_run}/rank0_trace.json", f"{s3_run}/nope.json", "-o", f"s3://{BUCKET}/out/never.json")
    assert res.returncode == 1
    one_line_error(res.stderr, f"{s3_run}/nope.json")
    assert not s3.exists(f"{BUCKET}/out/never.json")


def test_forbidden_object_over_http(http_root, tmp_path):
    base, _ = http_root
    res = invoke("extract", f"{base}/forbidden/rank0_trace.json", "-o", tmp_path / "x.stev")
    assert res.exit_code == 1
    assert "access denied" in one_line_error(res.output, f"{base}/forbidden/rank0_trace.json")
    assert not (tmp_path / "x.stev").exists()


def test_http_traces_without_an_output_path(http_root, tmp_path):
    """Traces over http(s) and no output given: the default workbook would go
    beside them, where nothing can be written; the one line says so and names
    the flags that choose another place, before any trace is read."""
    base, server = http_root
    urls = [f"{base}/run/rank{r}_trace.json?token=SECRET" for r in range(4)]
    before = len(server.requests)
    res = run("collective-report", *urls, "--world_size", 4)
    assert res.returncode == 1
    line = one_line_error(res.stderr, f"{base}/run/nccl_analysis_report.xlsx")
    assert "SECRET" not in res.stderr + res.stdout
    assert "no output path was given" in line and "beside the traces" in line, line
    assert "--output_xlsx_path" in line and "--output_csvs_dir" in line, line
    assert not any(method == "GET" for method, _, _ in server.requests[before:]), "the traces were read first"
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("flag", ["--trace_dir", "--trace_glob"])
def test_empty_listing(s3, flag, tmp_path):
    where = "s3://empty-bucket/run" if flag == "--trace_dir" else "s3://empty-bucket/run/*.json"
    res = invoke("collective-report", flag, where, "--world_size", 2, "--output_csvs_dir", tmp_path / "csv")
    assert res.exit_code == 1
    one_line_error(res.output, "s3://empty-bucket/run")
    assert not (tmp_path / "csv").exists()


def test_unreachable_endpoints(tmp_path):
    closed = _free_port()   # nothing listens there
    res = run("extract", f"http://127.0.0.1:{closed}/run/rank0_trace.json", "-o", tmp_path / "x.stev")
    assert res.returncode == 1
    assert "cannot reach" in one_line_error(res.stderr, f"http://127.0.0.1:{closed}/run/rank0_trace.json")
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{closed}", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": "1"}
    res = run("collective-report", "--trace_dir", "s3://traces/run", "--world_size", 2,
              "--output_csvs_dir", tmp_path / "csv", env=env)
    assert res.returncode == 1
    one_line_error(res.stderr, "s3://traces/run")
    assert os.listdir(tmp_path) == []


def _cut_trace(http_root, run_dir, name):
    """rank 1's trace served at /cut/<name>, every response cut at half the file."""
    base, server = http_root
    d, _ = run_dir
    dst = os.path.join(server.root, "cut", name)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copy(os.path.join(d, "rank1_trace.json"), dst)
    server.cuts[f"/cut/{name}"] = os.path.getsize(dst) // 2
    return f"{base}/cut/{name}"


def test_connection_cut_mid_read_keeps_events(http_root, run_dir, tmp_path, monkeypatch):
    """A cut connection is a truncated trace: the events before the cut are
    kept, with a warning naming the URL; the events are the local file's first ones."""
    d, _ = run_dir
    url = _cut_trace(http_root, run_dir, "keep.json")
    monkeypatch.setenv("STREAMTRACE_REMOTE_BLOCK_SIZE", SMALL_BLOCKS)
    full = invoke("extract", os.path.join(d, "rank1_trace.json"), "-o", tmp_path / "full.stev")
    res = run("extract", url, "-o", tmp_path / "cut.stev")
    assert full.exit_code == 0 and res.returncode == 0, res.stderr
    assert url in res.stderr and "truncated" in res.stderr and "the read failed" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    kept, whole = read_stream((tmp_path / "cut.stev").read_bytes())[1], read_stream((tmp_path / "full.stev").read_bytes())[1]
    assert 0 < len(kept.events) < len(whole.events)
    assert kept.meta["truncated_at_byte"] is not None
    for field in ("ts", "dur", "name"):
        assert (kept.events[field] == whole.events[field][:len(kept.events)]).all()


def test_connection_cut_with_strict_fails(http_root, run_dir, tmp_path, monkeypatch):
    url = _cut_trace(http_root, run_dir, "strict.json")
    monkeypatch.setenv("STREAMTRACE_REMOTE_BLOCK_SIZE", SMALL_BLOCKS)
    res = run("extract", "--strict", url, "-o", tmp_path / "x.stev")
    assert res.returncode == 1
    line = one_line_error(res.stderr, url)
    assert "--strict" in line and "the read failed" in line
    assert os.listdir(tmp_path) == []


def test_connection_cut_in_a_stream(http_root, run_dir, tmp_path, monkeypatch):
    """An event stream cut mid-read is an incomplete stream: one line, naming
    the URL and the failed read, and no output."""
    base, server = http_root
    d, _ = run_dir
    stev = os.path.join(server.root, "cut", "run.stev")
    os.makedirs(os.path.dirname(stev), exist_ok=True)
    assert invoke("extract", "--trace_dir", d, "--world_size", 4, "-o", stev).exit_code == 0
    server.cuts["/cut/run.stev"] = os.path.getsize(stev) // 2
    monkeypatch.setenv("STREAMTRACE_REMOTE_BLOCK_SIZE", SMALL_BLOCKS)
    res = run("align", f"{base}/cut/run.stev", "-o", tmp_path / "a.stev")
    assert res.returncode == 1
    line = one_line_error(res.stderr, f"{base}/cut/run.stev")
    assert re.search("(truncated|incomplete) stream", line) and "the read failed" in line
    assert "connection closed" in line
    assert os.listdir(tmp_path) == []


def test_interrupted_upload_leaves_nothing(http_root, s3, s3_run, run_dir, tmp_path):
    """SIGTERM while fuse writes its output (the input's second read stalls):
    nothing at the URL, no temporary file left."""
    import signal

    base, server = http_root
    d, _ = run_dir
    shutil.copy(os.path.join(d, "rank0_trace.json"), os.path.join(server.root, "stall.json"))
    stalled, release = threading.Event(), threading.Event()
    server.stalls["/stall.json"] = [2, stalled, release]   # the metadata peek and the scan pass; the write stalls
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([BIN, "fuse", f"{base}/stall.json", "-o", f"s3://{BUCKET}/out/stalled.json"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp)})
    try:
        assert stalled.wait(120), "the write pass never read the input"
        assert any(n.startswith(".streamtrace-upload-") for n in os.listdir(tmp))   # the output under way
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        release.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert not s3.exists(f"{BUCKET}/out/stalled.json")
    assert os.listdir(tmp) == []


def test_credentials_never_shown(http_root, run_dir, tmp_path, monkeypatch):
    base, _ = http_root
    host = base.split("://")[1]
    missing = f"http://alice:hunter2@{host}/run/missing.json?X-Amz-Signature=s3cr3t&token=t0k3n"
    res = run("extract", missing, "-o", tmp_path / "x.stev")
    assert res.returncode == 1
    line = one_line_error(res.stderr, f"{base}/run/missing.json")
    for secret in ("alice", "hunter2", "s3cr3t", "t0k3n"):
        assert secret not in res.stderr + res.stdout, line
    # a warning too: a cut read of a URL with credentials
    url = _cut_trace(http_root, run_dir, "secret.json")
    monkeypatch.setenv("STREAMTRACE_REMOTE_BLOCK_SIZE", SMALL_BLOCKS)
    res = run("extract", url.replace("://", "://alice:hunter2@") + "?sig=s3cr3t", "-o", tmp_path / "y.stev")
    assert res.returncode == 0 and "warning" in res.stderr
    for secret in ("alice", "hunter2", "s3cr3t"):
        assert secret not in res.stderr, res.stderr
    assert "hunter2" not in json.dumps(read_stream((tmp_path / "y.stev").read_bytes())[1].meta)


def test_url_output_that_is_an_input_is_refused(s3, s3_run):
    res = invoke("fuse", f"{s3_run}/rank0_trace.json", "-o", f"s3://{BUCKET}//run/./rank0_trace.json")
    assert res.exit_code == 1
    assert "also an input" in one_line_error(res.output, "rank0_trace.json")
    assert s3.exists(f"{BUCKET}/run/rank0_trace.json")


def test_unknown_protocol(tmp_path):
    res = invoke("extract", "nosuchproto://bucket/rank0_trace.json", "-o", tmp_path / "x.stev")
    assert res.exit_code == 1
    one_line_error(res.output, "nosuchproto://bucket/rank0_trace.json")
    assert os.listdir(tmp_path) == []


def test_output_bucket_missing(s3, s3_run, tmp_path):
    res = invoke("extract", f"{s3_run}/rank0_trace.json", "-o", "s3://no-such-bucket/x.stev")
    assert res.exit_code == 1
    assert "does not exist" in one_line_error(res.output, "s3://no-such-bucket/x.stev")

"""No URL credential in any output (issue #40, item 1 and the secret scan):
traces read from a real HTTP server on 127.0.0.1 through URLs that carry a
user, a password and a query string; every command that writes something
(extract's stream, align's, the report's workbook, CSVs and HTML page, the
fused trace, blockers' text and page, dump's lines, and every stderr) runs
on them, and every byte written -- the workbook unzipped, gzip outputs
inflated, the stream's zstd frames decompressed -- is searched for the
user, the password and the query value."""
import gzip
import http.server
import io
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import urllib.parse
import zipfile

import pytest
import zstandard

import generate_fixture
from http_ranges import send_range_headers
from streamtrace.html_report import sources_text

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")
USER, PASSWORD, TOKEN = "alice7u", "hunter2pw", "t0k3nq"
SECRETS = (USER, PASSWORD, TOKEN)
DEADLINE = 300


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Files(http.server.BaseHTTPRequestHandler):
    """GET and HEAD of the files under the server's root, single byte ranges
    answered 206 (fsspec's HTTP file system reads in ranged blocks); the
    query string and any credentials are accepted and ignored."""

    protocol_version = "HTTP/1.1"
    timeout = 2   # an idle kept-alive connection ends its thread, so the server's close can join it

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self._serve(body=False)

    def do_GET(self):
        self._serve(body=True)

    def _serve(self, body):
        full = os.path.join(self.server.root, urllib.parse.urlsplit(self.path).path.lstrip("/"))
        if not os.path.isfile(full):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        with open(full, "rb") as f:
            data = f.read()
        start, end = send_range_headers(self, data)
        if body:
            self.wfile.write(data[start:end + 1])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """An HTTP server on 127.0.0.1 serving a generated 4-rank run under /run/."""
    root = tmp_path_factory.mktemp("secret_root")
    generate_fixture.generate(str(root / "run"), ranks=4, steps=2, fill_ops=12, tp=2, straggler_rank=1,
                              slow_kernel_rank=2, seed=31)
    os.unlink(root / "run" / "truth.json")
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", _free_port()), _Files)
    srv.root = str(root)
    srv.daemon_threads = False   # server_close joins every request's thread
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(DEADLINE)


def _urls(host, ranks=4):
    return [f"http://{USER}:{PASSWORD}@{host}/run/rank{r}_trace.json?token={TOKEN}" for r in range(ranks)]


def _run(*args, cwd=None):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, timeout=DEADLINE, cwd=cwd,
                          stdin=subprocess.DEVNULL)


def _expanded(data, depth=0):
    """``data`` and everything packed in it: zip members, gzip members and
    zstd frames (found by their magic numbers), recursively."""
    out = [data]
    if depth > 3:
        return out
    if data[:4] == b"PK\x03\x04":
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            for name in z.namelist():
                out += _expanded(z.read(name), depth + 1)
    if data[:2] == b"\x1f\x8b":
        out += _expanded(gzip.decompress(data), depth + 1)
    for m in re.finditer(re.escape(b"\x28\xb5\x2f\xfd"), data):
        try:
            part = zstandard.ZstdDecompressor().decompressobj().decompress(data[m.start():])
        except zstandard.ZstdError:
            continue   # the magic's bytes inside something else
        out += _expanded(part, depth + 1)
    return out


def _secrets_in(data):
    found = []
    for part in _expanded(data):
        found += [s for s in SECRETS if s.encode() in part]
    return found


def test_the_html_sources_line_names_urls_redacted_and_whole(server, tmp_path):
    page = tmp_path / "r.html"
    res = _run("collective-report", *_urls(server), "--world_size", 4, "--output_html_path", page, cwd=tmp_path)
    assert res.returncode == 0, res.stderr.decode()
    text = page.read_text(encoding="utf-8")
    line = re.search(r"<dt>sources</dt><dd>([^<]*)</dd>", text).group(1)
    assert line == (f"rank0_trace.json, rank1_trace.json, rank2_trace.json, rank3_trace.json "
                    f"(in http://{server}/run)")
    assert not _secrets_in(page.read_bytes())


def test_sources_line_of_object_store_and_local_paths():
    assert sources_text(["s3://bkt/run/rank0.json", "s3://bkt/run/rank1.json"]) == \
        "rank0.json, rank1.json (in s3://bkt/run)"
    assert sources_text(["s3://a/run/x.json", "gs://a/run/y.json"]) == "x.json, y.json"   # no place in common
    assert sources_text(["/data/run/a.json", "/data/run/b.json"]) == "a.json, b.json (in /data/run)"
    assert sources_text([f"https://u:p@h:9/r/{i}.json?sig=s" for i in range(6)]) == \
        "0.json, 1.json, 2.json, 3.json and 2 more (in https://h:9/r)"


def test_no_output_holds_a_credential(server, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    urls = _urls(server)
    runs = [
        ("extract", *urls, "--world_size", 4, "-o", out / "s.stev"),
        ("align", out / "s.stev", "-o", out / "a.stev"),
        ("correlate", out / "a.stev", "-o", out / "c.stev"),
        ("report", out / "a.stev", "--output_xlsx_path", out / "rep.xlsx", "--output_csvs_dir", out / "rep_csvs",
         "--output_html_path", out / "rep.html.gz"),
        ("collective-report", *urls, "--world_size", 4, "--blocking_analysis", "--output_xlsx_path", out / "cr.xlsx",
         "--output_csvs_dir", out / "cr_csvs", "--output_html_path", out / "cr.html"),
        ("fuse", *urls, "--world_size", 4, "-o", out / "fused.json.gz"),
        ("blockers", *urls, "--html", out / "b.html"),
        ("blockers", out / "c.stev"),
        ("dump", "--what", "meta", out / "c.stev"),
        ("dump", "--what", "strings", out / "c.stev"),
    ]
    texts = {}
    for argv in runs:
        res = _run(*argv, cwd=tmp_path)
        assert res.returncode == 0, (argv[0], res.stderr.decode())
        texts[" ".join(map(str, argv[:2]))] = res.stdout + res.stderr
    # failures name the URL: redacted too
    missing = f"http://{USER}:{PASSWORD}@{server}/run/rank9_trace.json?token={TOKEN}"
    writing = f"http://{USER}:{PASSWORD}@{server}/out/x.stev?token={TOKEN}"
    for argv, problem in ((("extract", missing, "-o", out / "m.stev"), "rank9_trace.json"),
                          (("extract", urls[0], "-o", writing), "writing to http(s) URLs is not supported")):
        res = _run(*argv, cwd=tmp_path)
        assert res.returncode == 1, res.stderr.decode()
        assert problem in res.stderr.decode() and len(res.stderr.decode().strip().splitlines()) == 1, res.stderr
        if "writing" in problem:
            assert res.stderr.decode().startswith(f"Error: http://{server}/out/x.stev: {problem}")
            assert not os.path.exists(out / "x.stev")
        texts[argv[0] + " " + problem] = res.stdout + res.stderr
    written = []
    for root, _, files in os.walk(out):
        written += [os.path.join(root, f) for f in files]
    names = {os.path.relpath(p, out) for p in written}
    assert {"s.stev", "a.stev", "c.stev", "rep.xlsx", "rep.html.gz", "cr.xlsx", "cr.html", "fused.json.gz",
            "b.html"} <= names and any(n.startswith("cr_csvs/") for n in names), names
    found = {p: _secrets_in(open(p, "rb").read()) for p in written}
    found.update({k: _secrets_in(v) for k, v in texts.items()})
    assert {k: v for k, v in found.items() if v} == {}
    # the scan does look inside: the sources are in the outputs, redacted
    assert any(f"{server}/run/rank0_trace.json".encode() in part
               for part in _expanded(open(out / "fused.json.gz", "rb").read()))
    assert any(b"rank0_trace.json" in part for part in _expanded(open(out / "s.stev", "rb").read())[1:])


def test_report_default_output_of_url_sources_is_their_url_not_a_mangled_path(server, tmp_path):
    """``report`` without an output path writes beside the traces, as
    collective-report does: for traces read over http(s), a URL that cannot
    be written, said in one line -- not a local path made of the URL
    ('http:/host/...: the output directory does not exist')."""
    stream = tmp_path / "s.stev"
    assert _run("extract", *_urls(server), "--world_size", 4, "-o", stream, "-q", cwd=tmp_path).returncode == 0
    res = _run("report", stream, cwd=tmp_path)
    assert res.returncode == 1
    line = _one_line(res.stderr.decode())
    assert line.startswith(f"Error: http://{server}/run/nccl_analysis_report.xlsx: writing to http(s) URLs is not "
                           "supported"), line
    assert sorted(os.listdir(tmp_path)) == ["s.stev"]


def _one_line(err):
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]

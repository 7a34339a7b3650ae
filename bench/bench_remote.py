"""Extract over HTTP and from an S3-compatible store against the same file on local disk.

    python bench/bench_remote.py [--mb 200] [--repeat 3]

Serves bench/out/trace{mb}.json and .json.gz (bench/run.py's traces,
generated when missing) from two servers on 127.0.0.1: a small HTTP server
with Range support that sends only the bytes asked for (a thread here), and
moto's S3 server (its own process).  Each file is extracted from disk, from
its http:// URL and from its s3:// URL, each run in a fresh process
(bench/measure.py).  Prints the time ratios remote/local and each case's
peak RSS: the reads stream in ranged blocks, so a remote run's RSS stays near
the local one's whatever the trace size (a whole download would add the
file's size).  The servers are on this machine: the HTTP ratio is the cost of
fsspec and aiohttp's copies; moto copies the whole object for every ranged
GET (about 0.4 s per request on a 200 MB object), so its ratio measures moto.
"""
import argparse
import http.server
import os
import re
import socket
import subprocess
import sys
import threading
import time

from measure import machine_speed  # bench/ is on sys.path when run as a script
from run import OUT, generate, measure

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _RangeHandler(http.server.BaseHTTPRequestHandler):
    """HEAD and single-range GET, the range read with pread: what a store does."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self._serve(False)

    def do_GET(self):
        self._serve(True)

    def _serve(self, body):
        path = os.path.join(OUT, os.path.basename(self.path))
        if not os.path.isfile(path):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        size = os.path.getsize(path)
        start, end = 0, size - 1
        m = re.match(r"bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
        if m:
            start, end = int(m.group(1)), min(int(m.group(2) or size - 1), size - 1)
        self.send_response(206 if m else 200)
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        if m:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if body:
            with open(path, "rb") as f:
                os.sendfile(self.wfile.fileno(), f.fileno(), start, end - start + 1)


def _s3(method, *args):
    """An S3 call in a child process: this one stays small, since the
    measured children inherit its peak RSS (an upload through s3fs would
    count in every figure)."""
    code = "import fsspec, sys; getattr(fsspec.filesystem('s3'), sys.argv[1])(*sys.argv[2:])"
    subprocess.run([sys.executable, "-c", code, method, *args], check=True)


def _wait_listening(port, proc, seconds=60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("moto_server exited at start")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise SystemExit("moto_server did not start listening")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=200, help="size of the trace (MB of JSON)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per case; the fastest is shown")
    args = ap.parse_args()

    print(machine_speed())
    os.makedirs(OUT, exist_ok=True)
    plain = generate(args.mb)
    port = _free_port()
    server = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1",
                               "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RangeHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        _wait_listening(port, server)
        _s3("mkdir", "bench")
        print(f"extract: local file, http:// and s3:// (moto) on 127.0.0.1 ({args.mb} MB of JSON; "
              f"best of {args.repeat}; {os.environ.get('STREAMTRACE_REMOTE_BLOCK_SIZE', '8 MB')} blocks)")
        print(f"{'input':<18}{'local s':>8}{'http s':>8}{'s3 s':>8}{'http/local':>11}{'s3/local':>9}"
              f"{'RSS MB local/http/s3':>22}")
        for suffix in ("", ".gz"):
            path = plain + suffix
            url = f"s3://bench/{os.path.basename(path)}"
            _s3("put_file", path, url)
            local = measure("extract", path, args.repeat)
            web_run = measure("extract", f"http://127.0.0.1:{web.server_address[1]}/{os.path.basename(path)}",
                              args.repeat)
            s3_run = measure("extract", url, args.repeat)
            _s3("rm_file", url)
            rss = "/".join(f"{r['peak_rss_mb']:.0f}" for r in (local, web_run, s3_run))
            print(f"{os.path.basename(path):<18}{local['seconds']:>8.2f}{web_run['seconds']:>8.2f}"
                  f"{s3_run['seconds']:>8.2f}{web_run['seconds'] / local['seconds']:>11.2f}"
                  f"{s3_run['seconds'] / local['seconds']:>9.2f}{rss:>22}")
    finally:
        web.shutdown()
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()

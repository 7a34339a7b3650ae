"""Extract from an S3-compatible store against the same file on local disk.

    python bench/bench_remote.py [--mb 200] [--repeat 3]

Uploads bench/out/trace{mb}.json and .json.gz (bench/run.py's traces,
generated when missing) to a moto S3 server started here on 127.0.0.1 (its
own process, so its memory is not counted), then extracts each from the
local file and from its s3:// URL, each run in a fresh process
(bench/measure.py).  Prints the time ratio remote/local and each case's peak
RSS: the reads stream in ranged blocks, so a remote run's RSS stays near the
local one's whatever the trace size (a whole download would add the file's
size).  The store is on this machine, so the ratio is the cost of the HTTP
round trips and copies, not of a network.
"""
import argparse
import os
import socket
import subprocess
import sys
import time

from run import OUT, generate, measure  # bench/ is on sys.path when run as a script

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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

    os.makedirs(OUT, exist_ok=True)
    plain = generate(args.mb)
    port = _free_port()
    server = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1",
                               "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    try:
        _wait_listening(port, server)
        import fsspec

        fs = fsspec.filesystem("s3")
        fs.mkdir("bench")
        print(f"extract, local file vs s3:// on a local moto server ({args.mb} MB of JSON; best of {args.repeat})")
        print(f"{'input':<22}{'local s':>9}{'s3 s':>9}{'s3/local':>10}{'local RSS MB':>14}{'s3 RSS MB':>11}")
        for suffix in ("", ".gz"):
            path = plain + suffix
            url = f"s3://bench/{os.path.basename(path)}"
            fs.put_file(path, url)
            local = measure("extract", path, args.repeat)
            remote = measure("extract", url, args.repeat)
            print(f"{os.path.basename(path):<22}{local['seconds']:>9.2f}{remote['seconds']:>9.2f}"
                  f"{remote['seconds'] / local['seconds']:>10.2f}{local['peak_rss_mb']:>14.0f}"
                  f"{remote['peak_rss_mb']:>11.0f}")
            fs.rm_file(url)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()

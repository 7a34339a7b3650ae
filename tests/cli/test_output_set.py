"""The outputs of one run appear together or not at all (issue #40, item 9):
the workbook, the CSV directory, the HTML page and the uploads of a
collective report are staged, then committed as a set; a failed upload, a
failed move or a stop signal at any time before the set is in place leaves
no output of the run (and an earlier output at a local path as it was).

Real processes against a real S3 server on 127.0.0.1 (moto, as
tests/cli/test_remote.py runs it) behind a fault layer that refuses, or
holds, the PUT of chosen keys.  Every wait is bounded."""
import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import fsspec
import pytest

import generate_fixture

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")
BUCKET = "outs"
DEADLINE = 120   # seconds for any one wait: a hang fails the test, it never blocks the suite


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Faults:
    """What the fault layer does to a PUT whose path ends with a key:
    ``refuse``: 403 AccessDenied; ``hold``: read the whole body, then wait
    for ``release`` before moto stores it (a server that has everything and
    answers late)."""

    def __init__(self):
        self.refuse = set()
        self.hold = None
        self.held = threading.Event()
        self.release = threading.Event()

    def reset(self):
        self.refuse, self.hold = set(), None
        self.held.clear()
        self.release.set()   # a request still held from a failed test goes on
        self.release = threading.Event()


def _faulty(app, faults):
    def wsgi(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if environ["REQUEST_METHOD"] == "PUT":
            if any(path.endswith(k) for k in faults.refuse):
                environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
                start_response("403 Forbidden", [("Content-Type", "application/xml")])
                return [b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
                        b'<Message>Access Denied</Message></Error>']
            if faults.hold and path.endswith(faults.hold):
                body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
                environ["wsgi.input"] = io.BytesIO(body)
                release = faults.release
                faults.held.set()
                release.wait(DEADLINE)
        return app(environ, start_response)
    return wsgi


@pytest.fixture(scope="module")
def s3():
    """moto's S3 app behind the fault layer, on 127.0.0.1; the environment of
    the commands started here points at it (AWS_ENDPOINT_URL)."""
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    faults = _Faults()
    port = _free_port()
    server = make_server("127.0.0.1", port, _faulty(DomainDispatcherApplication(create_backend_app), faults),
                         threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    try:
        fs = fsspec.filesystem("s3", skip_instance_cache=True, use_listings_cache=False,
                               endpoint_url=env["AWS_ENDPOINT_URL"], key="testing", secret="testing")
        fs.mkdir(BUCKET)
        yield fs, faults, env
    finally:
        faults.reset()
        server.shutdown()
        thread.join(DEADLINE)


@pytest.fixture
def faults(s3):
    _, faults, _ = s3
    yield faults
    faults.reset()


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("set_run")
    generate_fixture.generate(str(d), ranks=4, steps=2, straggler_rank=1, seed=40)
    os.unlink(d / "truth.json")
    return str(d)


@pytest.fixture
def where(tmp_path):
    """An output folder and a TMPDIR of the test's own: whatever is left behind is seen."""
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    out.mkdir()
    tmp.mkdir()
    return out, tmp


def _argv(traces, out, html):
    return [BIN, "collective-report", "--trace_dir", traces, "--world_size", "4", "--blocking_analysis",
            "--output_csvs_dir", str(out / "csvs"), "--output_xlsx_path", str(out / "r.xlsx"),
            "--output_html_path", html]


def _env(s3, tmp):
    return {**os.environ, **s3[2], "TMPDIR": str(tmp)}


def _objects(fs):
    fs.invalidate_cache()
    return sorted(fs.find(BUCKET))


def _while_held(argv, env, faults, change):
    """Run ``argv`` until the server holds its upload, call ``change(proc)``,
    let the upload finish; (exit code, stderr) once the command has ended."""
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env, stdin=subprocess.DEVNULL)
    try:
        assert faults.held.wait(DEADLINE), "the upload never started"
        change(proc)
        faults.release.set()
        _, err = proc.communicate(timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err


def _one_line(err):
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_a_failed_upload_leaves_no_output_of_the_run(s3, faults, traces, where):
    fs = s3[0]
    out, tmp = where
    faults.refuse.add("/refused.html")
    url = f"s3://{BUCKET}/run/refused.html"
    res = subprocess.run(_argv(traces, out, url), capture_output=True, text=True, env=_env(s3, tmp),
                         stdin=subprocess.DEVNULL, timeout=DEADLINE)
    assert res.returncode == 1, res.stderr
    line = _one_line(res.stderr)
    assert line.startswith(f"Error: {url}: cannot write it: ") and "AccessDenied" in line, line
    assert os.listdir(out) == [] and os.listdir(tmp) == []   # no CSV directory, no workbook, no temporary file
    assert _objects(fs) == []


def test_a_failed_move_puts_every_output_back(s3, faults, traces, where):
    """The last local output cannot be moved into place (its name became a
    directory while the run waited on its upload): the uploaded page is
    removed, the earlier workbook and CSV files are back as they were."""
    fs = s3[0]
    out, tmp = where
    (out / "csvs").mkdir()
    (out / "csvs" / "nccl_long.csv").write_text("an earlier run's sheet\n")
    (out / "csvs" / "mine.txt").write_text("the user's own file\n")
    (out / "r.xlsx").write_text("an earlier workbook")
    faults.hold = "/moved.html"
    url = f"s3://{BUCKET}/run/moved.html"

    def workbook_becomes_a_directory(proc):
        os.unlink(out / "r.xlsx")
        (out / "r.xlsx").mkdir()   # the workbook's name is a directory now: its move must fail

    code, err = _while_held(_argv(traces, out, url), _env(s3, tmp), faults, workbook_becomes_a_directory)
    assert code == 1, err
    assert "r.xlsx: cannot replace it: it is no longer a regular file" in _one_line(err)
    assert _objects(fs) == []   # the page was uploaded, then removed
    assert sorted(os.listdir(out / "csvs")) == ["mine.txt", "nccl_long.csv"]
    assert (out / "csvs" / "nccl_long.csv").read_text() == "an earlier run's sheet\n"
    assert (out / "r.xlsx").is_dir() and os.listdir(out / "r.xlsx") == []
    assert sorted(os.listdir(out)) == ["csvs", "r.xlsx"] and os.listdir(tmp) == []


def test_a_signal_during_a_late_upload_leaves_nothing(s3, faults, traces, where):
    """SIGTERM while the server holds the page's whole body: the command
    exits 143, and the object the server stores after the signal is removed
    before the command ends; no CSV directory, no workbook."""
    fs = s3[0]
    out, tmp = where
    faults.hold = "/late.html"
    url = f"s3://{BUCKET}/run/late.html"

    def terminate(proc):
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)   # the server stores the page after the signal

    code, err = _while_held(_argv(traces, out, url), _env(s3, tmp), faults, terminate)
    assert code == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1] == "interrupted by SIGTERM", err
    assert _objects(fs) == []
    assert os.listdir(out) == [] and os.listdir(tmp) == []


def test_a_signal_at_any_time_gives_all_the_outputs_or_none(traces, tmp_path):
    """SIGTERM at times spread over a whole run (outputs local): either the
    command finished (exit 0, the three outputs) or it was interrupted (exit
    143, no output and no temporary file) -- never some of them."""
    times = []
    out = tmp_path / "timing"
    out.mkdir()
    start = time.monotonic()
    res = subprocess.run(_argv(traces, out, str(out / "r.html")), capture_output=True, text=True,
                         timeout=DEADLINE, stdin=subprocess.DEVNULL)
    whole = time.monotonic() - start
    assert res.returncode == 0, res.stderr
    seen = set()
    for k in range(10):
        out = tmp_path / f"try{k}"
        out.mkdir()
        proc = subprocess.Popen(_argv(traces, out, str(out / "r.html")), stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL, env={**os.environ, "TMPDIR": str(out)})
        delay = whole * (0.5 + 0.06 * k)   # the second half: reading the traces, then writing
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=DEADLINE)
        left = sorted(os.listdir(out))
        times.append((round(delay, 2), proc.returncode, left))
        if proc.returncode == 0:
            assert left == ["csvs", "r.html", "r.xlsx"], times
        else:
            assert proc.returncode == 128 + signal.SIGTERM, (err, times)
            assert left == [], times
        seen.add(proc.returncode)
    assert seen, times


def test_a_failed_move_restores_the_file_it_had_replaced(s3, faults, traces, where):
    """The CSVs go to S3, the workbook replaces an earlier one, then the
    page cannot be moved into place: the earlier workbook is back, byte for
    byte, and the uploaded CSVs are removed."""
    fs = s3[0]
    out, tmp = where
    (out / "r.xlsx").write_bytes(b"an earlier workbook")
    faults.hold = ".csv"
    argv = _argv(traces, out, str(out / "r.html"))
    argv[argv.index("--output_csvs_dir") + 1] = f"s3://{BUCKET}/run/csvs"

    def page_becomes_a_directory(proc):
        (out / "r.html").mkdir()   # the page's name is a directory now: its move, the last, must fail

    code, err = _while_held(argv, _env(s3, tmp), faults, page_becomes_a_directory)
    assert code == 1, err
    assert "r.html: cannot replace it: it is no longer a regular file" in _one_line(err)
    assert _objects(fs) == []
    assert (out / "r.xlsx").read_bytes() == b"an earlier workbook"
    assert sorted(os.listdir(out)) == ["r.html", "r.xlsx"] and os.listdir(out / "r.html") == []
    assert os.listdir(tmp) == []

"""Outputs never clobber what they should not (issue #24): a FIFO, a device or
a ``/dev/stdout``-style link is written into, not renamed over; a symlink
stays a link; an input is never the output; a CSV directory holds one run;
every write error names the user's path; CSV and xlsx cells are never
formulas, even past a CR.

Special files are made under tmp_path (a FIFO, a link into /proc/self/fd, a
character device node made with mknod as root); the machine's own /dev
entries are used only where the command must already leave them alone."""
import csv
import errno
import io
import json
import logging
import os
import re
import stat
import subprocess
import sys
import threading

import pytest
from click.testing import CliRunner

import generate_fixture
from hostile import HOSTILE_KERNEL, make_names_hostile
from streamtrace.cli import main
from streamtrace.errors import StreamtraceError

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


_LOG = logging.getLogger("streamtrace")
_LOG_STATE = (_LOG.handlers[:], _LOG.level, _LOG.propagate)


@pytest.fixture(autouse=True)
def _logger_as_it_was():
    """The CLI's -q sets the "streamtrace" logger to ERROR without propagation
    (module fixtures run it too); later tests (caplog) need it as it was."""
    yield
    _LOG.handlers[:], _LOG.level, _LOG.propagate = _LOG_STATE[0][:], _LOG_STATE[1], _LOG_STATE[2]


@pytest.fixture(scope="module")
def run_set(tmp_path_factory):
    d = tmp_path_factory.mktemp("outputs")
    generate_fixture.generate(str(d / "traces"), ranks=2, steps=2, seed=3)
    for cmd in (["extract", "--trace_dir", str(d / "traces"), "--world_size", "2", "-q", "-o", str(d / "x.stev")],
                ["align", str(d / "x.stev"), "-q", "-o", str(d / "a.stev")]):
        res = CliRunner().invoke(main, cmd)
        assert res.exit_code == 0, res.output
    return d


def _commands(d):
    """Every command that writes a file: its arguments but the output path,
    the flag that takes it, and how its outputs compare."""
    traces = ["--trace_dir", str(d / "traces"), "--world_size", "2", "-q"]
    return {
        "extract": (["extract", *traces], "-o", "bytes"),
        "align": (["align", str(d / "x.stev"), "-q"], "-o", "bytes"),
        "correlate": (["correlate", str(d / "a.stev"), "-q"], "-o", "bytes"),
        "report": (["report", str(d / "a.stev"), "-q"], "--output_xlsx_path", "xlsx"),
        "collective-report": (["collective-report", *traces], "--output_xlsx_path", "xlsx"),
        "fuse": (["fuse", *traces], "-o", "json"),
        "fuse-j2": (["fuse", *traces, "-j", "2"], "-o", "json"),
    }


COMMANDS = list(_commands(__import__("pathlib").Path(".")))


def _run(args):
    res = CliRunner().invoke(main, args)
    return res


def _expected(run_set, command, tmp_path):
    """The command's output written to a plain new file."""
    args, flag, kind = _commands(run_set)[command]
    out = tmp_path / "expected.out"
    res = _run([*args, flag, str(out)])
    assert res.exit_code == 0, res.output
    data = out.read_bytes()
    out.unlink()
    return data


def _same(kind, got, want):
    if kind == "bytes":
        assert got == want
    elif kind == "json":
        assert json.loads(got)["traceEvents"] == json.loads(want)["traceEvents"]
    else:   # a workbook: same sheets and cells (zip timestamps may differ)
        import openpyxl

        a, b = (openpyxl.load_workbook(io.BytesIO(x), read_only=True) for x in (got, want))
        assert a.sheetnames == b.sheetnames
        for name in a.sheetnames:
            assert list(a[name].values) == list(b[name].values)


def _no_leftovers(directory):
    assert not [n for n in os.listdir(directory) if n.startswith(".streamtrace")]


# ---------------------------------------------------------------------- special files


@pytest.mark.parametrize("command", COMMANDS)
def test_a_fifo_gets_the_bytes_and_stays_a_fifo(run_set, tmp_path, command):
    want = _expected(run_set, command, tmp_path)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    reader.start()
    args, flag, kind = _commands(run_set)[command]
    res = _run([*args, flag, str(fifo)])
    reader.join(60)
    assert res.exit_code == 0, res.output
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    _same(kind, got[0], want)
    _no_leftovers(tmp_path)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_symlink_stays_a_link_and_its_target_gets_the_output(run_set, tmp_path, command):
    want = _expected(run_set, command, tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "real.out").write_bytes(b"old")
    os.symlink("sub/real.out", tmp_path / "link")            # relative, to an existing file
    os.symlink("sub/new.out", tmp_path / "dangling")         # to a file yet to be made
    os.symlink("link", tmp_path / "link2")                   # a link to a link
    args, flag, kind = _commands(run_set)[command]
    for name, target in (("link2", "real.out"), ("dangling", "new.out")):
        res = _run([*args, flag, str(tmp_path / name)])
        assert res.exit_code == 0, res.output
        assert os.path.islink(tmp_path / name)
        _same(kind, (tmp_path / "sub" / target).read_bytes(), want)
    assert os.readlink(tmp_path / "link") == "sub/real.out" and os.readlink(tmp_path / "link2") == "link"
    _no_leftovers(tmp_path)
    _no_leftovers(tmp_path / "sub")


@pytest.mark.skipif(not IS_ROOT, reason="mknod of a character device needs root")
@pytest.mark.parametrize("command", COMMANDS)
def test_a_character_device_stays_a_device(run_set, tmp_path, command):
    null = tmp_path / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))   # a /dev/null of our own
    args, flag, _ = _commands(run_set)[command]
    res = _run([*args, flag, str(null)])
    assert res.exit_code == 0, res.output
    assert stat.S_ISCHR(os.lstat(null).st_mode)
    _no_leftovers(tmp_path)


@pytest.mark.skipif(not IS_ROOT, reason="mknod of a character device needs root")
@pytest.mark.parametrize("command", ["extract", "report", "fuse"])
def test_a_full_device_is_one_line_naming_it(run_set, tmp_path, command):
    full = tmp_path / "full"
    os.mknod(full, 0o666 | stat.S_IFCHR, os.makedev(1, 7))   # a /dev/full of our own: every write ENOSPC
    args, flag, _ = _commands(run_set)[command]
    res = _run([*args, flag, str(full)])
    assert res.exit_code == 1
    assert res.output.strip().splitlines() == [f"Error: {full}: cannot write to it: No space left on device"]
    assert stat.S_ISCHR(os.lstat(full).st_mode)


def test_the_machines_devnull_stays_a_device(run_set):
    """Run only with the fix in (its test above uses a device of its own)."""
    for command in COMMANDS:
        args, flag, _ = _commands(run_set)[command]
        res = _run([*args, flag, os.devnull])
        assert res.exit_code == 0, (command, res.output)
        assert stat.S_ISCHR(os.lstat(os.devnull).st_mode), command
    _no_leftovers(os.path.dirname(os.devnull))


def test_a_link_into_proc_self_fd_writes_to_the_process_stdout(run_set, tmp_path):
    """A /dev/stdout-style link (here one of our own): the bytes go to the
    command's stdout as the shell opened it -- what came before stays."""
    want = _expected(run_set, "extract", tmp_path)
    link = tmp_path / "my_stdout"
    os.symlink(os.path.join("/proc", "self", "fd", "1"), link)
    args = ["extract", "--trace_dir", str(run_set / "traces"), "--world_size", "2", "-q"]
    proc = subprocess.run([BIN, *args, "-o", str(link)], capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == want and os.path.islink(link)
    out = tmp_path / "log"
    cmd = f"{{ echo before; {BIN} {' '.join(args)} -o {link}; }} > {out}"
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == b"before\n" + want and os.path.islink(link)
    _no_leftovers(tmp_path)


def test_dev_stdout_in_a_real_pipe(run_set, tmp_path):
    """The machine's /dev/stdout (the command must already leave it alone)."""
    want = _expected(run_set, "extract", tmp_path)
    dev_stdout = os.path.join("/dev", "stdout")
    before = os.readlink(dev_stdout)
    args = ["extract", "--trace_dir", str(run_set / "traces"), "--world_size", "2", "-q"]
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", f"{BIN} {' '.join(args)} -o {dev_stdout} | cat"],
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == want
    assert os.readlink(dev_stdout) == before


@pytest.mark.parametrize("argv", [["extract", "{traces}/rank0_trace.json"], ["align", "{x}"],
                                  ["fuse", "{traces}/rank0_trace.json", "-o", "-"], ["dump", "{a}"]])
def test_closed_stdout_is_one_line(run_set, argv):
    argv = [a.format(traces=run_set / "traces", x=run_set / "x.stev", a=run_set / "a.stev") for a in argv]
    proc = subprocess.run(["bash", "-c", f"{BIN} {' '.join(argv)} -q >&-" if argv[0] != "dump"
                           else f"{BIN} {' '.join(argv)} >&-"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "stdout is closed" in proc.stderr and "Traceback" not in proc.stderr


def test_a_socket_is_refused(run_set, tmp_path):
    import socket

    s = socket.socket(socket.AF_UNIX)
    s.bind(str(tmp_path / "sock"))
    try:
        res = _run(["extract", str(run_set / "traces" / "rank0_trace.json"), "-q", "-o", str(tmp_path / "sock")])
    finally:
        s.close()
    assert res.exit_code == 1
    assert res.output.strip() == f"Error: {tmp_path / 'sock'}: is a socket, not an output file"


# ---------------------------------------------------------------------- an input as the output


def _copy(src, dst):
    dst.write_bytes(src.read_bytes())
    return dst


@pytest.mark.parametrize("case", ["extract", "fuse", "report_xlsx", "align", "collective_report_xlsx",
                                  "report_csv_dir", "hard_link", "symlink"])
def test_an_input_as_the_output_is_refused_before_any_work(run_set, tmp_path, case):
    trace = _copy(run_set / "traces" / "rank0_trace.json", tmp_path / "t.json")
    stream = _copy(run_set / "a.stev", tmp_path / "a.stev")
    os.link(trace, tmp_path / "hard.json")
    os.symlink("t.json", tmp_path / "sym.json")
    (tmp_path / "csvs").mkdir()
    csv_input = _copy(run_set / "a.stev", tmp_path / "csvs" / "nccl_long.csv")
    argv, victim = {
        "extract": (["extract", str(trace), "-o", str(trace)], trace),
        "fuse": (["fuse", str(trace), "-o", str(trace)], trace),
        "report_xlsx": (["report", str(stream), "--output_xlsx_path", str(stream)], stream),
        "align": (["align", str(stream), "-o", str(stream)], stream),
        "collective_report_xlsx": (["collective-report", str(trace), "--output_xlsx_path", str(trace)], trace),
        "report_csv_dir": (["report", str(csv_input), "--output_csvs_dir", str(tmp_path / "csvs")], csv_input),
        "hard_link": (["extract", str(trace), "-o", str(tmp_path / "hard.json")], trace),
        "symlink": (["fuse", str(trace), "-o", str(tmp_path / "sym.json")], trace),
    }[case]
    before = victim.read_bytes()
    res = _run([*argv, "-q"])
    assert res.exit_code == 1
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "is also an input" in lines[0], res.output
    assert victim.read_bytes() == before
    assert os.path.islink(tmp_path / "sym.json")
    _no_leftovers(tmp_path)


def test_stdin_from_the_output_file_is_refused(run_set, tmp_path):
    """``align -o s.stev < s.stev``: the input comes through stdin, by fd."""
    stream = _copy(run_set / "x.stev", tmp_path / "s.stev")
    before = stream.read_bytes()
    with open(stream, "rb") as stdin:
        proc = subprocess.run([BIN, "align", "-q", "-o", str(stream)], stdin=stdin, capture_output=True, text=True,
                              timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [f"Error: {stream}: the output is also an input (<stdin>); writing it "
                                                "would destroy the input: choose another name"]
    assert stream.read_bytes() == before
    _no_leftovers(tmp_path)


# ---------------------------------------------------------------------- names and write errors


@pytest.mark.parametrize("argv", [["fuse", "{trace}", "-o", "{out}.json.bz2"], ["fuse", "{trace}", "-o", "{out}.xz"],
                                  ["extract", "{trace}", "-o", "{out}.stev.lz4"],
                                  ["report", "{a}", "--output_xlsx_path", "{out}.xlsx.zip"]])
def test_an_unsupported_compression_suffix_is_refused(run_set, tmp_path, argv):
    argv = [a.format(trace=run_set / "traces" / "rank0_trace.json", a=run_set / "a.stev", out=tmp_path / "o")
            for a in argv]
    res = _run([*argv, "-q"])
    assert res.exit_code == 1
    assert res.output.strip().splitlines() == [res.output.strip()] and "output is not supported" in res.output
    assert os.listdir(tmp_path) == []


def test_a_write_error_names_the_users_path_not_the_temporary_one(tmp_path, monkeypatch):
    import pandas as pd

    import streamtrace.report.writers as report_mod

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(report_mod, "_write_fast", full)
    with pytest.raises(StreamtraceError) as err:
        report_mod.write_xlsx({"s": pd.DataFrame({"a": [1]})}, tmp_path / "r.xlsx")
    assert str(err.value) == f"{tmp_path / 'r.xlsx'}: cannot write it: No space left on device"
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------------- the CSV directory


def _csv_report(run_set, directory, *extra):
    res = _run(["report", str(run_set / "a.stev"), "-q", "--output_csvs_dir", str(directory), *extra])
    return res


def test_a_csv_directory_holds_one_run_and_keeps_the_users_files(run_set, tmp_path):
    out = tmp_path / "csvs"
    assert _csv_report(run_set, out, "--all2allv_heatmap").exit_code == 0
    first = set(os.listdir(out))
    assert "nccl_all2allv_heatmap.csv" in first
    (out / "notes.txt").write_text("mine")
    (out / "other.csv").write_text("mine too")
    res = _csv_report(run_set, out)
    assert res.exit_code == 0, res.output
    assert set(os.listdir(out)) == first - {"nccl_all2allv_heatmap.csv"} | {"notes.txt", "other.csv"}
    assert (out / "notes.txt").read_text() == "mine" and (out / "other.csv").read_text() == "mine too"
    _no_leftovers(tmp_path)


def test_a_symlinked_csv_directory_stays_a_link(run_set, tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink("real", tmp_path / "csvs")
    os.symlink("new", tmp_path / "to_new")
    for name in ("csvs", "to_new"):
        res = _csv_report(run_set, tmp_path / name)
        assert res.exit_code == 0, res.output
        assert os.path.islink(tmp_path / name)
    assert "nccl_long.csv" in os.listdir(tmp_path / "real") and "nccl_long.csv" in os.listdir(tmp_path / "new")
    _no_leftovers(tmp_path)


def test_a_failed_csv_commit_replaces_nothing_and_names_the_users_path(run_set, tmp_path):
    out = tmp_path / "csvs"
    assert _csv_report(run_set, out).exit_code == 0
    before = {n: (out / n).read_bytes() for n in os.listdir(out)}
    (out / "nccl_long.csv").unlink()
    (out / "nccl_long.csv").mkdir()   # a sheet's name taken by a directory
    del before["nccl_long.csv"]
    for n in before:
        (out / n).write_bytes(b"earlier run")
    res = _csv_report(run_set, out)
    assert res.exit_code == 1
    assert res.output.strip() == f"Error: {out / 'nccl_long.csv'}: is not a regular file; nothing was replaced"
    assert all((out / n).read_bytes() == b"earlier run" for n in before)
    _no_leftovers(tmp_path)


# ---------------------------------------------------------------------- formulas in CSV and xlsx

_FORMULA_START = tuple("=+-@\t\r")


def _is_number(cell):
    try:
        float(cell)
        return True
    except ValueError:
        return False


def _formula(cell):
    return cell.startswith(_FORMULA_START) and not _is_number(cell)


def _unescape(cell):
    """The value before neutralising: the ``'`` put before a formula start
    at the beginning, and after a line break or comma in a multi-line value."""
    if cell.startswith("'") and cell[1:2] in _FORMULA_START:
        cell = cell[1:]
    if "\r" in cell or "\n" in cell:
        cell = re.sub(r"(?<=[\r\n,])'(?=\"*[=+\-@\t])", "", cell)
    return cell


@pytest.fixture(scope="module")
def hostile_report(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile_names")
    truth = generate_fixture.generate(str(d / "traces"), ranks=4, steps=2, tp=2, slow_kernel_rank=1, seed=5)
    names, kernel = make_names_hostile(str(d / "traces"), truth["slow_kernel"]["kernel_name"])
    res = _run(["collective-report", "--trace_dir", str(d / "traces"), "--world_size", "4", "-q",
                "--blocking_analysis", "--output_csvs_dir", str(d / "csvs"), "--output_xlsx_path", str(d / "r.xlsx")])
    assert res.exit_code == 0, res.output
    return d, names, kernel


def test_no_csv_cell_is_a_formula_even_split_at_a_line_break(hostile_report):
    d, names, kernel = hostile_report
    seen = set()
    for name in sorted(os.listdir(d / "csvs")):
        raw = (d / "csvs" / name).read_bytes().decode("utf-8")
        with open(d / "csvs" / name, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
        width = len(rows[0])
        for row in rows:
            assert len(row) == width, (name, row)   # no row split at a CR
            for cell in row:
                assert not _formula(cell), (name, cell)
                seen.add(_unescape(cell))
        for line in re.split(r"[\r\n]", raw):   # as a spreadsheet that splits rows at every CR and LF
            for cell in next(csv.reader([line])) if line else []:
                assert not _formula(cell), (name, line)
    assert set(names.values()) <= seen and kernel == HOSTILE_KERNEL and kernel in seen


def test_the_hostile_names_round_trip_in_their_sheets(hostile_report):
    d, names, kernel = hostile_report
    with open(d / "csvs" / "nccl_long.csv", newline="", encoding="utf-8") as f:
        long = list(csv.DictReader(f))
    assert {_unescape(r["Process Group Name"]) for r in long} == set(names.values())
    with open(d / "csvs" / "blocking_kernels.csv", newline="", encoding="utf-8") as f:
        kernels = [_unescape(r["kernel"]) for r in csv.DictReader(f)]
    assert kernels[0] == kernel   # the injected slow kernel: the top blocker, its name intact


def test_no_xlsx_cell_is_a_formula_and_texts_are_kept_exactly(hostile_report):
    import openpyxl

    d, names, kernel = hostile_report
    wb = openpyxl.load_workbook(d / "r.xlsx")
    texts = set()
    for ws in wb.worksheets:
        for row in ws.iter_rows():
            for cell in row:
                assert cell.data_type != "f", (ws.title, cell.value)
                if isinstance(cell.value, str):
                    texts.add(cell.value)
    assert set(names.values()) <= texts and kernel in texts   # stored as they are, CR included


@pytest.mark.parametrize("engine", ["fast", "openpyxl"])
def test_both_xlsx_engines_store_formula_text_as_text(tmp_path, engine):
    import openpyxl
    import pandas as pd

    from streamtrace.report.writers import write_xlsx

    values = ["=1+1", "+x", "-y", "@z", "pg\r=2+3", "a\n=b"]
    write_xlsx({"s": pd.DataFrame({"t": values, "n": range(len(values))})}, tmp_path / "w.xlsx", engine=engine)
    ws = openpyxl.load_workbook(tmp_path / "w.xlsx").active
    cells = [row[0] for row in ws.iter_rows(min_row=2)]
    assert all(c.data_type == "s" for c in cells)
    assert [c.value.replace("\r", "\n") for c in cells] == [v.replace("\r", "\n") for v in values]


def test_the_pandas_fallback_quotes_a_cr_too(tmp_path):
    """One-column sheets go through pandas' to_csv: a CR still cannot split the row."""
    import pandas as pd

    from streamtrace.report.writers import _write_csv

    _write_csv(pd.DataFrame({"t": ["pg\r=2+3", "plain", "=x"]}), tmp_path / "one.csv")
    with open(tmp_path / "one.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows == [["t"], ["pg\r'=2+3"], ["plain"], ["'=x"]]

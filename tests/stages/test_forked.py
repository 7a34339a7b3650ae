"""forked.split_in_two: work split between this process and a forked child,
and write_csvs on that path giving the same bytes as the serial one."""
import os
import threading

import numpy as np
import pandas as pd
import pytest

from streamtrace.report import writers as report
from streamtrace.errors import StreamtraceError
from streamtrace.parallel.fork import balanced, can_fork, split_in_two


def _writer(path):
    def task():
        with open(path, "w") as f:
            f.write(str(os.getpid()))
    return task


def _require_fork():
    assert can_fork(), f"threads left running by an earlier test: {threading.enumerate()}"


def test_every_task_runs_once_and_both_processes_work(tmp_path):
    _require_fork()
    paths = [tmp_path / f"t{i}" for i in range(5)]
    split_in_two([_writer(p) for p in paths], [5, 4, 3, 2, 1])
    pids = {p.read_text() for p in paths}
    assert len(pids) == 2 and str(os.getpid()) in pids


def test_failure_in_the_child_is_raised_here(tmp_path):
    _require_fork()
    done = tmp_path / "parent"

    def fail():
        raise StreamtraceError("sheet x: disk full")

    # the heavier task goes to this process, the failing one to the child
    with pytest.raises(StreamtraceError, match="sheet x: disk full"):
        split_in_two([_writer(done), fail], [10, 1])
    assert done.read_text() == str(os.getpid())


def test_failure_here_stops_and_reaps_the_child(tmp_path):
    _require_fork()
    started = tmp_path / "child"

    def slow_child():
        started.write_text("x")
        import time
        time.sleep(30)

    def fail():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        split_in_two([fail, slow_child], [10, 1])
    with pytest.raises(ChildProcessError):  # no child left to reap
        os.waitpid(-1, os.WNOHANG)


def test_no_fork_while_another_thread_runs(tmp_path):
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert not can_fork()
        paths = [tmp_path / "a", tmp_path / "b"]
        split_in_two([_writer(p) for p in paths], [1, 1])
        assert {p.read_text() for p in paths} == {str(os.getpid())}
    finally:
        stop.set()
        t.join()


def test_balanced_groups():
    weight = {"a": 10, "b": 1, "c": 1, "d": 1, "e": 9}
    mine, theirs = balanced(list(weight), list(weight.values()))
    assert sorted(mine + theirs) == sorted(weight)
    assert sum(weight[x] for x in mine) == sum(weight[x] for x in theirs) == 11


def _sheets():
    rng = np.random.default_rng(3)
    n = 30_000
    big = pd.DataFrame({"ts": rng.integers(0, 10**9, n) / 1000.0, "name": rng.choice(["=a", "b,c", 'q"'], n),
                        "k": pd.array(rng.integers(0, 5, n), dtype="Int64")})
    return {"big": big, "other": big.iloc[::-1].reset_index(drop=True), "small": big.head(3),
            "empty": big.head(0)}


def _serial_then_forked(monkeypatch, write):
    """write(label) once on one CPU, then with the forked writer forced."""
    _require_fork()
    monkeypatch.setattr(report, "available_cpus", lambda: 1)
    write("serial")
    monkeypatch.setattr(report, "available_cpus", lambda: 2)
    monkeypatch.setattr(report, "_PARALLEL_MIN_CELLS", 0)
    write("forked")


def test_write_csvs_forked_equals_serial(tmp_path, monkeypatch):
    sheets = _sheets()
    _serial_then_forked(monkeypatch, lambda label: report.write_csvs(sheets, tmp_path / label))
    for name in sheets:
        assert (tmp_path / "forked" / f"{name}.csv").read_bytes() == (tmp_path / "serial" / f"{name}.csv").read_bytes()


def test_write_csvs_child_failure_leaves_no_output(tmp_path, monkeypatch):
    _require_fork()
    sheets = _sheets()
    real = report._write_csv

    def failing(df, path):
        if path.endswith("other.csv"):
            raise StreamtraceError(f"{path}: No space left on device")
        real(df, path)

    monkeypatch.setattr(report, "_write_csv", failing)
    monkeypatch.setattr(report, "available_cpus", lambda: 2)
    monkeypatch.setattr(report, "_PARALLEL_MIN_CELLS", 0)
    with pytest.raises(StreamtraceError, match="No space left on device"):
        report.write_csvs(sheets, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".streamtrace-csv-")]


def _members(path):
    import zipfile

    with zipfile.ZipFile(path) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def test_write_xlsx_forked_equals_serial(tmp_path, monkeypatch):
    """A forked child formats some sheets' XML; the workbook holds the same
    members with the same contents as when one process writes it all, and
    pandas reads it back."""
    sheets = _sheets()
    _serial_then_forked(monkeypatch, lambda label: report.write_xlsx(sheets, tmp_path / f"{label}.xlsx"))
    assert _members(tmp_path / "forked.xlsx") == _members(tmp_path / "serial.xlsx")
    back = pd.read_excel(tmp_path / "forked.xlsx", sheet_name=None)
    assert list(back) == list(sheets) and len(back["big"]) == len(sheets["big"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["forked.xlsx", "serial.xlsx"]   # no spool left


def test_write_xlsx_child_failure_leaves_no_output(tmp_path, monkeypatch):
    _require_fork()
    real = report._spool_sheet_xml

    def failing(part, path, extras):
        raise StreamtraceError(f"{path}: No space left on device")

    monkeypatch.setattr(report, "_spool_sheet_xml", failing)
    monkeypatch.setattr(report, "available_cpus", lambda: 2)
    monkeypatch.setattr(report, "_PARALLEL_MIN_CELLS", 0)
    with pytest.raises(StreamtraceError, match="No space left on device"):
        report.write_xlsx(_sheets(), tmp_path / "out.xlsx")
    assert list(tmp_path.iterdir()) == []
    assert real is not failing


# ---------------------------------------------------------------- both

def test_both_returns_each_result_and_runs_there_in_a_child():
    _require_fork()
    from streamtrace.parallel.fork import both

    here, there = both(lambda: ("here", os.getpid()), lambda: ("there", os.getpid(), np.arange(3)))
    assert here == ("here", os.getpid())
    assert there[0] == "there" and there[1] != os.getpid() and there[2].tolist() == [0, 1, 2]


def test_both_raises_the_childs_exception_as_itself():
    _require_fork()
    from streamtrace.errors import TraceError
    from streamtrace.parallel.fork import both

    def fail():
        raise TraceError("r3.json", "truncated", 17)

    with pytest.raises(TraceError, match="r3.json.*truncated"):
        both(lambda: 1, fail)


def test_both_turns_an_exception_that_does_not_pickle_into_its_message():
    _require_fork()
    from streamtrace.parallel.fork import both

    class Local(Exception):   # a local class cannot be pickled by reference
        pass

    def fail():
        raise Local("sheet y: no space left")

    with pytest.raises(StreamtraceError, match="sheet y: no space left"):
        both(lambda: 1, fail)


def test_both_runs_in_order_here_when_it_cannot_fork():
    from streamtrace.parallel.fork import both

    calls = []
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        result = both(lambda: calls.append("here") or os.getpid(), lambda: calls.append("there") or os.getpid())
    finally:
        stop.set()
        t.join()
    assert result == (os.getpid(), os.getpid()) and calls == ["here", "there"]

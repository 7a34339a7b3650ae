"""The C scanner's SIMD paths (csrc/st_scan.c, issue #44): chosen by CPU
detection, forced with STREAMTRACE_SIMD, and the same records byte for byte
from every path."""
import gzip
import json
import os
import platform
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import real_id, real_traces
from scanpaths import scan_path  # noqa: F401 (a fixture)
from streamtrace import _native
from streamtrace._core import ffi, lib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STREAMTRACE = os.path.join(os.path.dirname(sys.executable), "streamtrace")


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or not os.path.exists("/proc/cpuinfo"),
                    reason="CPU flags are read from Linux x86-64's /proc/cpuinfo")
def test_detection_matches_the_cpu_and_auto_takes_the_best():
    flags = cpu_flags()
    want = ["off"] + ["avx2"] * ("avx2" in flags) + ["avx512"] * ({"avx512f", "avx512bw"} <= flags)
    assert _native.simd_paths() == want
    assert _native.apply_simd("") == want[-1] == _native.apply_simd("auto")


def test_unknown_name_is_refused():
    with pytest.raises(_native.InvalidArgumentError, match="STREAMTRACE_SIMD=sse9: not one of"):
        _native.apply_simd("sse9")


@pytest.mark.skipif(set(_native.SIMD_PATHS) == set(_native.simd_paths()), reason="this CPU runs every path")
def test_a_path_the_cpu_lacks_is_refused():
    lacking = next(p for p in _native.SIMD_PATHS if p not in _native.simd_paths())
    before = _native.simd_path()
    with pytest.raises(_native.InvalidArgumentError, match="this CPU cannot run it"):
        _native.apply_simd(lacking)
    assert _native.simd_path() == before


def test_bad_simd_setting_is_one_line_and_exit_1(tmp_path):
    trace = tmp_path / "rank0_trace.json"
    trace.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "pid": 1, "tid": 1}]}))
    out = tmp_path / "out.stev"
    env = dict(os.environ, STREAMTRACE_SIMD="avx1024")
    proc = subprocess.run([STREAMTRACE, "extract", str(trace), "-o", str(out)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "STREAMTRACE_SIMD=avx1024" in lines[0], proc.stderr
    assert not out.exists()


def test_each_path_runs_through_the_command(tmp_path, scan_path):
    """The command honours the forced path (the same stream from each)."""
    trace = tmp_path / "rank0_trace.json"
    events = [{"ph": "X", "cat": "kernel", "name": "k" * 200 + f"\\\"{i}", "ts": i, "dur": 1, "pid": 0, "tid": 7,
               "args": {"correlation": i}} for i in range(50)]
    events += [{"ph": "X", "cat": "python_function", "name": "f", "ts": 1, "dur": 1, "pid": 1, "tid": 1,
                "args": {"blob": ["[{\"}" * 30, {"x": "]" * 100}]}}]
    trace.write_text(json.dumps({"traceEvents": events}))
    out = tmp_path / f"{scan_path}.stev"
    proc = subprocess.run([STREAMTRACE, "extract", str(trace), "-o", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    from streamtrace.stream import read_stream

    data = next(iter(read_stream(out.read_bytes()).values()))
    assert len(data.events) == 50 and data.meta["counts"]["pyfunc_skipped"] == 1


# -------------------------------------------------------- the scanner itself

ALPHABET = b'ab "\\{}[]:,\x00\xff\xdb\x7b\x5b\x7d\x5d\xfb\xfd'


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(min_size=64, max_size=300).map(lambda b: bytes(ALPHABET[c % len(ALPHABET)] if c & 1 else c
                                                                  for c in b)),
       st.integers(0, 300))
def test_scanner_functions_match_a_byte_loop(scan_path, data, stop):
    """Bit masks of 64 bytes and the first quote or backslash, on every path,
    equal a plain loop's; the search never looks past its end (a quote put
    just past it is not found)."""
    buf = ffi.new("char[]", data + b'"')
    m = ffi.new("uint64_t[3]")
    for at in range(0, len(data) - 63, 7):
        lib.st_scan_masks64(buf + at, m, m + 1, m + 2)
        block = data[at:at + 64]
        assert m[0] == sum(1 << i for i, c in enumerate(block) if c == 0x5C)
        assert m[1] == sum(1 << i for i, c in enumerate(block) if c == 0x22)
        assert m[2] == sum(1 << i for i, c in enumerate(block) if c in b"{}[]")
    stop = min(stop, len(data))
    for start in (0, 1, 17, 33):
        if start > stop:
            continue
        got = ffi.cast("char *", lib.st_scan_quote_or_backslash(buf + start, buf + stop)) - buf
        hits = [i for i in range(start, stop) if data[i] in b'"\\']
        assert got == (hits[0] if hits else stop)


# ----------------------------------------------------- records, byte for byte

def tokenize_all(data, chunk, **opts):
    """Everything the tokenizer produces for ``data`` fed ``chunk`` new bytes at a time."""
    tok = _native.Tokenizer(capacity=1000, **opts)
    records, meta, pending, status = [[], [], []], [], bytearray(), None
    for start in range(0, max(len(data), 1), chunk):
        pending += data[start:start + chunk]
        eof = start + chunk >= len(data)
        while True:
            status, consumed = tok.feed(pending, eof=eof)
            del pending[:consumed]
            for i, part in enumerate(tok.take_records()):
                records[i].append(bytes(part))
            meta += tok.take_meta()
            if status != _native.OUTPUT_FULL:
                break
    return status, [b"".join(r) for r in records], tok.take_new_strings()[1], meta, tok.counts()


def read_plain(path):
    with open(path, "rb") as f:
        data = f.read()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


OPTION_SETS = [{}, {"keep_pyfunc": True}, {"drop_flows": True, "align_only": True}]


@pytest.mark.parametrize("path", real_traces(), ids=real_id)
def test_real_traces_give_the_same_records_on_every_path(path):
    """Records, strings, metadata and counts of every real trace are the
    same bytes from every path, at two chunkings, with each option set."""
    data = read_plain(path)
    for opts in OPTION_SETS:
        for chunk in (1 << 20, 65521):
            got = {}
            for name in _native.simd_paths():
                _native.apply_simd(name)
                got[name] = tokenize_all(data, chunk, **opts)
            _native.apply_simd("")
            first = got["off"]
            for name, result in got.items():
                assert result == first, f"{name} differs from off ({opts}, chunk {chunk})"


tricky = st.lists(st.sampled_from(['"', "\\", "\\\\", "{", "}", "[", "]", "a", " ", "é", "x" * 33, "y" * 64]),
                  max_size=30).map("".join)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["python_function", "kernel", "cpu_op"]), tricky,
                          st.recursive(tricky | st.integers(), lambda k: st.lists(k, max_size=4) |
                                       st.dictionaries(tricky, k, max_size=3), max_leaves=12)),
                min_size=1, max_size=8),
       st.integers(1, 300), st.booleans())
def test_generated_traces_give_the_same_records_on_every_path(events, chunk, indent):
    """Long names with escapes, skipped events and args full of brackets
    and quotes inside strings: the same bytes from every path."""
    doc = {"traceEvents": [{"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": i, "dur": 1,
                            "args": {"blob": blob, "External id": i, "name": name}}
                           for i, (cat, name, blob) in enumerate(events)]}
    data = json.dumps(doc, ensure_ascii=False, indent=1 if indent else None).encode()
    got = {}
    for name in _native.simd_paths():
        _native.apply_simd(name)
        got[name] = (tokenize_all(data, chunk), tokenize_all(data, chunk, align_only=True, drop_flows=True))
    _native.apply_simd("")
    assert got["off"][0][0] == _native.DONE
    assert all(result == got["off"] for result in got.values())

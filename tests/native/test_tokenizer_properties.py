"""Property tests for the C tokenizer (hypothesis).

- any chunking of the input gives identical records, strings and metadata;
- numbers parse exactly (decimal -> int64 ns, half-even) like Decimal does;
- mutated or random input never crashes: it extracts or raises TraceError.
"""
import gzip
import io
import json
from decimal import Decimal

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reference import scaled_int
from streamtrace import TraceError, _native
from streamtrace.extract import decode_raw_string, extract_rank

SAMPLE = (
    b'{\n  "schemaVersion": 1,\n  "deviceProperties": [{"id": 0, "numSms": 80}],\n'
    b'  "distributedInfo": {"backend": "nccl", "rank": 2, "world_size": 4},\n  "traceEvents": [\n'
    b'  {\n    "ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)",'
    b' "pid": 0, "tid": 84,\n    "ts": 1694128201429795.123, "dur": 2146,\n'
    b'    "args": {"External id": 41246, "stream": 84, "correlation": 41246, "grid": [8, 1, 1],'
    b' "block": [640, 1, 1], "blocks per SM": 0.1, "Collective name": "allreduce", "In msg nelems": 1024,'
    b' "Process Group Ranks": "[0, 1, 2, 3]", "dtype": "Float"}\n  },\n'
    b'  {"ph": "f", "id": 41246, "pid": 0, "tid": 84, "ts": 1694128201429795.123, "cat": "ac2g",'
    b' "name": "ac2g", "bp": "e"},\n'
    b'  {"ph": "X", "cat": "python_function", "name": "x.py(1): f", "pid": 1, "tid": 1, "ts": 5, "dur": 1},\n'
    b'  {"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce \\"quoted\\" \\u00e9", "pid": 1,'
    b' "tid": "thread 7", "ts": 4, "dur": 10, "args": {"Input Dims": [[6144]], "Input type": ["float"]}},\n'
    b'  {"name": "thread_name", "ph": "M", "pid": 0, "tid": 84, "args": {"name": "stream 84 "}},\n'
    b'  {"ph": "i", "s": "g", "pid": "Traces", "tid": "Trace PyTorch Profiler", "ts": 1, "name": "it"}\n'
    b'  ],\n  "traceName": "x.json",\n  "baseTimeNanoseconds": 1711964646000000000\n}\n'
)


def tokenize(data, cuts, keep_pyfunc=False, capacity=3, drop_flows=False, align_only=False):
    """Feed ``data`` split at ``cuts`` (a small output capacity forces
    OUTPUT_FULL round trips too); return everything the tokenizer produced."""
    tok = _native.Tokenizer(keep_pyfunc=keep_pyfunc, capacity=capacity, drop_flows=drop_flows, align_only=align_only)
    records, meta = [b"", b"", b""], []
    pending = bytearray()
    bounds = sorted(set(c for c in cuts if 0 < c < len(data))) + [len(data)]
    start = 0
    for end in bounds:
        pending += data[start:end]
        start = end
        eof = end == len(data)
        while True:
            status, consumed = tok.feed(pending, eof=eof)
            del pending[:consumed]
            for i, part in enumerate(tok.take_records()):
                records[i] += part
            meta += tok.take_meta()
            if status != _native.OUTPUT_FULL:
                break
    _, strings = tok.take_new_strings()
    return status, records, strings, meta, tok.counts()["events_stored"]


REFERENCE = tokenize(SAMPLE, [])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(SAMPLE)), max_size=40))
def test_any_chunking_gives_identical_output(cuts):
    assert tokenize(SAMPLE, cuts) == REFERENCE
    assert REFERENCE[0] == _native.DONE and REFERENCE[4] == 5


def test_top_level_members_are_taken():
    """take_meta skips its C calls when the last feed reported no members
    waiting (``n_meta``): the members still all arrive, in order."""
    assert [k for k, _ in REFERENCE[3]] == [b"schemaVersion", b"deviceProperties", b"distributedInfo", b"traceName",
                                         b"baseTimeNanoseconds"]


def test_records_taken_stay_intact_and_read_only(monkeypatch):
    """Full record arrays are handed over rather than copied: what
    take_records returned must not change as the tokenizer fills its next
    arrays, and must not be writable (the frames built on it are shared).
    The new arrays are not cleared, so the tokenizer must write every byte
    of a record, padding included: here they start full of garbage."""
    def garbage(ctype, n):
        array = _native.ffi.new(ctype, n)
        size = _native.ffi.sizeof(array)
        _native.ffi.memmove(array, b"\xab" * size, size)
        return array

    monkeypatch.setattr(_native, "_new_uncleared", garbage)
    tok = _native.Tokenizer(capacity=1)   # every record is a full array, and every array starts as garbage
    parts, status, pending = [[], [], []], _native.OUTPUT_FULL, bytearray(SAMPLE)
    while status == _native.OUTPUT_FULL:
        status, consumed = tok.feed(pending, eof=True)
        del pending[:consumed]
        for i, part in enumerate(tok.take_records()):
            parts[i].append(part)
    assert status == _native.DONE
    handed = [p for p in parts[0] if isinstance(p, memoryview)]
    assert len(handed) == 5 and sum(isinstance(p, memoryview) for p in parts[2]) == 2   # 5 events, 2 comms
    assert all(p.readonly and not np.frombuffer(p, np.uint8).flags.writeable for p in handed)
    assert [b"".join(p) for p in parts] == REFERENCE[1]


NO_FLOWS = tokenize(SAMPLE, [], drop_flows=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(SAMPLE)), max_size=40))
def test_drop_flows_at_any_chunking(cuts):
    """drop_flows leaves out the one flow event of SAMPLE, wherever the input is cut."""
    assert tokenize(SAMPLE, cuts, drop_flows=True) == NO_FLOWS
    assert NO_FLOWS[0] == _native.DONE and NO_FLOWS[4] == REFERENCE[4] - 1
    assert NO_FLOWS[1][1] == REFERENCE[1][1]   # the kernel record (its event comes before the flow)


# events align reads (kept), events it never reads (left out) and events the
# tokenizer cannot rule out (kept): escaped names, members in unusual order
ALIGN_EXTRA = (
    b'  {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 6, "dur": 3,'
    b' "args": {"External id": 7, "Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"]}},\n'
    b'  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 7, "dur": 1,'
    b' "args": {"External id": 7, "correlation": 99}},\n'
    b'  {"ph": "X", "cat": "cuda_runtime", "name": "cudaEventRecord", "pid": 1, "tid": 1, "ts": 8, "dur": 1,'
    b' "args": {"correlation": 100}},\n'
    b'  {"ph": "X", "cat": "cpu_op", "name": "aten::\\u006dm", "pid": 1, "tid": 1, "ts": 9, "dur": 1},\n'
    b'  {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 7, "ts": 9, "dur": 2,'
    b' "args": {"bytes": 8}},\n'
    b'  {"name": "aten::add", "args": {"External id": 8}, "cat": "cpu_op", "ph": "X", "pid": 1, "tid": 1,'
    b' "ts": 11, "dur": 1},\n'
    b'  {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1, "ts": 12, "dur": 4},\n'
)
ALIGN_SAMPLE = SAMPLE.replace(b'  {"ph": "i"', ALIGN_EXTRA + b'  {"ph": "i"')
ALIGN_FULL = tokenize(ALIGN_SAMPLE, [], drop_flows=True)
ALIGN_LEAN = tokenize(ALIGN_SAMPLE, [], drop_flows=True, align_only=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(ALIGN_SAMPLE)), max_size=40))
def test_align_only_at_any_chunking(cuts):
    """align_only leaves out aten::mm, cudaEventRecord, the memcpy and
    aten::add (its name comes first), wherever the input is cut; the escaped
    name is kept."""
    assert tokenize(ALIGN_SAMPLE, cuts, drop_flows=True, align_only=True) == ALIGN_LEAN
    assert ALIGN_LEAN[0] == _native.DONE and ALIGN_FULL[4] == REFERENCE[4] - 1 + 7
    assert ALIGN_LEAN[4] == ALIGN_FULL[4] - 4
    assert b"aten::mm" not in ALIGN_LEAN[2] and b"aten::add" not in ALIGN_LEAN[2]
    assert {b"cudaLaunchKernel", b"c10d::allreduce_", b"aten::\\u006dm"} <= set(ALIGN_LEAN[2])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunk=st.integers(min_value=1, max_value=4096))
def test_extract_chunk_size_does_not_matter(tmp_path, chunk):
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(SAMPLE * 1))
    frames = list(extract_rank(str(path), chunk_size=chunk))
    baseline = list(extract_rank(str(path)))
    assert [(f.kind, f.payload) for f in frames if f.kind != 1] == \
           [(f.kind, f.payload) for f in baseline if f.kind != 1] or \
           _same_records(frames, baseline)


def _same_records(a, b):
    """Frames may be split differently; the concatenated records must match."""
    def joined(frames, kind):
        return b"".join(f.records().tobytes() for f in frames if f.kind == kind)
    return all(joined(a, k) == joined(b, k) for k in (3, 4, 5))


numbers = st.one_of(
    st.integers(min_value=-(10**18), max_value=10**18).map(str),
    st.decimals(allow_nan=False, allow_infinity=False, places=None,
                min_value=Decimal("-1e15"), max_value=Decimal("1e15")).map(lambda d: format(d, "f")),
    st.tuples(st.integers(0, 10**6), st.integers(-30, 30)).map(lambda t: f"{t[0]}e{t[1]}"),
    st.tuples(st.integers(0, 999999), st.integers(0, 10**9)).map(lambda t: f"{t[0]}.{t[1]:09d}"),
    # around int64's end in ns (9223372036854775.807 us), where the fast path must give way
    st.builds(lambda sign, us, frac: f"{sign}{us}" + (f".{frac:03d}" if frac >= 0 else ""),
              st.sampled_from(["", "-"]), st.integers(9_223_372_036_854_000, 9_223_372_036_856_000),
              st.integers(-1, 999)),
)


@settings(max_examples=500, deadline=None)
@given(numbers)
@example("9223372036854776")        # 16 digits of us: past int64 in ns (once taken by the fast path)
@example("9223372036854775.807")    # INT64_MAX ns exactly
@example("9223372036854775.808")
@example("-9223372036854775.807")
def test_timestamps_parse_exactly(text):
    doc = b'{"traceEvents": [{"ph": "X", "ts": ' + text.encode() + b', "args": {"correlation": ' + text.encode() + b"}}]}"
    status, (events, _, _), _, _, n = tokenize(doc, [])
    rec = _native.np.frombuffer(events, dtype=_native.EVENT_DTYPE)[0]
    expected_ns = scaled_int(Decimal(text), 3)
    has_ts = bool(rec["flags"] & _native.FLAGS["has_ts"])
    assert has_ts == (expected_ns != _native.NONE)
    if has_ts:
        assert rec["ts"] == expected_ns
    assert rec["correlation"] == scaled_int(Decimal(text), 0)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_mutated_input_never_crashes(tmp_path, data):
    buf = bytearray(SAMPLE)
    for _ in range(data.draw(st.integers(1, 8))):
        op = data.draw(st.sampled_from(["flip", "delete", "insert", "truncate"]))
        pos = data.draw(st.integers(0, max(len(buf) - 1, 0)))
        if op == "flip" and buf:
            buf[pos] = data.draw(st.integers(0, 255))
        elif op == "delete" and buf:
            del buf[pos:pos + data.draw(st.integers(1, 20))]
        elif op == "insert":
            buf[pos:pos] = data.draw(st.sampled_from([b"{", b"[", b"]", b"}", b'"', b"\\", b",", b":", b"\x00", b"1e999"]))
        else:
            del buf[pos:]
    path = tmp_path / "m.json"
    path.write_bytes(bytes(buf))
    try:
        list(extract_rank(str(path)))
    except TraceError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20) |
                    st.floats(allow_nan=False, allow_infinity=False),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                    max_leaves=30))
def test_random_json_values_in_events_never_crash(value):
    for key in ("ts", "pid", "name", "args", "grid", "ph", "id"):
        ev = {"ph": "X", key: value, "args": {key: value, "grid": value, "Collective name": value}}
        doc = json.dumps({"traceEvents": [ev, {"ph": "X", "name": "after"}]}).encode()
        status, _, strings, _, n = tokenize(doc, [len(doc) // 2])
        assert status == _native.DONE and n == 2 and "after" in [decode_raw_string(s) for s in strings]


def test_bom_split_across_chunks():
    doc = b"\xef\xbb\xbf" + SAMPLE
    for cut in (1, 2, 3):
        assert tokenize(doc, [cut]) == REFERENCE


PAD = b" " * 40  # room after a value, so the tokenizer's word-at-a-time paths run


@settings(max_examples=500, deadline=None)
@given(numbers, st.sampled_from([b"", PAD]))
def test_numbers_parse_exactly_on_fast_and_slow_paths(text, pad):
    """Integers, floats and grid triples come out the same whether the bytes
    after the value allow the word-at-a-time paths (pad) or not."""
    t = text.encode()
    doc = (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": ' + t + pad + b', "args": {"correlation": ' + t + pad +
           b', "blocks per SM": ' + t + pad + b', "grid": [' + t + pad + b", 2" + pad + b", 3" + pad + b"]" + pad +
           b"}}]}")
    status, (events, kernels, _), _, _, n = tokenize(doc, [])
    assert n == 1
    rec = _native.np.frombuffer(events, dtype=_native.EVENT_DTYPE)[0]
    assert rec["correlation"] == scaled_int(Decimal(text), 0)
    expected_ns = scaled_int(Decimal(text), 3)
    if expected_ns != _native.NONE:
        assert rec["ts"] == expected_ns
    k = _native.np.frombuffer(kernels, dtype=_native.KERNEL_DTYPE)[0]
    assert k["blocks_per_sm"] == _native.np.float32(float(text))
    v = scaled_int(Decimal(text), 0)
    fits = v != _native.NONE and -(2**31) <= v < 2**31
    assert list(k["grid"]) == ([v, 2, 3] if fits else [-1, -1, -1])


# JSON values with the bytes that make skipping hard: brackets and quotes
# inside strings, escapes, backslash runs, long strings that cross 64-byte
# blocks, deep nesting.
tricky_text = st.lists(st.sampled_from(list('ab{}[]",:\\ é') + ["\\\\", '\\"', "x" * 70]), max_size=12).map("".join)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), tricky_text),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(tricky_text, inner, max_size=4)),
    max_leaves=25,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.booleans(), json_values), min_size=1, max_size=6), st.booleans())
def test_skipped_values_match_the_reference(tmp_path, events, keep_pyfunc):
    """Events whose args hold arbitrary nested values, some of them dropped
    python_function events, extract exactly as the json-based reference."""
    from helpers import assert_matches_reference

    doc = {"traceEvents": []}
    for i, (pyfunc, value) in enumerate(events):
        doc["traceEvents"].append({"ph": "X", "cat": "python_function" if pyfunc else "cpu_op", "name": f"e{i}",
                                   "pid": 1, "tid": 1, "ts": i, "dur": 1, "args": {"blob": value, "External id": i}})
        doc["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": i, "dur": 1,
                                   "args": {"nested": [value, {"v": value}], "correlation": i}})
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc, ensure_ascii=False, indent=1 if keep_pyfunc else None))
    assert_matches_reference(str(path), keep_pyfunc=keep_pyfunc)

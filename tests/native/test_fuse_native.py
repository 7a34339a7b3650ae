"""The C rewriter (csrc/st_fuse.c) under hypothesis: any chunking of the input
and any output-buffer size give identical bytes; hostile input never crashes
and, when accepted, always yields strict JSON; ts shifting is exact decimal
arithmetic; lanes always leave properly nested tracks."""
import json
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fuse_reference import interval_violations, load_last_wins, load_strict, ordered, undo
from streamtrace._native import Fuser, NativeError

FL = Fuser.FLAGS
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SAMPLE = (
    b'\xef\xbb\xbf{"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "GPU"}],\n'
    b' "distributedInfo": {"rank": 3, "world_size": 4},\n'
    b' "traceEvents": [\n'
    b'  {"name": "process_name", "ph": "M", "pid": 42, "tid": 0, "args": {"name": "python3"}},\n'
    b'  {"name": "thread_name", "ph": "M", "pid": 42, "tid": 7, "args": {"name": "thread 7 (main)"}},\n'
    b'  {"name": "thread_name", "ph": "M", "pid": 99, "tid": 1, "args": {"name": "idle"}},\n'
    b'  {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 42, "tid": 7, "ts": 1694128201429795,'
    b' "dur": 12, "args": {"External id": 5, "Input Dims": [[8, 16], []], "Ev Idx": 0}},\n'
    b'  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 42, "tid": 7,'
    b' "ts": 1694128201429797.5, "dur": 3, "args": {"correlation": 77, "External id": 5, "cbid": 211}},\n'
    b'  {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", "pid": 0,'
    b' "tid": 20, "ts": 1694128201429801, "dur": 40, "args": {"correlation": 77, "grid": [8, 1, 1],'
    b' "est. achieved occupancy %": NaN, "note": "caf\xc3\xa9 \\u00e9 \\q \x01 \xff"}},\n'
    b'  {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 20, "ts": 1694128201429830,'
    b' "dur": 20, "args": {"correlation": 78}},\n'
    b'  {"ph": "s", "id": 77, "pid": 42, "tid": 7, "ts": 1694128201429797.5, "cat": "ac2g", "name": "ac2g"},\n'
    b'  {"ph": "f", "id": 77, "pid": 0, "tid": 20, "ts": 1694128201429801, "cat": "ac2g", "name": "ac2g",'
    b' "bp": "e"},\n'
    b'  {"ph": "X", "cat": "python_function", "name": "f", "pid": 42, "tid": 7, "ts": 1e3, "dur": 1},\n'
    b'  {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",'
    b' "ts": 1694128201429000, "dur": 5000},\n'
    b'  {"name": "Iteration Start", "ph": "i", "s": "g", "pid": "Traces", "tid": "Trace", "ts": 0.125},\n'
    b'  {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": -1.5},\n'
    b'  {"ph": "X", "cat": "cpu_op", "name": "big", "pid": 42, "tid": 7, "ts": 12345678901234567890123,'
    b' "dur": 1, "args": [1, 2]},\n'
    b'  {"ph": "X", "name": "no args", "pid": 42, "tid": 7, "ts": 1694128201429900, "dur": 0},\n'
    b'  {"ph": "X", "cat": "cpu_op", "name": "dup", "pid": 42, "tid": 7, "ts": 1694128201429795,'
    b' "dur": 12, "args": {"rank": 9, "pid_raw": 1}}\n'
    b' ],\n "traceName": "x", "baseTimeNanoseconds": 1711964646000000000}\n'
)


def feed_all(fz, doc, mode, cuts=(), out_cap=1 << 16, decide=None, on_run=None):
    """Feed ``doc`` in pieces cut at ``cuts``; returns (status, output bytes).

    Mimics streamtrace.fuse._feed_file: unconsumed bytes are passed again
    with the next piece; a full output buffer is drained; a too-small one grown.
    """
    cuts = sorted({c for c in cuts if 0 < c < len(doc)})
    pieces = [doc[a:b] for a, b in zip([0] + cuts, cuts + [len(doc)])]
    out = bytearray(max(out_cap, 1)) if mode == Fuser.WRITE else None
    written, buf, i = [], b"", 0
    while True:
        if i < len(pieces):
            buf += pieces[i]
            i += 1
        eof = i == len(pieces)
        status, consumed, n = fz.feed(buf, eof, out)
        if n:
            written.append(bytes(out[:n]))
        buf = buf[consumed:]
        if status == Fuser.NAME:
            fz.decide_name(decide(fz.pending_name()))
            continue
        if status == Fuser.OUTPUT_FULL:
            continue
        if status == Fuser.OUTPUT_SMALL:
            out = bytearray(2 * len(out))
            continue
        if status == Fuser.RUN:
            on_run()
            continue
        if status == Fuser.TRUNCATED or (status == Fuser.DONE and eof):
            return status, b"".join(written)
        if status == Fuser.OK and eof:
            return status, b"".join(written)


def take_run(fz, runs):
    buf, n, size = fz.take_run()
    runs.append((bytes(buf), n, size))


def finish_with_runs(fz, runs, chunk=3):
    """finish_scan, then merge the spilled runs back, fed in small chunks."""
    status = fz.finish_scan()
    while status == Fuser.RUN:
        take_run(fz, runs)
        status = fz.finish_scan()
    if status != Fuser.MERGE:
        assert status == Fuser.OK and not runs
        return
    pos, held = [0] * len(runs), {}
    fz.merge_begin(len(runs))
    while True:
        status, run = fz.merge()
        if status == Fuser.OK:
            return
        data, n, size = runs[run]
        take = min(chunk, n - pos[run])
        held[run] = bytearray(data[pos[run] * size:(pos[run] + take) * size])
        pos[run] += take
        fz.merge_feed(run, held[run], take, pos[run] >= n)


def fuse_bytes(doc, rank=3, flags=FL["comma_first"], scan_cuts=(), write_cuts=(), out_cap=1 << 16,
               decide=None, interval_budget=0, **cfg):
    """Scan then write one document; returns (fused events text, scan stats, tracks, write stats)."""
    fz = Fuser(rank=rank, flags=flags, interval_budget=interval_budget, **cfg)
    fz.begin(fz.SCAN)
    runs = []
    feed_all(fz, doc, fz.SCAN, scan_cuts, decide=decide, on_run=lambda: take_run(fz, runs))
    finish_with_runs(fz, runs)
    scan, tracks = fz.stats(), fz.tracks()
    pids = sorted({t["pid"] for t in tracks if isinstance(t["pid"], int) and t["n_kept"]})
    fz.set_pid_map(pids, [rank * 1000 + p for p in pids])
    for t in tracks:
        if t["n_lanes"] > 1 and isinstance(t["tid"], int):
            fz.set_lane_base(t["index"], 10_000 + t["tid"] * 100)
    fz.begin(fz.WRITE)
    _, text = feed_all(fz, doc, fz.WRITE, write_cuts, out_cap, decide=decide)
    return text, scan, tracks, fz.stats()


def as_events(text, comma_first=True):
    body = text[1:] if comma_first and text.startswith(b",") else text
    return load_strict(b"[" + body + b"]")


# ---------------------------------------------------------------- the sample

def test_sample_rewrites():
    text, scan, tracks, ws = fuse_bytes(SAMPLE, id_offset=3_000_000, ts_shift_ns=1500)
    ev = as_events(text)
    by_name = {e["name"]: e for e in ev}
    assert "process_name" not in by_name and "f" not in by_name and "PyTorch Profiler (0)" not in by_name
    assert "idle" not in {e["args"].get("name") for e in ev}  # thread of a process with no events
    k = by_name["ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)"]
    assert k["pid"] == 3000 and k["args"]["pid_raw"] == 0
    assert k["args"]["correlation"] == 3_000_077 and k["args"]["correlation_raw"] == 77
    assert k["args"]["est. achieved occupancy %"] is None          # NaN -> null
    assert k["args"]["note"] == "caf\u00e9 \u00e9 \\q \x01 \ufffd"  # repaired, still readable
    assert k["ts"] == Decimal("1694128201429802.5") and k["args"]["rank"] == 3
    launch = by_name["cudaLaunchKernel"]
    assert launch["ts"] == Decimal("1694128201429799.000")
    s = [e for e in ev if e["ph"] == "s"][0]
    assert s["id"] == 3_000_077 and s["args"]["id_raw"] == 77 and s["ts"] == launch["ts"]
    assert by_name["Iteration Start"]["pid"] == "Traces (rank 3)" and by_name["Iteration Start"]["ts"] == Decimal("1.625")
    assert by_name["Record Window End"]["pid"] == "(rank 3)" and by_name["Record Window End"]["ts"] == 0
    big = by_name["big"]
    assert big["ts"] == Decimal("12345678901234567890124.5") and big["args"] == {"rank": 3, "pid_raw": 42, "args_raw": [1, 2]}
    assert by_name["no args"]["args"] == {"rank": 3, "pid_raw": 42}
    assert by_name["dup"]["args"] == {"rank": 3, "pid_raw": 42}     # inputs' own rank/pid_raw replaced
    assert ws["bad_literals"] == 1 and ws["repaired_strings"] == 1
    assert scan["events_seen"] == ws["events_seen"] == 16
    main = [t for t in tracks if t["name"] == b"thread 7 (main)"]
    assert main and main[0]["n_kept"] == 6


def test_sample_meta_members():
    fz = Fuser(rank=0)
    fz.begin(fz.SCAN)
    feed_all(fz, SAMPLE, fz.SCAN)
    meta = dict(fz.meta())
    assert list(meta) == [b"schemaVersion", b"deviceProperties", b"distributedInfo", b"traceName",
                          b"baseTimeNanoseconds"]
    assert json.loads(meta[b"distributedInfo"]) == {"rank": 3, "world_size": 4}


# ---------------------------------------------------------------- chunking

@SETTINGS
@given(scan_cuts=st.lists(st.integers(0, len(SAMPLE)), max_size=12),
       write_cuts=st.lists(st.integers(0, len(SAMPLE)), max_size=12),
       out_cap=st.sampled_from([1, 7, 64, 300, 1 << 16]),
       shift=st.integers(-10 ** 12, 10 ** 12))
def test_any_chunking_gives_identical_output(scan_cuts, write_cuts, out_cap, shift):
    whole = fuse_bytes(SAMPLE, ts_shift_ns=shift, id_offset=5000)
    cut = fuse_bytes(SAMPLE, ts_shift_ns=shift, id_offset=5000, scan_cuts=scan_cuts, write_cuts=write_cuts,
                     out_cap=out_cap, interval_budget=1 + out_cap % 5)
    assert cut[0] == whole[0]
    assert cut[2] == whole[2]
    for key in ("events_seen", "events_kept", "bad_literals", "repaired_strings", "pid_min", "pid_max",
                "id_min", "id_max", "lane_moves"):
        assert cut[1][key] == whole[1][key] and cut[3][key] == whole[3][key], key


@SETTINGS
@given(data=st.data())
def test_any_chunking_on_a_generated_trace(sample_trace, data):
    cuts = data.draw(st.lists(st.integers(0, len(sample_trace)), min_size=1, max_size=30))
    whole = fuse_bytes(sample_trace, ts_shift_ns=-123_456_789)
    cut = fuse_bytes(sample_trace, ts_shift_ns=-123_456_789, scan_cuts=cuts, write_cuts=cuts[::-1], out_cap=4096,
                     interval_budget=data.draw(st.sampled_from([0, 64, 1000])))
    assert cut[0] == whole[0] and cut[2] == whole[2]


@pytest.fixture(scope="module")
def sample_trace(tmp_path_factory):
    import generate_fixture as gen

    d = tmp_path_factory.mktemp("native")
    truth = gen.generate(str(d), ranks=2, steps=1, fill_ops=20, format="json", seed=5)
    with open(d / truth["files"]["1"], "rb") as f:
        return f.read()


def test_name_decisions_are_asked_once_per_name(sample_trace):
    asked = []

    def decide(raw):
        asked.append(raw)
        return raw.startswith(b"aten::")

    text, scan, _, ws = fuse_bytes(sample_trace, flags=FL["comma_first"] | FL["name_filter"], decide=decide)
    assert len(asked) == len(set(asked)) > 10
    ev = as_events(text)
    assert ev and all(e["name"].startswith("aten::") for e in ev if e["ph"] != "M")
    assert scan["dropped_name"] == ws["dropped_name"] > 0


# ---------------------------------------------------------------- hostile input

def _mutate(doc, ops):
    b = bytearray(doc)
    for kind, pos, val in ops:
        if not b:
            break
        pos %= len(b)
        if kind == 0:
            b[pos] = val
        elif kind == 1:
            b[pos:pos] = bytes([val]) * (1 + val % 3)
        elif kind == 2:
            del b[pos:pos + 1 + val % 16]
        else:
            del b[pos:]
    return bytes(b)


@SETTINGS
@given(ops=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1 << 20), st.integers(0, 255)),
                    min_size=1, max_size=6),
       cuts=st.lists(st.integers(0, 2000), max_size=5))
def test_mutated_input_never_crashes(ops, cuts):
    doc = _mutate(SAMPLE, ops)
    try:
        text, scan, _, ws = fuse_bytes(doc, scan_cuts=cuts, write_cuts=cuts, out_cap=256,
                                       ts_shift_ns=1, id_offset=7)
    except NativeError as exc:
        assert str(exc) and exc.code < 0
        return
    ev = as_events(text)  # whatever was accepted is strict JSON, duplicate keys resolved at every depth
    assert len(ev) == ws["events_kept"]


@SETTINGS
@given(junk=st.binary(max_size=64))
def test_strings_with_any_bytes_become_valid_json(junk):
    assume(b'"' not in junk and (len(junk) - len(junk.rstrip(b"\\"))) % 2 == 0)
    doc = b'{"traceEvents":[{"ph":"X","name":"' + junk + b'","pid":1,"tid":1,"ts":1,"dur":1}]}'
    text, _, _, ws = fuse_bytes(doc)
    ev = as_events(text)
    assert len(ev) == 1
    try:
        want = json.loads((b'"' + junk + b'"').decode("utf-8"))
    except ValueError:
        assert ws["repaired_strings"] == 1
        if b"\\" not in junk and not any(c < 0x20 for c in junk):
            # invalid UTF-8 only: one U+FFFD per maximal invalid subpart, as Python decodes it
            assert ev[0]["name"] == junk.decode("utf-8", "replace")
    else:
        assert ev[0]["name"] == want


def test_errors_carry_a_message_and_offset():
    for doc, what in ((b'{"traceEvents":[{"ph" "X"}]}', "':'"),
                      (b'{"traceEvents":[{"ph":"X",}]}', "key"),
                      (b'{"traceEvents":[{"args":{"a":[1,2}}]}', "bracket"),
                      (b'42', "not a trace"),
                      (b'{"traceEvents":{}}', "not an array"),
                      (b'{"traceEvents":[]} x', "after the end")):
        with pytest.raises(NativeError) as ei:
            fuse_bytes(doc)
        assert what in str(ei.value)
        assert ei.value.offset is not None and 0 <= ei.value.offset <= len(doc)
    deep = b'{"traceEvents":[{"args":{"a":' + b"[" * 300 + b"]" * 300 + b"}}]}"
    with pytest.raises(NativeError, match="deeper") as ei:
        fuse_bytes(deep)
    assert ei.value.code == -2


def test_truncated_document_keeps_complete_events():
    cut = SAMPLE[: SAMPLE.index(b'"big"')]
    fz = Fuser(rank=0, flags=FL["comma_first"])
    fz.begin(fz.SCAN)
    status, _ = feed_all(fz, cut, fz.SCAN)
    assert status == Fuser.TRUNCATED and fz.stats()["events_seen"] == 13


def test_api_misuse_is_reported():
    fz = Fuser(rank=0, flags=FL["name_filter"])
    fz.begin(fz.SCAN)
    status, _, _ = fz.feed(SAMPLE, True)
    assert status == Fuser.NAME
    with pytest.raises(NativeError, match="awaits"):
        fz.feed(SAMPLE, True)
    fz.begin(fz.WRITE)
    with pytest.raises(NativeError, match="output buffer"):
        fz.feed(SAMPLE, True)
    with pytest.raises(NativeError, match="after a scan"):
        fz.finish_scan()


# ---------------------------------------------------------------- exact ts arithmetic

numbers = st.one_of(
    st.integers(-10 ** 20, 10 ** 20).map(str),
    st.tuples(st.integers(-10 ** 16, 10 ** 16), st.integers(0, 10 ** 9), st.integers(1, 9)).map(
        lambda t: f"{'-' if t[0] < 0 else ''}{abs(t[0])}.{str(t[1]).zfill(t[2])[:t[2]]}"),
    st.tuples(st.integers(1, 99999), st.integers(-12, 12), st.sampled_from(["e", "E"])).map(
        lambda t: f"{t[0]}{t[2]}{t[1]:+d}"),
)


@SETTINGS
@given(ts=numbers, shift=st.integers(-(10 ** 15), 10 ** 15))
def test_ts_shift_is_exact(ts, shift):
    doc = b'{"traceEvents":[{"ph":"i","name":"x","pid":1,"tid":1,"ts":' + ts.encode() + b"}]}"
    text, _, _, ws = fuse_bytes(doc, ts_shift_ns=shift)
    out = as_events(text)[0]["ts"]
    assert Decimal(out) == Decimal(ts) + Decimal(shift) / 1000
    assert "e" not in str(out).lower() or shift == 0
    assert ws["ts_unshifted"] == 0


def test_ts_beyond_exact_range_is_left_alone():
    ts = "1" + "0" * 120
    doc = b'{"traceEvents":[{"ph":"i","name":"x","pid":1,"tid":1,"ts":' + ts.encode() + b"}]}"
    text, _, _, ws = fuse_bytes(doc, ts_shift_ns=5)
    assert as_events(text)[0]["ts"] == int(ts) and ws["ts_unshifted"] == 1


# ---------------------------------------------------------------- lanes


@SETTINGS
@given(ivs=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 25), st.integers(0, 2)), min_size=1, max_size=60),
       budget=st.sampled_from([0, 1, 2, 5, 17]))
def test_lanes_leave_every_track_nested(ivs, budget):
    events = [{"ph": "X", "name": f"e{i}", "cat": "cpu_op", "pid": 5, "tid": 9 + k, "ts": t, "dur": d}
              for i, (t, d, k) in enumerate(ivs)]
    doc = json.dumps({"traceEvents": events}).encode()
    text, scan, tracks, ws = fuse_bytes(doc, interval_budget=budget)
    if budget:  # spilling sorted runs and merging them back changes nothing
        ref_text, ref_scan, ref_tracks, _ = fuse_bytes(doc)
        assert text == ref_text and scan["lane_moves"] == ref_scan["lane_moves"] and tracks == ref_tracks
    ev = as_events(text)
    assert len(ev) == len(ivs)
    for k in range(3):
        before = interval_violations([(t, -(t + d)) for t, d, kk in ivs if kk == k])
        track = [t for t in tracks if t["tid"] == 9 + k]
        by_tid = {}
        for e in ev:
            if e["args"].get("tid_raw", e["tid"]) == 9 + k:
                by_tid.setdefault(e["tid"], []).append((e["ts"], -(e["ts"] + e["dur"])))
        assert all(interval_violations(v) == 0 for v in by_tid.values())
        if track:
            assert (track[0]["n_moved"] == 0) == (before == 0)
            assert len(by_tid) == track[0]["n_lanes"]
    assert sum(1 for e in ev if "lane" in e["args"]) == scan["lane_moves"] == sum(t["n_moved"] for t in tracks)
    want = reference_lanes([(9 + k, t, t + d) for t, d, k in ivs])
    assert [e["args"].get("lane", 0) for e in ev] == want


def reference_lanes(ivs):
    """The documented lane rule, in Python: per track, by (ts, longest first,
    file order), the first lane where the interval nests in the innermost open one."""
    lanes = [0] * len(ivs)
    order = sorted(range(len(ivs)), key=lambda i: (ivs[i][0], ivs[i][1], -ivs[i][2], i))
    stacks, track = [], None
    for i in order:
        tr, t0, t1 = ivs[i]
        if tr != track:
            stacks, track = [], tr
        for lane, stack in enumerate(stacks):
            while stack and stack[-1] <= t0:
                stack.pop()
            if not stack or stack[-1] >= t1:
                break
        else:
            stacks.append([])
            lane = len(stacks) - 1
        stacks[lane].append(t1)
        lanes[i] = lane
    return lanes


# ---------------------------------------------------------------- strict JSON out (issue 24)

HOSTILE_KEYS = (b'{"traceEvents":['
                b'{"ph":"X","name":"first","name":"last","pid":1,"tid":1,"pid":2,"ts":1,"dur":1,'
                b'"args":{"a":1,"b":2,"a":3,"correlation":5,"correlation":6}},'
                b'{"ph":"X","name":"two args","pid":1,"tid":1,"ts":2,"dur":1,"args":{"x":1},"args":{"y":2}},'
                b'{"ph":"X","name":"many","pid":1,"tid":1,"ts":3,"dur":1,"args":{'
                + b",".join(b'"k%d":%d' % (i % 50, i) for i in range(120)) + b'}},'
                b'{"ph":"X","name":"lone \\ud800 high","pid":1,"tid":1,"ts":4,"dur":1,"args":{'
                b'"low":"\\udc00x","pair":"\\ud83d\\ude00","high then other":"\\ud800\\u0041",'
                b'"\\udbff key":1,"at end":"\\ud800","two highs":"\\ud800\\ud800\\udc00"}}'
                b']}')


def test_duplicate_keys_keep_the_last_and_lone_surrogates_become_fffd():
    text, _, _, ws = fuse_bytes(HOSTILE_KEYS, id_offset=1000)
    ev = {e["name"]: e for e in as_events(text)}  # strict: no duplicate keys, no lone surrogates
    last = ev["last"]
    assert last["pid"] == 3002 and last["args"]["pid_raw"] == 2
    assert last["args"]["a"] == 3 and last["args"]["b"] == 2
    assert last["args"]["correlation"] == 1006 and last["args"]["correlation_raw"] == 6
    assert ev["two args"]["args"] == {"y": 2, "rank": 3, "pid_raw": 1}
    assert ev["many"]["args"] == {**{f"k{i % 50}": i for i in range(120)}, "rank": 3, "pid_raw": 1}
    lone = ev["lone \ufffd high"]["args"]
    assert lone["low"] == "\ufffdx" and lone["pair"] == "\U0001F600" and lone["high then other"] == "\ufffdA"
    assert lone["\ufffd key"] == 1 and lone["at end"] == "\ufffd" and lone["two highs"] == "\ufffd\U00010000"
    assert ws["repaired_strings"] == 6  # the name, one key and four values with a lone surrogate


# ---------------------------------------------------------------- strict JSON at every depth

# few keys, so that objects repeat them; each may be written with escapes
KEYS = ("a", "b", "k", "/", "a/b", "\u00e9", "\u20ac", "\U0001F600")


def _escaped(key, hows):
    """key as JSON string content, character i raw (0), as \\uXXXX (1, a
    surrogate pair beyond the BMP) or, for '/', as \\/ (2)."""
    out = []
    for c, how in zip(key, hows):
        cp = ord(c)
        if how == 2 and c == "/":
            out.append("\\/")
        elif how == 0:
            out.append(c)
        elif cp > 0xFFFF:
            cp -= 0x10000
            out.append("\\u%04x\\u%04X" % (0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)))
        else:
            out.append("\\u%04x" % cp)
    return '"' + "".join(out) + '"'


def json_key(pool):
    return st.sampled_from(pool).flatmap(
        lambda k: st.lists(st.integers(0, 2), min_size=len(k), max_size=len(k)).map(lambda h: _escaped(k, h)))


def _object(pairs, ws):
    return "{" + ("," + ws).join(f"{k}{ws}:{ws}{v}" for k, v in pairs) + "}"


json_values = st.recursive(
    st.sampled_from(["0", "-3", "1.50", "null", "true", '"x"', '"\\u0078"', "[]", "{}"]),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda xs: "[" + ",".join(xs) + "]"),
        st.tuples(st.lists(st.tuples(json_key(KEYS), inner), max_size=6), st.sampled_from(["", " "])).map(
            lambda t: _object(*t))),
    max_leaves=24)


@SETTINGS
@given(extra=st.lists(st.tuples(json_key(("name", "a", "/", "\u00e9")), json_values), max_size=4),
       decoy=st.one_of(st.none(), json_values),
       args_key=json_key(("args",)),
       args=st.lists(st.tuples(json_key(KEYS), json_values), max_size=8),
       ws=st.sampled_from(["", " "]),
       cuts=st.lists(st.integers(0, 600), max_size=4))
def test_duplicate_keys_at_every_depth_keep_the_last(extra, decoy, args_key, args, ws, cuts):
    members = [('"ph"', '"X"'), ('"pid"', "1"), ('"tid"', "1"), ('"ts"', "1"), ('"dur"', "1")] + extra
    if decoy is not None:
        members.append(('"args"', decoy))
    members.append((args_key, _object(args, ws)))
    doc = ('{"traceEvents":[' + _object(members, ws) + "]}").encode()
    text, _, _, ws_stats = fuse_bytes(doc, write_cuts=cuts, out_cap=64)
    got = as_events(text)  # strict: fails on any duplicate key, at any depth
    assert len(got) == 1 and ws_stats["repaired_strings"] == 0
    want = load_last_wins(doc)["traceEvents"][0]
    u = undo(got[0], {"pid_map": {"1": 3001}, "id_offset": 0, "ts_shift_ns": 0}, 3)
    assert ordered(u) == ordered(want)  # values of the last ones, each in its (last) place


ESCAPED_KEYS = (b'{"traceEvents":['
                b'{"ph":"X","name":"esc","pid":2,"tid":1,"ts":1,"dur":1,"p\\u0069d":1,'
                b'"args":{"r\\u0061nk":9,"pid\\u005fraw":8,"\\u0063orrelation":5,"x":{"k":1,"\\u006b":2,'
                b'"k\\/":[{"z":1,"z":2}],"k/":[{"z":3,"\\ud83d\\ude00":4,"\\ud83d\\uDE00":5}]}}},'
                b'{"ph":"X","name":"array args","pid":1,"tid":1,"ts":2,"dur":1,"\\u0061rgs":[{"a":1,"a":2}]},'
                b'{"ph":"X","name":"lone","pid":1,"tid":1,"ts":3,"dur":1,"args":{"o":{"\\ud800":1,"\\ufffd":2,'
                b'"\\q":3,"\\\\q":4}}},'
                b'{"ph":"i","name":"ends lone","pid":"p\\ud800","tid":1,"ts":4,"\\ud800":1,"k\\ud800\\u":3,'
                b'"args":{"\\udbff":2,"v":"\\ud800\\u"}}'
                b']}')


def test_keys_equal_once_decoded_are_one_key():
    text, _, _, ws = fuse_bytes(ESCAPED_KEYS, id_offset=1000)
    ev = {e["name"]: e for e in as_events(text)}
    esc = ev["esc"]
    assert esc["pid"] == 3001 and esc["args"]["pid_raw"] == 1  # "p\\u0069d" is pid, and the last
    assert esc["args"]["rank"] == 3                               # the input's escaped rank is replaced
    assert esc["args"]["correlation"] == 1005 and esc["args"]["correlation_raw"] == 5
    assert esc["args"]["x"] == {"k": 2, "k/": [{"z": 3, "\U0001F600": 5}]}
    assert ev["array args"]["args"] == {"rank": 3, "pid_raw": 1, "args_raw": [{"a": 2}]}
    # repaired keys are compared as written out: a lone surrogate is U+FFFD,
    # an invalid escape keeps its backslash
    assert ev["lone"]["args"]["o"] == {"\ufffd": 2, "\\q": 4}
    # a lone high surrogate escape or a cut \\u escape right before a key's or a string's closing quote
    ends = ev["ends lone"]
    assert ends["pid"] == "p\ufffd (rank 3)" and ends["args"]["pid_raw"] == "p\ufffd"
    assert ends["\ufffd"] == 1 and ends["k\ufffd\\u"] == 3
    assert ends["args"]["\ufffd"] == 2 and ends["args"]["v"] == "\ufffd\\u"
    assert ws["repaired_strings"] == 1 + 5  # per member value ("o" holds two repaired keys) and per key

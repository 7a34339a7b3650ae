"""Per-rank summaries in the stream (issue #25): ``extract`` writes, after
each rank's META frame, what align's and correlate's per-rank maps make of
the rank, so that those stages read it instead of the rank's events.

Truths: the fixture generator's truth.json (the straggler), the stream made
without summaries (the same stages collecting the events: every table must
be equal), and values built in the test for the codec."""
import io
import json
import math
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import generate_fixture
from streamtrace import extract, iter_frames
from streamtrace.align.stage import align_frames
from streamtrace.cli import main
from streamtrace.correlate.stage import correlate_frames
from streamtrace.io.ranks import resolve_inputs
from streamtrace.stream import packing
from streamtrace.stream.format import Kind, encode_frame, header_bytes
from streamtrace.stream.summaries import ANNOUNCE, SummaryError, decode_summary, encode_summary

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """4 ranks, a straggler, send/recv (p2p tables), random clock offsets."""
    d = tmp_path_factory.mktemp("summaries")
    truth = generate_fixture.generate(str(d / "traces"), ranks=4, steps=2, straggler_rank=2, straggler_us=300,
                                      clock_offsets="random", all2allv=True, seed=21)
    return d, truth


def _stream(d, summaries, world_size=4):
    buf = io.BytesIO()
    extract(resolve_inputs(trace_dir=str(d / "traces"), world_size=world_size), buf, summaries=summaries)
    return buf.getvalue()


def _tables(frames):
    out = {}
    for f in frames:
        if f.kind == Kind.TABLE:
            name, df = f.table()
            out[name] = df
    return out


def _staged(stream_bytes, **align_options):
    return _tables(correlate_frames(align_frames(iter_frames(io.BytesIO(stream_bytes)), **align_options)))


def _assert_same_tables(a, b):
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].equals(b[name]), name


def _rewritten(stream_bytes, change):
    """The stream with each frame's (kind, rank, payload) passed through ``change``
    (None drops the frame), checksums made again."""
    out = [header_bytes()]
    for f in iter_frames(io.BytesIO(stream_bytes)):
        got = change(f.kind, f.rank, bytes(f.payload))
        if got is not None:
            out.append(encode_frame(*got))
    return b"".join(out)


def _garbled_events(kind, rank, payload):
    """EVENTS payloads that no reader can unpack (a correct checksum, so only unpacking finds it)."""
    if kind == Kind.EVENTS:
        payload = payload[:packing.ENVELOPE.size] + b"\0" * (len(payload) - packing.ENVELOPE.size)
    return kind, rank, payload


# ------------------------------------------------------------------ what extract writes


def test_each_rank_announces_its_summaries_before_its_events_and_holds_them_after_its_metadata(run):
    d, _ = run
    by_rank = {}
    for f in iter_frames(io.BytesIO(_stream(d, True))):
        if f.kind != Kind.END:
            name = f.summary_header()["name"] if f.kind == Kind.SUMMARY else None
            by_rank.setdefault(f.rank, []).append((f.kind, name))
    assert sorted(by_rank) == [0, 1, 2, 3]
    for frames in by_rank.values():
        assert frames[0] == (Kind.SUMMARY, ANNOUNCE)
        assert frames[-3:] == [(Kind.META, None), (Kind.SUMMARY, "align.rank"), (Kind.SUMMARY, "correlate.rank")]
        assert all(k != Kind.SUMMARY for k, _ in frames[1:-3])


def test_without_summaries_the_stream_holds_none(run):
    d, _ = run
    assert Kind.SUMMARY not in {f.kind for f in iter_frames(io.BytesIO(_stream(d, False)))}


def test_the_cli_summarizes_traces_from_its_threshold_up(run, tmp_path, monkeypatch):
    """A trace under STREAMTRACE_SUMMARIES_MIN_BYTES is written without
    summaries (collecting it again costs less than its summaries' bytes)."""
    d, _ = run
    sizes = sorted(os.path.getsize(p) for p in (d / "traces").glob("*.json"))
    for limit, expected in ((sizes[-1] + 1, False), (sizes[0], True)):
        monkeypatch.setenv("STREAMTRACE_SUMMARIES_MIN_BYTES", str(limit))
        out = tmp_path / f"{limit}.stev"
        res = CliRunner().invoke(main, ["extract", "--trace_dir", str(d / "traces"), "--world_size", "4", "-q",
                                        "-o", str(out)])
        assert res.exit_code == 0, res.output
        assert (Kind.SUMMARY in {f.kind for f in iter_frames(str(out))}) == expected
    res = CliRunner().invoke(main, ["extract", "--trace_dir", str(d / "traces"), "--world_size", "4", "-q",
                                    "--no_summaries", "-o", str(out)])
    assert res.exit_code == 0 and Kind.SUMMARY not in {f.kind for f in iter_frames(str(out))}


# ------------------------------------------------------------------ stages read them


def test_stages_read_summaries_not_events_and_give_the_same_tables(run):
    """Every EVENTS frame garbled under a correct checksum: align and
    correlate still give every table equal to those of the stream without
    summaries, so they never unpacked an event; the straggler is the
    injected one."""
    d, truth = run
    plain = _staged(_stream(d, False))
    summarized = _staged(_rewritten(_stream(d, True), _garbled_events))
    _assert_same_tables(plain, summarized)
    late = summarized["correlate.collective_blockers"]
    assert set(late["late_rank"]) >= {truth["straggler"]["rank"]}
    assert late["late_rank"].mode()[0] == truth["straggler"]["rank"]


def test_a_pipeline_run_s_send_recv_tables_are_the_same(tmp_path):
    """Point-to-point halves travel in align's summary (RankResult.p2p):
    the p2p tables equal those of the events, and correlate's p2p blockers
    those of the one-shot."""
    from pipeline import generate_pipeline

    from streamtrace.chain import correlated_tables

    generate_pipeline(str(tmp_path / "traces"), stages=4, microbatches=4, slow_stage=2)
    plain = _staged(_stream(tmp_path, False))
    summarized = _staged(_rewritten(_stream(tmp_path, True), _garbled_events))
    assert len(plain["align.p2p"])
    _assert_same_tables(plain, summarized)
    # and the staged path's send/recv blockers are the one-shot's (correlate keeps align.p2p)
    one_shot = correlated_tables([str(p) for p in sorted((tmp_path / "traces").glob("rank*_trace.json"))])
    assert len(one_shot["correlate.p2p_blockers"])
    assert summarized["correlate.p2p_blockers"].equals(one_shot["correlate.p2p_blockers"])


def test_the_same_sheets_through_real_pipes(run, tmp_path):
    """extract | align | correlate | report as processes, with and without summaries: the same CSVs."""
    d, _ = run
    outs = {}
    for flag in ("--summaries", "--no_summaries"):
        out = tmp_path / flag.strip("-")
        cmd = (f"'{BIN}' extract --trace_dir '{d / 'traces'}' --world_size 4 -q {flag} | '{BIN}' align -q | "
               f"'{BIN}' correlate -q | '{BIN}' report - -q --output_csvs_dir '{out}'")
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        outs[flag] = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    assert len(outs["--summaries"]) > 5
    assert outs["--summaries"] == outs["--no_summaries"]


def test_a_summary_of_another_version_is_not_read(run):
    """An announcement of other versions: the stages collect the events (the
    same tables), and so garbled events are an error naming the frame."""
    d, _ = run

    def other_version(kind, rank, payload):
        if kind == Kind.SUMMARY and decode_summary(payload)[0] == ANNOUNCE:
            return kind, rank, encode_summary(ANNOUNCE, 1, {"align.rank": "0", "correlate.rank": "0"})
        return kind, rank, payload

    older = _rewritten(_stream(d, True), other_version)
    _assert_same_tables(_staged(_stream(d, False)), _staged(older))
    from streamtrace.errors import StreamFormatError

    with pytest.raises(StreamFormatError, match="corrupt EVENTS frame"):
        _staged(_rewritten(older, _garbled_events))


def test_align_with_custom_collectives_collects_the_events(run):
    """Custom collective patterns change what align makes of a rank: it
    collects the events then, as it would without summaries."""
    d, _ = run
    options = {"custom_collective_patterns": [("elementwise", "allreduce")]}
    plain = _tables(align_frames(iter_frames(io.BytesIO(_stream(d, False))), **options))
    summarized = _tables(align_frames(iter_frames(io.BytesIO(_stream(d, True))), **options))
    _assert_same_tables(plain, summarized)
    without = _tables(align_frames(iter_frames(io.BytesIO(_stream(d, True)))))
    assert len(summarized["align.collectives"]) > len(without["align.collectives"])   # the patterns took


def test_an_announced_summary_that_never_comes_is_one_line_and_exit_1(run, tmp_path):
    d, _ = run

    def no_align_summary(kind, rank, payload):
        if kind == Kind.SUMMARY and rank == 1 and decode_summary(payload)[0] == "align.rank":
            return None
        return kind, rank, payload

    bad = tmp_path / "bad.stev"
    bad.write_bytes(_rewritten(_stream(d, True), no_align_summary))
    res = CliRunner().invoke(main, ["align", str(bad), "-q", "-o", str(tmp_path / "out.stev")])
    assert res.exit_code == 1
    assert res.output.strip().splitlines() == [
        "Error: rank 1: the stream announces its summary but holds none (extract the traces again)"]
    assert not (tmp_path / "out.stev").exists()


def test_a_corrupt_summary_names_the_stream_and_the_frame(run, tmp_path):
    d, _ = run
    at = {}

    def corrupt(kind, rank, payload):
        if kind == Kind.SUMMARY and rank == 2 and decode_summary(payload)[0] == "correlate.rank":
            (n,) = struct.unpack_from("<I", payload)
            at = 4 + n + 8   # inside the zstd frame of its value and columns
            return kind, rank, payload[:at] + b"\0" * 16 + payload[at + 16:]
        return kind, rank, payload

    bad = tmp_path / "bad.stev"
    bad.write_bytes(_rewritten(_stream(d, True), corrupt))
    for f in iter_frames(str(bad)):
        if f.kind == Kind.SUMMARY and f.rank == 2 and f.summary_header()["name"] == "correlate.rank":
            at["offset"] = f.offset
    res = CliRunner().invoke(main, ["correlate", str(bad), "-q", "-o", str(tmp_path / "out.stev")])
    assert res.exit_code == 1
    line, = res.output.strip().splitlines()
    assert line.startswith(f"Error: {bad} at byte {at['offset']}: corrupt SUMMARY frame")
    assert not (tmp_path / "out.stev").exists()


def test_dump_summary_counts_the_same_with_summaries(run, tmp_path):
    d, _ = run
    outs = []
    for summaries in (True, False):
        p = tmp_path / f"{summaries}.stev"
        p.write_bytes(_stream(d, summaries))
        res = CliRunner().invoke(main, ["dump", str(p), "--what", "summary"])
        assert res.exit_code == 0, res.output
        outs.append(res.output)
    assert outs[0] == outs[1]


# ------------------------------------------------------------------ the codec

_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                  st.text(max_size=8), st.binary(max_size=16))
_dtypes = st.sampled_from(["<i8", "<u8", "<i4", "<u2", "|u1", "|i1", "<f8", "<f4", "|b1"])


@st.composite
def _arrays(draw):
    dtype = np.dtype(draw(_dtypes))
    shape = draw(st.sampled_from([(0,), (1,), (5,), (3, 4), (2, 0)]))
    raw = draw(st.binary(min_size=dtype.itemsize * math.prod(shape), max_size=dtype.itemsize * math.prod(shape)))
    a = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    if dtype.kind == "b":
        a = a.view(np.uint8).astype(bool)
    return a


_values = st.recursive(
    st.one_of(_leaf, _arrays(), st.lists(st.text(max_size=5), max_size=4).map(lambda xs: np.array(xs, dtype=object)),
              st.integers(-2**31, 2**31 - 1).map(np.int32), st.floats(width=32).map(np.float32)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.lists(inner, max_size=3).map(tuple),
                            st.dictionaries(st.text(max_size=6), inner, max_size=4),
                            st.dictionaries(st.integers(-5, 5), inner, max_size=3)),
    max_leaves=20)


def _same(a, b):
    assert type(a) is type(b), (a, b)
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        if a.dtype.kind == "O":
            assert a.tolist() == b.tolist()
        else:
            assert a.tobytes() == b.tobytes()
            assert b.flags.writeable
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b)
    elif isinstance(a, np.floating) and np.isnan(a):
        assert np.isnan(b)
    else:
        assert a == b


@given(_values)
@settings(max_examples=300, deadline=None)
def test_a_value_comes_back_as_it_went_in(value):
    """Types, dtypes, shapes and bytes kept exactly (NaN, huge integers,
    tuples, integer keys, numpy scalars, object arrays, empty arrays)."""
    name, version, back = decode_summary(encode_summary("x", "1", value))
    assert (name, version) == ("x", "1")
    _same(value, back)


@given(st.lists(st.integers(-2**63, 2**63 - 1), min_size=2, max_size=50))
@settings(max_examples=200, deadline=None)
def test_64_bit_integers_are_delta_coded_and_come_back_exactly(xs):
    """Steps in the column's own width (wrapping), so extremes survive."""
    a = np.array(xs, dtype=np.int64)
    payload = encode_summary("x", "1", a)
    (n,) = struct.unpack_from("<I", payload)
    assert json.loads(payload[4:4 + n])["arrays"] == [["<i8", [len(xs)], "delta"]]
    assert decode_summary(payload)[2].tolist() == xs


def test_what_a_summary_cannot_hold_is_refused_when_written():
    for bad in (object(), {1.5j}, np.array([1 + 2j]), np.array(["a"], dtype="U1"), {"x": set()}):
        with pytest.raises(TypeError):
            encode_summary("x", "1", bad)


@pytest.mark.parametrize("damage", [
    lambda p: p[:3],                                                          # no header length
    lambda p: struct.pack("<I", 10**6) + p[4:],                               # header past the frame
    lambda p: p[:-1],                                                         # parts do not add up
    lambda p: p + b"\0",
    lambda p: p.replace(b'"<i8"', b'"|O8"'),                                   # object dtype from bytes
    lambda p: p.replace(b'"<i8"', b'">i8"'),                                   # big-endian
    lambda p: p.replace(b'[1000]', b'[99999999999]'),                          # a shape the bytes do not hold
    lambda p: p.replace(b'"delta"', b'"zigzag"'),                              # an unknown coding
    lambda p: p.replace(b'{"name"', b'["name"'),                              # not a JSON object
    lambda p: p.replace(b'[1000]', b'[1001]'),                                 # one value more than it holds
])
def test_a_damaged_summary_is_refused_with_a_reason(damage):
    payload = encode_summary("x", "1", {"t": np.arange(1000, dtype=np.int64), "b": b"abc"})
    with pytest.raises(SummaryError):
        decode_summary(damage(payload))


def test_extract_makes_its_summaries_without_pandas(run):
    """The summaries are the per-rank map's numpy work: an extract process
    does not pay pandas' import (a quarter of a second per process)."""
    d, _ = run
    code = f"""
import io, sys
from streamtrace import extract, iter_frames
from streamtrace.io.ranks import resolve_inputs
buf = io.BytesIO()
extract(resolve_inputs(trace_dir={str(d / 'traces')!r}, world_size=4), buf, jobs=1)
assert b"correlate.rank" in buf.getvalue()
assert "pandas" not in sys.modules, "pandas imported"
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, STREAMTRACE_SUMMARIES_MIN_BYTES="0"))
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_a_bad_threshold_setting_is_one_line(run, tmp_path, monkeypatch):
    d, _ = run
    monkeypatch.setenv("STREAMTRACE_SUMMARIES_MIN_BYTES", "1MB")
    res = CliRunner().invoke(main, ["extract", "--trace_dir", str(d / "traces"), "--world_size", "4", "-q",
                                    "-o", str(tmp_path / "x.stev")])
    assert res.exit_code == 1
    assert res.output.strip().splitlines() == ["Error: STREAMTRACE_SUMMARIES_MIN_BYTES='1MB': not a number of bytes"]
    assert not (tmp_path / "x.stev").exists()


def test_a_summary_declaring_more_than_memory_holds_is_refused_not_allocated():
    """A layout and a zstd frame that agree on a terabyte: one error, no
    attempt to hold it (the declared size is what decompress would take)."""
    import zstandard

    payload = encode_summary("x", "1", {"t": np.zeros(4, dtype=np.uint8)})
    (n,) = struct.unpack_from("<I", payload)
    header = json.loads(payload[4:4 + n])
    header["arrays"] = [["|u1", [1 << 40]]]
    total = header["value_bytes"] + (-header["value_bytes"] % 8) + (1 << 40)   # as the layout adds up
    body = zstandard.ZstdCompressor().compressobj(size=total)
    packed = body.compress(b"{}") + body.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)   # a frame that says 1 TB
    header["packed"] = len(packed)
    head = json.dumps(header).encode()
    with pytest.raises(SummaryError):
        decode_summary(struct.pack("<I", len(head)) + head + packed)

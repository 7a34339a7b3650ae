"""Stream format v3 (issue #25): packed record frames, a summary from the
metadata alone, dump that streams frame by frame.

Truths: the fixture generator's truth.json (event counts per rank and
category), the records extract holds in memory before any packing, and
the numpy arrays packed in the test itself."""
import contextlib
import io
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import generate_fixture
from streamtrace import extract_rank, iter_frames, read_stream
from streamtrace._native import COMM_DTYPE, EVENT_DTYPE, KERNEL_DTYPE, NONE
from streamtrace.cli import main
from streamtrace.stream import packing
from streamtrace.stream.format import Kind

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("v3")
    truth = generate_fixture.generate(str(d / "traces"), ranks=2, steps=2, seed=11)
    # events only: these tests read the records (test_summaries.py: streams with summaries)
    res = CliRunner().invoke(main, ["extract", "--trace_dir", str(d / "traces"), "--world_size", "2",
                                    "-o", str(d / "run.stev"), "-q", "--no_summaries"])
    assert res.exit_code == 0, res.output
    return d, truth


def _random_records(dtype, n, seed):
    """Records with every byte random, then the extremes a delta must survive."""
    rng = np.random.default_rng(seed)
    records = np.frombuffer(rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8).tobytes(), dtype=dtype).copy()
    for name in packing.DELTAS[dtype]:
        info = np.iinfo(records[name].dtype)
        records[name][:4] = [info.min, info.max, info.min, 0][:n]
    if "ts" in dtype.names:
        records["ts"][4:8] = NONE
    return records


@pytest.mark.parametrize("dtype", [EVENT_DTYPE, KERNEL_DTYPE, COMM_DTYPE])
@pytest.mark.parametrize("n", [0, 1, 2, 1000])
def test_records_survive_packing_field_for_field(dtype, n):
    records = _random_records(dtype, n, seed=n)
    payload = packing.pack_records(records)
    count, codec, size = packing.envelope(payload, dtype)
    assert (count, codec, size) == (n, packing.CODEC_ZSTD, n * packing.FIELD_BYTES[dtype])
    back = packing.unpack_records(payload, dtype)
    assert back.dtype == dtype and len(back) == n
    for name in dtype.names:   # the bytes of every field (NaN payloads included)
        assert back[name].tobytes() == records[name].tobytes(), name
    # padding never reaches the stream: it comes back as zeros
    covered = np.zeros(dtype.itemsize, dtype=bool)
    for name in dtype.names:
        offset = dtype.fields[name][1]
        covered[offset:offset + dtype.fields[name][0].itemsize] = True
    assert not np.frombuffer(back.tobytes(), np.uint8).reshape(n, dtype.itemsize)[:, ~covered].any()


def test_a_packed_frame_is_compressed_columns_as_documented():
    """The layout docs/stream-format.md gives, decoded by hand: envelope,
    then one zstd frame of each field's values back to back, ``ts`` as
    differences."""
    import zstandard

    records = np.zeros(3, dtype=EVENT_DTYPE)
    records["ts"] = [1000, 1500, 1400]
    records["name"] = [7, 7, 8]
    payload = packing.pack_records(records)
    count, codec, size = struct.unpack_from("<IIQ", payload)
    raw = zstandard.ZstdDecompressor().decompress(payload[16:])
    assert (count, codec, size, len(raw)) == (3, 1, 3 * 96, 3 * 96)
    assert np.frombuffer(raw, "<i8", count=3).tolist() == [1000, 500, -100]   # ts: the first field, as deltas
    name_at = 3 * sum(EVENT_DTYPE.fields[f][0].itemsize for f in EVENT_DTYPE.names[:EVENT_DTYPE.names.index("name")])
    assert np.frombuffer(raw, "<u4", count=3, offset=name_at).tolist() == [7, 7, 8]


def test_stream_records_are_those_extract_made(run):
    """read_stream gives back, field for field, the records extract held in
    memory before packing them, and as many events as the truth counts."""
    d, truth = run
    ranks = read_stream(str(d / "run.stev"))
    for rank, data in ranks.items():
        made = {Kind.EVENTS: [], Kind.KERNELS: [], Kind.COMMS: []}
        path = str(d / "traces" / truth["files"][str(rank)])
        for frame in extract_rank(path, rank):
            if frame.kind in made:
                made[frame.kind].append(np.array(frame.records()))
        for kind, got in ((Kind.EVENTS, data.events), (Kind.KERNELS, data.kernels), (Kind.COMMS, data.comms)):
            want = np.concatenate(made[kind])
            for name in want.dtype.names:
                assert got[name].tobytes() == want[name].tobytes(), (rank, kind, name)
        stored = sum(n for key, n in truth["event_counts"][str(rank)].items() if key != "X/python_function")
        assert len(data.events) == stored


def test_stream_is_far_smaller_than_the_json(run):
    d, truth = run
    json_bytes = sum(os.path.getsize(d / "traces" / f) for f in truth["files"].values())
    assert os.path.getsize(d / "run.stev") * 8 <= json_bytes


def _summary(stream):
    res = CliRunner().invoke(main, ["dump", str(stream), "--what", "summary"])
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in res.output.splitlines()]


def test_summary_reads_no_record(run, monkeypatch):
    """The summary's numbers come from META and the frame envelopes: with
    unpacking records made impossible it still gives the truth's counts."""
    d, truth = run

    def refuse(*args):
        raise AssertionError("the summary unpacked records")

    monkeypatch.setattr(packing, "unpack_records", refuse)
    import streamtrace.stream.format as fmt
    monkeypatch.setattr(fmt, "unpack_records", refuse)
    rows = _summary(d / "run.stev")
    assert [r["rank"] for r in rows] == [0, 1]
    for row in rows:
        counts = truth["event_counts"][str(row["rank"])]
        assert row["kernels"] == counts["X/kernel"]
        assert row["events"] == sum(n for k, n in counts.items() if k != "X/python_function")
        assert row["pyfunc_skipped"] == counts["X/python_function"]


def test_summary_does_not_import_pandas(run):
    """dump --what summary is a few numbers per rank: its start-up must not
    pay for importing pandas (issue #25: most of its time was that import).
    A real process, as a user runs it; values checked against the truth."""
    d, truth = run
    code = ("import sys; from streamtrace.cli import main\n"
            "try:\n    main(sys.argv[1:])\n"
            "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "sys.stderr.write('pandas imported' if 'pandas' in sys.modules else 'no pandas')")
    for fmt in ("jsonl", "csv"):
        proc = subprocess.run([sys.executable, "-c", code, "dump", str(d / "run.stev"), "--what", "summary",
                               "--format", fmt], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr.endswith("no pandas"), proc.stderr
    rows = [json.loads(line) for line in subprocess.run(
        [sys.executable, "-c", code, "dump", str(d / "run.stev"), "--what", "summary"],
        capture_output=True, text=True, check=True).stdout.splitlines()]
    assert [r["kernels"] for r in rows] == [truth["event_counts"][str(r)]["X/kernel"] for r in (0, 1)]


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_summary_without_pandas_prints_what_pandas_printed(run, fmt):
    """The summary's own writer gives the bytes the DataFrame writer gives
    for the same rows (the format every other --what has)."""
    import pandas as pd

    from streamtrace.dump import _summary_rows, write_table

    d, _ = run
    want = io.StringIO()
    for i, (_, row) in enumerate(_summary_rows(str(d / "run.stev"))):
        write_table(pd.DataFrame([row]), fmt, want, header=i == 0)
    res = CliRunner().invoke(main, ["dump", str(d / "run.stev"), str(d / "run.stev"), "--what", "summary",
                                    "--format", fmt])
    assert res.exit_code == 0, res.output
    lines = want.getvalue().splitlines(keepends=True)
    assert res.output == "".join(lines + lines[1 if fmt == "csv" else 0:])   # a header once


def test_summary_matches_the_records(run):
    """What extract counted into META is what the records say (the way
    summary computed it from every record before v3)."""
    d, _ = run
    rows = {r["rank"]: r for r in _summary(d / "run.stev")}
    for rank, data in read_stream(str(d / "run.stev")).items():
        e = data.events
        cats = data.names(e["cat"])
        kernel = np.isin(cats, ["kernel", "Kernel"])
        names = data.names(e["name"][kernel])
        nccl = sum(1 for n in names if isinstance(n, str) and ("nccl" in n.lower() or "rccl" in n.lower()))
        x = (e["ph"] == ord("X")) & ((e["flags"] & 4) != 0)
        span_ms = round(float((e["ts"][x] + e["dur"][x]).max() - e["ts"][x].min()) / 1e6, 3)
        row = rows[rank]
        assert (row["kernels"], row["nccl_kernels"], row["comm_records"], row["gpu_streams"], row["span_ms"]) == \
            (int(kernel.sum()), nccl, len(data.comms), len(np.unique(e["stream"][kernel])), span_ms)
        assert nccl > 0


@pytest.mark.parametrize("what", ["events", "kernels", "collectives", "strings"])
def test_dump_streams_what_the_whole_rank_gives(run, what):
    """dump, frame by frame, prints what the rank's whole tables give."""
    import pandas as pd

    from streamtrace.dump import write_table
    from streamtrace.stream.records import comms_frame, events_frame, kernels_frame

    d, _ = run
    want = io.StringIO()
    for rank, data in read_stream(str(d / "run.stev")).items():
        if what == "events":
            df = events_frame(data)
        elif what == "kernels":
            df = kernels_frame(data)
        elif what == "strings":
            df = pd.DataFrame({"id": range(len(data.strings)), "string": data.strings})
        else:
            comms = comms_frame(data)
            cols = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "stream", "correlation", "external_id"]
            joined = events_frame(data).loc[comms["event"].to_numpy(), cols].reset_index(drop=True)
            df = pd.concat([joined, comms], axis=1)
        df.insert(0, "rank", rank)
        write_table(df, "csv", want, header=rank == 0)
    res = CliRunner().invoke(main, ["dump", str(d / "run.stev"), "--what", what, "--format", "csv"])
    assert res.exit_code == 0, res.output
    assert res.output == want.getvalue()
    # the same through a real pipe
    with open(d / "run.stev", "rb") as f:
        proc = subprocess.run([BIN, "dump", "--what", what, "--format", "csv"], stdin=f, capture_output=True)
    assert proc.returncode == 0 and proc.stdout.decode() == want.getvalue()


def test_dump_events_holds_one_frame_at_a_time(run, tmp_path, monkeypatch):
    """dump --what events never holds more than the frame it is printing:
    every events table it makes is one frame's records."""
    import streamtrace.stream.records as records   # dump imports its table makers when it needs them
    from streamtrace import StreamWriter

    d, truth = run
    with open(tmp_path / "run.stev", "wb") as f:   # small frames: many of them
        writer = StreamWriter(f)
        writer.write_all(extract_rank(str(d / "traces" / truth["files"]["0"]), 0, batch_events=300))
        writer.close()
    d = tmp_path
    sizes = []
    real = records.events_frame

    def spy(rank):
        sizes.append(len(rank.events))
        return real(rank)

    monkeypatch.setattr(records, "events_frame", spy)
    res = CliRunner().invoke(main, ["dump", str(d / "run.stev"), "--what", "events", "--format", "csv"])
    assert res.exit_code == 0
    frames = [f.count() for f in iter_frames(str(d / "run.stev")) if f.kind == Kind.EVENTS]
    assert sizes == frames and len(frames) > 2


@pytest.mark.parametrize("version", [2, 3])
def test_an_older_stream_is_refused_with_extract_again(run, tmp_path, version):
    """Version 3's comm records lack dst_rank/src_rank (version 4)."""
    data = bytearray((run[0] / "run.stev").read_bytes())
    data[8:12] = struct.pack("<I", version)
    (tmp_path / "old.stev").write_bytes(bytes(data))
    res = CliRunner().invoke(main, ["align", str(tmp_path / "old.stev"), "-q", "-o", str(tmp_path / "a.stev")])
    assert res.exit_code == 1
    assert res.output.strip() == (f"Error: {tmp_path / 'old.stev'} at byte 0: stream format version {version} was "
                                  "written by an older streamtrace; extract the traces again")


def test_read_stream_joins_many_frames_of_a_rank(run, tmp_path):
    """A rank in many frames (unpacked by threads into one array) reads
    back, field for field, as the records extract made, in order."""
    from streamtrace import StreamWriter

    d, truth = run
    path = str(d / "traces" / truth["files"]["1"])
    made = list(extract_rank(path, 1, batch_events=300))
    with open(tmp_path / "many.stev", "wb") as f:
        writer = StreamWriter(f)
        writer.write_all(made)
        writer.close()
    data = read_stream(str(tmp_path / "many.stev"))[1]
    for kind, got in ((Kind.EVENTS, data.events), (Kind.KERNELS, data.kernels), (Kind.COMMS, data.comms)):
        parts = [f.records() for f in made if f.kind == kind]
        assert len(parts) > 1 or kind != Kind.EVENTS
        want = np.concatenate(parts)
        for name in want.dtype.names:
            assert got[name].tobytes() == want[name].tobytes(), (kind, name)


def _frames_of(stream):
    return [(f.kind, f.rank, bytes(f.payload), f.offset) for f in iter_frames(stream)]


def test_read_ahead_gives_the_frames_unpacked(run):
    """Frames read ahead in a thread are the frames read inline, the record
    kinds asked for already unpacked (records equal to unpacking inline)."""
    from streamtrace.stream.format import read_ahead

    d, _ = run
    stream = str(d / "run.stev")
    ahead = list(read_ahead(iter_frames(stream), (Kind.EVENTS, Kind.COMMS), depth=2))
    assert [(f.kind, f.rank, bytes(f.payload), f.offset) for f in ahead] == _frames_of(stream)
    for frame in ahead:
        unpacked = "_records" in frame.__dict__
        assert unpacked == (frame.kind in (Kind.EVENTS, Kind.COMMS))
        if unpacked:
            want = packing.unpack_records(frame.payload, Kind.RECORDS[frame.kind])
            assert frame.records().tobytes() == want.tobytes()


def _with_corrupt_events(src, dst):
    """A copy of stream ``src`` whose second EVENTS frame holds a zstd body
    that does not decompress, under a correct checksum (so only unpacking
    finds it); its byte offset."""
    from streamtrace.stream.format import encode_frame, header_bytes

    out, bad, seen = [header_bytes()], None, 0
    for f in iter_frames(src):
        payload = bytes(f.payload)
        if f.kind == Kind.EVENTS:
            seen += 1
            if seen == 2:
                payload = payload[:packing.ENVELOPE.size] + b"\0" * (len(payload) - packing.ENVELOPE.size)
                bad = sum(len(b) for b in out)
        out.append(encode_frame(f.kind, f.rank, payload))
    dst.write_bytes(b"".join(out))
    return bad


def test_read_ahead_raises_a_corrupt_frame_where_inline_reading_does(run, tmp_path):
    """A frame that does not unpack: the frames before it arrive, then its
    own records() raises the error naming its offset (not the thread)."""
    from streamtrace import StreamFormatError
    from streamtrace.stream.format import read_ahead

    d, _ = run
    bad = _with_corrupt_events(str(d / "run.stev"), tmp_path / "bad.stev")
    got = []
    frames = read_ahead(iter_frames(str(tmp_path / "bad.stev")), (Kind.EVENTS,), depth=2)
    with pytest.raises(StreamFormatError) as exc, contextlib.closing(frames):
        for frame in frames:
            got.append(frame.offset)
            if frame.kind == Kind.EVENTS:
                frame.records()
    assert got[-1] == bad and exc.value.offset == bad and "corrupt EVENTS frame" in str(exc.value)


def test_read_ahead_thread_ends_when_the_consumer_stops(run):
    import threading

    from streamtrace.stream.format import read_ahead

    d, _ = run
    frames = read_ahead(iter_frames(str(d / "run.stev")), (Kind.EVENTS,), depth=1)
    next(frames)
    frames.close()
    assert not [t for t in threading.enumerate() if t.name == "streamtrace-unpack"]


def test_align_and_correlate_through_pipes_give_the_files_bytes(run, tmp_path):
    """The stages read ahead when reading a pipe as when reading a file:
    the same bytes out (a real pipe between real processes)."""
    d, _ = run
    stev = str(d / "run.stev")
    subprocess.run([BIN, "align", stev, "-q", "-o", str(tmp_path / "a.stev")], check=True)
    subprocess.run([BIN, "correlate", str(tmp_path / "a.stev"), "-q", "-o", str(tmp_path / "c.stev")], check=True)
    with open(stev, "rb") as src:
        align = subprocess.Popen([BIN, "align", "-q"], stdin=src, stdout=subprocess.PIPE)
        piped = subprocess.run([BIN, "correlate", "-q"], stdin=align.stdout, capture_output=True, check=True).stdout
        align.stdout.close()
        assert align.wait() == 0
    assert piped == (tmp_path / "c.stev").read_bytes()


def test_a_stage_that_fails_midway_leaves_no_read_ahead_thread(run, tmp_path):
    """align on a stream whose records do not unpack fails with one line and
    stops its read-ahead thread (in-process: a leftover thread would keep
    parallel.fork from forking)."""
    import threading

    d, _ = run
    _with_corrupt_events(str(d / "run.stev"), tmp_path / "bad.stev")
    for stage in ("align", "correlate"):
        res = CliRunner().invoke(main, [stage, str(tmp_path / "bad.stev"), "-q", "-o", str(tmp_path / "out.stev")])
        assert res.exit_code == 1 and "corrupt EVENTS frame" in res.output, res.output
        assert not [t for t in threading.enumerate() if t.name == "streamtrace-unpack"]
        assert not (tmp_path / "out.stev").exists()


def _rewritten(src, change):
    """Stream ``src`` with each frame's payload replaced by ``change(frame)``
    (None: kept), under correct checksums."""
    from streamtrace.stream.format import encode_frame, header_bytes

    out = [header_bytes()]
    for f in iter_frames(src):
        payload = change(f)
        out.append(encode_frame(f.kind, f.rank, bytes(f.payload) if payload is None else payload))
    return b"".join(out)


def test_ids_are_checked_against_the_strings_and_events_before_the_frame(run):
    """Every frame's records reach exactly the ids the frames before them
    define (extract writes them that way); one past is refused, by
    read_stream and by a frame's records() alike, naming the frame."""
    from streamtrace import StreamFormatError

    d, _ = run
    strings, events, seen = {}, {}, 0
    for f in iter_frames(str(d / "run.stev")):
        if f.kind == Kind.STRINGS:
            strings[f.rank] = strings.get(f.rank, 0) + f.count()
        elif f.kind in Kind.RECORDS:
            assert f.bounds == (strings.get(f.rank, 0), events.get(f.rank, 0))
            f.records()
            seen += 1
            if f.kind == Kind.EVENTS:
                events[f.rank] = events.get(f.rank, 0) + f.count()
    assert seen > 4

    def one_past(f):
        if f.kind != Kind.KERNELS or f.rank != 1 or one_past.done:
            return None
        records = f.records().copy()
        records["event"][-1] = f.bounds[1]   # the first index no event has yet
        one_past.done = True
        return packing.pack_records(records)
    one_past.done = False
    data = _rewritten(str(d / "run.stev"), one_past)
    with pytest.raises(StreamFormatError, match=r"at byte \d+: KERNELS frame of rank 1: record \d+'s event is "
                                                r"\d+, but the rank has \d+ events before this frame"):
        read_stream(data)


def test_a_strings_frame_must_hold_the_count_of_its_envelope(run):
    from streamtrace import StreamFormatError

    d, _ = run

    def miscounted(f):
        if f.kind != Kind.STRINGS or f.rank != 0:
            return None
        count, raw = packing.unpack_bytes(f.payload)
        return packing.pack_bytes(count + 1, raw)   # ids up to count would pass the records' check
    data = _rewritten(str(d / "run.stev"), miscounted)
    with pytest.raises(StreamFormatError, match=r"corrupt STRINGS frame \(it holds (\d+) strings, its envelope "
                                                r"says \d+\)"):
        read_stream(data)


# ------------------------------------------------------------------ limits that admit every honest stream

def _stream_of(*frames):
    from streamtrace.stream.format import encode_frame, header_bytes, json_frame

    end = json_frame(Kind.END, 0, {})
    return header_bytes() + b"".join(encode_frame(f.kind, f.rank, bytes(f.payload)) for f in (*frames, end))


@pytest.mark.parametrize("n", [0, 1, (128 << 10) - 1, 128 << 10, (128 << 10) + 1, 1 << 20])
def test_a_stored_zstd_frame_is_its_bytes_for_any_zstd_reader(n):
    import zstandard

    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
    frame = packing.stored_frame(data)
    assert zstandard.frame_content_size(frame) == n
    assert len(frame) == 14 + 3 * max(1, -(-n // (128 << 10))) + n
    assert zstandard.ZstdDecompressor().stream_reader(frame).read() == data
    if n:
        assert zstandard.ZstdDecompressor().decompress(frame, max_output_size=n) == data


def test_one_item_over_the_frame_limit_is_read_within_the_ratio(monkeypatch):
    """A META frame or a frame of one string may unpack past the frame
    limit up to 64 times its zstd bytes; a frame of two strings may not,
    and an item compressing better than that is refused."""
    from streamtrace import StreamFormatError
    from streamtrace.stream.format import Frame, json_frame, strings_frame

    monkeypatch.setenv("STREAMTRACE_MAX_FRAME_BYTES", "64K")
    rng = np.random.default_rng(3)
    text = "".join(rng.choice(list("abcdefgh"), 200_000))   # ~3 bits a byte: compresses ~2.5 times
    meta = json_frame(Kind.META, 0, {"x": text})
    assert len(list(iter_frames(io.BytesIO(_stream_of(meta))))) == 2
    one = strings_frame(0, 0, [text])
    assert len(read_stream(_stream_of(one))[0].strings[0]) == 200_000
    two = strings_frame(0, 0, [text[:100_000], text[100_000:]])
    with pytest.raises(StreamFormatError, match=r"STRINGS frame unpacks to 200016 bytes, over the limit of 65536 "
                                                r"bytes \(raise it with STREAMTRACE_MAX_FRAME_BYTES\)"):
        read_stream(_stream_of(two))
    # 10 MB of one letter: zstd's ratio is in the thousands, a bomb's
    import zstandard

    bomb = b'{"x":"' + b"a" * 10_000_000 + b'"}'
    payload = packing.ENVELOPE.pack(1, packing.CODEC_ZSTD, len(bomb)) + zstandard.ZstdCompressor().compress(bomb)
    with pytest.raises(StreamFormatError, match=r"META frame unpacks to 10000008 bytes, over the limit of \d+ bytes"):
        list(iter_frames(io.BytesIO(_stream_of(Frame(Kind.META, 0, payload)))))
    monkeypatch.setenv("STREAMTRACE_MAX_UNPACK_RATIO", "100000")
    assert len(list(iter_frames(io.BytesIO(_stream_of(Frame(Kind.META, 0, payload)))))) == 2


def test_an_item_compressing_better_than_the_ratio_is_stored(monkeypatch):
    """pack_bytes and encode_summary store (uncompressed) what readers would
    refuse for its ratio, and only that: the stream then reads back."""
    from streamtrace.stream.format import json_frame, strings_frame, summary_frame
    from streamtrace.stream.summaries import decode_summary

    monkeypatch.setenv("STREAMTRACE_MAX_FRAME_BYTES", "64K")
    monkeypatch.setenv("STREAMTRACE_MAX_SUMMARY_BYTES", "64K")
    name = "void k<" + "float, " * 100_000 + ">"   # a 700 KB kernel name: zstd makes it a few hundred bytes
    frame = strings_frame(0, 0, [name])
    assert len(frame.payload) > len(name)   # stored
    meta = json_frame(Kind.META, 0, {"name": name})
    assert len(meta.payload) > len(name)
    zeros = np.zeros(200_000, np.int64)
    summary = summary_frame(0, "x", 1, {"a": zeros})
    assert len(summary.payload) > zeros.nbytes
    data = read_stream(_stream_of(frame, meta, summary))[0]
    assert data.strings == [name] and data.meta == {"name": name}
    np.testing.assert_array_equal(decode_summary(data.extra[0].payload)[2]["a"], zeros)
    # below the limits, or compressing less than the ratio: compressed as before
    small = strings_frame(0, 0, [name[:50_000]])
    assert len(small.payload) < 1000
    noise = np.random.default_rng(1).integers(0, 1 << 40, 200_000)
    assert len(summary_frame(0, "x", 1, {"a": noise}).payload) < noise.nbytes


def test_a_summary_past_its_limit_is_read_within_the_ratio(monkeypatch):
    from streamtrace.stream.summaries import SummaryLimitError, decode_summary, encode_summary

    monkeypatch.setenv("STREAMTRACE_MAX_SUMMARY_BYTES", "64K")
    rng = np.random.default_rng(2)
    value = {"t": np.cumsum(rng.integers(0, 1000, 100_000)), "names": [f"op{i % 50}" for i in range(20_000)]}
    payload = encode_summary("x", 1, value)
    back = decode_summary(payload)[2]
    np.testing.assert_array_equal(back["t"], value["t"])
    assert back["names"] == value["names"]
    monkeypatch.setenv("STREAMTRACE_MAX_UNPACK_RATIO", "1")
    with pytest.raises(SummaryLimitError, match=r"unpacks to \d+ bytes, over the limit of \d+ bytes "
                                                r"\(raise it with STREAMTRACE_MAX_SUMMARY_BYTES\)"):
        decode_summary(payload)


def test_strings_over_the_frame_limit_are_split(monkeypatch):
    """Every frame within the limit; a string longer than it alone in its
    frame; ids consecutive; read back as they were."""
    from streamtrace.stream.format import strings_frames

    monkeypatch.setenv("STREAMTRACE_MAX_FRAME_BYTES", "64K")
    rng = np.random.default_rng(4)
    strings = ["k" + "".join(rng.choice(list("abcdef<>,"), n)) for n in rng.integers(0, 20_000, 40)]
    strings[7] = "x" * 100_000
    strings[8] = "é" * 40_000   # 80,000 bytes of UTF-8
    frames = strings_frames(3, 10, strings)
    assert len(frames) > 4
    first, got = 10, []
    for f in frames:
        count, _, size = packing.envelope(f.payload)
        at, held = f.strings()
        assert at == first and len(held) == count
        assert size <= 64 << 10 or count == 1
        first += count
        got += held
    assert got == strings
    alone = [f.strings()[1] for f in frames if f.count() == 1]
    assert [strings[7]] in alone and [strings[8]] in alone
    monkeypatch.delenv("STREAMTRACE_MAX_FRAME_BYTES")
    assert len(strings_frames(3, 10, strings)) == 1


def test_a_bad_ratio_setting_is_one_line(run):
    d, _ = run
    bad = subprocess.run([BIN, "dump", str(d / "run.stev"), "--what", "meta"], capture_output=True, text=True,
                         env=dict(os.environ, STREAMTRACE_MAX_UNPACK_RATIO="0"), timeout=120)
    assert bad.returncode == 1
    assert bad.stderr.strip() == ("Error: STREAMTRACE_MAX_UNPACK_RATIO='0': expected a whole number of 1 or more, "
                                  "such as 64")

"""The read-ahead thread that overlaps reading/decompressing with tokenizing.

Its output must be exactly what reading inline gives, for every compression
and any chunk size; errors raised while reading (corrupt gzip) must reach the
consumer; a consumer that stops early must not leave the thread running.
"""
import gzip
import threading

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamtrace import TraceError
from streamtrace.extract import extract_rank
from streamtrace.io.reading import BufferChunks, MappedChunks, ReadAhead, ReadInline, chunk_reader, open_source
from test_tokenizer_properties import SAMPLE


def _payloads(path, monkeypatch, read_ahead, chunk_size):
    monkeypatch.setenv("STREAMTRACE_READ_AHEAD", "1" if read_ahead else "0")
    frames = list(extract_rank(str(path), chunk_size=chunk_size))
    joined = {k: b"".join(f.payload for f in frames if f.kind == k) for k in (2, 3, 4, 5)}
    meta = [f.json() for f in frames if f.kind == 1][0]
    return joined, meta["trace"], meta["counts"]


@pytest.fixture(params=["json", "gzip", "zstd"])
def sample_path(request, tmp_path):
    body = SAMPLE * 1
    # many events, so chunks end inside events, keys, numbers and strings
    events_start = body.index(b'"traceEvents": [') + len(b'"traceEvents": [')
    events_end = body.rindex(b"]")
    events = body[events_start:events_end].strip()
    body = body[:events_start] + b",".join([events] * 40) + body[events_end:]
    data = {"json": body, "gzip": gzip.compress(body), "zstd": zstandard.ZstdCompressor().compress(body)}
    path = tmp_path / f"t.{request.param}"
    path.write_bytes(data[request.param])
    return path


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunk=st.integers(min_value=1, max_value=3000))
def test_read_ahead_output_equals_inline(sample_path, monkeypatch, chunk):
    inline = _payloads(sample_path, monkeypatch, False, chunk)
    ahead = _payloads(sample_path, monkeypatch, True, chunk)
    assert ahead == inline
    assert inline[2]["events_seen"] == 6 * 40


@pytest.mark.parametrize("mapped", [False, True])
@pytest.mark.parametrize("reader_cls", [ReadAhead, ReadInline])
def test_chunks_cover_the_input_exactly(tmp_path, reader_cls, mapped):
    path = tmp_path / "x.json"
    data = bytes(range(256)) * 1000
    path.write_bytes(data)
    source, close = open_source(str(path))
    producer = MappedChunks(source._f, 5000) if mapped else BufferChunks(source, 777)
    reader = reader_cls(producer)
    got = bytearray()
    while True:
        buf, n = reader.next_chunk()
        got += buf[:n]
        reader.recycle(buf)
        if n == 0:
            break
    reader.close()
    close()
    assert bytes(got) == data


def test_plain_files_are_mapped_and_stdin_is_not(tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes(SAMPLE)
    source, close = open_source(str(path))
    reader = chunk_reader(source)
    assert isinstance(reader._producer, MappedChunks)
    reader.close()
    close()
    gz = tmp_path / "x.json.gz"
    gz.write_bytes(gzip.compress(SAMPLE))
    source, close = open_source(str(gz))
    reader = chunk_reader(source)
    assert isinstance(reader._producer, BufferChunks)
    reader.close()
    close()


def test_corrupt_gzip_error_reaches_the_consumer(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMTRACE_READ_AHEAD", "1")
    good = gzip.compress(SAMPLE * 1)
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    path = tmp_path / "bad.json.gz"
    path.write_bytes(bytes(bad))
    with pytest.raises(TraceError, match="bad.json.gz"):
        list(extract_rank(str(path)))


def test_early_close_stops_the_thread(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMTRACE_READ_AHEAD", "1")
    path = tmp_path / "t.json"
    event = b'{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 1}'
    path.write_bytes(b'{"traceEvents": [' + b",".join([event] * 100_000) + b"]}")
    before = {t.ident for t in threading.enumerate()}
    frames = extract_rank(str(path), chunk_size=4096)
    next(frames)  # the first batch of records: the thread is still reading
    frames.close()  # the consumer gives up mid-file
    left = [t for t in threading.enumerate() if t.ident not in before and t.name == "streamtrace-read-ahead"]
    assert left == []


def test_mapping_failure_falls_back_to_reads(tmp_path, monkeypatch):
    """A file system that refuses mmap still extracts, identically."""
    import mmap as mmap_module

    path = tmp_path / "t.json"
    path.write_bytes(SAMPLE)
    expected = _payloads(path, monkeypatch, False, None)

    def refuse(*args, **kwargs):
        raise OSError(19, "No such device")

    monkeypatch.setattr(mmap_module, "mmap", refuse)
    assert _payloads(path, monkeypatch, True, None) == expected
    assert _payloads(path, monkeypatch, False, 5000) == expected

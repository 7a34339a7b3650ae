"""Hostile and broken inputs: handled or refused with a one-line error."""
import pytest

import hostile
from helpers import extract_one
from streamtrace import TraceError


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile")
    return out, hostile.write_all(str(out))


CASE_NAMES = [name for name, _, _ in hostile.cases()]


@pytest.mark.parametrize("name", CASE_NAMES)
def test_case_is_handled_or_refused(corpus, name):
    out, expect = corpus
    path = out / name
    if expect[name] == "error":
        with pytest.raises(TraceError) as err:
            extract_one(path)
        message = str(err.value)
        assert str(path) in message and "\n" not in message
    else:
        data = extract_one(path)
        truncated = any("truncated" in w for w in data.meta["warnings"])
        assert truncated == (expect[name] == "warn"), data.meta["warnings"]


def test_error_names_byte_offset(corpus):
    out, _ = corpus
    with pytest.raises(TraceError) as err:
        extract_one(out / "missing_colon.json")
    assert err.value.offset == len(hostile.HEAD) + len('{"ph" ')


def test_nan_and_huge_numbers_become_absent(corpus):
    out, _ = corpus
    ev = extract_one(out / "nan_infinity.json").events_df()
    assert ev["ts"].isna().all() and ev["dur"].isna().all()
    data = extract_one(out / "huge_numbers.json")
    row = data.events_df().iloc[0]
    assert row["ts"] is __import__("pandas").NA and row["pid"] is __import__("pandas").NA
    assert data.meta["counts"]["bad_numbers"] >= 4
    assert any("out of range" in w for w in data.meta["warnings"])


def test_tiny_numbers_round_to_zero(corpus):
    out, _ = corpus
    row = extract_one(out / "tiny_numbers.json").events_df().iloc[0]
    assert row["ts"] == 0 and row["dur"] == 0


def test_invalid_utf8_and_escapes_decode_with_replacement(corpus):
    out, _ = corpus
    names = extract_one(out / "invalid_utf8.json").events_df()["name"].tolist()
    assert names[0].startswith("bad ") and "\ufffd" in names[0]
    name = extract_one(out / "bad_escapes.json").events_df()["name"].iloc[0]
    assert name.startswith("esc ") and name.endswith(" end")


def test_distinct_names_are_interned_once_each(corpus):
    out, _ = corpus
    data = extract_one(out / "distinct_names.json")
    assert len(data.events) == 50_000
    assert len(set(data.strings)) == len(data.strings) >= 50_000


def test_huge_string_kept_intact(corpus):
    out, _ = corpus
    name = extract_one(out / "huge_string.json").events_df()["name"].iloc[0]
    assert len(name) == 8 << 20 and set(name) == {"a"}


def test_truncated_gzip_keeps_complete_events(corpus):
    out, _ = corpus
    data = extract_one(out / "truncated.json.gz")
    assert 0 < len(data.events) < 2000
    assert data.meta["truncated_at_byte"] > 0
    assert any("compressed stream ends early" in w for w in data.meta["warnings"])


def test_strict_turns_truncation_into_error(corpus):
    out, _ = corpus
    with pytest.raises(TraceError, match="truncated"):
        extract_one(out / "truncated_mid_event.json", strict=True)


def test_two_gzip_members_are_one_document(corpus):
    out, _ = corpus
    assert len(extract_one(out / "two_gzip_members.json.gz").events) == 2000


@pytest.mark.parametrize("backend", ["zlib", "isal"])
@pytest.mark.parametrize("name", [n for n in CASE_NAMES if n.endswith(".gz")])
def test_gzip_backends_agree(corpus, monkeypatch, backend, name):
    """The C zlib inflater and ISA-L give the same outcome on every gzip case."""
    out, expect = corpus
    monkeypatch.setenv("STREAMTRACE_GZIP", backend)
    if expect[name] == "error":
        with pytest.raises(TraceError):
            extract_one(out / name)
        return
    monkeypatch.setenv("STREAMTRACE_GZIP", "zlib")
    a = extract_one(out / name)
    monkeypatch.setenv("STREAMTRACE_GZIP", "isal")
    b = extract_one(out / name)
    assert a.events.tobytes() == b.events.tobytes()
    assert a.meta["truncated_at_byte"] == b.meta["truncated_at_byte"]


@pytest.mark.parametrize("name", ["gzip_zero_padded.json.gz", "zstd_skippable_first.json.zst",
                                  "zstd_skippable_between.json.zst"])
def test_padded_gzip_and_skippable_zstd_frames_read_whole(corpus, name):
    out, _ = corpus
    data = extract_one(out / name)
    assert len(data.events) == 2000 and data.meta["compression"] == {"gz": "gzip", "zst": "zstd"}[name.rsplit(".", 1)[1]]
    assert data.meta["warnings"] == []


def test_zero_padding_then_data_is_refused(corpus):
    out, _ = corpus
    with pytest.raises(TraceError, match="after the end of the gzip stream"):
        extract_one(out / "gzip_zero_padded_then_garbage.json.gz")


def test_padded_gzip_and_skippable_zstd_frames_fuse(corpus, tmp_path):
    import json

    from streamtrace.fuse import fuse

    out, _ = corpus
    for name in ("gzip_zero_padded.json.gz", "zstd_skippable_first.json.zst"):
        target = tmp_path / (name + ".fused.json")
        fuse({0: str(out / name)}, str(target))
        events = [e for e in json.loads(target.read_text())["traceEvents"] if e.get("ph") == "X"]
        assert len(events) == 2000, name


def test_string_times_are_counted_and_warned(corpus):
    out, _ = corpus
    path = out / "string_ts.json"
    data = extract_one(path)
    ev = data.events_df()
    assert ev["ts"].isna().sum() == hostile.STRING_TIMES and ev["dur"].isna().sum() == 1
    assert data.meta["counts"]["string_times"] == hostile.STRING_TIMES + 1
    warned = [w for w in data.meta["warnings"] if "string" in w]
    assert len(warned) == 1 and str(path) in warned[0] and f"{hostile.STRING_TIMES + 1} " in warned[0]


def test_fuse_output_is_strict_json_for_duplicate_keys_and_lone_surrogates(corpus, tmp_path):
    from fuse_reference import load_strict  # strict: unique keys, no lone surrogates

    from streamtrace.fuse import fuse

    out, _ = corpus
    target = tmp_path / "dups.json"
    fuse({0: str(out / "duplicate_keys.json")}, str(target))
    doc = load_strict(str(target))
    ev = {e["name"]: e for e in doc["traceEvents"] if e.get("ph") == "X"}
    assert ev["last"]["args"] == {"b": 4, "rank": 0, "pid_raw": 1}
    assert ev["wide"]["args"] == {**{f"k{i % 40}": i for i in range(100)}, "rank": 0, "pid_raw": 1}
    assert doc["streamtrace"]["ranks"]["0"]["distributedInfo"] == {"rank": 1}
    target = tmp_path / "lone.json"
    fuse({0: str(out / "lone_surrogates.json")}, str(target))
    doc = load_strict(str(target))
    (ev,) = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    assert ev["name"] == "lone \ufffd"
    assert ev["args"]["\ufffd"] == "\ufffdA" and ev["args"]["pair"] == "\U0001F600"
    assert doc["streamtrace"]["ranks"]["0"]["deviceProperties"] == [{"name": "gpu \ufffd"}]


def test_crafted_streams_are_refused_naming_the_offset(tmp_path):
    """The corpus's crafted event streams (hostile.stream_cases): read_stream
    refuses each with one line naming the file and the bad frame's offset."""
    import re

    from streamtrace import RankInput, StreamFormatError, extract, read_stream

    base = tmp_path / "base.stev"
    (tmp_path / "t.json").write_bytes(hostile.HEAD + hostile.EV + b"]}")
    with open(base, "wb") as f:
        extract([RankInput(str(tmp_path / "t.json"))], f)
    for name, data, problem in hostile.stream_cases(base.read_bytes()):
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(StreamFormatError) as err:
            read_stream(str(path))
        message = str(err.value)
        assert "\n" not in message and re.match(rf"{re.escape(str(path))} at byte \d+: .*{problem}", message), message

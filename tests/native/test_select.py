"""_native.select_rows and select_many (the C row selection align and
correlate run on every EVENTS frame) against a numpy reference on random
records and class tables."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrace import _native

NOSTR = _native.NOSTR


def reference(records, classes, n_classes, cat_any, name_any, flags_all, ph):
    def cls(ids):
        ids = ids.astype(np.int64)
        out = np.zeros(len(ids), dtype=np.uint16)
        ok = ids < n_classes
        out[ok] = classes[ids[ok]]
        return out

    keep = (cls(records["cat"]) & cat_any) != 0
    if name_any:
        keep &= (cls(records["name"]) & name_any) != 0
    keep &= (records["flags"] & flags_all) == flags_all
    if ph:
        keep &= records["ph"] == ord(ph)
    return np.flatnonzero(keep)


@st.composite
def cases(draw):
    n_strings = draw(st.integers(0, 12))
    n = draw(st.integers(0, 300))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    recs = np.zeros(n, _native.EVENT_DTYPE)
    # ids past the table (not yet defined) and NOSTR are both possible
    ids = np.concatenate([np.arange(n_strings + 3, dtype=np.uint32), [NOSTR]])
    recs["cat"], recs["name"] = rng.choice(ids, n), rng.choice(ids, n)
    recs["ph"] = rng.choice([ord("X"), ord("i"), ord("s"), 0], n)
    recs["flags"] = rng.integers(0, 128, n)
    classes = rng.integers(0, 1 << 16, n_strings + draw(st.integers(0, 4)), dtype=np.uint16)
    n_classes = draw(st.integers(0, min(n_strings, len(classes))))
    return (recs, classes, n_classes, draw(st.integers(1, 0xFFFF)), draw(st.sampled_from([0, 1, 6, 0x8000])),
            draw(st.sampled_from([0, 4, 12])), draw(st.sampled_from([b"", b"X", b"i"])))


@given(cases())
@settings(max_examples=300, deadline=None)
def test_select_rows_matches_the_numpy_reference(case):
    recs, classes, n_classes, cat_any, name_any, flags_all, ph = case
    got = _native.select_rows(recs, classes, n_classes, cat_any, name_any, flags_all, ph)
    assert got.dtype == np.int64
    assert got.tolist() == reference(*case).tolist()


@given(cases(), st.lists(st.tuples(st.integers(1, 0xFFFF), st.sampled_from([0, 1, 6, 0x8000]),
                                    st.sampled_from([0, 4, 12]), st.sampled_from([b"", b"X", b"i"])), max_size=4))
@settings(max_examples=300, deadline=None)
def test_select_many_is_each_rule_selected_on_its_own(case, more_rules):
    """One pass with several rules gives each rule's rows, as separate passes would."""
    recs, classes, n_classes = case[:3]
    rules = [case[3:]] + more_rules
    got = _native.select_many(recs, classes, n_classes,
                              [dict(cat_any=c, name_any=n, flags_all=f, ph=p) for c, n, f, p in rules])
    assert len(got) == len(rules)
    for rows, rule in zip(got, rules):
        assert rows.dtype == np.int64 and rows.tolist() == reference(recs, classes, n_classes, *rule).tolist()


@given(cases())
@settings(max_examples=300, deadline=None)
def test_select_spans_are_the_selected_rows_as_spans(case):
    recs, classes, n_classes, cat_any, name_any, flags_all, ph = case
    rng = np.random.default_rng(len(recs))
    recs["ts"], recs["dur"] = rng.integers(-10**12, 10**12, len(recs)), rng.integers(0, 10**9, len(recs))
    recs["tid"] = rng.integers(0, 50, len(recs))
    rows = reference(*case)
    start, end, thread, name = _native.select_spans(recs, classes, n_classes, cat_any, name_any, flags_all, ph)
    assert start.tolist() == recs["ts"][rows].tolist()
    assert end.tolist() == (recs["ts"] + recs["dur"])[rows].tolist()
    string_tid = (recs["flags"][rows] & _native.FLAGS["tid_str"]) != 0
    assert thread.tolist() == np.where(string_tid, -1 - recs["tid"][rows], recs["tid"][rows]).tolist()
    assert name.dtype == np.uint32 and name.tolist() == recs["name"][rows].tolist()


def test_select_rows_reads_a_read_only_frame_payload():
    recs = np.zeros(3, _native.EVENT_DTYPE)
    recs["ph"], recs["cat"] = ord("X"), [0, 1, 0]
    frozen = np.frombuffer(recs.tobytes(), dtype=_native.EVENT_DTYPE)   # what Frame.records() gives
    assert _native.select_rows(frozen, np.array([4, 0], np.uint16), 2, 4).tolist() == [0, 2]


def test_select_rows_refuses_other_records_and_a_short_class_table():
    with pytest.raises(TypeError, match="needs EVENTS records"):
        _native.select_rows(np.zeros(2, _native.KERNEL_DTYPE), np.zeros(1, np.uint16), 1, 1)
    with pytest.raises(ValueError, match="outside"):
        _native.select_rows(np.zeros(2, _native.EVENT_DTYPE), np.zeros(1, np.uint16), 5, 1)


# ---------------------------------------------------------------- gather

_WIDER = {np.dtype(np.int8): np.int16, np.dtype(np.uint8): np.int64, np.dtype(np.uint16): np.uint32,
          np.dtype(np.int32): np.int64, np.dtype(np.uint32): np.int64}


@st.composite
def gather_cases(draw):
    dtype = draw(st.sampled_from([_native.EVENT_DTYPE, _native.KERNEL_DTYPE, _native.COMM_DTYPE]))
    n = draw(st.integers(0, 200))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    recs = np.frombuffer(rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8).tobytes(), dtype=dtype)
    rows = rng.integers(0, n, draw(st.integers(0, 300))) if n else np.zeros(0, np.int64)
    names = [f for f in dtype.names if dtype.fields[f][0].shape == ()]
    fields = draw(st.lists(st.sampled_from(names), min_size=1, max_size=6))
    # each destination: the field's own dtype or a wider integer, alone or
    # as a field of a structured array (strided)
    dests = []
    for f in fields:
        src = dtype.fields[f][0]
        dst = np.dtype(_WIDER[src]) if src in _WIDER and draw(st.booleans()) else src
        if draw(st.booleans()):
            dests.append(np.zeros(len(rows), np.dtype([("pad", "u1"), ("x", dst), ("more", "<f8")]))["x"])
        else:
            dests.append(np.zeros(len(rows), dst))
    return recs, rows, list(zip(fields, dests))


@given(gather_cases())
@settings(max_examples=300, deadline=None)
def test_gather_writes_each_field_of_each_row_as_numpy_would(case):
    recs, rows, columns = case
    _native.gather(recs, rows, columns)   # a read-only source (a frame's payload) is fine
    for name, dst in columns:
        want = recs[name][rows]
        if want.dtype.kind == "f":   # compared as bits: random bytes make NaNs
            assert dst.view(want.dtype).tobytes() == want.tobytes()
        else:
            assert dst.tolist() == want.astype(dst.dtype).tolist()


def test_gather_refuses_a_bad_row_or_destination_and_writes_nothing():
    recs = np.zeros(4, _native.EVENT_DTYPE)
    recs["ts"] = [10, 20, 30, 40]
    out = np.full(3, -7, np.int64)
    for rows in ([0, 4, 1], [-1, 0, 0]):
        with pytest.raises(IndexError, match="outside the 4 records"):
            _native.gather(recs, np.array(rows), [("ts", out)])
        assert out.tolist() == [-7, -7, -7]
    rows = np.array([3, 0, 2])
    with pytest.raises(ValueError, match="cannot be written"):
        _native.gather(recs, rows, [("ts", np.zeros(3, np.int32))])     # narrowing
    with pytest.raises(ValueError, match="cannot be written"):
        _native.gather(recs, rows, [("stream", np.zeros(3, np.float64))])
    with pytest.raises(ValueError, match="cannot be written"):
        _native.gather(recs, rows, [("name", np.zeros(3, np.int32))])     # uint32 values past int32's
    with pytest.raises(ValueError, match="1-D array of 3 rows"):
        _native.gather(recs, rows, [("ts", np.zeros(2, np.int64))])
    frozen = np.zeros(3, np.int64)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        _native.gather(recs, rows, [("ts", frozen)])
    _native.gather(recs, rows, [("ts", out)])
    assert out.tolist() == [40, 10, 30]

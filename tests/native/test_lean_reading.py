"""Lean reading for align (the one-shot report reads ranks this way):
``drop_flows`` leaves flow events out, and ``align_only`` the complete
events align never reads; the tokenizer skips both unparsed.  The events
kept are exactly the others, and align's rows do not change."""
import numpy as np
import pandas as pd
import pytest

from conftest import real_id, real_traces
from streamtrace._native import FLAGS
from streamtrace.extract import extract_rank
from streamtrace.align.collect import (S_ANNOT, S_C10D, S_CPU_CAT, S_KERNEL_CAT, S_LAUNCH, S_RPC, S_RUNTIME_CAT,
                                     S_STEP, S_USER_CAT, classify_string)
from streamtrace.align.stage import collect_rank
from streamtrace.stream.format import Kind

EVENT_INDEX_COLUMNS = ["event", "launch_event", "rpc_event", "annotation_event", "c10d_event", "cpu_op_event"]


def _events(frames):
    parts = [f.records() for f in frames if f.kind == Kind.EVENTS]
    return np.concatenate(parts) if parts else None


def _meta(frames):
    return next(f.json() for f in frames if f.kind == Kind.META)


def _without_index(rows):
    # event indices count stored events, so they differ once flows are left out
    return rows.drop(columns=[c for c in EVENT_INDEX_COLUMNS if c in rows.columns]).reset_index(drop=True)


def _align_reads(ev, strings):
    """Per event: would align's row selection (rankcollect) consider it, or
    is it a ProfilerStep#N op (the report's step marks)?"""
    cls = np.array([classify_string(s) for s in strings] + [0], dtype=np.int64)
    cat = cls[np.minimum(ev["cat"], len(strings))]
    name = cls[np.minimum(ev["name"], len(strings))]
    return ((cat & S_KERNEL_CAT) != 0) | (((cat & S_RUNTIME_CAT) != 0) & ((name & S_LAUNCH) != 0)) | \
        (((cat & S_CPU_CAT) != 0) & ((name & (S_ANNOT | S_RPC | S_C10D | S_STEP)) != 0)) | \
        ((cat & S_USER_CAT) != 0)   # every user annotation: the labels among them are align's (S_LABEL)


def _escaped(strings, ids):
    """Per id: might its JSON text hold an escape (the tokenizer keeps such events)?"""
    risky = np.array([any(c in s for c in '"\\/') or not s.isascii() or not s.isprintable() for s in strings]
                     + [False])
    return risky[np.minimum(ids, len(strings))]


def _check(path, align_only=False):
    full = list(extract_rank(path, 0))
    lean = list(extract_rank(path, 0, drop_flows=True, align_only=align_only))
    ev_full, ev_lean = _events(full), _events(lean)
    # string ids are per rank and assigned in order of appearance, so compare the texts
    strings_full = [s for f in full if f.kind == Kind.STRINGS for s in _strings(f)]
    strings_lean = [s for f in lean if f.kind == Kind.STRINGS for s in _strings(f)]
    flow = np.isin(ev_full["ph"], [ord("s"), ord("f"), ord("t")])
    unread = np.zeros(len(ev_full), dtype=bool)
    if align_only:
        unread = (ev_full["ph"] == ord("X")) & ~_align_reads(ev_full, strings_full) & \
            ~_escaped(strings_full, ev_full["cat"]) & ~_escaped(strings_full, ev_full["name"])
    meta = _meta(lean)
    assert meta["drop_flows"] is True and "drop_flows" not in _meta(full)
    assert meta["counts"]["flows_skipped"] == int(flow.sum())
    assert meta["counts"]["events_seen"] == _meta(full)["counts"]["events_seen"]
    if align_only:
        assert meta["align_only"] is True and "align_only" not in _meta(full)
        assert meta["counts"]["align_skipped"] == int((unread & ~flow).sum())
    # the same events but those left out, in the same order
    kept = ev_full[~flow & ~unread]
    assert len(kept) == len(ev_lean)
    for field in ("ph", "flags", "ts", "dur", "correlation", "external_id", "stream", "device"):
        assert (kept[field] == ev_lean[field]).all(), field

    def text(table, ids):
        return [table[i] if i < len(table) else None for i in ids.tolist()]

    assert text(strings_full, kept["name"]) == text(strings_lean, ev_lean["name"])
    for field, flag in (("pid", FLAGS["pid_str"]), ("tid", FLAGS["tid_str"])):
        as_text = (kept["flags"] & flag) != 0   # a string pid/tid is a string id
        assert (kept[field][~as_text] == ev_lean[field][~as_text]).all(), field
        assert text(strings_full, kept[field][as_text]) == text(strings_lean, ev_lean[field][as_text]), field
    # align's rows: identical but for event indices
    a = pd.DataFrame(collect_rank(iter(full), 0).rows)
    b = pd.DataFrame(collect_rank(iter(lean), 0).rows)
    assert _without_index(a).equals(_without_index(b))
    return int(flow.sum()), int(unread.sum())


def _strings(frame):
    return frame.strings()[1]


def test_fixture_rank_without_flows(tmp_path):
    import generate_fixture

    generate_fixture.generate(str(tmp_path), ranks=2, steps=2, fill_ops=12, tp=1)
    assert _check(str(tmp_path / "rank1_trace.json"))[0] > 0


@pytest.mark.parametrize("layout", ["new", "old"])
def test_fixture_rank_align_only(tmp_path, layout):
    import generate_fixture

    generate_fixture.generate(str(tmp_path), ranks=2, steps=2, fill_ops=12, tp=1, layout=layout)
    flows, unread = _check(str(tmp_path / "rank1_trace.json"), align_only=True)
    assert flows > 0 and unread > 0


@pytest.mark.parametrize("path", real_traces()[:6], ids=real_id)
def test_real_traces_without_flows(path):
    _check(path)


@pytest.mark.parametrize("path", real_traces(), ids=real_id)
def test_real_traces_align_only(path):
    _check(path, align_only=True)

"""extract_rank(drop_flows=True): the tokenizer leaves flow events out and
nothing else changes (the one-shot report reads ranks this way)."""
import numpy as np
import pandas as pd
import pytest

from conftest import real_id, real_traces
from streamtrace._native import FLAGS
from streamtrace.extract import extract_rank
from streamtrace.rankcollect import collect_rank
from streamtrace.stream import Kind

EVENT_INDEX_COLUMNS = ["event", "launch_event", "rpc_event", "annotation_event", "c10d_event", "cpu_op_event"]


def _events(frames):
    parts = [f.records() for f in frames if f.kind == Kind.EVENTS]
    return np.concatenate(parts) if parts else None


def _meta(frames):
    return next(f.json() for f in frames if f.kind == Kind.META)


def _without_index(rows):
    # event indices count stored events, so they differ once flows are left out
    return rows.drop(columns=[c for c in EVENT_INDEX_COLUMNS if c in rows.columns]).reset_index(drop=True)


def _check(path):
    full = list(extract_rank(path, 0))
    lean = list(extract_rank(path, 0, drop_flows=True))
    ev_full, ev_lean = _events(full), _events(lean)
    flow = np.isin(ev_full["ph"], [ord("s"), ord("f"), ord("t")])
    meta = _meta(lean)
    assert meta["drop_flows"] is True and "drop_flows" not in _meta(full)
    assert meta["counts"]["flows_skipped"] == int(flow.sum())
    assert meta["counts"]["events_seen"] == _meta(full)["counts"]["events_seen"]
    # the same events but the flows, in the same order (string ids are per rank
    # and assigned in order of appearance, so compare the texts)
    strings_full = [s for f in full if f.kind == Kind.STRINGS for s in _strings(f)]
    strings_lean = [s for f in lean if f.kind == Kind.STRINGS for s in _strings(f)]
    kept = ev_full[~flow]
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
    return int(flow.sum())


def _strings(frame):
    from streamtrace.stream import decode_strings

    return decode_strings(frame.payload)[1]


def test_fixture_rank_without_flows(tmp_path):
    import generate_fixture

    generate_fixture.generate(str(tmp_path), ranks=2, steps=2, fill_ops=12, tp=1)
    assert _check(str(tmp_path / "rank1_trace.json")) > 0


@pytest.mark.parametrize("path", real_traces()[:6], ids=real_id)
def test_real_traces_without_flows(path):
    _check(path)

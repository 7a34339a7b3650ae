"""Shared test helpers: extract to an in-memory stream, compare to the reference."""
import io
import json

import numpy as np
import pandas as pd

from reference import NONE, reference_extract
from streamtrace import RankInput, extract, read_stream


def extract_one(path, **kwargs):
    """Extract one trace and return its RankData."""
    buf = io.BytesIO()
    extract([RankInput(str(path))], buf, **kwargs)
    ranks = read_stream(buf.getvalue())
    assert len(ranks) == 1
    return next(iter(ranks.values()))


def _norm(v):
    """DataFrame cell -> None / str / int."""
    if v is None or v is pd.NA or (isinstance(v, float) and v != v):
        return None
    return v if isinstance(v, str) else int(v)


def _str_or_json_equal(ours, expected):
    if expected is None:
        return ours is None
    if isinstance(expected, tuple):  # ("json", value): ours is the raw JSON text
        return ours is not None and json.loads(ours) == json.loads(json.dumps(expected[1], default=str))
    return ours == expected


def assert_matches_reference(path, rank_data=None, keep_pyfunc=False):
    """Every stored event, kernel and comm record equals the reference's."""
    data = rank_data or extract_one(path, keep_pyfunc=keep_pyfunc)
    _, ref = reference_extract(path, keep_pyfunc=keep_pyfunc)
    ev = data.events_df()
    assert len(ev) == len(ref), f"{len(ev)} events, reference has {len(ref)}"

    def col(name, fill=None):
        return [r[0][name] for r in ref]

    for name in ("ph", "cat", "name", "scope", "bp_e"):
        got = ev[name].tolist()
        exp = col(name)
        got = [None if (isinstance(g, float) and g != g) else g for g in got]
        bad = [i for i, (g, e) in enumerate(zip(got, exp)) if g != e]
        assert not bad, f"{name} differs at event {bad[0]}: {got[bad[0]]!r} != {exp[bad[0]]!r}"
    for name in ("pid", "tid", "id", "ts", "dur"):
        got = [_norm(v) for v in ev[name].tolist()]
        exp = col(name)
        bad = [i for i, (g, e) in enumerate(zip(got, exp)) if g != e]
        assert not bad, f"{name} differs at event {bad[0]}: {got[bad[0]]!r} != {exp[bad[0]]!r}"
    e = data.events
    for name in ("correlation", "external_id", "value", "stream", "device", "cbid"):
        exp = np.array(col(name), dtype=np.int64)
        bad = np.nonzero(e[name].astype(np.int64) != exp)[0]
        assert not len(bad), f"{name} differs at event {bad[0]}: {e[name][bad[0]]} != {exp[bad[0]]}"
    labels = [_norm(v) for v in ev["label"].tolist()]
    exp = col("label")
    bad = [i for i, (g, x) in enumerate(zip(labels, exp)) if g != x]
    assert not bad, f"label differs at event {bad[0]}: {labels[bad[0]]!r} != {exp[bad[0]]!r}"

    # kernels
    ref_k = [(i, r[1]) for i, r in enumerate(ref) if r[1] is not None]
    k = data.kernels
    assert len(k) == len(ref_k), f"{len(k)} kernel records, reference has {len(ref_k)}"
    for rec, (i, exp) in zip(k, ref_k):
        assert rec["event"] == i
        assert list(rec["grid"]) == exp["grid"] and list(rec["block"]) == exp["block"], (i, rec, exp)
        assert rec["registers_per_thread"] == exp["registers_per_thread"]
        assert rec["shared_memory"] == exp["shared_memory"]
        for f in ("blocks_per_sm", "warps_per_sm", "occupancy_pct"):
            assert np.isclose(rec[f], exp[f], rtol=1e-6, equal_nan=True), (i, f, rec[f], exp[f])

    # comms
    ref_c = [(i, r[2]) for i, r in enumerate(ref) if r[2] is not None]
    cdf = data.comms_df()
    assert len(cdf) == len(ref_c), f"{len(cdf)} comm records, reference has {len(ref_c)}"
    int_fields = {"in_nelems", "out_nelems", "group_size", "pg_id", "seq"}
    for row, (i, exp) in zip(cdf.itertuples(index=False), ref_c):
        assert row.event == i
        for f in ("collective_name", "dtype", "pg_name", "pg_desc", "pg_ranks", "in_split", "out_split",
                  "input_dims", "input_type", "comms_id"):
            assert _str_or_json_equal(_norm(getattr(row, f)), exp.get(f)), (i, f, getattr(row, f), exp.get(f))
        for f in int_fields | {"rank"}:
            got = getattr(row, "rank_arg" if f == "rank" else f)
            want = exp.get(f, NONE)
            assert (got is pd.NA and want == NONE) or got == want, (i, f, got, want)
    for f in ("dst_rank", "src_rank"):   # int32, -1 when absent (not in comms_df: dump's columns)
        got = data.comms[f].astype(np.int64).tolist()
        assert got == [exp.get(f, -1) for _, exp in ref_c], f
    return data


def serial_and_forked(monkeypatch, module, run):
    """``run()`` once on one CPU, then on two with ``module``'s parallel
    threshold at 0: (serial result, parallel result, per ``module.both`` call
    whether it really forked)."""
    import streamtrace.parallel.fork as forked

    monkeypatch.setattr(module, "available_cpus", lambda: 1)
    serial = run()
    forks = []
    real_both = module.both
    monkeypatch.setattr(module, "both",
                        lambda a, b, fork: forks.append(fork and forked.can_fork()) or real_both(a, b, fork=fork))
    monkeypatch.setattr(module, "available_cpus", lambda: 2)
    monkeypatch.setattr(module, "_PARALLEL_MIN_ROWS", 0)
    return serial, run(), forks

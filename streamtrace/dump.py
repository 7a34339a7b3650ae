"""``dump``: any part of an event stream as JSON lines or CSV.

One writer (``write_table``) serves every table, so every ``--what`` has the
same formats.  Tables are produced per rank, so memory is one rank's table.
"""
import json
import math
import os

import numpy as np
import pandas as pd

from ._native import FLAGS

from .stream.format import read_stream
from .stream.records import comms_frame, events_frame, kernels_frame


def _collectives(rank):
    """Comm-argument rows joined with their event's identity and timing."""
    comms = comms_frame(rank)
    events = events_frame(rank)
    cols = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "stream", "correlation", "external_id"]
    joined = events.loc[comms["event"].to_numpy(), cols].reset_index(drop=True)
    return pd.concat([joined, comms.reset_index(drop=True)], axis=1)


def _meta_rows(rank):
    return pd.DataFrame([{"rank": rank.rank, **{k: v for k, v in rank.meta.items()}}])


def _strings(rank):
    return pd.DataFrame({"id": range(len(rank.strings)), "string": rank.strings})


def _summary(rank):
    """One row per rank: what extract found."""
    e = rank.events
    cats = rank.names(e["cat"])
    kernel = np.isin(cats, ["kernel", "Kernel"])
    # each distinct kernel name is tested once, as a Python string: a numpy
    # string array would be as wide as the longest name for every kernel
    ids, counts = np.unique(e["name"][kernel], return_counts=True)
    names = rank.names(ids)
    nccl = np.array([isinstance(n, str) and ("nccl" in n.lower() or "rccl" in n.lower()) for n in names], dtype=bool)
    has_ts = (e["flags"] & FLAGS["has_ts"]) != 0
    x = (e["ph"] == ord("X")) & has_ts
    span_ms = float((e["ts"][x] + e["dur"][x]).max() - e["ts"][x].min()) / 1e6 if x.any() else 0.0
    m = rank.meta
    return pd.DataFrame([{
        "source": os.path.basename(m.get("source", "")),
        "world_size": m.get("world_size"),
        "events": len(e),
        "kernels": int(kernel.sum()),
        "nccl_kernels": int(counts[nccl].sum()),
        "comm_records": len(rank.comms),
        "gpu_streams": int(len(np.unique(e["stream"][kernel]))),
        "span_ms": round(span_ms, 3),
        "pyfunc_skipped": m.get("counts", {}).get("pyfunc_skipped", 0),
        "warnings": len(m.get("warnings", [])),
    }])


TABLES = {
    "summary": _summary,
    "events": events_frame,
    "kernels": kernels_frame,
    "collectives": _collectives,
    "meta": _meta_rows,
    "strings": _strings,
}


def _jsonable(v):
    if v is None or v is pd.NA:
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    if hasattr(v, "item"):
        return v.item()
    return v


def write_table(df, fmt, out, header=True):
    """Write a DataFrame as JSON lines, CSV or an aligned text table."""
    if fmt == "table":
        out.write(df.to_string(index=False, header=header) + "\n")
        return
    if fmt == "csv":
        nested = [c for c in df.columns if df[c].map(lambda v: isinstance(v, (dict, list))).any()]
        if nested:
            df = df.copy()
            for c in nested:
                df[c] = df[c].map(lambda v: json.dumps(v) if isinstance(v, (dict, list)) else v)
        df.to_csv(out, index=False, header=header)
        return
    columns = list(df.columns)
    for row in df.itertuples(index=False, name=None):
        out.write(json.dumps({c: _jsonable(v) for c, v in zip(columns, row)}, default=str))
        out.write("\n")


def dump_stream(sources, what, fmt, out, ranks=None):
    """Write table ``what`` of every rank.  JSON lines and CSV go out rank by
    rank; an aligned text table needs every row first, so it is printed once."""
    first, held = True, []
    for source in sources:
        for r, data in read_stream(source).items():
            if ranks is not None and r not in ranks:
                continue
            df = TABLES[what](data)
            if what != "meta":
                df.insert(0, "rank", r)
            if fmt == "table":
                held.append(df)
                continue
            write_table(df, fmt, out, header=first)
            first = False
    if held:
        write_table(pd.concat(held, ignore_index=True), fmt, out)

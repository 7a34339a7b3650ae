"""Tabular views of a rank's records: numpy records -> pandas DataFrames.

Integer fields keep ``NONE`` (INT64_MIN) where absent in the numpy arrays; in
the DataFrames they become pandas' nullable ``Int64`` with <NA>.  String ids are
resolved to text.
"""
import numpy as np
import pandas as pd

from .._native import FLAGS, NONE


def _int_col(values, missing):
    """Nullable Int64 column: ``missing`` marks <NA> rows."""
    return pd.arrays.IntegerArray(np.asarray(values, dtype=np.int64).copy(), np.asarray(missing, dtype=bool))


def _nullable(values):
    values = np.asarray(values, dtype=np.int64)
    return _int_col(values, values == NONE)


def _ids_or_strings(rank, values, is_str):
    """pid/tid/id columns: ints, except rows flagged as strings."""
    if not is_str.any():
        return _nullable(values)
    out = np.array(values, dtype=object)
    out[is_str] = rank.names(values[is_str])
    out[(~is_str) & (values == NONE)] = None
    return out


def _char(values):
    return np.array([chr(c) if c else "" for c in range(256)], dtype=object)[values]


def events_frame(rank):
    e = rank.events
    flags = e["flags"]
    return pd.DataFrame({
        "ph": _char(e["ph"]),
        "cat": rank.names(e["cat"]),
        "name": rank.names(e["name"]),
        "pid": _ids_or_strings(rank, e["pid"], (flags & FLAGS["pid_str"]) != 0),
        "tid": _ids_or_strings(rank, e["tid"], (flags & FLAGS["tid_str"]) != 0),
        "ts": _int_col(e["ts"], (flags & FLAGS["has_ts"]) == 0),
        "dur": _int_col(e["dur"], (flags & FLAGS["has_dur"]) == 0),
        "id": _ids_or_strings(rank, e["id"], (flags & FLAGS["id_str"]) != 0),
        "correlation": _nullable(e["correlation"]),
        "external_id": _nullable(e["external_id"]),
        "value": _nullable(e["value"]),
        "stream": _int_col(e["stream"], e["stream"] == -1),
        "device": _int_col(e["device"], e["device"] == -1),
        "cbid": _int_col(e["cbid"], e["cbid"] == -1),
        "label": rank.names(e["label"]),
        "scope": _char(e["scope"]),
        "bp_e": (flags & FLAGS["bp_e"]) != 0,
    })


def kernels_frame(rank):
    k = rank.kernels
    df = pd.DataFrame({"event": k["event"].astype(np.int64)})
    for field in ("grid", "block"):
        for i, axis in enumerate("xyz"):
            df[f"{field}_{axis}"] = _int_col(k[field][:, i], k[field][:, i] == -1)
    for field in ("registers_per_thread", "shared_memory"):
        df[field] = _int_col(k[field], k[field] == -1)
    for field in ("blocks_per_sm", "warps_per_sm", "occupancy_pct"):
        df[field] = k[field].astype(np.float64)
    return df


COMM_STRING_FIELDS = ("collective_name", "dtype", "pg_name", "pg_desc", "pg_ranks",
                      "in_split", "out_split", "input_dims", "input_type", "comms_id")
COMM_INT_FIELDS = ("in_nelems", "out_nelems", "group_size", "pg_id", "seq", "rank")


def comms_frame(rank):
    c = rank.comms
    df = pd.DataFrame({"event": c["event"].astype(np.int64)})
    for field in COMM_STRING_FIELDS:
        df[field] = rank.names(c[field])
    for field in COMM_INT_FIELDS:
        # the "Rank" arg is named rank_arg so it never shadows the stream's rank
        df["rank_arg" if field == "rank" else field] = _nullable(c[field])
    return df


def meta_frame(ranks):
    rows = []
    for r, data in ranks.items():
        m = data.meta
        rows.append({"rank": r, "source": m.get("source"), "world_size": m.get("world_size"),
                     "compression": m.get("compression"), "layout": m.get("layout"),
                     "events": len(data.events), "kernels": len(data.kernels), "comms": len(data.comms),
                     "strings": len(data.strings), "truncated_at_byte": m.get("truncated_at_byte"),
                     "warnings": "; ".join(m.get("warnings", []))})
    return pd.DataFrame(rows)

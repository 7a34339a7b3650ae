"""The ``align.*`` tables' names and columns, and the pandas code that builds
``align.ranks``, an empty ``align.collectives`` and ``align.quality`` (whose
builder the report's data_quality sheet uses too)."""
import math

import numpy as np
import pandas as pd

from .describe import rank_row_count

VERSION = 1
TABLE_NAMES = ("align.options", "align.ranks", "align.collectives", "align.clocks", "align.quality")

#: Columns of ``align.collectives``, in order (see docs/stream-format.md).
COLLECTIVE_COLUMNS = [
    "instance", "collective_id", "index_in_group", "pg", "pg_key", "match_method", "match_key",
    "rank", "event", "kernel_name", "kernel_kind", "selected_by",
    "pid", "device", "stream", "correlation", "external_id",
    "ts_ns", "dur_ns", "base_ns", "clock_offset_ns", "ts_aligned_ns", "dur_aligned_ns",
    "launch_event", "launch_ts_ns", "launch_dur_ns", "launch_tid",
    "cpu_op_event", "cpu_op_name", "rpc_event", "annotation_event", "c10d_event", "link",
    "collective_name", "name_source", "category", "kind", "implicit_sync",
    "dtype", "bytes_per_elem", "in_nelems", "out_nelems", "size_source", "in_bytes", "out_bytes",
    "in_split", "out_split", "pg_name", "pg_desc", "pg_ranks", "group_size", "group_size_source", "seq",
    "participants", "metadata_mismatch", "mismatch_fields", "stream_mismatch", "flags", "user_label",
]
CLOCK_COLUMNS = ["rank", "offset_ns", "residual_ns", "max_residual_ns", "collectives", "reference_rank",
                 "applied", "method"]
QUALITY_COLUMNS = ["severity", "category", "rank", "pg", "collective_id", "count", "message"]
RANK_COLUMNS = ["rank", "source", "world_size", "trace_rank", "trace_world_size", "gpus", "base_ns",
                "pg_config", "collective_kernels", "events", "truncated_at_byte", "warnings"]


def _ranks_table(results):
    """align.ranks, built column by column (for a few rows, a DataFrame of
    row dicts and its per-column conversions would cost more than the rest)."""
    metas = [res.meta for res in results]
    cols = {
        "rank": np.array([res.rank for res in results], dtype=np.int64),
        "source": _objects([m.get("source") for m in metas]),
        "base_ns": np.array([int(m.get("base_ns") or 0) for m in metas], dtype=np.int64),
        "pg_config": _objects([m.get("pg_config") for m in metas]),   # describe.pg_config_text
        "collective_kernels": np.array([rank_row_count(res.rows) for res in results], dtype=np.int64),
        "events": np.array([res.events for res in results], dtype=np.int64),
        "warnings": _objects(["; ".join(m.get("warnings") or []) for m in metas]),
    }
    for col in ("world_size", "trace_rank", "trace_world_size", "gpus", "truncated_at_byte"):
        cols[col] = nullable_ints([m.get(col) for m in metas])
    return pd.DataFrame({col: cols[col] for col in RANK_COLUMNS})


def _missing(v):
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def nullable_ints(values):
    """An Int64 array of values, None or NaN as missing."""
    return pd.array([None if _missing(v) else int(v) for v in values], dtype="Int64")


def _objects(values):
    """An object column of values, None for missing."""
    return pd.Series([None if _missing(v) else v for v in values], dtype=object)


def quality_table(findings):
    """Finding dicts as a QUALITY_COLUMNS table: Int64 rank and count, None
    for every missing value (also report's data_quality sheet)."""
    cols = {c: [f.get(c) for f in findings] for c in QUALITY_COLUMNS}
    return pd.DataFrame({c: nullable_ints(v) if c in ("rank", "count") else _objects(v) for c, v in cols.items()})


def _empty_collectives():
    ints = {"instance", "index_in_group", "rank", "event", "pid", "ts_ns", "dur_ns", "base_ns", "clock_offset_ns",
            "ts_aligned_ns", "dur_aligned_ns", "launch_event", "cpu_op_event", "rpc_event", "annotation_event",
            "c10d_event", "participants"}
    nullable = {"device", "stream", "correlation", "external_id", "launch_ts_ns", "launch_dur_ns", "launch_tid",
                "in_nelems", "out_nelems", "in_bytes", "out_bytes", "group_size", "seq"}
    bools = {"implicit_sync", "metadata_mismatch", "stream_mismatch"}
    cols = {}
    for c in COLLECTIVE_COLUMNS:
        if c in ints:
            cols[c] = pd.Series([], dtype="int64")
        elif c in nullable:
            cols[c] = pd.Series([], dtype="Int64")
        elif c in bools:
            cols[c] = pd.Series([], dtype=bool)
        elif c == "bytes_per_elem":
            cols[c] = pd.Series([], dtype="float64")
        else:
            cols[c] = pd.Series([], dtype=object)
    return pd.DataFrame(cols)


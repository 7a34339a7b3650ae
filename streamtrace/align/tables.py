"""The ``align.*`` tables' names and columns, and the code that builds
``align.options``, ``align.ranks``, an empty ``align.collectives``,
``align.clocks`` without collectives and ``align.quality`` (whose builder the
report's data_quality sheet uses too).  They are built as numpy columns
(``Columns``), which a stage with nothing to compute writes without loading
pandas; ``frame_of`` makes the DataFrame the other callers want."""
import math

import numpy as np

from ..stream.format import Columns
from .describe import rank_row_count

#: ends of one collective on two ranks closer than this are "consistent" (ns);
#: defined here, below ``sequences``, so the stage reads it without loading pandas
MATCH_TOLERANCE_NS = 20_000
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


def ranks_columns(results):
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
    return Columns({col: cols[col] for col in RANK_COLUMNS}, len(results))


def _ranks_table(results):
    return frame_of(ranks_columns(results))


def frame_of(columns):
    """A ``Columns`` table as the DataFrame these builders always gave:
    masked ints as pandas' Int64, object columns as object Series."""
    import pandas as pd

    data = {}
    for name, v in columns.items():
        if isinstance(v, np.ma.MaskedArray):
            data[name] = pd.arrays.IntegerArray(np.ma.getdata(v).astype(np.int64), np.ma.getmaskarray(v).copy())
        elif v.dtype == object:
            data[name] = pd.Series(v, dtype=object)
        else:
            data[name] = pd.Series(v, dtype=v.dtype)
    return pd.DataFrame(data, index=pd.RangeIndex(len(columns)))


def _missing(v):
    return v is None or (isinstance(v, float) and math.isnan(v)) or type(v).__name__ == "NAType"


def nullable_ints(values):
    """An int64 masked array of values (masked: None, NaN or pandas' NA)."""
    values = list(values)
    mask = np.array([_missing(v) for v in values], dtype=bool)
    data = np.array([0 if m else int(v) for v, m in zip(values, mask.tolist())], dtype=np.int64)
    return np.ma.MaskedArray(data, mask=mask)


def _objects(values):
    """An object column of values, None for missing."""
    out = np.empty(len(values), dtype=object)
    out[:] = [None if _missing(v) else v for v in values]
    return out


def quality_columns(findings):
    """Finding dicts as a QUALITY_COLUMNS table: Int64 rank and count, None
    for every missing value."""
    cols = {c: [f.get(c) for f in findings] for c in QUALITY_COLUMNS}
    return Columns({c: nullable_ints(v) if c in ("rank", "count") else _objects(v) for c, v in cols.items()},
                   len(findings))


def quality_table(findings):
    """``quality_columns`` as a DataFrame (also report's data_quality sheet)."""
    return frame_of(quality_columns(findings))


def empty_collectives_columns():
    ints = {"instance", "index_in_group", "rank", "event", "pid", "ts_ns", "dur_ns", "base_ns", "clock_offset_ns",
            "ts_aligned_ns", "dur_aligned_ns", "launch_event", "cpu_op_event", "rpc_event", "annotation_event",
            "c10d_event", "participants"}
    nullable = {"device", "stream", "correlation", "external_id", "launch_ts_ns", "launch_dur_ns", "launch_tid",
                "in_nelems", "out_nelems", "in_bytes", "out_bytes", "group_size", "seq"}
    bools = {"implicit_sync", "metadata_mismatch", "stream_mismatch"}
    cols = {}
    for c in COLLECTIVE_COLUMNS:
        if c in ints:
            cols[c] = np.zeros(0, dtype=np.int64)
        elif c in nullable:
            cols[c] = nullable_ints([])
        elif c in bools:
            cols[c] = np.zeros(0, dtype=bool)
        elif c == "bytes_per_elem":
            cols[c] = np.zeros(0, dtype=np.float64)
        else:
            cols[c] = np.empty(0, dtype=object)
    return Columns(cols, 0)


def _empty_collectives():
    return frame_of(empty_collectives_columns())


def unestimated_clocks_columns(present, apply):
    """align.clocks when there are no collectives: offset 0, method "none"."""
    n = len(present)
    method = np.empty(n, dtype=object)
    method[:] = "none"
    if not n:   # as pandas made an empty list column: float64
        method = np.zeros(0, dtype=np.float64)
    return Columns({"rank": np.array(present, dtype=np.int64), "offset_ns": np.zeros(n, dtype=np.int64),
                    "residual_ns": np.full(n, np.nan), "max_residual_ns": np.full(n, np.nan),
                    "collectives": np.zeros(n, dtype=np.int64), "reference_rank": np.array(present, dtype=np.int64),
                    "applied": np.full(n, bool(apply)), "method": method}, n)


def options_columns(align_clocks=None, gpus_per_node=None, tolerance_ns=MATCH_TOLERANCE_NS):
    """The one-row ``align.options`` table (strings; '' = automatic/absent)."""
    options = {"align_clocks": align_clocks, "gpus_per_node": gpus_per_node, "tolerance_ns": tolerance_ns,
               "version": VERSION}
    return Columns({k: _objects(["" if v is None else str(v)]) for k, v in options.items()}, 1)


def nodes(results, gpus_per_node):
    """GPUs per node: ``gpus_per_node``, else the first rank's count, else None."""
    if gpus_per_node:
        return int(gpus_per_node)
    for res in results:
        if res.meta.get("gpus"):
            return int(res.meta["gpus"])
    return None


def tables_without_collectives(results, align_clocks, gpus_per_node):
    """The ``align.*`` tables (but ``align.options``) of ranks none of which
    has a collective kernel, as ``Columns`` -- pandas is not loaded unless a
    rank has send/recv ops (their sheets are DataFrames: ``p2p_match``).
    ``align_clocks``: as ``match.match_ranks`` takes it."""
    from .quality import _finding, _rank_findings

    results = sorted(results, key=lambda r: r.rank)
    quality = []
    for res in results:
        quality += res.quality
    present = [res.rank for res in results]
    quality += _rank_findings(results)
    node_gpus = nodes(results, gpus_per_node)
    multi_node = node_gpus is not None and len({r // node_gpus for r in present}) > 1
    apply = bool(align_clocks) if align_clocks is not None else multi_node
    p2p = {}
    if any(getattr(res, "p2p", None) is not None for res in results):
        from .p2p_match import p2p_tables
        # send/recv ops whose kernels are all missing are still listed (p2p_unmatched)
        p2p = p2p_tables(results, None, quality)
    quality.append(_finding("warning", "no_collectives", f"no collective kernels in {len(present)} rank(s): "
                            + ("only the point-to-point sheets have rows" if p2p else "the report is empty")))
    tables = {"align.ranks": ranks_columns(results), "align.collectives": empty_collectives_columns(),
              "align.clocks": unestimated_clocks_columns(present, apply), "align.quality": quality_columns(quality)}
    tables.update(p2p)
    return tables


def has_collectives(results):
    """Whether any rank has a collective kernel row (else: ``tables_without_collectives``)."""
    return any(rank_row_count(res.rows) for res in results)

"""``report``: the multi-rank collective report (sheets as DataFrames, then writers).

``build_report(source, ...)`` turns the ``align.*`` tables (from a stream, a
list of frames, or a dict of tables) into ``{sheet name: DataFrame}``:

Part A (TraceLens-compatible, spec collective-report.md A4/A5):
``nccl_summary_implicit_sync``, ``nccl_summary_long``, ``nccl_summary_all2allv``,
``nccl_all2allv_heatmap``, ``nccl_long``, ``nccl_implicit_sync``,
``nccl_all2allv``, ``straggler_summary`` -- same columns, order, formulas and
units ("MB" = MiB, "GB/s" = GiB/s, times in us).  Part B adds columns at the
end of those sheets and the sheets ``nccl_summary_by_size``,
``clock_alignment`` and ``data_quality``.

Where streamtrace deliberately differs from TraceLens (spec Part B):

* times are exact integer ns internally; waits and skews are computed on
  integers and converted to us once, so they carry no float noise;
* ``ts`` is the trace's own microseconds (relative to ``baseTimeNanoseconds``
  when the traces have one; ranks with different bases are put on the
  smallest base), shifted by the rank's clock offset when clock alignment is
  on (the ``clock_alignment`` sheet then says so);
* metadata the kernels lack comes from the CPU ops (B2): ``Collective name``,
  ``dtype`` and sizes are filled for old traces; sizes exist for every c10
  dtype;
* rows and rank columns are in a deterministic order: instances by collective
  time, ranks ascending;
* metadata disagreements flag rows (``metadata_mismatch``) unless ``strict``.

``write_xlsx`` / ``write_csvs`` write atomically.  The one-shot
``generate_collective_report`` (extract -> align -> report in one process)
lives in ``streamtrace.chain``.
"""
import contextlib
import csv
import functools
import io
import itertools
import json
import logging
import math
import os
import re
import shutil
import tempfile

import numpy as np
import pandas as pd
from pandas.api.types import infer_dtype

from .. import collectives as coll
from ..align.stage import COLLECTIVE_COLUMNS, align_frames, quality_table, read_align_tables
from ..codes import Text, dense_rank, factorize, group_ids
from ..errors import InvalidArgumentError, MetadataMismatchError, StreamtraceError
from ..io.outputs import atomic_file, check_suffix, resolve_output, umask
from ..parallel.cpus import available_cpus
from ..parallel.fork import Child, balanced, both, can_fork, split_in_two
from ..stream.format import Kind, iter_frames
from .cells import ILLEGAL_XML as _ILLEGAL_XML, xml_escape as _xml_escape
from .files import BLOCKING_SHEETS, SHEET_ORDER, check_report_outputs  # noqa: F401 (importable from here)
from .options import DEFAULT_AGG_METRICS, agg_label, check_aggs

log = logging.getLogger("streamtrace")

REPORT_NAME = "nccl_analysis_report.xlsx"
EXCEL_MAX_ROWS = 1_048_576  # including the header row
HEATMAP_MAX_WORLD, HEATMAP_WARN_WORLD = 1024, 256

LONG_COLUMNS = ["collective_id", "index_in_group", "rank", "Process Group Name", "Process Group Ranks",
                "Collective name", "Group size", "dtype", "In msg nelems", "In msg size (MB)", "Out msg nelems",
                "Out msg size (MB)", "In split size", "Out split size", "stream", "ts", "dur"]
LONG_EXTRA = ["instance", "kernel_name", "match_method", "ts_raw", "clock_offset_us", "flags"]
SUMMARY_LONG_KEYS = ["rank", "Process Group Name", "Process Group Ranks", "Collective name", "Group size", "dtype",
                     "In msg nelems", "Out msg nelems", "In split size", "Out split size", "stream"]
SUMMARY_LONG_METRICS = ["In msg size (MB)_first", "Out msg size (MB)_first", "dur_sum", "dur_mean", "dur_std",
                        "dur_min", "dur_max", "operation_count"]
IMPLICIT_COLUMNS = ["collective_id", "Process Group Name", "Process Group Ranks", "Collective name", "Group size",
                    "dtype", "In msg nelems", "Out msg nelems", "In msg size (MB)", "Out msg size (MB)",
                    "Full msg size (MB)", "comm_latency", "skew in start time", "earliest arrival rank",
                    "avg_wait_time", "skew in end time", "algo bw (GB/s)", "bus bw (GB/s)"]
IMPLICIT_EXTRA = ["xfer_latency", "straggler_rank", "blame_us", "participants", "metadata_mismatch",
                  "mismatch_fields", "instance", "flags"]
IMPLICIT_CHECK = ["Process Group Name", "Process Group Ranks", "Collective name", "Group size", "dtype",
                  "In msg nelems", "Out msg nelems", "In msg size (MB)", "Out msg size (MB)"]
SUMMARY_IMPLICIT_KEYS = ["Collective name", "dtype", "In msg nelems"]
SUMMARY_IMPLICIT_METRICS = ["comm_latency", "skew in start time", "skew in end time", "algo bw (GB/s)",
                            "bus bw (GB/s)"]
A2AV_COLUMNS = ["collective_id", "Process Group Name", "Process Group Ranks", "Collective name", "Group size",
                "dtype", "stream", "total data communicated (MB)", "total nelems communicated", "wall_time (us)",
                "max_rank_dur (us)", "min_rank_dur (us)", "avg_rank_dur (us)", "throughput (GB/s)",
                "max_rank_throughput (GB/s)", "min_rank_throughput (GB/s)", "size_imbalance",
                "skew in start time", "skew in end time"]
A2AV_RANK_BLOCK = ["ts", "dur", "In msg nelems", "Out msg nelems", "In msg size (MB)", "Out msg size (MB)",
                   "In split size", "Out split size"]
A2AV_CHECK = ["Process Group Name", "Process Group Ranks", "Collective name", "Group size", "dtype", "stream"]
A2AV_EXTRA = ["bus bw (GB/s)", "participants", "metadata_mismatch", "stream_mismatch", "instance", "flags"]
STRAGGLER_COLUMNS = ["rank", "total_wait_time_us", "mean_wait_time_us", "times_arrived_last", "times_arrived_first",
                     "pct_arrived_last", "num_collectives", "total_nccl_dur_us"]
STRAGGLER_EXTRA = ["participated", "pct_arrived_last_of_participated", "total_blame_us"]
HEATMAP_COLUMNS = ["src_rank", "dst_rank", "total_sent_MB", "avg_sent_MB", "count"]
BY_SIZE_COLUMNS = ["Collective name", "Process Group Name", "size_bucket", "count", "total_bytes",
                   "total_latency_us", "avg_latency_us", "p50_latency_us", "p99_latency_us",
                   "avg bus bw (GB/s)", "bus bw (GB/s)"]
CLOCK_SHEET_COLUMNS = ["rank", "offset_us", "residual_us", "max_residual_us", "collectives", "reference_rank",
                       "applied", "method", "note"]


# ====================================================================== inputs


def collect_tables(frames, align_clocks=None, gpus_per_node=None):
    """``{name: DataFrame}`` of the TABLE frames of a stream.

    When the stream carries no align results (no ``align.options`` frame
    before its first rank frame), align runs here, in-process, on the
    stream's frames.
    """
    tables = {}
    it = iter(frames)
    for frame in it:
        if frame.kind == Kind.TABLE:
            name, df = frame.table()
            tables[name] = pd.concat([tables[name], df], ignore_index=True) if name in tables else df
            continue
        if frame.kind in (Kind.EVENTS, Kind.STRINGS, Kind.COMMS, Kind.META, Kind.KERNELS) \
                and "align.options" not in tables:
            for f in align_frames(itertools.chain([frame], it), align_clocks=align_clocks,
                                  gpus_per_node=gpus_per_node):
                if f.kind == Kind.TABLE:
                    name, df = f.table()
                    if name.startswith("align.") or name not in tables:
                        tables[name] = df
                    else:
                        tables[name] = pd.concat([tables[name], df], ignore_index=True)
            break
    return tables


def _as_tables(source, align_clocks=None, gpus_per_node=None):
    if isinstance(source, dict):
        return source
    if isinstance(source, (str, bytes, os.PathLike)):
        return collect_tables(iter_frames(source), align_clocks, gpus_per_node)
    return collect_tables(source, align_clocks, gpus_per_node)


# ====================================================================== helpers


def _us(ns):
    """int ns -> float us, correctly rounded (also beyond 2**53 ns, via whole + fraction)."""
    ns = np.asarray(ns, dtype=np.int64)
    small = np.abs(ns) < (1 << 53)
    out = ns / 1000.0
    if not small.all():
        big = ~small
        out[big] = (ns[big] // 1000).astype(np.float64) + (ns[big] % 1000) / 1000.0
    return out


def _float(series):
    """Nullable numbers -> float64 with NaN."""
    return pd.to_numeric(series, errors="coerce").astype(np.float64).to_numpy()


def _nullable_int(values, mask=None):
    values = np.asarray(values)
    if mask is None:
        mask = pd.isna(values)
    return pd.arrays.IntegerArray(np.where(mask, 0, values).astype(np.int64), np.asarray(mask, dtype=bool))


def _obj(series):
    """Object values with None for missing (as ``astype(object).where(notna, None)``, without its overhead)."""
    values = series.to_numpy(dtype=object)
    if infer_dtype(values, skipna=False) == "string":  # all text: nothing missing (a 4x cheaper scan than isna)
        return pd.Series(values, dtype=object, index=series.index)
    missing = pd.isna(values)
    if missing.any():
        values = values.copy()
        values[missing] = None
    return pd.Series(values, dtype=object, index=series.index)


def _obj_text(text):
    """A Text as an object Series, None for missing (a plain array would be inferred as pandas' str dtype)."""
    return pd.Series(text.objects(), dtype=object)


class _Nodes:
    """node_id / node_span (A5.9, with B1's pg_config fallback for truncated lists)."""

    def __init__(self, gpus_per_node, ranks_table):
        self.G = gpus_per_node
        self.groups = []  # (pg_name, ranks tuple) from distributedInfo.pg_config
        for text in ranks_table.get("pg_config", pd.Series([], dtype=object)).dropna().tolist():
            try:
                for pg in json.loads(text):
                    if isinstance(pg, dict) and isinstance(pg.get("ranks"), list):
                        self.groups.append((str(pg.get("pg_name")), tuple(pg["ranks"])))
            except (ValueError, TypeError):
                continue
        self._cache = {}
        self.unresolved_keys = set()   # the (ranks list, pg name) pairs that stayed truncated

    def node_id(self, ranks):
        return np.asarray(ranks, dtype=np.int64) // self.G

    def span(self, pg_ranks, pg_name=None):
        key = (pg_ranks, pg_name)
        if key in self._cache:
            return self._cache[key]
        ranks, truncated = coll.parse_rank_list(pg_ranks)
        if truncated:
            full = [g for name, g in self.groups if name == str(pg_name) and g[:len(ranks)] == ranks]
            if full:
                ranks, truncated = full[0], False
            else:
                self.unresolved_keys.add(key)
        if ranks is None or truncated or not ranks:
            value = "unknown"
        else:
            value = "intra_node" if len({r // self.G for r in ranks}) == 1 else "inter_node"
        self._cache[key] = value
        return value

    def spans(self, pg_ranks, pg_names):
        return self.coded_spans(Text.of(pg_ranks), Text.of(pg_names))

    def coded_spans(self, pg_ranks, pg_names):
        """``spans`` of two Text columns: span() once per distinct pair (a handful in 100k rows)."""
        ids = group_ids(pg_ranks.codes, pg_names.codes)
        _, first = np.unique(ids, return_index=True)
        values = np.array([self.span(pg_ranks.at(i), pg_names.at(i)) for i in first.tolist()], dtype=object)
        return values[ids].tolist()


def _check_align_options(tables, align_clocks):
    options = tables.get("align.options")
    if align_clocks is None or options is None or not len(options) or "align_clocks" not in options:
        return
    used = str(options["align_clocks"].iloc[-1])
    if used != str(bool(align_clocks)):
        log.warning(f"the stream was aligned with align_clocks={used or 'auto'}: --align_clocks has no effect "
                    "here (run 'streamtrace align --align_clocks' to change it)")


# ====================================================================== the report


def build_report(source, detailed_analysis=True, agg_metrics=DEFAULT_AGG_METRICS, gpus_per_node=None,
                 all2allv_heatmap=False, strict=False, align_clocks=None, world_size=None, deliver=None):
    """The report as ``{sheet name: DataFrame}`` in workbook order.

    ``source``: a dict of tables, an iterable of frames, or a stream path.
    ``gpus_per_node`` (else the first rank's ``deviceProperties`` count) adds
    the node columns.  ``strict`` turns metadata disagreements into an error
    (TraceLens behaviour).  ``align_clocks`` and ``gpus_per_node`` are also
    used when the stream has not been through ``align`` yet.

    ``deliver`` (for a caller that needs only files, e.g. ``CsvDir.write``):
    when a large report's sheets are built in two groups at once (the second
    in a forked child), each process hands its group to ``deliver`` as soon
    as it is built, and the returned dict maps those names to None: the
    child sends back no tables, and writing them needs no second fork (on
    two cores, forking once more to write cost about what it saved).
    """
    if gpus_per_node is not None and gpus_per_node <= 0:
        raise InvalidArgumentError(f"--gpus_per_node must be > 0 (got {gpus_per_node})")
    aggs = check_aggs(agg_metrics)
    tables = read_align_tables(_as_tables(source, align_clocks, gpus_per_node))
    _check_align_options(tables, align_clocks)
    c = tables["align.collectives"]
    ranks_t = tables["align.ranks"]
    clocks = tables["align.clocks"]
    findings = [dict(r) for r in tables["align.quality"].to_dict("records")]
    if len(c) and not _sorted_by_instance_rank(c):  # align writes them sorted: skip a copy of every column
        c = c.sort_values(["instance", "rank"], kind="stable").reset_index(drop=True)
    elif len(c):
        c = c.reset_index(drop=True)
    G = gpus_per_node
    if G is None and len(ranks_t) and ranks_t["gpus"].notna().any():
        G = int(ranks_t.sort_values("rank")["gpus"].dropna().iloc[0])
    nodes = _Nodes(G, ranks_t) if G else None
    applied = bool(clocks["applied"].any()) if len(clocks) else False
    common_base = int(ranks_t["base_ns"].min()) if len(ranks_t) else 0
    simplified = bool(len(c)) and (c["pg"] == "all").all() and c["pg_name"].isna().all()

    long, ns = _long_table(c, common_base)
    inst = _instance_stats(ns)

    def implicit_sync_sheet(implicit):
        return _with_nodes(implicit, nodes, span_col=True, before=IMPLICIT_EXTRA[0])

    def implicit_part(with_implicit_sheet=True):
        """The implicit-sync sheets, nccl_long, straggler_summary, by size."""
        part, notes = {}, []
        implicit, imp_rows = _implicit_sync(long, ns, inst, simplified, strict, notes)
        part["nccl_summary_implicit_sync"] = _summary_implicit(implicit, aggs)
        if detailed_analysis:
            part["nccl_long"] = _with_nodes(long, nodes, rank_col=True, span_col=True,
                                            text=(ns["text"]["Process Group Ranks"], ns["text"]["Process Group Name"]))
            if with_implicit_sheet:
                part["nccl_implicit_sync"] = implicit_sync_sheet(implicit)
        if len(implicit):
            part["straggler_summary"] = _straggler(ns, imp_rows, implicit, nodes)
        part["nccl_summary_by_size"] = _by_size(long, ns, inst)
        return part, notes, nodes.unresolved_keys if nodes is not None else set()

    def other_part(with_implicit_sheet=False):
        """nccl_summary_long and the all_to_allv sheets (and, to balance the
        work of delivered groups, nccl_implicit_sync)."""
        part, notes = {}, []
        if with_implicit_sheet:
            implicit, _ = _implicit_sync(long, ns, inst, simplified, strict, [])   # its notes come from implicit_part
            part["nccl_implicit_sync"] = implicit_sync_sheet(implicit)
        part["nccl_summary_long"] = _summary_long(long, nodes, ns["text"])
        a2av = _all2allv(long, ns, inst, strict, notes, nodes)
        if len(a2av):
            part["nccl_summary_all2allv"] = _summary_all2allv(a2av, aggs, nodes)
            if detailed_analysis:
                part["nccl_all2allv"] = a2av
        if all2allv_heatmap:
            world = max([int(x) for x in ranks_t["world_size"].dropna().tolist()] + [len(ranks_t)] +
                        [int(world_size or 0)])
            heat = _heatmap(long, world, notes)
            if heat is not None and len(heat):
                part["nccl_all2allv_heatmap"] = heat
        return part, notes, nodes.unresolved_keys if nodes is not None else set()

    def delivered(build_part, **options):
        def build_and_deliver():
            part, notes, keys = build_part(**options)
            deliver(part)
            return dict.fromkeys(part), notes, keys
        return build_and_deliver

    # two groups of sheets that share nothing they write: on two cores the
    # second runs in a forked child meanwhile (large reports only: forking a
    # process that holds every row costs ~20 ms) and sends back its tables,
    # or delivers them itself
    fork = len(c) >= _PARALLEL_MIN_ROWS and available_cpus() > 1 and can_fork()
    if deliver is not None and fork:
        (mine, mine_notes, mine_keys), (theirs, their_notes, their_keys) = both(
            delivered(implicit_part, with_implicit_sheet=False),
            delivered(other_part, with_implicit_sheet=detailed_analysis), fork=True)
    else:
        (mine, mine_notes, mine_keys), (theirs, their_notes, their_keys) = both(implicit_part, other_part, fork=fork)
    sheets = {**mine, **theirs}
    findings += mine_notes + their_notes   # the order the sheets were once built in: implicit first
    story = [f for f in findings if f["category"] == "clock_offsets_change_results"]
    sheets["clock_alignment"] = _clock_sheet(clocks, applied, story)
    for f in story:   # the command line says it too, not only the sheet
        log.warning(f["message"])
    unresolved = len(mine_keys | their_keys)
    if unresolved:
        findings.append({"severity": "info", "category": "node_span_unknown", "rank": None, "pg": None,
                         "collective_id": None, "count": unresolved,
                         "message": f"{unresolved} truncated 'Process Group Ranks' list(s) could not be "
                                    "completed from distributedInfo.pg_config: node_span is 'unknown' there"})
    for name in BLOCKING_SHEETS:
        if f"correlate.{name}" in tables:
            sheets[name] = tables[f"correlate.{name}"]
    quality = tables.get("correlate.correlate_quality")
    if quality is not None:
        findings += [{"severity": "info", "category": row["check"], "rank": row["rank"], "pg": None,
                      "collective_id": None, "count": None, "message": row["detail"]}
                     for row in quality.to_dict("records")]
    sheets["data_quality"] = quality_table(findings)
    if not len(c):
        log.warning("no collective kernels found: the report is empty (see the data_quality sheet)")
    return {name: sheets[name] for name in SHEET_ORDER if name in sheets}


def _sorted_by_instance_rank(c):
    inst, rank = c["instance"].to_numpy(dtype=np.int64), c["rank"].to_numpy(dtype=np.int64)
    return bool(np.all((inst[1:] > inst[:-1]) | ((inst[1:] == inst[:-1]) & (rank[1:] >= rank[:-1]))))


# ---------------------------------------------------------------------- nccl_long


#: nccl_long text columns kept as codes too (``ns["text"]``): the mismatch checks,
#: summary group-bys and node spans compare codes instead of strings
_CODED_TEXT = {"Process Group Name": "pg", "Process Group Ranks": "pg_ranks", "Collective name": "collective_name",
               "dtype": "dtype", "In split size": "in_split", "Out split size": "out_split"}


def _long_table(c, common_base):
    """(nccl_long without node columns, per-row ns arrays)."""
    text = {name: Text.of(c[col].to_numpy(dtype=object)) for name, col in _CODED_TEXT.items()}
    ts_disp = c["ts_aligned_ns"].to_numpy(dtype=np.int64) - common_base
    raw = c["base_ns"].to_numpy(dtype=np.int64) + c["ts_ns"].to_numpy(dtype=np.int64) - common_base
    dur = c["dur_ns"].to_numpy(dtype=np.int64)
    in_b, out_b = _float(c["in_bytes"]), _float(c["out_bytes"])
    long = pd.DataFrame({
        "collective_id": _obj(c["collective_id"]),
        "index_in_group": c["index_in_group"].to_numpy(dtype=np.int64),
        "rank": c["rank"].to_numpy(dtype=np.int64),
        "Process Group Name": _obj_text(text["Process Group Name"]),
        "Process Group Ranks": _obj_text(text["Process Group Ranks"]),
        "Collective name": _obj_text(text["Collective name"]),
        "Group size": c["group_size"].astype("Int64"),
        "dtype": _obj_text(text["dtype"]),
        "In msg nelems": c["in_nelems"].astype("Int64"),
        "In msg size (MB)": in_b / coll.MIB,
        "Out msg nelems": c["out_nelems"].astype("Int64"),
        "Out msg size (MB)": out_b / coll.MIB,
        "In split size": _obj_text(text["In split size"]),
        "Out split size": _obj_text(text["Out split size"]),
        "stream": c["stream"].astype("Int64"),
        "ts": _us(ts_disp),
        "dur": dur / 1000.0,
        "instance": c["instance"].to_numpy(dtype=np.int64),
        "kernel_name": _obj(c["kernel_name"]),
        "match_method": _obj(c["match_method"]),
        "ts_raw": _us(raw),
        "clock_offset_us": c["clock_offset_ns"].to_numpy(dtype=np.int64) / 1000.0,
        "flags": _obj(c["flags"]),
    })
    ns = {"instance": long["instance"].to_numpy(), "rank": long["rank"].to_numpy(), "s": ts_disp, "dur": dur,
          "e": ts_disp + dur, "in_bytes": in_b, "out_bytes": out_b, "pg_name": c["pg_name"].to_numpy(dtype=object),
          "category": c["category"].to_numpy(dtype=object), "kind": c["kind"].to_numpy(dtype=object),
          "mismatch_fields": c["mismatch_fields"].to_numpy(dtype=object),
          "stream_mismatch": c["stream_mismatch"].to_numpy(dtype=bool),
          "participants": c["participants"].to_numpy(dtype=np.int64), "text": text}
    return long, ns


def _instance_stats(ns):
    """Per-instance reductions over the rows (rows sorted by instance, then rank)."""
    inst = ns["instance"]
    if not len(inst):
        return {"starts": np.empty(0, dtype=np.int64), "ids": np.empty(0, dtype=np.int64), "codes": {}}
    starts = np.flatnonzero(np.r_[True, inst[1:] != inst[:-1]])
    counts = np.diff(np.r_[starts, len(inst)])
    s, e, dur, rank = ns["s"], ns["e"], ns["dur"], ns["rank"]
    st = {"starts": starts, "ids": inst[starts], "count": counts,
          "max_s": np.maximum.reduceat(s, starts), "min_s": np.minimum.reduceat(s, starts),
          "max_e": np.maximum.reduceat(e, starts), "min_e": np.minimum.reduceat(e, starts),
          "min_dur": np.minimum.reduceat(dur, starts), "max_dur": np.maximum.reduceat(dur, starts),
          "sum_dur": np.add.reduceat(dur, starts),
          "codes": {name: t.codes for name, t in ns["text"].items()}}  # _mismatch_by_instance's cache
    pos = np.repeat(np.arange(len(starts)), counts)  # instance position of each row
    st["pos"] = pos
    # earliest arrival: smallest start, ties -> highest rank
    o = np.lexsort((-rank, s, pos))
    first = np.r_[True, pos[o][1:] != pos[o][:-1]]
    st["earliest_rank"] = rank[o][first]
    # last arrival (straggler): largest start, ties -> lowest rank; and the second-last start
    o = np.lexsort((rank, -s, pos))
    po = pos[o]
    first = np.flatnonzero(np.r_[True, po[1:] != po[:-1]])
    st["last_rank"] = rank[o][first]
    second = np.where(counts >= 2, s[o][np.minimum(first + 1, len(o) - 1)], np.iinfo(np.int64).min)
    st["second_s"] = second
    return st


# ---------------------------------------------------------------------- implicit sync


def _mismatch_by_instance(df, cols, starts, codes_cache=None):
    """Per instance (rows grouped contiguously, ``starts`` = first row of each):
    the first column of ``cols`` whose values disagree across its rows, or ''.
    ``codes_cache`` (a dict) keeps each column's codes for the next call."""
    out = np.full(len(starts), "", dtype=object)
    if not len(starts):
        return out
    cache = {} if codes_cache is None else codes_cache
    for col in cols:
        codes = cache.get(col)
        if codes is None:  # equal values share a code; missing ones are all -1
            codes = cache[col] = factorize(df[col])[0]
        bad = (np.minimum.reduceat(codes, starts) != np.maximum.reduceat(codes, starts)) & (out == "")
        out[bad] = col
    return out


def _implicit_sync(long, ns, st, simplified, strict, findings):
    """(nccl_implicit_sync without node_span, mask of the rows that belong to it)."""
    cols = IMPLICIT_COLUMNS + IMPLICIT_EXTRA
    if not len(long):
        return pd.DataFrame({c: [] for c in cols}), np.zeros(0, dtype=bool)
    starts = st["starts"]
    first = _first_rows(long, st)
    cat = pd.Series(ns["category"][starts])
    include = cat.isin(coll.IMPLICIT_SYNC).to_numpy()
    if simplified:  # A3.2: unknown names are included in inference mode
        include = include | first["Collective name"].isna().to_numpy()
    rows = include[st["pos"]]
    if not include.any():
        return pd.DataFrame({c: [] for c in cols}), rows
    mism = _mismatch_by_instance(long, IMPLICIT_CHECK, starts, st["codes"])
    bad = include & (mism != "")
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        msg = (f"Metadata mismatch in '{mism[i]}' across the ranks of collective {first['collective_id'][i]}")
        if strict and not simplified:
            raise MetadataMismatchError(msg + " (--strict)")
        findings.append({"severity": "warning", "category": "metadata_mismatch", "rank": None, "pg": None,
                         "collective_id": first["collective_id"][i], "count": int(bad.sum()),
                         "message": f"{int(bad.sum())} implicit-sync instance(s) disagree on metadata; first: {msg}. "
                                    "Values shown are the lowest participating rank's"})
    sel = np.flatnonzero(include)
    n = len(sel)
    out = first.loc[sel, IMPLICIT_COLUMNS[:10]].reset_index(drop=True)
    catv = cat.to_numpy()[sel]
    in_mb = out["In msg size (MB)"].to_numpy(dtype=np.float64)
    out_mb = out["Out msg size (MB)"].to_numpy(dtype=np.float64)
    full = np.where(catv == "allgather", out_mb, in_mb)
    lat = st["min_dur"][sel] / 1000.0
    with np.errstate(divide="ignore", invalid="ignore"):
        algo = np.where(lat > 0, (full / 1024) / (lat / 1e6), np.nan)
    gsize = out["Group size"].astype("Float64").to_numpy(dtype=np.float64, na_value=np.nan)
    factor = np.array(_cached(_factor, catv, gsize), dtype=np.float64)
    # waits, per row
    rowpos = st["pos"]
    waits_ns = st["max_s"][rowpos] - ns["s"]
    sum_w = np.add.reduceat(waits_ns, starts) if len(starts) else np.empty(0)
    out["Full msg size (MB)"] = full
    out["comm_latency"] = lat
    out["skew in start time"] = (st["max_s"] - st["min_s"])[sel] / 1000.0
    out["earliest arrival rank"] = st["earliest_rank"][sel]
    out["avg_wait_time"] = sum_w[sel] / st["count"][sel] / 1000.0
    out["skew in end time"] = (st["max_e"] - st["min_e"])[sel] / 1000.0
    out["algo bw (GB/s)"] = algo
    out["bus bw (GB/s)"] = algo * factor
    # per-rank columns
    keep = rows
    ranks = np.unique(ns["rank"][keep])
    rpos = np.searchsorted(ranks, ns["rank"][keep])
    ipos = np.searchsorted(sel, rowpos[keep])
    mats = {}
    for name, values in (("ts", long["ts"].to_numpy()[keep]), ("dur", long["dur"].to_numpy()[keep]),
                         ("wait_time", waits_ns[keep] / 1000.0)):
        m = np.full((n, len(ranks)), np.nan)
        m[ipos, rpos] = values
        mats[name] = m
    wide = {}
    for j, r in enumerate(ranks):
        wide[f"rank_{r}_ts"] = mats["ts"][:, j]
        wide[f"rank_{r}_dur"] = mats["dur"][:, j]
    for j, r in enumerate(ranks):
        wide[f"rank_{r}_wait_time"] = mats["wait_time"][:, j]
    extra = {
        "xfer_latency": (st["min_e"] - st["max_s"])[sel] / 1000.0,
        "straggler_rank": st["last_rank"][sel],
        "blame_us": np.where(st["count"][sel] >= 2, (st["max_s"] - st["second_s"])[sel] / 1000.0, np.nan),
        "participants": st["count"][sel],
        "metadata_mismatch": mism[sel] != "",
        "mismatch_fields": np.where(mism[sel] != "", mism[sel], None),
        "instance": st["ids"][sel],
        "flags": _flags_by_instance(long, st)[sel],
    }
    result = pd.concat([out, pd.DataFrame(wide), pd.DataFrame(extra)], axis=1)
    return result, rows


def _first_rows(long, st):
    """The first row of every instance (kept in ``st``: three sheets read it; none modifies it)."""
    if "first" not in st:
        st["first"] = long.iloc[st["starts"]].reset_index(drop=True)
    return st["first"]


def _instance_flags(flags, starts, counts):
    """Union of the row flags of each instance."""
    out = np.full(len(starts), "", dtype=object)
    flagged = np.flatnonzero(flags != "")
    if not len(flagged):
        return out
    inst_of_row = np.repeat(np.arange(len(starts)), counts)
    for i in np.unique(inst_of_row[flagged]).tolist():
        tokens = []
        for f in flags[starts[i]:starts[i] + counts[i]]:
            for t in (f.split(";") if f else ()):
                if t not in tokens:
                    tokens.append(t)
        out[i] = ";".join(tokens)
    return out


def _flag_array(long):
    return long["flags"].astype(object).fillna("").to_numpy(dtype=object)


def _flags_by_instance(long, st):
    """``_instance_flags`` of every instance, computed once per report (kept in ``st``)."""
    if "flags" not in st:
        st["flags"] = _instance_flags(_flag_array(long), st["starts"], st["count"])
    return st["flags"]


def _first_agg(series):
    v = series.dropna()
    return v.iloc[0] if len(v) else None


def _summary_implicit(implicit, aggs):
    if not len(implicit):
        cols = SUMMARY_IMPLICIT_KEYS + ["Process Group Name", "Group size", "Full msg size (MB)"]
        for m in SUMMARY_IMPLICIT_METRICS:
            cols += [f"{m}_{agg_label(a)}" for a in aggs]
        return pd.DataFrame({c: [] for c in cols + ["count", "Total comm latency (ms)"]})
    df = implicit.copy()
    for k in SUMMARY_IMPLICIT_KEYS:
        df[k] = df[k].astype(object).where(df[k].notna(), "Unknown")
    codes = [factorize(df[k].to_numpy(dtype=object))[0] for k in SUMMARY_IMPLICIT_KEYS]
    g = df.groupby(codes, sort=False)
    res = g[SUMMARY_IMPLICIT_KEYS].first()
    for c in ("Process Group Name", "Group size", "Full msg size (MB)"):
        res[c] = g[c].agg(_first_agg)
    for m in SUMMARY_IMPLICIT_METRICS:
        if m.startswith(("algo", "bus")) and df[m].isna().all():
            continue
        for a in aggs:
            res[f"{m}_{agg_label(a)}"] = g[m].agg(a)
    res["count"] = g.size()
    res["Total comm latency (ms)"] = g["comm_latency"].sum() / 1000.0
    res = res.reset_index(drop=True)
    order = np.lexsort((np.arange(len(res)), -res["Total comm latency (ms)"].to_numpy(dtype=np.float64)))
    res = res.iloc[order].reset_index(drop=True)
    res["Group size"] = res["Group size"].astype("Int64")
    return res


# ---------------------------------------------------------------------- summary long


def _sorted_codes(long, text, col):
    """Per row: the position of its ``col`` value among the column's sorted distinct values (-1: missing)."""
    if col in text:  # text: sort the distinct values only
        t = text[col]
        return np.append(t.sort_rank(), -1)[t.codes]  # code -1 (missing) picks the -1 at the end
    return pd.factorize(long[col], sort=True, use_na_sentinel=True)[0]


def _summary_long(long, nodes, text):
    """``long.groupby(SUMMARY_LONG_KEYS, sort=True, dropna=True)`` aggregated,
    grouped by one integer id built from the column codes (``text``: the
    coded text columns): the sums and means are pandas' own, over the same
    rows in the same order."""
    codes = [_sorted_codes(long, text, k) for k in SUMMARY_LONG_KEYS]
    keep = np.flatnonzero(np.logical_and.reduce([k >= 0 for k in codes])) if len(long) else np.empty(0, np.int64)
    if not len(keep):  # rows with a missing key are in no group (dropna)
        res = pd.DataFrame({c: [] for c in SUMMARY_LONG_KEYS + SUMMARY_LONG_METRICS})
    else:
        ids = dense_rank(*[k[keep] for k in codes])
        _, first = np.unique(ids, return_index=True)
        keys = long[SUMMARY_LONG_KEYS].iloc[keep[first]].reset_index(drop=True)
        for k in [k for k in SUMMARY_LONG_KEYS if k in text]:  # as groupby's own key columns: text as pandas' str
            keys[k] = keys[k].astype("str")
        g = long[["In msg size (MB)", "Out msg size (MB)", "dur"]].iloc[keep].groupby(ids, sort=True)
        res = g.agg(**{
            "In msg size (MB)_first": ("In msg size (MB)", "first"),
            "Out msg size (MB)_first": ("Out msg size (MB)", "first"),
            "dur_sum": ("dur", "sum"), "dur_mean": ("dur", "mean"), "dur_std": ("dur", "std"),
            "dur_min": ("dur", "min"), "dur_max": ("dur", "max"), "operation_count": ("dur", "size"),
        }).reset_index(drop=True)
        res = pd.concat([keys, res], axis=1)
        order = np.lexsort((np.arange(len(res)), -res["dur_sum"].to_numpy(dtype=np.float64)))
        res = res.iloc[order].reset_index(drop=True)
    return _with_nodes(res, nodes, rank_col=True, span_col=True)


def _with_nodes(df, nodes, rank_col=False, span_col=False, before=None, text=None):
    """Add node_id (rank) and node_span (Process Group Ranks) columns.
    ``text``: df's (Process Group Ranks, Process Group Name) as Text, when known."""
    if nodes is None:
        return df
    df = df.copy(deep=False)  # copy-on-write: the inserts below leave the caller's frame as it was
    cols = {}
    if rank_col:
        cols["node_id"] = pd.array(df["rank"].to_numpy(dtype=np.int64) // nodes.G, dtype="Int64") if len(df) \
            else pd.array([], dtype="Int64")
    if span_col:
        if text is None:
            text = (Text.of(df["Process Group Ranks"]), Text.of(df["Process Group Name"]))
        cols["node_span"] = pd.Series(nodes.coded_spans(*text), dtype=object)
    at = list(df.columns).index(before) if before in df.columns else None
    if at is None:
        # Part A columns first: node columns go before our extra columns
        extras = [c for c in LONG_EXTRA + IMPLICIT_EXTRA + A2AV_EXTRA + STRAGGLER_EXTRA if c in df.columns]
        at = min([list(df.columns).index(c) for c in extras], default=len(df.columns))
    for i, (name, values) in enumerate(cols.items()):
        df.insert(at + i, name, values)
    return df


# ---------------------------------------------------------------------- all_to_allv


def _all2allv(long, ns, st, strict, findings, nodes):
    if not len(long):
        return pd.DataFrame()
    starts = st["starts"]
    first = _first_rows(long, st)
    include = (first["Collective name"] == "all_to_allv").to_numpy()
    if not include.any():
        return pd.DataFrame()
    sel = np.flatnonzero(include)
    n = len(sel)
    mism = _mismatch_by_instance(long, A2AV_CHECK, starts, st["codes"])
    bad = include & (mism != "")
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        msg = f"Metadata mismatch in '{mism[i]}' across the ranks of all_to_allv {first['collective_id'][i]}"
        if strict:
            raise MetadataMismatchError(msg + " (--strict)")
        only_stream = include & (mism == "stream")
        findings.append({"severity": "warning" if (bad & ~only_stream).any() else "info",
                         "category": "all2allv_mismatch", "rank": None, "pg": None,
                         "collective_id": first["collective_id"][i], "count": int(bad.sum()),
                         "message": f"{int(bad.sum())} all_to_allv instance(s) disagree on metadata "
                                    f"({int(only_stream.sum())} only on the NCCL stream id, which is per-process "
                                    f"and meaningless across ranks); first: {msg}"})
    rows = include[st["pos"]]
    pos = st["pos"][rows]
    ipos = np.searchsorted(sel, pos)
    m_mb = long["In msg size (MB)"].to_numpy(dtype=np.float64)[rows]
    nel = long["In msg nelems"].astype("Float64").to_numpy(dtype=np.float64, na_value=np.nan)[rows]
    dur = ns["dur"][rows]

    def per_inst(values, fn):
        res = np.full(n, np.nan)
        frame = pd.DataFrame({"p": ipos, "v": values})
        agg = frame.groupby("p")["v"].agg(fn)
        res[agg.index.to_numpy()] = agg.to_numpy(dtype=np.float64)
        return res

    # rows come grouped by instance, each selected instance has rows: exact
    # reductions (any, NaN-skipping max / min as pandas') over contiguous runs
    bounds = np.flatnonzero(np.r_[True, ipos[1:] != ipos[:-1]])

    def inst_max(values):
        return np.fmax.reduceat(values, bounds)

    def inst_min(values):
        return np.fmin.reduceat(values, bounds)

    any_nan_m = np.logical_or.reduceat(np.isnan(m_mb), bounds)
    total_mb = np.where(any_nan_m, np.nan, per_inst(np.nan_to_num(m_mb), "sum"))
    any_nan_n = np.logical_or.reduceat(np.isnan(nel), bounds)
    total_n = np.where(any_nan_n, np.nan, per_inst(np.nan_to_num(nel), "sum"))
    wall = (st["max_e"] - st["min_s"])[sel] / 1000.0
    with np.errstate(divide="ignore", invalid="ignore"):
        thr = np.where(wall > 0, (total_mb / 1024) / (wall / 1e6), np.nan)
        rank_thr = np.where((m_mb > 0) & (dur > 0), (m_mb / 1024) / ((dur / 1000.0) / 1e6), np.nan)
        mean_m = per_inst(m_mb, "mean")
        imbalance = np.where(mean_m != 0, inst_max(m_mb) / mean_m, np.nan)
    out = first.loc[sel, ["collective_id", "Process Group Name", "Process Group Ranks", "Collective name",
                          "Group size", "dtype", "stream"]].reset_index(drop=True)
    out["total data communicated (MB)"] = total_mb
    out["total nelems communicated"] = pd.array([None if math.isnan(x) else int(x) for x in total_n], dtype="Int64")
    out["wall_time (us)"] = wall
    out["max_rank_dur (us)"] = st["max_dur"][sel] / 1000.0
    out["min_rank_dur (us)"] = st["min_dur"][sel] / 1000.0
    out["avg_rank_dur (us)"] = st["sum_dur"][sel] / st["count"][sel] / 1000.0
    out["throughput (GB/s)"] = thr
    out["max_rank_throughput (GB/s)"] = inst_max(rank_thr)
    out["min_rank_throughput (GB/s)"] = inst_min(rank_thr)
    out["size_imbalance"] = imbalance
    out["skew in start time"] = (st["max_s"] - st["min_s"])[sel] / 1000.0
    out["skew in end time"] = (st["max_e"] - st["min_e"])[sel] / 1000.0
    ranks = np.unique(ns["rank"][rows])
    rp = np.searchsorted(ranks, ns["rank"][rows])
    sub = long.loc[rows, list(dict.fromkeys(A2AV_RANK_BLOCK + _OFFRANK_COLUMNS))]  # only the columns read below
    wide = {}
    skew = {}
    s_rows, e_rows = ns["s"][rows], ns["e"][rows]
    skew_s = (s_rows - st["min_s"][sel][ipos]) / 1000.0
    skew_e = (st["max_e"][sel][ipos] - e_rows) / 1000.0
    for j, r in enumerate(ranks):
        mask = rp == j
        for col in A2AV_RANK_BLOCK:
            values = sub[col].to_numpy()[mask]
            if col in ("In split size", "Out split size"):
                arr = np.full(n, None, dtype=object)
            elif col in ("In msg nelems", "Out msg nelems"):
                arr = pd.array([None] * n, dtype="Int64")
                values = sub[col].astype("Int64").array[mask]
            else:
                arr = np.full(n, np.nan)
            arr[ipos[mask]] = values
            wide[f"rank_{r}_{col}"] = arr
        a = np.full(n, np.nan)
        a[ipos[mask]] = skew_s[mask]
        skew[f"rank_{r}_skew in start time"] = a
        b = np.full(n, np.nan)
        b[ipos[mask]] = skew_e[mask]
        skew[f"rank_{r}_skew in end time"] = b
    result = pd.concat([out, pd.DataFrame(wide), pd.DataFrame(skew)], axis=1)
    if nodes is not None:
        result["node_span"] = nodes.spans(result["Process Group Ranks"].to_numpy(dtype=object),
                                          result["Process Group Name"].to_numpy(dtype=object))
    # B5: bus bandwidth from the actual bytes each rank sends to other ranks
    offrank = _offrank_mb(sub, ns["rank"][rows])
    lat = st["min_dur"][sel] / 1000.0
    with np.errstate(divide="ignore", invalid="ignore"):
        result["bus bw (GB/s)"] = np.where(lat > 0, (inst_max(offrank) / 1024) / (lat / 1e6), np.nan)
    result["participants"] = st["count"][sel]
    result["metadata_mismatch"] = ~np.isin(mism[sel], ["", "stream"])
    result["stream_mismatch"] = ns["stream_mismatch"][starts][sel]
    result["instance"] = st["ids"][sel]
    result["flags"] = _flags_by_instance(long, st)[sel]
    order = np.lexsort((np.arange(n), np.nan_to_num(-result["total data communicated (MB)"].to_numpy(dtype=np.float64),
                                                    nan=np.inf)))
    return result.iloc[order].reset_index(drop=True)


_OFFRANK_COLUMNS = ["In msg size (MB)", "In msg nelems", "Group size", "In split size", "Process Group Ranks"]


def _offrank_mb(rows, ranks):
    """MiB each a2av row sends to ranks other than itself (from its In split
    size when readable, else (n-1)/n of its input)."""
    in_mb = rows["In msg size (MB)"].to_numpy(dtype=np.float64)
    in_n = rows["In msg nelems"].astype("Float64").to_numpy(dtype=np.float64, na_value=np.nan)
    gsz = rows["Group size"].astype("Float64").to_numpy(dtype=np.float64, na_value=np.nan)
    splits, members = {}, {}

    def one(split, pgr, r, mb, n, g):
        if math.isnan(mb):
            return math.nan
        if split not in splits:
            splits[split] = coll.parse_split(split)
        if pgr not in members:
            m, truncated = coll.parse_rank_list(pgr)
            members[pgr] = None if truncated or m is None else {x: j for j, x in enumerate(m)}
        parts, where = splits[split], members[pgr]
        r = int(r)
        if parts and where is not None and len(parts) == len(where) and r in where and n > 0:
            return mb * (n - parts[where[r]]) / n
        if not math.isnan(g) and g > 0:
            return mb * (g - 1) / g
        return math.nan

    # once per distinct row: the split lists repeat from step to step
    return np.array(_cached(one, rows["In split size"].to_numpy(dtype=object),
                            rows["Process Group Ranks"].to_numpy(dtype=object), np.asarray(ranks), in_mb, in_n, gsz),
                    dtype=np.float64)


def _summary_all2allv(a2av, aggs, nodes):
    df = a2av.dropna(subset=["Process Group Name", "dtype"])
    cols = ["Process Group Name", "dtype"]
    if not len(df):
        return pd.DataFrame({c: [] for c in cols})
    g = df.groupby(cols, sort=True)
    res = pd.DataFrame(index=g.size().index)
    for a in aggs:
        res[f"total data communicated (MB)_{agg_label(a)}"] = g["total data communicated (MB)"].agg(a)
    for a in aggs:
        res[f"wall_time (us)_{agg_label(a)}"] = g["wall_time (us)"].agg(a)
    res["Total wall_time (us)"] = g["wall_time (us)"].sum()
    for a in aggs:
        res[f"throughput (GB/s)_{agg_label(a)}"] = g["throughput (GB/s)"].agg(a)
    for m in ("size_imbalance", "max_rank_dur (us)", "skew in start time", "skew in end time"):
        res[f"{m}_mean"] = g[m].mean()
        res[f"{m}_max"] = g[m].max()
    res["count"] = g.size()
    for c in ("Process Group Ranks", "Collective name", "Group size"):
        res[c] = g[c].agg(_first_agg)
    res["Total wall_time (ms)"] = res["Total wall_time (us)"] / 1000.0
    res = res.reset_index()
    res["Group size"] = res["Group size"].astype("Int64")
    if nodes is not None:
        res["node_span"] = nodes.spans(res["Process Group Ranks"].to_numpy(dtype=object),
                                      res["Process Group Name"].to_numpy(dtype=object))
    order = np.lexsort((np.arange(len(res)), -res["Total wall_time (ms)"].to_numpy(dtype=np.float64)))
    return res.iloc[order].reset_index(drop=True)


def _heatmap(long, world, findings):
    if world > HEATMAP_MAX_WORLD:
        findings.append({"severity": "warning", "category": "heatmap_skipped", "rank": None, "pg": None,
                         "collective_id": None, "count": None,
                         "message": f"world size {world} > {HEATMAP_MAX_WORLD}: the all2allv heatmap is skipped"})
        return None
    if world > HEATMAP_WARN_WORLD:
        log.warning(f"all2allv heatmap for a world of {world} ranks: the sheet may be large")
    rows = long[long["Collective name"] == "all_to_allv"]
    acc = {}
    skipped = {"unreadable split list": 0, "split list length != Group size": 0, "unknown dtype": 0}
    cache = {}
    for split, gsz, dtype, rank, pgr in zip(rows["In split size"].tolist(), rows["Group size"].tolist(),
                                            rows["dtype"].tolist(), rows["rank"].tolist(),
                                            rows["Process Group Ranks"].tolist()):
        if split not in cache:
            cache[split] = coll.parse_split(split)
        parts = cache[split]
        if parts is None:
            skipped["unreadable split list"] += 1
            continue
        if gsz is None or gsz is pd.NA or len(parts) != int(gsz):
            skipped["split list length != Group size"] += 1
            continue
        bpe = coll.bytes_per_elem(dtype)
        if bpe is None:
            skipped["unknown dtype"] += 1
            continue
        members, truncated = coll.parse_rank_list(pgr)
        if members is not None and (truncated or len(members) != len(parts)):
            members = None
        for j, count in enumerate(parts):
            key = (int(rank), j)
            b, c, g = acc.get(key, (0, 0, None))
            acc[key] = (b + count * bpe, c + 1, members[j] if members is not None else g)
    for why, count in skipped.items():
        if count:
            findings.append({"severity": "info", "category": "heatmap_rows_skipped", "rank": None, "pg": None,
                             "collective_id": None, "count": count,
                             "message": f"all2allv heatmap: {count} all_to_allv kernel row(s) skipped ({why})"})
    if not acc:
        return pd.DataFrame({c: [] for c in HEATMAP_COLUMNS + ["dst_global_rank"]})
    keys = sorted(acc)
    total = np.array([acc[k][0] for k in keys], dtype=np.float64) / coll.MIB
    count = np.array([acc[k][1] for k in keys], dtype=np.int64)
    return pd.DataFrame({"src_rank": [k[0] for k in keys], "dst_rank": [k[1] for k in keys],
                         "total_sent_MB": total, "avg_sent_MB": total / count, "count": count,
                         "dst_global_rank": pd.array([acc[k][2] for k in keys], dtype="Int64")})


# ---------------------------------------------------------------------- straggler summary


def _straggler(ns, imp_rows, implicit, nodes):
    N = len(implicit)
    rows = imp_rows
    rank = ns["rank"]
    inst_rows = ns["instance"][rows]
    # waits on implicit rows: max start of the instance - start
    frame = pd.DataFrame({"instance": inst_rows, "rank": rank[rows], "s": ns["s"][rows]})
    frame["max_s"] = frame.groupby("instance")["s"].transform("max")
    frame["wait"] = (frame["max_s"] - frame["s"]) / 1000.0
    by_rank = frame.groupby("rank")
    total = by_rank["wait"].sum()
    mean = by_rank["wait"].mean()
    participated = by_rank.size()
    last = pd.Series(implicit["straggler_rank"].to_numpy()).value_counts()
    first = pd.Series(implicit["earliest arrival rank"].to_numpy()).value_counts()
    blame = pd.Series(implicit["blame_us"].to_numpy()).groupby(implicit["straggler_rank"].to_numpy()).sum()
    all_dur = pd.Series(ns["dur"] / 1000.0).groupby(rank).sum()
    ranks = total.index.to_numpy()
    df = pd.DataFrame({
        "rank": ranks.astype(np.int64),
        "total_wait_time_us": np.round(total.to_numpy(dtype=np.float64), 1),
        "mean_wait_time_us": np.round(mean.to_numpy(dtype=np.float64), 1),
        "times_arrived_last": last.reindex(ranks, fill_value=0).to_numpy(dtype=np.int64),
        "times_arrived_first": first.reindex(ranks, fill_value=0).to_numpy(dtype=np.int64),
    })
    df["pct_arrived_last"] = np.round(100.0 * df["times_arrived_last"] / N, 1)
    df["num_collectives"] = N
    df["total_nccl_dur_us"] = np.round(all_dur.reindex(ranks, fill_value=0.0).to_numpy(dtype=np.float64), 1)
    df["participated"] = participated.reindex(ranks).to_numpy(dtype=np.int64)
    df["pct_arrived_last_of_participated"] = np.round(100.0 * df["times_arrived_last"] / df["participated"], 1)
    df["total_blame_us"] = np.round(blame.reindex(ranks, fill_value=0.0).to_numpy(dtype=np.float64), 1)
    order = np.lexsort((df["rank"].to_numpy(), df["total_wait_time_us"].to_numpy()))
    df = df.iloc[order].reset_index(drop=True)
    if nodes is not None:
        df.insert(len(STRAGGLER_COLUMNS), "node_id", pd.array(df["rank"].to_numpy() // nodes.G, dtype="Int64"))
    return df


# ---------------------------------------------------------------------- Part B sheets


def _by_size(long, ns, st):
    if not len(long):
        return pd.DataFrame({c: [] for c in BY_SIZE_COLUMNS})
    starts = st["starts"]
    first = _first_rows(long, st)
    cat = ns["category"][starts]
    kind = ns["kind"][starts]
    pos = st["pos"]
    in_b, out_b = ns["in_bytes"], ns["out_bytes"]
    a2av = cat == "alltoallv"
    max_in = pd.Series(in_b).groupby(pos).max().to_numpy()
    nbytes = np.where(cat == "allgather", out_b[starts], np.where(a2av, max_in, in_b[starts]))
    lat = st["min_dur"] / 1000.0
    gsize = first["Group size"].astype("Float64").to_numpy(dtype=np.float64, na_value=np.nan)
    factor = np.array(_cached(_factor, kind, gsize), dtype=np.float64)
    bus_bytes = nbytes * factor
    if a2av.any():
        rows = a2av[pos]
        off = _offrank_mb(long.loc[rows, _OFFRANK_COLUMNS], ns["rank"][rows]) * coll.MIB
        mx = pd.Series(off).groupby(pos[rows]).max()
        bus_bytes[mx.index.to_numpy()] = mx.to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        bw = np.where(lat > 0, bus_bytes / coll.GIB / (lat / 1e6), np.nan)
    df = pd.DataFrame({
        "Collective name": first["Collective name"].astype(object).where(first["Collective name"].notna(), "Unknown"),
        "Process Group Name": first["Process Group Name"].astype(object),
        "size_bucket": _cached(lambda b: coll.size_bucket(None if math.isnan(b) else b), nbytes),
        "bytes": nbytes, "lat": lat, "bw": bw, "bus_bytes": bus_bytes,
    })
    g = df.groupby(["Collective name", "Process Group Name", "size_bucket"], sort=False)
    res = g.agg(count=("lat", "size"), total_bytes=("bytes", "sum"), total_latency_us=("lat", "sum"),
                avg_latency_us=("lat", "mean"), p50_latency_us=("lat", lambda x: np.percentile(x, 50)),
                p99_latency_us=("lat", lambda x: np.percentile(x, 99)),
                **{"avg bus bw (GB/s)": ("bw", "mean")}).reset_index()
    tb = g["bus_bytes"].sum(min_count=1).to_numpy()
    tl = g["lat"].sum().to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        res["bus bw (GB/s)"] = np.where(tl > 0, tb / coll.GIB / (tl / 1e6), np.nan)
    res["total_bytes"] = pd.array([None if math.isnan(x) else int(x) for x in
                                   g["bytes"].sum(min_count=1).to_numpy(dtype=np.float64)], dtype="Int64")
    res["_b"] = res["size_bucket"].map(coll.SIZE_BUCKET_ORDER)
    res = res.sort_values(["Collective name", "Process Group Name", "_b"], kind="stable").drop(columns="_b")
    return res[BY_SIZE_COLUMNS].reset_index(drop=True)


def _cached(fn, *columns):
    """``[fn(*values) for values in zip(*columns)]`` for numpy ``columns``,
    calling ``fn`` once per distinct tuple (a handful of kinds, group sizes
    and sizes per report), with the Python values of its first row.  Missing
    values (None, NaN) count as one value: every ``fn`` here treats them alike."""
    ids = group_ids(*columns)
    _, first = np.unique(ids, return_index=True)
    results = np.empty(len(first), dtype=object)
    for i, values in enumerate(zip(*[np.asarray(col)[first].tolist() for col in columns])):
        results[i] = fn(*values)
    return results[ids].tolist()


def _factor(kind, n):
    f = coll.bus_factor(kind if isinstance(kind, str) else None, None if math.isnan(n) else n)
    return np.nan if f is None else f


def _clock_sheet(clocks, applied, story=()):
    note = ("applied: ts, skew and wait columns of this report are on aligned clocks" if applied else
            "estimated only, not applied (times are as recorded; use --align_clocks to apply)")
    if story:   # the offsets change the answers: say so on every row
        note = ("estimated only, not applied, and LARGE ENOUGH TO CHANGE THE ANSWERS (see data_quality): skew, "
                "wait and straggler columns use the clocks as recorded; use --align_clocks for the aligned view")
    return pd.DataFrame({
        "rank": clocks["rank"].to_numpy(dtype=np.int64),
        "offset_us": clocks["offset_ns"].to_numpy(dtype=np.int64) / 1000.0,
        "residual_us": clocks["residual_ns"].to_numpy(dtype=np.float64) / 1000.0,
        "max_residual_us": clocks["max_residual_ns"].to_numpy(dtype=np.float64) / 1000.0,
        "collectives": clocks["collectives"].to_numpy(dtype=np.int64),
        "reference_rank": clocks["reference_rank"].to_numpy(dtype=np.int64),
        "applied": clocks["applied"].to_numpy(dtype=bool),
        "method": clocks["method"].astype(object).to_numpy(),
        "note": [note] * len(clocks),
    }, columns=CLOCK_SHEET_COLUMNS)


# ====================================================================== writers

_RISKY = ("=", "+", "-", "@", "\t", "\r")
_RISKY_FIRST = frozenset(_RISKY)


def sheet_parts(name, df, max_rows=EXCEL_MAX_ROWS - 1):
    """Excel-sized pieces of a sheet: ``[(title, df)]``; titles are cut to 31
    characters, pieces after the first are named ``name (2)``, ``name (3)``..."""
    if len(df) <= max_rows:
        return [(name[:31], df)]
    parts = []
    for k, start in enumerate(range(0, len(df), max_rows)):
        suffix = "" if k == 0 else f" ({k + 1})"
        parts.append((name[:31 - len(suffix)] + suffix, df.iloc[start:start + max_rows]))
    return parts


def _cell_columns(df):
    """Column-wise Python values for writing: None for missing, Python scalars."""
    cols = []
    for name in df.columns:
        s = df[name]
        if s.dtype.kind == "f":
            vals = s.to_numpy()
            cols.append([None if v != v else float(v) for v in vals.tolist()])
        elif s.dtype.kind in "iub":
            cols.append(s.to_numpy().tolist())
        else:
            cols.append([None if (v is None or v is pd.NA or (isinstance(v, float) and v != v)) else
                         (v.item() if hasattr(v, "item") else v) for v in s.astype(object).tolist()])
    return cols


def write_xlsx(sheets, path, max_rows=EXCEL_MAX_ROWS - 1, engine="fast"):
    """Write the sheets to one workbook at ``path`` (atomically: a temporary
    file renamed on success).

    Sheets longer than Excel's row limit are split (``nccl_long``,
    ``nccl_long (2)``, ...) with a warning.  Text is never a formula: cells
    starting with ``=``, ``+``, ``-`` or ``@`` are stored as text.  Control
    characters that XML cannot hold are dropped; NaN and missing values are
    empty cells.

    ``engine="fast"`` (default) streams the sheet XML straight into the zip
    (about 20x faster than openpyxl without lxml, which matters for
    100k-row sheets); ``engine="openpyxl"`` writes through openpyxl's
    write-only workbook.  Both produce workbooks that openpyxl, pandas and
    Excel read identically.
    """
    path = str(path)
    target, direct = resolve_output(path)
    if not direct and not os.path.isdir(os.path.dirname(target)):
        raise StreamtraceError(f"{path}: the output directory does not exist")
    check_suffix(path)
    parts = []
    for name, df in sheets.items():
        pieces = sheet_parts(name, df, max_rows)
        if len(pieces) > 1:
            log.warning(f"sheet {name}: {len(df)} rows exceed Excel's limit; split into {len(pieces)} sheets "
                        "(CSV output keeps the whole table)")
        parts += pieces
    if engine not in ("openpyxl", "fast"):
        raise StreamtraceError(f"unknown xlsx engine {engine!r} (fast or openpyxl)")
    # spooled sheets go beside the workbook, or to $TMPDIR when it is a device or a pipe
    spool_dir = tempfile.gettempdir() if direct else os.path.dirname(target)
    with atomic_file(path, suffix=".xlsx") as f:
        if engine == "openpyxl":
            _write_openpyxl(parts, f)
        else:
            _write_fast(parts, f, spool_dir)
    return path


def _write_openpyxl(parts, target):
    from openpyxl import Workbook
    from openpyxl.cell import WriteOnlyCell

    wb = Workbook(write_only=True)
    for title, part in parts:
        ws = wb.create_sheet(title)
        ws.append([str(c) for c in part.columns])
        cols = _cell_columns(part)
        text_cols = [i for i, c in enumerate(part.columns) if part[c].dtype.kind not in "fiub"]
        for row in zip(*cols) if cols else ():
            if text_cols:
                row = list(row)
                for i in text_cols:
                    v = row[i]
                    if isinstance(v, str):
                        if _ILLEGAL_XML.search(v):
                            v = _ILLEGAL_XML.sub("", v)
                            row[i] = v
                        if v.startswith(_RISKY):
                            cell = WriteOnlyCell(ws, v)
                            cell.data_type = "s"  # text, never a formula
                            row[i] = cell
                    elif not isinstance(v, (int, float, bool)) and v is not None:
                        row[i] = str(v)
            ws.append(row)
    wb.save(target)


# ---------------------------------------------------------------------- the fast engine

_NS_MAIN = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
_NS_REL = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
_NS_PKG = "http://schemas.openxmlformats.org/package/2006/relationships"
_XML_HEAD = '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
_STYLES = (_XML_HEAD + f'<styleSheet xmlns="{_NS_MAIN}"><fonts count="1"><font><sz val="11"/><name val="Calibri"/>'
           '</font></fonts><fills count="2"><fill><patternFill patternType="none"/></fill><fill><patternFill '
           'patternType="gray125"/></fill></fills><borders count="1"><border><left/><right/><top/><bottom/>'
           '<diagonal/></border></borders><cellStyleXfs count="1"><xf numFmtId="0" fontId="0" fillId="0" '
           'borderId="0"/></cellStyleXfs><cellXfs count="1"><xf numFmtId="0" fontId="0" fillId="0" borderId="0" '
           'xfId="0"/></cellXfs><cellStyles count="1"><cellStyle name="Normal" xfId="0" builtinId="0"/>'
           '</cellStyles></styleSheet>')
_EMPTY = "<c/>"


def _str_cell(s):
    s = _xml_escape(s)
    space = ' xml:space="preserve"' if s[:1].isspace() or s[-1:].isspace() else ""
    return f'<c t="inlineStr"><is><t{space}>{s}</t></is></c>'


#: characters _xml_escape changes (XML-illegal controls, CR, & < >)
_XML_SPECIAL = re.compile(r"[\x00-\x08\x0b-\x1f&<>]")


def _str_cells(values):
    """``_str_cell`` of each str: one search over them all when none needs escaping."""
    if _XML_SPECIAL.search("\t".join(values)):   # tab: legal and never escaped, so it adds no match
        return [_str_cell(s) for s in values]
    return [_str_cell(s) if s[:1].isspace() or s[-1:].isspace() else f'<c t="inlineStr"><is><t>{s}</t></is></c>'
            for s in values]


def _num_cell(v):
    return f"<c><v>{v!r}</v></c>" if v == v and v not in (math.inf, -math.inf) else _EMPTY


def _xml_other(v):
    """The <c> element of a non-str, non-missing object in a mixed column."""
    if isinstance(v, (bool, np.bool_)):
        return '<c t="b"><v>1</v></c>' if v else '<c t="b"><v>0</v></c>'
    if isinstance(v, (int, np.integer)):
        return f"<c><v>{int(v)}</v></c>"
    if isinstance(v, (float, np.floating)):
        return _num_cell(float(v))
    return _str_cell(str(v))


def _xml_style():
    """Cells as <c> elements: numbers as repr/str, text as inline strings
    (never a formula), escaped once per distinct value; NaN and +-inf empty."""
    from .cells import CellStyle

    return CellStyle(na=_EMPTY, true='<c t="b"><v>1</v></c>', false='<c t="b"><v>0</v></c>', text=_str_cell,
                     other=_xml_other, number_open="<c><v>", number_close="</v></c>", nonfinite_na=True,
                     texts=_str_cells)


def _isal_deflating(member):
    """A zip member being written, deflated by ISA-L (python-isal, already a
    dependency for gzip input) instead of zlib: the same raw deflate format at
    several times the speed and a smaller output (docs/performance.md).
    zipfile has no public hook for its compressor, so this swaps the member's
    own deflate object; when zipfile's internals differ, zlib stays."""
    try:
        from isal import isal_zlib
    except ImportError:  # pragma: no cover - isal is a dependency
        return member
    if getattr(member, "_compressor", None) is not None and getattr(member, "_compress_size", None) == 0:
        member._compressor = isal_zlib.compressobj(1, isal_zlib.DEFLATED, -15)
    return member


class _ZipWriterThread:
    """Deflates and writes zip members in a background thread, so the next
    chunk of sheet XML is formatted (Python, GIL) while the previous one is
    compressed (zlib, without the GIL).  Only this thread touches the zip."""

    def __init__(self, zf):
        import queue
        import threading

        self.zf, self.error = zf, None
        self.q = queue.Queue(maxsize=4)  # bounds the formatted-but-unwritten text
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        member = None
        while True:
            item = self.q.get()
            if item is None:
                break
            if self.error is not None:
                continue  # keep draining so the producer never blocks
            try:
                name, data = item
                if name is not None:  # start a member
                    member = _isal_deflating(self.zf.open(name, "w", force_zip64=True))
                elif data is None:  # end it
                    member, m = None, member
                    m.close()
                else:
                    member.write(data)
            except BaseException as exc:  # re-raised in the producer
                self.error = exc
        if member is not None:  # the producer failed mid-member: leave the zip closable
            try:
                member.close()
            except BaseException:
                pass

    def _put(self, item):
        if self.error is not None:
            raise self.error
        self.q.put(item)

    def member(self, name):
        self._put((name, None))

    def write(self, data):
        self._put((None, data))

    def end_member(self):
        self._put((None, None))

    def close(self):
        self.q.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error


def _sheet_xml(part, extras=("", "")):
    """The worksheet XML of one sheet, in pieces (20,000 rows each);
    ``extras``: XML before and after <sheetData> (``xlsx_style``)."""
    yield (_XML_HEAD + f'<worksheet xmlns="{_NS_MAIN}" xmlns:r="{_NS_REL}">{extras[0]}<sheetData>').encode()
    yield ("<row>" + "".join(_str_cell(str(c)) for c in part.columns) + "</row>").encode()
    from .cells import column_cells, table_rows

    style = _xml_style()
    for start in range(0, len(part), _CHUNK_ROWS):
        chunk = part.iloc[start:start + _CHUNK_ROWS]
        if not len(chunk.columns):
            yield b"<row/>" * len(chunk)
            continue
        cols = []
        for c in range(len(chunk.columns)):
            cells = column_cells(chunk.iloc[:, c], style)
            if cells is None:   # a dtype cells does not know: float32 as float64, others value by value
                col = chunk.iloc[:, c]
                wider = np.float64 if isinstance(col.dtype, np.dtype) and col.dtype.kind == "f" else object
                cells = column_cells(col.astype(wider), style)
            cols.append(cells)
        yield from table_rows(cols, style, sep="", row_open="<row>", row_close="</row>")
    yield f"</sheetData>{extras[1]}</worksheet>".encode()


def _spool_sheet_xml(part, path, extras):
    with open(path, "wb") as f:
        for piece in _sheet_xml(part, extras):
            f.write(piece)


def _write_fast(parts, target, spool_dir):
    import zipfile

    from . import xlsx_style

    titles = [title for title, _ in parts]
    styles = xlsx_style.Styles()
    chart = next((i for i, (title, part) in enumerate(parts) if xlsx_style.wants_chart(title, part)), None)
    extras = [styles.sheet(part, drawing=i == chart) for i, (_, part) in enumerate(parts)]
    # on two cores a forked child formats about half of a large workbook's
    # sheets into spooled XML files, which this process then compresses into
    # the zip (formatting holds the GIL; zlib in the writer thread does not)
    cells = [part.shape[0] * max(1, part.shape[1]) for _, part in parts]
    mine, theirs = list(range(len(parts))), []
    spool = child = None
    if len(parts) > 1 and sum(cells) >= _PARALLEL_MIN_CELLS and available_cpus() > 1 and can_fork():
        mine, theirs = (sorted(g) for g in balanced(list(range(len(parts))), cells))
        spool = tempfile.mkdtemp(prefix=".streamtrace-xlsx-", dir=spool_dir)
        child = Child([functools.partial(_spool_sheet_xml, parts[i][1], os.path.join(spool, f"{i}.xml"), extras[i])
                       for i in theirs])
    try:
        with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
            out = _ZipWriterThread(zf)
            try:
                for i in mine:
                    out.member(f"xl/worksheets/sheet{i + 1}.xml")
                    for piece in _sheet_xml(parts[i][1], extras[i]):
                        out.write(piece)
                    out.end_member()
                if child is not None:
                    child.wait()
                for i in theirs:
                    out.member(f"xl/worksheets/sheet{i + 1}.xml")
                    with open(os.path.join(spool, f"{i}.xml"), "rb") as f:
                        for piece in iter(lambda: f.read(4 << 20), b""):
                            out.write(piece)
                    out.end_member()
            finally:
                out.close()
            _write_workbook_parts(zf, titles, styles,
                                  None if chart is None else (chart, xlsx_style.chart_parts(*parts[chart])))
    finally:
        if child is not None:
            child.stop()
        if spool is not None:
            shutil.rmtree(spool, ignore_errors=True)


def _write_workbook_parts(zf, titles, styles=None, chart=None):
    """Every member of the workbook but the worksheets; ``chart``: (sheet
    index, ``xlsx_style.chart_parts``) or None."""
    from . import xlsx_style

    sheets_xml = "".join(f'<sheet name="{_attr(t)}" sheetId="{i}" r:id="rId{i}"/>'
                         for i, t in enumerate(titles, start=1))
    zf.writestr("xl/workbook.xml", _XML_HEAD + f'<workbook xmlns="{_NS_MAIN}" xmlns:r="{_NS_REL}">'
                f"<sheets>{sheets_xml}</sheets></workbook>")
    rels = "".join(f'<Relationship Id="rId{i}" Type="{_NS_REL}/worksheet" Target="worksheets/sheet{i}.xml"/>'
                   for i in range(1, len(titles) + 1))
    rels += f'<Relationship Id="rId{len(titles) + 1}" Type="{_NS_REL}/styles" Target="styles.xml"/>'
    zf.writestr("xl/_rels/workbook.xml.rels", _XML_HEAD + f'<Relationships xmlns="{_NS_PKG}">{rels}</Relationships>')
    zf.writestr("xl/styles.xml", _STYLES if styles is None else xlsx_style.styles_xml(styles))
    chart_types = ""
    if chart is not None:
        index, members = chart
        for name, xml in members.items():
            zf.writestr(f"xl/worksheets/_rels/sheet{index + 1}.xml.rels" if name == "sheet_rels" else name, xml)
        chart_types = xlsx_style.CONTENT_TYPES
    zf.writestr("_rels/.rels", _XML_HEAD + f'<Relationships xmlns="{_NS_PKG}"><Relationship Id="rId1" '
                f'Type="{_NS_REL}/officeDocument" Target="xl/workbook.xml"/></Relationships>')
    ct = "application/vnd.openxmlformats-officedocument.spreadsheetml"
    overrides = "".join(f'<Override PartName="/xl/worksheets/sheet{i}.xml" ContentType="{ct}.worksheet+xml"/>'
                        for i in range(1, len(titles) + 1))
    zf.writestr("[Content_Types].xml", _XML_HEAD + '<Types xmlns="http://schemas.openxmlformats.org/package/2006/'
                'content-types"><Default Extension="rels" ContentType="application/vnd.openxmlformats-package.'
                'relationships+xml"/><Default Extension="xml" ContentType="application/xml"/>'
                f'<Override PartName="/xl/workbook.xml" ContentType="{ct}.sheet.main+xml"/>'
                f'<Override PartName="/xl/styles.xml" ContentType="{ct}.styles+xml"/>{overrides}{chart_types}</Types>')


def _attr(s):
    s = _xml_escape(s).replace('"', "&quot;")
    for ch in '[]:*?/\\':
        s = s.replace(ch, "_")
    return s


#: where a spreadsheet starts a new cell inside a multi-line value -- after a
#: line break (it may split the row there) or a comma (on such a split line
#: the quoting no longer holds) -- followed, past any quotes, by what it
#: would read as the start of a formula
_FORMULA_AFTER_BREAK = re.compile(r'(?<=[\r\n,])(?="*[=+\-@\t])')


def _neutral(v):
    """A text cell that no spreadsheet evaluates: a ``'`` before a leading
    ``= + - @ TAB CR``, and in a value holding CR or LF (which the writers
    also quote) before each cell a spreadsheet could start inside it."""
    if v[:1] in _RISKY_FIRST:
        v = "'" + v
    if "\r" in v or "\n" in v:
        v = _FORMULA_AFTER_BREAK.sub("'", v)
    return v


def _csv_safe(df):
    """Text cells that a spreadsheet would evaluate neutralised (``_neutral``)."""
    out = None
    for col in df.columns:
        s = df[col]
        if s.dtype.kind in "fiub" or isinstance(s.dtype, pd.Int64Dtype):
            continue
        values = s.to_numpy(dtype=object)
        risky = np.fromiter((isinstance(v, str) and (v[:1] in _RISKY_FIRST or "\r" in v or "\n" in v)
                             for v in values), dtype=bool, count=len(values))
        if risky.any():
            if out is None:
                out = df.copy()
            values = values.copy()
            values[risky] = [_neutral(v) for v in values[risky]]
            out[col] = pd.Series(values, dtype=object, index=df.index)
    return df if out is None else out


def _pandas_csv(df, path):
    """``_csv_safe(df).to_csv(path, index=False)``; every field quoted when a
    text holds a CR, which the csv module alone leaves bare (it quotes only
    its own line end, "\n") and at which readers start a new row."""
    safe = _csv_safe(df)
    holds_cr = any(isinstance(v, str) and "\r" in v
                   for col in safe.columns if safe[col].dtype == object for v in safe[col].tolist())
    safe.to_csv(path, index=False, quoting=csv.QUOTE_ALL if holds_cr else csv.QUOTE_MINIMAL)


_CHUNK_ROWS = 20000  # rows formatted at a time: bounds the memory of a chunk's cells
#: below this many cells in all sheets (~40 ms of formatting) forking a writer does not pay
_PARALLEL_MIN_CELLS = 200_000
#: collective rows from which build_report computes its two groups of sheets at once
_PARALLEL_MIN_ROWS = 20_000


def _csv_style():
    """Cells as ``to_csv`` writes them: str values formula-neutralised (as
    ``_csv_safe``) and quoted as the csv module quotes them."""
    from . import cells

    quote = cells.CsvQuoter()

    return cells.CellStyle(na="", true="True", false="False", text=lambda v: quote(_neutral(v)),
                           other=lambda v: quote(cells.object_text(v)),
                           texts=lambda values: quote.many([_neutral(v) for v in values]))


def _write_csv(df, path):
    """``_pandas_csv(df, path)``, byte for byte (but for CR, see CsvQuoter), about 10x
    faster: columns become cells (streamtrace.cells: numbers as int64, texts
    made once per distinct value) that the C core writes as rows, instead of
    pandas' per-cell csv-module path.  Frames the fast path does not cover (a
    dtype cells does not format, one column, no rows, non-text column names,
    another line separator) go to pandas itself."""
    from .cells import column_cells, table_rows

    style = _csv_style()

    def chunk_cells(start):
        part = df.iloc[start:start + _CHUNK_ROWS]
        cols = [column_cells(part.iloc[:, j], style) for j in range(len(df.columns))]
        return None if any(c is None for c in cols) else cols

    simple = (len(df.columns) >= 2 and len(df) and os.linesep == "\n" and df.columns.is_unique
              and all(isinstance(c, str) for c in df.columns))
    first = chunk_cells(0) if simple else None   # dtypes are the same in every chunk: the first one decides
    if first is None:
        _pandas_csv(df, path)
        return
    header = io.StringIO()
    csv.writer(header, lineterminator="\n").writerow(list(df.columns))
    with open(path, "wb") as f:
        f.write(header.getvalue().encode("utf-8"))
        for start in range(0, len(df), _CHUNK_ROWS):
            for piece in table_rows(first if start == 0 else chunk_cells(start), style, sep=",", row_close="\n"):
                f.write(piece)


def write_csvs(sheets, directory):
    """One ``<sheet>.csv`` per sheet (full tables, no index) in ``directory``.

    Files are written to a temporary directory next to it and then moved in,
    so a failure leaves no partial output; sheet files of an earlier run that
    this run does not write are removed (see ``CsvDir``).  Text cells that a
    spreadsheet would evaluate get a leading ``'`` (see ``_neutral``).
    """
    out = CsvDir(directory)
    try:
        out.write(sheets)
        return out.commit(sheets)
    finally:
        out.discard()


class CsvDir:
    """A CSV output directory being written (``write_csvs``): ``write``
    puts sheets in a temporary directory beside it (from any process: the
    one-shot report's forked child writes the sheets it builds), ``commit``
    moves them in, ``discard`` removes what was not committed.

    A new directory is the temporary one renamed.  Into an existing one
    (which may hold the traces or anything else of the user's, or be a
    symlink) only the files the report owns are touched: ``<sheet>.csv`` for
    every sheet name the report can write -- this run's replace theirs, and
    those of an earlier run that this one did not write are removed, so the
    directory never mixes two runs.  Every target is checked before the
    first one is replaced."""

    def __init__(self, directory):
        self.directory = str(directory)   # the user's spelling, for messages
        target = os.path.realpath(os.path.abspath(self.directory))   # a symlinked directory stays a link
        parent = os.path.dirname(target)
        if not os.path.isdir(parent):
            raise StreamtraceError(f"{self.directory}: the parent directory does not exist")
        if os.path.exists(target) and not os.path.isdir(target):
            raise StreamtraceError(f"{self.directory}: exists and is not a directory")
        self.target = target
        try:
            self._tmp = tempfile.mkdtemp(prefix=".streamtrace-csv-", dir=parent)
        except OSError as exc:   # read-only, no permission
            raise StreamtraceError(f"{self.directory}: cannot write in its parent directory: "
                                   f"{exc.strerror or exc}") from None

    def _write_one(self, name, df):
        try:
            _write_csv(df, os.path.join(self._tmp, f"{name}.csv"))
        except OSError as exc:   # a full disk: the user's directory, not the hidden one
            raise StreamtraceError(f"{os.path.join(self.directory, name + '.csv')}: cannot write it: "
                                   f"{exc.strerror or exc}") from None

    def write(self, sheets, parallel=True):
        """Write ``{name: DataFrame}`` (``parallel`` on two cores: a large set
        split with a forked child)."""
        tasks = [functools.partial(self._write_one, name, df) for name, df in sheets.items()]
        cells = [df.shape[0] * max(1, df.shape[1]) for df in sheets.values()]
        if parallel and sum(cells) >= _PARALLEL_MIN_CELLS and available_cpus() > 1:
            split_in_two(tasks, cells)  # two cores: a forked child writes about half
        else:
            for task in tasks:
                task()

    def commit(self, names):
        """Move the sheets ``names`` (all written) into place; returns the
        directory (absolute, a link not followed)."""
        tmp, target = self._tmp, self.target
        names = list(names)
        for name in names:
            os.chmod(os.path.join(tmp, f"{name}.csv"), 0o666 & ~umask())
        try:
            if not os.path.exists(target):
                os.chmod(tmp, 0o777 & ~umask())
                os.rename(tmp, target)
                self._tmp = None
                return os.path.abspath(self.directory)
            owned = [f"{n}.csv" for n in dict.fromkeys(names + SHEET_ORDER)]
            for file in owned:   # all checked first: a refusal leaves the directory as it was
                dst = os.path.join(target, file)
                if os.path.lexists(dst) and (os.path.islink(dst) or not os.path.isfile(dst)):
                    raise StreamtraceError(f"{os.path.join(self.directory, file)}: is not a regular file; "
                                           "nothing was replaced")
            for name in names:
                os.replace(os.path.join(tmp, f"{name}.csv"), os.path.join(target, f"{name}.csv"))
            for file in owned[len(set(names)):]:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(target, file))
        except OSError as exc:
            raise StreamtraceError(f"{self.directory}: cannot move the sheets into it: "
                                   f"{exc.strerror or exc}") from None
        return os.path.abspath(self.directory)

    def discard(self):
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


def write_report(sheets, output_xlsx_path=None, output_csvs_dir=None):
    """Write the requested outputs; returns the paths written."""
    written = []
    if output_csvs_dir:
        written.append(write_csvs(sheets, output_csvs_dir))
    if output_xlsx_path:
        written.append(write_xlsx(sheets, output_xlsx_path))
    return written


def default_output_path(paths, trace_dir=None, trace_pattern=None, world_size=None):
    """A1.5: where ``nccl_analysis_report.xlsx`` goes when no output is given."""
    if trace_dir:
        return os.path.join(trace_dir, REPORT_NAME)
    if trace_pattern:
        first = [trace_pattern.replace("*", str(i)) for i in range(min(world_size or 1, 2))]
        common = os.path.commonpath([os.path.abspath(p) for p in first])
    else:
        real = [os.path.abspath(p) for p in paths if p and p != "-"]
        common = os.path.commonpath(real) if real else os.getcwd()
    if os.path.isfile(common) or not os.path.isdir(common):
        common = os.path.dirname(common)
    return os.path.join(common, REPORT_NAME)


__all__ = ["build_report", "collect_tables", "write_xlsx", "write_csvs", "write_report", "default_output_path",
           "sheet_parts", "DEFAULT_AGG_METRICS",
           "COLLECTIVE_COLUMNS"]

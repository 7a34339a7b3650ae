"""``report``: the multi-rank collective report (sheets as DataFrames, then writers).

``build_report(source, ...)`` turns the ``align.*`` tables (from a stream, a
list of frames, or a dict of tables) into ``{sheet name: DataFrame}``:

Part A (TraceLens-compatible, spec collective-report.md A4/A5):
``nccl_summary_implicit_sync``, ``nccl_summary_long``, ``nccl_summary_all2allv``,
``nccl_all2allv_heatmap``, ``nccl_long``, ``nccl_implicit_sync``,
``nccl_all2allv``, ``straggler_summary`` -- same columns, order, formulas and
units ("MB" = MiB, "GB/s" = GiB/s, times in us).  Part B adds columns at the
end of those sheets and the sheets ``nccl_summary_by_size``,
``clock_alignment`` and ``data_quality``; with the blocking analysis, its
sheets and ``confidence`` (streamtrace.confidence).

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

The sheets themselves are built in ``implicit``, ``all2allv`` and
``summaries`` from the rows of ``rows``; ``writers`` writes them
(``write_xlsx`` / ``write_csvs``, atomically).  The one-shot
``generate_collective_report`` (extract -> align -> report in one process)
lives in ``streamtrace.chain``.
"""
import functools
import logging

import numpy as np

from ..align.stage import quality_table, read_align_tables
from ..confidence import report_confidence
from ..errors import InvalidArgumentError
from ..parallel.cpus import available_cpus
from ..parallel.fork import both, can_fork
from .all2allv import _all2allv, _heatmap, _summary_all2allv
from .columns import IMPLICIT_EXTRA
from .files import BLOCKING_SHEETS, P2P_SHEETS, SHEET_ORDER
from .implicit import _implicit_sync, _straggler, _summary_implicit
from .nodes import _Nodes, _with_nodes
from .options import DEFAULT_AGG_METRICS, check_aggs
from .rows import _instance_stats, _long_table
from .summaries import _by_size, _clock_sheet, _summary_long
from .tables import _as_tables, _check_align_options

log = logging.getLogger("streamtrace")

#: collective rows from which build_report computes its two groups of sheets at once
_PARALLEL_MIN_ROWS = 20_000


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
    findings = [dict(r) for r in tables["align.quality"].to_dict("records")]
    inputs = _SheetInputs(tables, gpus_per_node, aggs, detailed_analysis, strict, all2allv_heatmap, world_size)
    sheets, notes, unresolved = _build_groups(inputs, deliver)
    findings += notes
    sheets["clock_alignment"] = _clock_alignment(tables["align.clocks"], findings)
    if unresolved:
        findings.append({"severity": "info", "category": "node_span_unknown", "rank": None, "pg": None,
                         "collective_id": None, "count": unresolved,
                         "message": f"{unresolved} truncated 'Process Group Ranks' list(s) could not be "
                                    "completed from distributedInfo.pg_config: node_span is 'unknown' there"})
    for name in P2P_SHEETS:   # runs without send/recv have no such table
        if f"align.{name}" in tables:   # (event numbers depend on what extract kept: not for users)
            sheets[name] = tables[f"align.{name}"].drop(columns=["send_event", "recv_event"], errors="ignore")
    for name in BLOCKING_SHEETS:
        if f"correlate.{name}" in tables:
            sheets[name] = tables[f"correlate.{name}"]
    if any(f"correlate.{name}" in tables for name in BLOCKING_SHEETS):
        # the blocking analysis' answers carry their confidence (docs/confidence.md)
        confidence = report_confidence(tables)
        sheets["confidence"] = confidence.table()
        if confidence.level != "high":
            findings.append({"severity": "warning", "category": "confidence", "rank": None, "pg": None,
                             "collective_id": None, "count": len(confidence.reasons),
                             "message": confidence.one_line() + " (confidence sheet)"})
    quality = tables.get("correlate.correlate_quality")
    if quality is not None:
        findings += [{"severity": "info", "category": row["check"], "rank": row["rank"], "pg": None,
                      "collective_id": None, "count": None, "message": row["detail"]}
                     for row in quality.to_dict("records")]
    sheets["data_quality"] = quality_table(findings)
    if not len(inputs.long):   # send/recv ops without kernels still fill the point-to-point sheets
        what = "only the point-to-point sheets have rows" if any(n in sheets for n in P2P_SHEETS) \
            else "the report is empty"
        log.warning(f"no collective kernels found: {what} (see the data_quality sheet)")
    return {name: sheets[name] for name in SHEET_ORDER if name in sheets}


class _SheetInputs:
    """What every sheet is built from: nccl_long (``long``), its per-row ns
    arrays (``ns``) and per-instance reductions (``inst``), the node columns
    (``nodes``, None without a GPU count) and the report's options."""

    def __init__(self, tables, gpus_per_node, aggs, detailed_analysis, strict, all2allv_heatmap, world_size):
        collectives = _in_instance_order(tables["align.collectives"])
        ranks_table = tables["align.ranks"]
        gpus = gpus_per_node
        if gpus is None and len(ranks_table) and ranks_table["gpus"].notna().any():
            gpus = int(ranks_table.sort_values("rank")["gpus"].dropna().iloc[0])
        self.nodes = _Nodes(gpus, ranks_table) if gpus else None
        common_base = int(ranks_table["base_ns"].min()) if len(ranks_table) else 0
        # A3.2's inference mode: traces without process groups
        self.simplified = (bool(len(collectives)) and (collectives["pg"] == "all").all()
                           and collectives["pg_name"].isna().all())
        self.long, self.ns = _long_table(collectives, common_base)
        self.inst = _instance_stats(self.ns)
        self.ranks_table = ranks_table
        self.aggs, self.detailed_analysis, self.strict = aggs, detailed_analysis, strict
        self.all2allv_heatmap, self.world_size = all2allv_heatmap, world_size

    def unresolved_keys(self):
        """The truncated rank lists node_span could not complete (so far, in this process)."""
        return self.nodes.unresolved_keys if self.nodes is not None else set()


def _in_instance_order(collectives):
    """align.collectives sorted by instance, then rank, with a fresh index."""
    if not len(collectives):
        return collectives
    if not _sorted_by_instance_rank(collectives):
        return collectives.sort_values(["instance", "rank"], kind="stable").reset_index(drop=True)
    return collectives.reset_index(drop=True)   # align writes them sorted: skip a copy of every column


def _sorted_by_instance_rank(collectives):
    inst = collectives["instance"].to_numpy(dtype=np.int64)
    rank = collectives["rank"].to_numpy(dtype=np.int64)
    return bool(np.all((inst[1:] > inst[:-1]) | ((inst[1:] == inst[:-1]) & (rank[1:] >= rank[:-1]))))


def _build_groups(inputs, deliver):
    """Both groups of sheets: (their sheets, their findings -- the implicit
    group's first --, the number of truncated rank lists left unresolved).

    The two groups share nothing they write: on two cores the second is
    built in a forked child meanwhile (large reports only: forking a process
    that holds every row costs ~20 ms) and sends back its tables, or, with
    ``deliver``, hands them over itself."""
    fork = len(inputs.long) >= _PARALLEL_MIN_ROWS and available_cpus() > 1 and can_fork()
    if deliver is not None and fork:
        here = functools.partial(_build_and_deliver, deliver,
                                 functools.partial(_implicit_group, inputs, with_implicit_sheet=False))
        there = functools.partial(_build_and_deliver, deliver,
                                  functools.partial(_other_group, inputs,
                                                    with_implicit_sheet=inputs.detailed_analysis))
    else:
        here, there = functools.partial(_implicit_group, inputs), functools.partial(_other_group, inputs)
    (mine, mine_notes, mine_keys), (theirs, their_notes, their_keys) = both(here, there, fork=fork)
    return {**mine, **theirs}, mine_notes + their_notes, len(mine_keys | their_keys)


def _build_and_deliver(deliver, build_group):
    """``build_group()``, its sheets handed to ``deliver``; their names stand in for the tables."""
    part, notes, keys = build_group()
    deliver(part)
    return dict.fromkeys(part), notes, keys


def _implicit_group(inputs, with_implicit_sheet=True):
    """The implicit-sync sheets, nccl_long, straggler_summary, by size:
    (sheets, findings, unresolved rank lists)."""
    long, ns, inst, nodes = inputs.long, inputs.ns, inputs.inst, inputs.nodes
    part, notes = {}, []
    implicit, imp_rows = _implicit_sync(long, ns, inst, inputs.simplified, inputs.strict, notes)
    part["nccl_summary_implicit_sync"] = _summary_implicit(implicit, inputs.aggs)
    if inputs.detailed_analysis:
        part["nccl_long"] = _with_nodes(long, nodes, rank_col=True, span_col=True,
                                        text=(ns["text"]["Process Group Ranks"], ns["text"]["Process Group Name"]))
        if with_implicit_sheet:
            part["nccl_implicit_sync"] = _implicit_sync_sheet(implicit, nodes)
    if len(implicit):
        part["straggler_summary"] = _straggler(ns, imp_rows, implicit, nodes)
    part["nccl_summary_by_size"] = _by_size(long, ns, inst)
    return part, notes, inputs.unresolved_keys()


def _other_group(inputs, with_implicit_sheet=False):
    """nccl_summary_long and the all_to_allv sheets (and, to balance the work
    of delivered groups, nccl_implicit_sync): (sheets, findings, unresolved
    rank lists)."""
    long, ns, inst, nodes = inputs.long, inputs.ns, inputs.inst, inputs.nodes
    part, notes = {}, []
    if with_implicit_sheet:
        # its findings come from the implicit group
        implicit, _ = _implicit_sync(long, ns, inst, inputs.simplified, inputs.strict, [])
        part["nccl_implicit_sync"] = _implicit_sync_sheet(implicit, nodes)
    part["nccl_summary_long"] = _summary_long(long, nodes, ns["text"])
    a2av = _all2allv(long, ns, inst, inputs.strict, notes, nodes)
    if len(a2av):
        part["nccl_summary_all2allv"] = _summary_all2allv(a2av, inputs.aggs, nodes)
        if inputs.detailed_analysis:
            part["nccl_all2allv"] = a2av
    if inputs.all2allv_heatmap:
        ranks_table = inputs.ranks_table
        world = max([int(x) for x in ranks_table["world_size"].dropna().tolist()] + [len(ranks_table)] +
                    [int(inputs.world_size or 0)])
        heat = _heatmap(long, world, notes)
        if heat is not None and len(heat):
            part["nccl_all2allv_heatmap"] = heat
    return part, notes, inputs.unresolved_keys()


def _implicit_sync_sheet(implicit, nodes):
    return _with_nodes(implicit, nodes, span_col=True, before=IMPLICIT_EXTRA[0])


def _clock_alignment(clocks, findings):
    """The clock_alignment sheet; when the offsets change the answers, the
    command line says so too, not only the sheet."""
    applied = bool(clocks["applied"].any()) if len(clocks) else False
    story = [f for f in findings if f["category"] in ("clock_offsets_change_results", "clock_offsets_unreliable")]
    sheet = _clock_sheet(clocks, applied, story)
    for f in story:
        log.warning(f["message"])
    return sheet


__all__ = ["build_report"]

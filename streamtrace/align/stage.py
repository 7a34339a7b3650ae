"""``align``: collective kernels per rank, matched across ranks, with clock offsets.

A stage over the event stream (stream in -> stream out)::

    for frame in align_frames(frames):      # every input frame, then the results
        ...

It passes every frame through as it reads it (END frames are replaced by one
END at its own end) and appends its results as TABLE frames (see
docs/stream-format.md, "Stage tables"):

``align.options``      one row: the options align ran with (written first, so
                       a later stage knows that align tables will follow)
``align.ranks``        one row per rank: source, world size, GPUs, time base,
                       process groups (distributedInfo.pg_config), warnings
``align.collectives``  one row per collective kernel per rank (COLLECTIVE_COLUMNS)
``align.clocks``       one row per rank: estimated clock offset and residual
``align.quality``      data-quality findings

How it works, per rank (``collect.RankCollector``, then
``describe.finish_rank``), as frames arrive:

* each new string of the rank's string table is classified once (NCCL/RCCL
  kernel name, ``nccl:*`` annotation, ``record_param_comms``, ``c10d::*``,
  kernel-launch API, event category);
* each EVENTS frame is filtered (one C pass) into three small arrays: kernels,
  kernel launches and collective CPU ops; comm-argument records are kept;
  everything else is dropped;
* at the rank's META frame the rank is finished (in a background thread,
  started before the frame is passed on, so that a stage downstream finishes
  its own view of the rank meanwhile): kernels join their launch by
  ``correlation``; launches/kernels join the CPU ops by ``External id`` (new
  traces) or by time containment of the launch on its thread (old traces,
  where External id == correlation); a kernel is a collective kernel when its
  name matches the NCCL/RCCL patterns or it is linked to ``record_param_comms``
  / ``nccl:*`` (spec B2); its kind, dtype, sizes and process group come from
  the kernel's args, then ``record_param_comms``, then the ``nccl:*``
  annotation's ``Input Dims``/``Input type``, then the c10d op, then the
  kernel name.  Only the collective rows are kept.

Across ranks (``match.match_ranks``): rows are grouped by process group (name
plus rank list, so disjoint subgroups sharing a name stay apart); within a
group the key is ``Seq`` when every row has one, else the per-rank ordinal
aligned like a diff against a consensus sequence (``sequences``; signature =
name, dtype, sizes; ties broken by end-time consistency), so a rank whose
window starts or ends at another collective does not shift every later index
(B3).  Clock offsets are estimated from the ends of implicit-sync collectives
(``clocks``, B4) and applied when requested, or by default when the ranks span
more than one node (``collective-report`` applies them only when asked);
offsets not applied that would change the last-arriving ranks are a warning
in the quality table (``clock_offsets_change_results``).

Memory: the collective rows, plus, for the rank being read, its kernels and
kernel launches (about 100 bytes per kernel) -- never CPU ops it does not use,
python frames, flows or other events.
"""
import functools
import importlib
import logging
import threading

from ..errors import StreamtraceError
from ..parallel.threads import in_thread
from ..stream.format import Kind, json_frame, table_frame
from ..stream.summaries import RankSummaries
from .collect import RankCollector, classify_string  # noqa: F401 - public names
from .custom import custom_collectives
from .describe import RankResult, collect_rank, finish_rank, rank_row_count  # noqa: F401 - public names
from .describe import SUMMARY_NAME, SUMMARY_VERSION, result_from_summary
from .clocks import estimate_clock_offsets  # noqa: F401 - public name
from .tables import CLOCK_COLUMNS, COLLECTIVE_COLUMNS, QUALITY_COLUMNS, RANK_COLUMNS  # noqa: F401 - public
from .tables import MATCH_TOLERANCE_NS, TABLE_NAMES, VERSION, frame_of, options_columns  # noqa: F401 - VERSION public
from .tables import tables_without_collectives
from ..steps import STEPS_TABLE, StepCollector
from .tables import quality_table  # noqa: F401 - report's data_quality sheet imports it from here

#: public names whose modules load pandas: imported when first asked for
#: (a stage with nothing to match never loads them)
_LAZY = {"align_sequences": "sequences"}

#: the matching module (and pandas with it), loaded in a background thread
#: once a rank with collectives is read (``preload``)
_MATCHING = "streamtrace.align.match"


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __package__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def preload(*modules):
    """Import ``modules`` (and pandas with them) in a background thread while
    the stage reads the rest of its input, once per process: the stage's own
    import of one later waits for this one rather than running its own."""
    with _preload_lock:
        modules = [m for m in modules if m not in _preloading]
        _preloading.update(modules)
    if modules:
        threading.Thread(target=_import_all, args=(modules,), daemon=True, name="streamtrace-import").start()


def _import_all(modules):
    for m in modules:
        importlib.import_module(m)


_preloading, _preload_lock = set(), threading.Lock()


def match_ranks(*args, **kwargs):
    """``match.match_ranks`` (its module imported when first called)."""
    from .match import match_ranks as match

    return match(*args, **kwargs)


log = logging.getLogger("streamtrace")

#: ``align_frames``' align_clocks for the clock rule (confidence.clock_rule)
CLOCK_RULE = "rule"

#: the record frames align unpacks (a reader may unpack them ahead: stream.format.read_ahead)
RECORDS_READ = (Kind.EVENTS, Kind.COMMS)

# ====================================================================== the stage


def align_frames(frames, align_clocks=None, gpus_per_node=None, tolerance_ns=MATCH_TOLERANCE_NS,
                 custom_collective_patterns=None):
    """The align stage: yield every input frame, then the ``align.*`` tables.

    ``align_clocks``: True/False, or None for "on when the ranks span more than
    one node" (nodes from ``gpus_per_node`` or the first rank's
    ``deviceProperties``), or CLOCK_RULE for the clock rule of streamtrace's
    own analyses (confidence.clock_rule: what ``blockers`` runs).  END
    frames of the input are dropped and one END is written after the
    tables.  TABLE frames named ``align.*`` already in the input (a stream
    aligned twice) are dropped with a warning.
    ``custom_collective_patterns``: (regex, Collective name) pairs (align.custom).
    """
    custom = custom_collectives(custom_collective_patterns)
    yield table_frame("align.options", options_columns(align_clocks, gpus_per_node, tolerance_ns))
    ranks = _Ranks(custom)
    replaced = False
    for frame in frames:
        kind = frame.kind
        if kind == Kind.END:
            continue
        if kind == Kind.TABLE:
            if frame.table_name().startswith("align."):
                replaced = True
                continue
            yield frame
            continue
        ranks.add(frame)   # first: a rank's end starts its finishing before the frame goes on
        yield frame
    if replaced:
        log.warning("the input already held align tables; they are replaced by this run's")
    results = ranks.results()
    if align_clocks == CLOCK_RULE:
        tables = match_by_rule(results, gpus_per_node=gpus_per_node, tolerance_ns=tolerance_ns, steps=ranks.steps())
    elif not any(rank_row_count(res.rows) for res in results):
        # nothing to match: the tables are built without pandas (Columns)
        tables = tables_without_collectives(results, align_clocks, gpus_per_node)
    else:
        tables = match_ranks(results, align_clocks=align_clocks, gpus_per_node=gpus_per_node,
                             tolerance_ns=tolerance_ns, steps=ranks.steps())
    names = TABLE_NAMES[1:]
    if any(name not in TABLE_NAMES for name in tables):   # the others only when present
        from .p2p_match import P2P_TABLE_NAMES

        names += P2P_TABLE_NAMES + (STEPS_TABLE,)
    for name in names:
        if name in tables:
            yield table_frame(name, tables[name])
    yield json_frame(Kind.END, 0, {"stage": "align", "ranks": len(results),
                                   "collective_kernels": int(len(tables["align.collectives"]))})


def match_by_rule(results, align_clocks=None, gpus_per_node=None, **kwargs):
    """``match_ranks`` with the clock rule (confidence.clock_rule) deciding
    when ``align_clocks`` is None: matched with the clocks as recorded, and
    again with the offsets applied when the rule says so (rare: offsets both
    large and well determined)."""
    from ..confidence import clock_rule

    if align_clocks is not None:
        return match_ranks(results, align_clocks=bool(align_clocks), gpus_per_node=gpus_per_node, **kwargs)
    tables = match_ranks(results, align_clocks=False, gpus_per_node=gpus_per_node, **kwargs)
    if clock_rule(tables).apply:
        tables = match_ranks(results, align_clocks=True, gpus_per_node=gpus_per_node, **kwargs)
    return tables


def align_tables(frames, align_clocks=None, gpus_per_node=None, tolerance_ns=MATCH_TOLERANCE_NS):
    """The ``align.*`` tables of ``frames`` as ``{name: DataFrame}``, for
    callers that want the results, not a stream (``collective-report``): the
    same analysis as ``align_frames`` without encoding the tables into frames
    and decoding them again.  Frames align does not use are dropped."""
    ranks = _Ranks()
    for frame in frames:
        ranks.add(frame)
    tables = match_ranks(ranks.results(), align_clocks=align_clocks, gpus_per_node=gpus_per_node,
                         tolerance_ns=tolerance_ns, steps=ranks.steps())
    tables["align.options"] = align_options_table(align_clocks, gpus_per_node, tolerance_ns)
    return tables


class _Ranks:
    """One RankCollector per rank of an interleaved frame sequence; a rank is
    finished (its bulky per-event arrays dropped) at its META frame.  A rank
    whose section announces align's summary (``extract`` wrote it, of this
    version) is not collected: its RankResult is read from that summary."""

    def __init__(self, custom=None):
        self.collectors, self.done = {}, {}
        self.custom = custom
        # ranks whose RankResult comes as a SUMMARY frame (not with custom patterns: made without them)
        self.summaries = RankSummaries(SUMMARY_NAME, SUMMARY_VERSION, use=custom is None)
        self.metas = {}   # the META frame's object of those, until their summary
        # each collected rank's ProfilerStep ops (for matching within steps); a
        # summarized rank's come in its summary (RankResult.steps)
        self.step_collectors = {}

    def add(self, frame):
        kind = frame.kind
        if kind == Kind.SUMMARY:
            self._summary(frame)
            return
        if kind not in (Kind.EVENTS, Kind.STRINGS, Kind.COMMS, Kind.META):
            return
        r = frame.rank
        if r in self.done or kind == Kind.META and r in self.metas:
            raise StreamtraceError(f"rank {r} appears twice in the input (two metadata frames)")
        if r in self.summaries.announced:
            if kind == Kind.META:
                self.metas[r] = frame.json()
            return
        c = self.collectors.get(r)
        if c is None:
            c = self.collectors[r] = RankCollector(r, self.custom)
            self.step_collectors[r] = StepCollector(r)
        c.add(frame)
        self.step_collectors[r].add(frame)
        if kind == Kind.META:
            # in a thread: in a chain, correlate finishes the rank meanwhile
            # (the last rank's finishing is otherwise all in the chain's tail)
            self.done[r] = in_thread(functools.partial(_finish, self.collectors.pop(r)), name="streamtrace-align-finish")

    def steps(self):
        """Every rank's ProfilerStep ops (``StepCollector.finish()`` results):
        a collected rank's from its events, a summarized rank's from its summary."""
        out = {r: c.finish() for r, c in self.step_collectors.items()}
        for r, done in self.done.items():
            if r not in out and isinstance(done, _Done) and done.result().steps is not None:
                out[r] = (r, *done.result().steps)
        return [out[r] for r in sorted(out)]

    def _summary(self, frame):
        r = frame.rank
        if r in self.summaries.announced and frame.summary_header()["name"] == SUMMARY_NAME and r not in self.metas:
            raise frame.error(f"rank {r}'s summary comes before its metadata frame")
        result = self.summaries.add(frame, lambda r: r in self.done or r in self.collectors,
                                    lambda value: result_from_summary(value, self.metas.pop(r)))
        if result is not None:
            if rank_row_count(result.rows):
                preload(_MATCHING)
            self.done[r] = _Done(result)

    def results(self):
        """RankResult of every rank, in rank order (unfinished ranks finished now)."""
        self.summaries.check_complete()
        for r, c in self.collectors.items():
            self.done[r] = in_thread(functools.partial(_finish, c))
        self.collectors = {}
        return [self.done[r].result() for r in sorted(self.done)]


def _finish(collector):
    """``finish_rank``; a rank with collective kernels starts loading the
    matching module meanwhile (the stage will need it)."""
    result = finish_rank(collector)
    if rank_row_count(result.rows):
        preload(_MATCHING)
    return result


class _Done:
    """A rank's result that was read, not computed (``in_thread``'s ``result()``)."""

    def __init__(self, value):
        self._value = value

    def result(self):
        return self._value


def align_options_table(align_clocks=None, gpus_per_node=None, tolerance_ns=MATCH_TOLERANCE_NS):
    """The one-row ``align.options`` table (strings; '' = automatic/absent)."""
    return frame_of(options_columns(align_clocks, gpus_per_node, tolerance_ns))



def read_align_tables(tables):
    """Check that ``tables`` holds the align tables; return them."""
    missing = [n for n in TABLE_NAMES[1:] if n not in tables]
    if missing:
        raise StreamtraceError("the stream has no align results (" + ", ".join(missing) + "): run 'streamtrace align' "
                               "on it first, e.g. 'streamtrace extract ... | streamtrace align | streamtrace report'")
    return tables



__all__ = ["align_frames", "align_tables", "match_ranks", "RankCollector", "RankResult", "collect_rank",
           "align_sequences", "estimate_clock_offsets", "COLLECTIVE_COLUMNS", "CLOCK_COLUMNS", "QUALITY_COLUMNS", "RANK_COLUMNS",
           "TABLE_NAMES", "classify_string", "read_align_tables"]

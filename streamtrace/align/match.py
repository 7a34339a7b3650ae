"""Matching across ranks: ``match_ranks`` groups every rank's collective rows
by process group, gives each row its collective instance (see ``sequences``),
checks that an instance's participants agree, estimates clock offsets (see
``clocks``) and builds the ``align.*`` tables."""
import functools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import collectives as coll
from .._native import NONE
from ..codes import Text, dense_rank, group_ids, joined_labels
from ..parallel.cpus import available_cpus
from ..parallel.fork import both
from ..parallel.heap import give_back_freed_memory
from .clocks import _clocks_table, estimate_clock_offsets
from .describe import rank_row_count
from .p2p_match import p2p_kernel_rows, p2p_tables
from .quality import _clock_findings, _finding, _rank_findings, _story_findings, _world_size
from .sequences import MATCH_TOLERANCE_NS, _match_ordinal, _seq_slots, seq_contradiction
from ..stream.format import Columns
from ..steps import STEPS_TABLE, clock_step_findings, coverage_findings, row_steps, step_coverage
from .tables import COLLECTIVE_COLUMNS, _ranks_table, frame_of, has_collectives, quality_table
from .tables import nodes as _nodes, tables_without_collectives


def _rank_key(text, cache):
    """Normalised rank list of a ``Process Group Ranks`` string: (key, tuple, truncated)."""
    if text in cache:
        return cache[text]
    ranks, truncated = coll.parse_rank_list(text)
    if ranks is None:
        key = "" if text is None else str(text).strip()
    else:
        key = ",".join(map(str, ranks)) + (",..." if truncated else "")
    cache[text] = (key, ranks, truncated)
    return cache[text]






#: fields that must agree across participants (A5.3; for all_to_allv A5.5 without stream)
MISMATCH_FIELDS = (("pg", "Process Group Name"), ("pg_ranks", "Process Group Ranks"),
                   ("collective_name", "Collective name"), ("group_size", "Group size"), ("dtype", "dtype"),
                   ("in_nelems", "In msg nelems"), ("out_nelems", "Out msg nelems"))


def _combined_rows(results):
    """The collective rows of every rank as ``{column: numpy array}``, sorted
    by rank, time and event, with ``rank`` and ``base_ns`` columns."""
    parts = [res for res in results if rank_row_count(res.rows)]
    lengths = [rank_row_count(res.rows) for res in parts]
    # one rank with rows: read-only views of its arrays, not copies (the
    # tables may hold them: a write into one raises instead of changing the
    # rank's rows, which a second match of the same ranks reads again)
    d = {col: np.concatenate([res.rows[col] for res in parts]) if len(parts) > 1 else _read_only(parts[0].rows[col])
         for col in parts[0].rows}
    d["rank"] = np.repeat(np.array([res.rank for res in parts], dtype=np.int64), lengths)
    d["base_ns"] = np.repeat(np.array([res.meta.get("base_ns") or 0 for res in parts], dtype=np.int64), lengths)
    order = np.lexsort((d["event"], d["ts"], d["rank"]))
    if (order != np.arange(len(order))).any():  # each rank's rows come sorted: usually nothing to do
        d = {col: v[order] for col, v in d.items()}
    return d


def _read_only(values):
    view = values.view()
    view.flags.writeable = False
    return view


def _process_groups(d, quality):
    """(pg, pg_key, simplified): the group name of each row (its pg_name, else
    "all" in simplified mode or "Unknown_Group"), and the matching key: the
    name, tagged with the lowest rank when disjoint rank sets share it."""
    name = Text.of(d["pg_name"])
    stream, rank = d["stream"], d["rank"]
    rank_starts = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1]])
    one_stream = (np.minimum.reduceat(stream, rank_starts) == np.maximum.reduceat(stream, rank_starts)).all()
    simplified = bool(name.missing().all() and one_stream)
    pg = name.recode(str, "all" if simplified else "Unknown_Group")
    cache = {}
    rkey = Text.of(d["pg_ranks"]).recode(lambda t: _rank_key(t, cache)[0], _rank_key(None, cache)[0])
    nk = len(rkey.uniques)
    rk = rkey.codes.copy()
    # rows of a named group without a rank list join the group's only list
    empty = [k for k, u in enumerate(rkey.uniques.tolist()) if u == ""]
    if empty:
        for p, ks in _lists_by_group(pg.codes, rk, nk).items():
            others = [k for k in ks if k != empty[0]]
            if empty[0] in ks and len(others) == 1:
                rk[(pg.codes == p) & (rk == empty[0])] = others[0]
    # one key per (name, rank list); a name with several rank lists is split
    lists = _lists_by_group(pg.codes, rk, nk)
    label = {}
    for p in sorted(lists, key=lambda p: pg.uniques[p]):
        name_p, ks = pg.uniques[p], lists[p]
        if len(ks) == 1:
            label[(p, ks[0])] = name_p
            continue
        for k in ks:
            key = rkey.uniques[k]
            ranks_k = [int(x) for x in key.split(",") if x.lstrip("-").isdigit()]
            tag = f"@r{min(ranks_k)}" if ranks_k else f"@{key or '?'}"
            label[(p, k)] = name_p + tag
        quality.append(_finding("warning", "shared_pg_name", f"process group name {name_p!r} is used by "
                                f"{len(ks)} disjoint rank sets; they are told apart by their rank lists "
                                "(TraceLens merges them and aborts with 'Metadata mismatch')", pg=name_p))
    pair_of_row = pg.codes * nk + rk
    pairs = np.unique(pair_of_row)
    labels = np.empty(len(pairs), dtype=object)
    for i, pair in enumerate(pairs.tolist()):
        labels[i] = label[divmod(pair, nk)]
    pair_codes, uniques = pd.factorize(labels)  # equal labels share a code
    pg_key = Text(pair_codes.astype(np.int64)[np.searchsorted(pairs, pair_of_row)], np.asarray(uniques, dtype=object))
    return pg, pg_key, simplified


def _lists_by_group(pg, rk, nk):
    """``{pg code: [rank-list codes]}`` of the (pg, rank list) pairs present."""
    lists = {}
    for pair in np.unique(pg * nk + rk).tolist():
        p, k = divmod(pair, nk)
        lists.setdefault(p, []).append(k)
    return lists


def _signatures(cname, kernel_kind, dtype, a2av, inn, out):
    """Integer signature per row: collective name (or kernel token), dtype,
    and sizes except for all_to_allv (whose sizes differ per rank).  Only
    equality of signatures matters."""
    texts = np.array([str(u) for u in cname.uniques.tolist()] + ["~" + str(u) for u in kernel_kind.uniques.tolist()]
                     + ["~?"], dtype=object)
    token = np.where(kernel_kind.codes >= 0, kernel_kind.codes, len(kernel_kind.uniques))
    name_code = pd.factorize(texts)[0][np.where(cname.codes >= 0, cname.codes, len(cname.uniques) + token)]
    dtype_code = dtype.recode(str, "?").codes
    return group_ids(name_code, dtype_code, np.where(a2av, -2, inn), np.where(a2av, -2, out))


def _disagree(values, inst, n_inst):
    """Per row: do the rows of its instance hold different ``values``
    (integers: codes or numbers)?"""
    lo = np.full(n_inst, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(n_inst, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(lo, inst, values)
    np.maximum.at(hi, inst, values)
    return (lo != hi)[inst]


#: collective rows from which match_ranks estimates clock offsets in a forked
#: child while it builds the rows (below it, forking a process that holds
#: every row costs more than the estimate it takes off)
_PARALLEL_MIN_ROWS = 20_000

#: the rows' text columns match_ranks handles as codes (``Text``)
_TEXT_COLUMNS = ("collective_name", "dtype", "kernel_kind", "pg_ranks", "comms_id", "group_size_source")

#: match_method values, by code
METHODS = np.array(["seq", "ordinal", "aligned", "unmatched", "p2p"], dtype=object)
#: the largest message size taken as real (1 TiB, beyond any GPU's memory);
#: sums of it over 2^20 ranks still fit int64
MAX_MESSAGE_BYTES = 1 << 40
M_SEQ, M_ORDINAL, M_ALIGNED, M_UNMATCHED, M_P2P = 0, 1, 2, 3, 4


def match_ranks(results, align_clocks=None, gpus_per_node=None, tolerance_ns=MATCH_TOLERANCE_NS, steps=None):
    """Match the collective rows of every rank; return the ``align.*`` tables
    (except ``align.options``) as ``{name: DataFrame}`` (``_match_ranks``).
    The heap's free pages are handed back before and after: what the ranks'
    collections and the matching's own columns freed would otherwise stay
    resident beside the tables and what the report builds next (a million
    rows: ~0.6 GB)."""
    give_back_freed_memory()
    tables = _match_ranks(results, align_clocks, gpus_per_node, tolerance_ns, steps)
    give_back_freed_memory()
    return tables


def _match_ranks(results, align_clocks, gpus_per_node, tolerance_ns, steps):
    """match_ranks' work.

    ``steps``: the ranks' ProfilerStep ops (``steps.StepCollector.finish()``
    results: (rank, numbers, starts, ends) in the trace's ns from its base
    time) or None.  With them, collectives matched without Seq pair only
    inside one step, and ``align.steps`` says which steps every rank with
    markers holds (``steps.step_coverage``).

    Rows are numpy arrays throughout; text columns are ``Text`` codes, so
    each step costs a few integer passes over the rows."""
    results = sorted(results, key=lambda r: r.rank)
    if not has_collectives(results):
        return {name: frame_of(t) if isinstance(t, Columns) else t
                for name, t in tables_without_collectives(results, align_clocks, gpus_per_node).items()}
    quality = []
    for res in results:
        quality += res.quality
    present = [res.rank for res in results]
    quality += _rank_findings(results)
    ranks_table = _ranks_table(results)
    node_gpus = _nodes(results, gpus_per_node)
    multi_node = node_gpus is not None and len({r // node_gpus for r in present}) > 1
    # None: on across nodes.  (collective-report passes False unless asked:
    # TraceLens's columns mean the times as recorded.)  Offsets not applied
    # are still estimated and reported, loudly when applying them would
    # change the answers (_story_findings)
    apply = bool(align_clocks) if align_clocks is not None else multi_node
    rows = _combined_rows(results)
    rank = rows["rank"]
    abs_ts = rows["base_ns"] + rows["ts"].astype(np.int64, copy=False)
    abs_end = abs_ts + rows["dur"].astype(np.int64, copy=False)
    # as codes only the text columns compared or mapped here: the others stay
    # object arrays (codes would be another 8 bytes a row each)
    text = {col: Text.of(rows[col]) for col in _TEXT_COLUMNS if col in rows}
    cname, dtype = text["collective_name"], text["dtype"]

    # ---- process groups, then the collective instance of each row
    pg, pg_key, simplified = _process_groups(rows, quality)
    category = cname.recode(coll.CATEGORY.get, coll.CATEGORY.get(None))
    a2av = category.lookup(lambda u: u == "alltoallv", False, bool)
    sig = _signatures(cname, text["kernel_kind"], dtype, a2av, rows["in_nelems"].astype(np.int64, copy=False),
                      rows["out_nelems"].astype(np.int64, copy=False))
    kind = cname.recode(coll.KIND.get, coll.KIND.get(None))
    # point-to-point kernels (batch_isend_irecv groups' included) are paired
    # by the p2p module, never matched across ranks as collective instances
    p2p = kind.isin(_P2P) | p2p_kernel_rows(results, rank, rows["event"])
    comms = text["comms_id"].codes if "comms_id" in text else None
    launch = rows["launch_ts"].astype(np.int64, copy=False)
    row_step, step_starts = row_steps(steps, rank, np.where(launch != NONE, launch, rows["ts"]),
                                      {res.rank: int(res.meta.get("base_ns") or 0) for res in results})
    slot, position, method, mkey = _slots(pg_key, rank, rows["seq"].astype(np.int64, copy=False), sig, abs_end,
                                          tolerance_ns, quality, p2p, comms, row_step, step_starts)
    instances = _instances(pg_key, simplified, rank, slot, position, method, mkey)
    inst, participants = instances.inst, instances.participants

    # ---- names, categories, sizes
    implicit_sync = category.isin(coll.IMPLICIT_SYNC)
    bytes_per_elem = dtype.lookup(lambda u: float(coll.DTYPE_BYTES[u]) if u in coll.DTYPE_BYTES else np.nan,
                                  np.nan, np.float64)
    gs, gsrc, inn, out = _group_sizes(rows, text["group_size_source"], pg, kind, participants, _world_size(results))

    # ---- checks per instance
    values = {"pg": pg.codes, "pg_ranks": text["pg_ranks"].codes, "collective_name": cname.codes, "group_size": gs,
              "dtype": dtype.codes, "in_nelems": inn, "out_nelems": out}
    mismatch_fields = _mismatch_fields(values, instances, a2av)
    metadata_mismatch = mismatch_fields.lookup(lambda u: u != "", False, bool)
    stream_mismatch = _disagree(rows["stream"].astype(np.int64, copy=False), inst, instances.count)

    # ---- the rows (without the clock offsets) and the clocks
    columns = {"index_in_group": instances.index_in_group, "pg": pg, "pg_key": pg_key, "match_key": mkey,
               "dur_aligned_ns": rows["dur"], "ts_ns": rows["ts"], "dur_ns": rows["dur"],
               "launch_ts_ns": rows["launch_ts"], "launch_dur_ns": rows["launch_dur"],
               "category": category, "kind": kind, "implicit_sync": implicit_sync,
               "bytes_per_elem": bytes_per_elem, "group_size": gs, "group_size_source": gsrc, "out_nelems": out,
               "participants": participants, "metadata_mismatch": metadata_mismatch,
               "mismatch_fields": mismatch_fields, "stream_mismatch": stream_mismatch}
    as_is = {}   # text columns as the rows hold them: the table's own when its rows keep their order
    for col in COLLECTIVE_COLUMNS:   # the others as they are
        if col not in columns and col not in _COMPUTED_PER_OFFSETS:
            columns[col] = text.get(col, rows[col])
            if col in text:
                as_is[col] = rows[col]
    columns["no_ids"] = rows["no_ids"]
    collectives = functools.partial(_collectives_table, columns, instances, abs_ts, method, cname.missing(), present,
                                    as_is=as_is)
    sample, clock_method, sync = _clock_sample(implicit_sync, np.where(p2p, 0, participants), inst, rank, abs_end)
    out_df, row_findings, clocks = _rows_and_clocks(collectives, sample, clock_method, rank, present, apply)
    if not apply:
        quality += _story_findings(clocks, inst[sync], rank[sync], abs_ts[sync])
    quality += _clock_findings(clocks, apply, multi_node, node_gpus) + row_findings
    coverage = step_coverage(steps, present, row_step, rank)
    if coverage is not None:
        quality += coverage_findings(coverage)
        quality += clock_step_findings(clocks, steps, {res.rank: int(res.meta.get("base_ns") or 0) for res in results})
    p2p = p2p_tables(results, _applied_offsets(clocks), quality)   # nothing without send/recv
    tables = {"align.ranks": ranks_table, "align.collectives": out_df, "align.clocks": clocks,
              "align.quality": quality_table(quality)}
    if coverage is not None:
        tables[STEPS_TABLE] = coverage
    tables.update(p2p)
    return tables


def _applied_offsets(clocks):
    """{rank: offset in ns} of the offsets applied to the rows (none when not applied)."""
    applied = clocks[clocks["applied"].astype(bool)] if len(clocks) else clocks
    return dict(zip(applied["rank"].tolist(), applied["offset_ns"].fillna(0).astype(np.int64).tolist()))


def _rows_and_clocks(collectives, sample, clock_method, rank, present, apply):
    """align.collectives (``collectives``: the rows for given per-row offsets),
    its findings, and align.clocks, with the offsets applied or not."""
    if apply:
        clocks = _clocks_table(estimate_clock_offsets(*sample), present, apply, clock_method)
        offs = dict(zip(clocks["rank"].tolist(), clocks["offset_ns"].tolist()))
        ranks_u, rank_inv = np.unique(rank, return_inverse=True)
        out_df, row_findings = collectives(np.array([offs[r] for r in ranks_u.tolist()], dtype=np.int64)[rank_inv])
        return out_df, row_findings, clocks
    # the offsets change no row, only align.clocks: on two cores (large
    # sets) they are estimated in a forked child while the rows are built
    n = len(rank)
    (out_df, row_findings), est = both(functools.partial(collectives, np.zeros(n, dtype=np.int64)),
                                       functools.partial(estimate_clock_offsets, *sample),
                                       fork=n >= _PARALLEL_MIN_ROWS and available_cpus() > 1)
    return out_df, row_findings, _clocks_table(est, present, apply, clock_method)


#: align.collectives columns that _collectives_table adds: those that depend
#: on the clock offsets, the match method, and those made from other columns
_COMPUTED_PER_OFFSETS = ("instance", "collective_id", "clock_offset_ns", "ts_aligned_ns", "match_method",
                         "in_bytes", "out_bytes", "flags")


def _slots(pg_key, rank, seq, sig, abs_end, tolerance_ns, quality, p2p, comms, row_step=None, step_starts=None):
    """Per row (rows sorted by rank, time and event): its slot within its
    process group, the time-order position of that slot, its match method
    (M_*) and, for rows matched by Seq, its match key.  ``p2p``: the rows of
    point-to-point kernels: each is a slot of its own (M_P2P), after its
    group's collectives, and takes no part in the matching of the others;
    ``comms``: Comms Id codes (-1: none) or None; ``row_step``, ``step_starts``:
    see ``steps.row_steps`` (None: no step markers)."""
    n = len(rank)
    slot = np.full(n, -1, dtype=np.int64)
    position = np.full(n, -1, dtype=np.int64)
    method = np.full(n, M_ORDINAL, dtype=np.int8)
    mkey = np.empty(n, dtype=object)
    by_key = np.argsort(pg_key.codes, kind="stable")
    bounds = np.r_[0, np.cumsum(np.bincount(pg_key.codes, minlength=len(pg_key.uniques)))]
    for c in sorted(range(len(pg_key.uniques)), key=lambda c: pg_key.uniques[c]):
        key = pg_key.uniques[c]
        idx = by_key[bounds[c]:bounds[c + 1]]  # ascending: the argsort is stable
        own = idx[p2p[idx]]
        if len(own):
            slot[own] = position[own] = n + own   # past every collective's slot
            method[own] = M_P2P
            mkey[own] = ["p2p" if q == NONE else f"p2p_seq={q}" for q in seq[own].tolist()]
            idx = idx[~p2p[idx]]
            if not len(idx):
                continue
        g_rank = rank[idx]
        if (seq[idx] != NONE).all():
            why = seq_contradiction(g_rank, seq[idx], p2p[idx], sig[idx], None if comms is None else comms[idx])
            if why is None:
                s, keys = _seq_slots(g_rank, seq[idx], p2p[idx], key, quality)
                slot[idx] = s
                position[idx] = s
                method[idx] = M_SEQ
                mkey[idx] = keys
                continue
            quality.append(_finding("warning", "seq_contradictory", f"process group {key}: its Seq numbers "
                                    f"contradict each other ({why}); its collectives are matched by alignment "
                                    "instead", pg=key))
        s, pos_of_slot, info, ref = _match_ordinal(g_rank, sig[idx], abs_end[idx], tolerance_ns,
                                                   None if row_step is None else row_step[idx], step_starts)
        slot[idx] = s
        position[idx] = pos_of_slot[s]
        ranks_g, inv = np.unique(g_rank, return_inverse=True)
        method[idx] = np.array([M_ALIGNED if info[r][0] == "aligned" else M_ORDINAL for r in ranks_g.tolist()],
                               dtype=np.int8)[inv]
        for r, (how, unmatched) in info.items():
            if how == "aligned":
                quality.append(_finding("info", "sequence_aligned", f"rank {r}: its collectives in process group {key} "
                                        f"do not line up one-to-one with reference rank {ref}'s (profiling window "
                                        "starts or ends at another collective, or one is missing); aligned by "
                                        f"signature and end time, {unmatched} without a counterpart",
                                        rank=r, pg=key, count=unmatched))
    return slot, position, method, mkey


@dataclass
class _Instances:
    """Which rows are one collective instance."""

    inst: np.ndarray            # per row: its instance's code, 0..count-1
    count: int
    participants: np.ndarray    # per row: the rows of its instance
    index_in_group: np.ndarray  # per row: its instance's ordinal index in its process group
    pg_key: Text
    simplified: bool            # no process group names: collective ids are the bare index


def _instances(pg_key, simplified, rank, slot, position, method, mkey):
    """The rows' collective instances (a process group's slot).  Also marks,
    in ``method``, the rows alone in their instance while other ranks take
    part in their group (M_UNMATCHED), and gives the rows not matched by Seq
    their match key (``mkey``, in place)."""
    # ordinal index per pg: the positions compacted to 0..n-1
    dense = dense_rank(pg_key.codes, position)
    group_first = np.full(len(pg_key.uniques), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(group_first, pg_key.codes, dense)
    index_in_group = dense - group_first[pg_key.codes]
    is_seq = method == M_SEQ
    by_order = (method != M_SEQ) & (method != M_P2P)
    if by_order.any():
        ix_values, ix_inv = np.unique(index_in_group[by_order], return_inverse=True)
        mkey[by_order] = np.array([f"ordinal={v}" for v in ix_values.tolist()], dtype=object)[ix_inv]
    inst = group_ids(pg_key.codes, slot)
    n_inst = int(inst.max()) + 1
    participants = np.bincount(inst)[inst]
    # a row alone in its instance, in a group that other ranks take part in
    pairs = group_ids(pg_key.codes, rank)
    _, first_of_pair = np.unique(pairs, return_index=True)
    ranks_per_group = np.bincount(pg_key.codes[first_of_pair], minlength=len(pg_key.uniques))
    single = (participants == 1) & by_order
    method[single & (ranks_per_group[pg_key.codes] > 1)] = M_UNMATCHED
    return _Instances(inst, n_inst, participants, index_in_group, pg_key, simplified)


def _group_sizes(rows, gsrc, pg, kind, participants, world):
    """(group size, its source, in and out element counts) per row: the group
    size from the instance when no arg or pg_config gives it, and the output
    sizes of all-gather / reduce-scatter that needed the group size."""
    gs = rows["group_size"].astype(np.int64, copy=False).copy()
    infer = (gs == NONE) & pg.isin(("Unknown_Group", "all"))
    if infer.any() and world:
        full = infer & (participants == world)
        gs[full] = world
        gsrc = gsrc.assign(full, "world_size")
    inn, out = rows["in_nelems"].astype(np.int64, copy=False), rows["out_nelems"].astype(np.int64, copy=False).copy()
    fix = (out == NONE) & (inn != NONE) & (gs != NONE) & (gs > 0)
    ag, rs = fix & kind.isin(("allgather",)), fix & kind.isin(("reducescatter",))
    out[ag] = inn[ag] * gs[ag]
    out[rs] = inn[rs] // np.maximum(gs[rs], 1)
    return gs, gsrc, inn, out


def _mismatch_fields(values, instances, a2av):
    """Per row: the labels of the MISMATCH_FIELDS (``values``: integers per
    row) on which its instance's participants disagree, joined by ","; sizes
    of all_to_allv are allowed to differ."""
    inst, n_inst = instances.inst, instances.count
    a2av_inst = np.zeros(n_inst, dtype=bool)
    a2av_inst[inst[a2av]] = True
    a2av_row = a2av_inst[inst]
    checks = []
    for col, label in MISMATCH_FIELDS:
        bad = _disagree(values[col], inst, n_inst)
        if col in ("in_nelems", "out_nelems"):
            bad &= ~a2av_row
        checks.append((label, bad))
    return joined_labels(checks, ",")


#: point-to-point kinds: with the kernels of batch_isend_irecv groups
#: (p2p_kernel_rows) each is an instance of its own (M_P2P), no rendezvous of
#: its group: no findings, no straggler, nothing said about the clocks
_P2P = frozenset(("send", "recv"))


def _clock_sample(implicit_sync, participants, inst, rank, abs_end):
    """The (instance, rank, end) of the rows the clock offsets are estimated
    from, the method's name and those rows' mask: the ends of implicit-sync
    collectives with more than one participant, else of every such collective
    (``participants``: 0 for rows that never count, point-to-point ones)."""
    sync = implicit_sync & (participants > 1)
    if not sync.any():
        sync = participants > 1
        clock_method = "all_collectives"
    else:
        clock_method = "implicit_sync_ends"
    return (inst[sync], rank[sync], abs_end[sync]), clock_method, sync


def _instance_ids(instances, ts_aligned):
    """Per row: its instance's number in the order of first start (then
    process group, then index), and its collective_id "<pg>_<index>"."""
    inst, n_inst, pg_key = instances.inst, instances.count, instances.pg_key
    first_ts = np.full(n_inst, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_ts, inst, ts_aligned)
    inst_pg = np.empty(n_inst, dtype=np.int64)
    inst_pg[inst] = pg_key.codes
    inst_ix = np.empty(n_inst, dtype=np.int64)
    inst_ix[inst] = instances.index_in_group
    by_time = np.lexsort((inst_ix, pg_key.sort_rank()[inst_pg], first_ts))
    new_id = np.empty(n_inst, dtype=np.int64)
    new_id[by_time] = np.arange(n_inst)
    instance = new_id[inst]
    inst_ids = np.empty(n_inst, dtype=object)  # collective_id per instance code: "<pg>_<index>"
    for p, prefix in enumerate([""] * len(pg_key.uniques) if instances.simplified else
                               [f"{u}_" for u in pg_key.uniques.tolist()]):
        of_pg = np.flatnonzero(inst_pg == p)   # a few groups: one string join per instance
        inst_ids[of_pg] = [prefix + ix for ix in map(str, inst_ix[of_pg].tolist())]
    return instance, Text(inst, inst_ids)


def _collectives_table(columns, instances, abs_ts, method, name_missing, present, applied_off, as_is=None):
    """align.collectives with these clock offsets (per row), and its findings.
    ``columns``: the columns that do not depend on the offsets, per row in
    match_ranks' order; ``as_is``: text columns among them as object arrays
    (the Text's values), used as they are when the rows keep that order."""
    ts_aligned = abs_ts - applied_off
    instance, collective_id = _instance_ids(instances, ts_aligned)
    # rows in (instance, rank) order: one take per column (text columns as
    # codes: the objects are looked up after the take, from a few values)
    order = np.lexsort((columns["rank"], instance))
    cols = dict(columns, instance=instance, collective_id=collective_id, clock_offset_ns=applied_off,
                ts_aligned_ns=ts_aligned)
    if (order != np.arange(len(order))).any():   # often in that order already: then no column is copied
        cols = {col: v.take(order) for col, v in cols.items()}  # ndarray.take or Text.take
        as_is = None
    row_method = method[order]
    cols["match_method"] = Text(row_method.astype(np.int64, copy=False), METHODS)
    implausible = _implausible_sizes(cols, len(order))
    cols["flags"] = _flags(cols, row_method, name_missing[order])
    findings = _instance_findings(cols, row_method, present)
    if implausible:
        findings.append(_finding("warning", "implausible_size", f"{implausible} collective kernel row(s) give In/Out "
                                 "msg nelems no message can have (negative, or over 1 TiB): their sizes are left "
                                 "unknown (flag size_unknown)", count=implausible))
    return _collectives_frame(cols, as_is), findings


def _implausible_sizes(cols, n):
    """A size no message can have (negative, or above MAX_MESSAGE_BYTES: 2^62
    elements overflow int64 bytes) is unknown, never a wrapped number: such
    element counts become absent in ``cols``; returns how many rows had one."""
    implausible = np.zeros(n, dtype=bool)
    for src in ("in_nelems", "out_nelems"):
        v = cols[src].astype(np.int64, copy=False)
        bad = (v != NONE) & ((v < 0) | (v * np.nan_to_num(cols["bytes_per_elem"], nan=1.0) > MAX_MESSAGE_BYTES))
        if bad.any():
            cols[src] = np.where(bad, NONE, v)
            implausible |= bad
    return int(implausible.sum())


def _collectives_frame(cols, as_is=None):
    """The align.collectives DataFrame of the output-ordered ``cols``: byte
    counts added, sizes and ids as nullable integers, text as objects (those
    of ``as_is`` where given: the same values, no new array)."""
    bpe = cols["bytes_per_elem"]
    n = len(bpe)
    for src, dst in (("in_nelems", "in_bytes"), ("out_nelems", "out_bytes")):
        v = cols[src]
        ok = (v != NONE) & ~np.isnan(bpe)
        vals = np.zeros(n, dtype=np.int64)
        vals[ok] = v[ok] * bpe[ok].astype(np.int64, copy=False)
        cols[dst] = pd.arrays.IntegerArray(vals, ~ok)
    # nullable integers (the arrays are this function's own: no copy needed)
    for col in ("in_nelems", "out_nelems", "group_size", "seq", "launch_ts_ns", "launch_dur_ns", "launch_tid",
                "correlation", "external_id"):
        v = cols[col].astype(np.int64, copy=False)
        cols[col] = pd.arrays.IntegerArray(v, v == NONE)
    for col in ("stream", "device"):
        v = cols[col].astype(np.int64, copy=False)
        cols[col] = pd.arrays.IntegerArray(v, v == -1)
    columns = {}
    for col in COLLECTIVE_COLUMNS:  # text columns: plain object dtype, None for missing
        v = cols[col]
        if isinstance(v, Text):
            v = as_is[col] if as_is and col in as_is else v.objects()
        columns[col] = pd.Series(v, dtype=object, copy=False) if v.dtype == object else v
    # copy=False: one block per column instead of copying them into 2-D blocks
    return pd.DataFrame(columns, copy=False)


def _flags(cols, method, name_missing):
    checks = (("no_launch", cols["launch_event"] < 0), ("no_cpu_op", cols["cpu_op_event"] < 0),
              ("no_ids", cols["no_ids"]), ("unmatched", method == M_UNMATCHED), ("aligned", method == M_ALIGNED),
              ("metadata_mismatch", cols["metadata_mismatch"]), ("stream_mismatch", cols["stream_mismatch"]),
              ("size_unknown", (cols["in_nelems"].astype(np.int64) == NONE) | np.isnan(cols["bytes_per_elem"])),
              ("kind_unknown", name_missing))
    return joined_labels(checks, ";")


def _instance_findings(cols, method, present):
    """Findings over the output rows (sorted by instance, then rank)."""
    out = []
    pg_ranks, pg_key = cols["pg_ranks"], cols["pg_key"]
    inst = cols["instance"]
    firsts = np.flatnonzero(np.r_[True, inst[1:] != inst[:-1]])  # first row of each instance
    mm = firsts[cols["metadata_mismatch"][firsts]]
    if len(mm):
        first_id, first_fields = cols["collective_id"].at(mm[0]), cols["mismatch_fields"].at(mm[0])
        out.append(_finding("warning", "metadata_mismatch", f"{len(mm)} collective instance(s) whose participants "
                            f"disagree on metadata (first: {first_id}: {first_fields});"
                            " rows are flagged, not dropped", collective_id=first_id, count=len(mm)))
    um = np.flatnonzero(method == M_UNMATCHED)
    if len(um):  # per (rank, process group), in that order
        r, k = cols["rank"][um], pg_key.sort_rank()[pg_key.codes[um]]
        o = np.lexsort((k, r))
        r, c = r[o], pg_key.codes[um][o]
        starts = np.flatnonzero(np.r_[True, (r[1:] != r[:-1]) | (c[1:] != c[:-1])])
        counts = np.diff(np.r_[starts, len(r)])
        for rr, cc, count in zip(r[starts].tolist(), c[starts].tolist(), counts.tolist()):
            key = pg_key.uniques[cc]
            out.append(_finding("warning", "unmatched", f"rank {rr}: {count} collective(s) of process group {key} "
                                "have no counterpart on any other rank", rank=rr, pg=key, count=count))
    neg = np.flatnonzero(cols["dur_ns"] < 0)
    if len(neg):  # per (rank, process group): recorded as is, but every latency built on them is wrong
        r, c = cols["rank"][neg], pg_key.codes[neg]
        o = np.lexsort((pg_key.sort_rank()[c], r))
        r, c = r[o], c[o]
        starts = np.flatnonzero(np.r_[True, (r[1:] != r[:-1]) | (c[1:] != c[:-1])])
        counts = np.diff(np.r_[starts, len(r)])
        for rr, cc, count in zip(r[starts].tolist(), c[starts].tolist(), counts.tolist()):
            key = pg_key.uniques[cc]
            out.append(_finding("error", "negative_duration", f"rank {rr}: {count} collective kernel(s) of process "
                                f"group {key} have a negative duration in the trace; kept as recorded, so their "
                                "latencies and skews are wrong", rank=rr, pg=key, count=count))
    # participants against the process group's rank list
    present_set = set(present)

    def expected(text):
        ranks, truncated = coll.parse_rank_list(text)
        return len([r for r in ranks if r in present_set]) if ranks is not None and not truncated else np.nan

    exp = pg_ranks.take(firsts).lookup(expected, np.nan, np.float64)
    exp[method[firsts] == M_P2P] = np.nan   # a point-to-point kernel is no rendezvous of its group
    partial = firsts[~np.isnan(exp) & (cols["participants"][firsts] < np.nan_to_num(exp, nan=0.0))]
    if len(partial):
        first = cols["collective_id"].at(partial[0])
        out.append(_finding("warning", "partial_instances", f"{len(partial)} collective instance(s) have fewer "
                            f"participants than their process group's ranks present in the input (first: {first})",
                            collective_id=first, count=len(partial)))
    return out


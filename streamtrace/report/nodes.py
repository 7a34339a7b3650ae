"""The node columns: ``node_id`` of a rank and ``node_span`` of a process
group (A5.9, with B1's ``pg_config`` fallback for truncated rank lists)."""
import json

import numpy as np
import pandas as pd

from .. import collectives as coll
from ..codes import Text, group_ids
from .columns import A2AV_EXTRA, IMPLICIT_EXTRA, LONG_EXTRA, STRAGGLER_EXTRA


class _Nodes:
    """node_id / node_span (A5.9, with B1's pg_config fallback for truncated lists)."""

    def __init__(self, gpus_per_node, ranks_table):
        self.G = gpus_per_node
        # (pg_name, ranks tuple) from distributedInfo.pg_config, each once in
        # first-seen order: every rank repeats the job's configs, so parsed
        # per rank they would be O(ranks^2)
        groups = {}
        for text in dict.fromkeys(ranks_table.get("pg_config", pd.Series([], dtype=object)).dropna().tolist()):
            try:
                for pg in json.loads(text):
                    if isinstance(pg, dict) and isinstance(pg.get("ranks"), list):
                        groups.setdefault((str(pg.get("pg_name")), tuple(pg["ranks"])), None)
            except (ValueError, TypeError):
                continue
        self.groups = list(groups)
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

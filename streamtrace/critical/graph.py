"""The critical path's inputs, made in the blocking analysis' reduce: every
rank's GPU work cut into its profiler steps, as two tables.

``critical.nodes``: one row per GPU item of a step (a compute kernel, a
collective kernel, a send/recv kernel), on the clocks correlate used (the
clock rule), with what the replay needs: its rank, stream, start and end,
its kind, its kernel identity or collective instance, its host release (a
collective's launch end; NaN for compute kernels, whose launches a rank's
summary does not keep) and whether it overlapped the rank's communication.

``critical.syncs``: the host calls that wait for the GPU
(``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
``cudaEventSynchronize``) on the threads that launch collectives, per rank
and step: after one of them the host runs on when the GPU is done.

``critical.steps``: each rank's step windows (rank, step, start, end).

Both are made a step at a time from the ranks' summaries
(correlate/summary.py): each step's rows come from a slice of a rank's
arrays, never a copy of the whole rank.  See docs/critical-path.md.
"""
import re

import numpy as np
import pandas as pd

from .. import _native

NODES, SYNCS, STEPS = "critical.nodes", "critical.syncs", "critical.steps"

#: node kinds
COMPUTE, COLLECTIVE, P2P = 0, 1, 2

_SYNC = re.compile(r"^cuda(Stream|Device|Event)Synchronize$")


def _dims(d):
    return "[" + ",".join(str(int(x)) for x in d) + "]" if d[0] >= 0 else ""


def _identities(tl):
    """Per compute kernel of timeline ``tl``, its identity text (name grid
    block), as (texts, index)."""
    texts = np.array([f"{tl.names[int(k[0])]} grid {_dims(k[1:4])} block {_dims(k[4:7])}".strip()
                      for k in tl.lkeys], dtype=object)
    return tl.by_lcode(texts)


def step_windows(tl):
    """[(step name, start, end)] of a rank on the timeline's clock: a step
    holds the GPU work that starts from its ProfilerStep's start to the next
    one's (the last: to its end, or to the rank's last GPU end when later);
    one window over everything when the trace has no steps."""
    names, starts, ends = tl.steps
    names = [str(n) for n in names]
    keep = [i for i, n in enumerate(names) if n.startswith("ProfilerStep#")]
    last_gpu = tl.gpu_extent[1] if tl.gpu_extent is not None else None
    if not keep:
        lo = tl.gpu_extent[0] if tl.gpu_extent is not None else 0
        return [("all", int(lo), int(last_gpu or lo))]
    out = []
    for j, i in enumerate(keep):
        end = int(starts[keep[j + 1]]) if j + 1 < len(keep) else max(int(ends[i]), int(last_gpu or 0))
        out.append((names[i], int(starts[i]), end))
    return out


def _step_number(name):
    return int(name.split("#", 1)[1]) if name.startswith("ProfilerStep#") and name.split("#", 1)[1].isdigit() else -1


def node_tables(timelines, instances):
    """{NODES, SYNCS, STEPS} DataFrames from the ranks' (shifted) timelines and
    correlate's instance rows (``instances``: collectives and send/recv
    pairs, correlate.inputs' columns with ``kind`` COLLECTIVE or P2P)."""
    parts, syncs, steps = [], [], []
    by_rank = {r: df for r, df in instances.groupby("rank")} if len(instances) else {}
    for r, tl in timelines.items():
        windows = step_windows(tl)
        texts, index = _identities(tl)
        start, end = tl.compute_start, tl.compute_end
        comm = tl.unions.get("comm")
        inst = by_rank.get(r)
        ops = _sync_ops(tl)
        for name, lo, hi in windows:
            step = _step_number(name)
            steps.append((step, r, lo, hi))
            a, b = np.searchsorted(start, [lo, hi])
            s, e = start[a:b], end[a:b]
            j = np.arange(a, b)
            over = _native.overlap_with_union(s, e, *comm) if comm is not None and len(comm[0]) and len(s) \
                else np.zeros(len(s), np.int64)
            parts.append(pd.DataFrame({
                "step": step, "rank": r, "kind": COMPUTE, "stream": tl.compute_column("stream", j).astype(np.int64),
                "start": s, "end": e, "identity": texts[index[j]] if len(j) else np.zeros(0, object),
                "instance": None, "release": np.nan, "overlapped": over > 0, "nbytes": np.nan, "label": None,
                "event": -1}))
            if inst is not None:
                k = inst[(inst["start"] >= lo) & (inst["start"] < hi)]
                parts.append(pd.DataFrame({
                    "step": step, "rank": r, "kind": k["kind"].to_numpy(np.int64),
                    "stream": pd.to_numeric(k["stream"], errors="coerce").fillna(-1).to_numpy(np.int64),
                    "start": k["start"].to_numpy(np.int64), "end": k["end"].to_numpy(np.int64),
                    "identity": k["kernel_name"].to_numpy(object), "instance": k["instance"].to_numpy(object),
                    "release": k["launch_end"].to_numpy(np.float64), "overlapped": False,
                    "nbytes": k["nbytes"].to_numpy(np.float64), "label": k["label"].to_numpy(object),
                    "event": k["event"].to_numpy(np.int64)}))
            if len(ops[0]):
                x, y = np.searchsorted(ops[0], [lo, hi])
                syncs.append(pd.DataFrame({"step": step, "rank": r, "start": ops[0][x:y], "end": ops[1][x:y]}))
    nodes = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=["step", "rank", "kind", "stream", "start", "end", "identity", "instance", "release",
                 "overlapped", "nbytes", "label", "event"])
    # an instance belongs to the step of its first member's rank: the others follow it there
    coll = nodes["kind"] != COMPUTE
    if coll.any():
        first = nodes[coll].sort_values("rank").groupby("instance")["step"].first()
        nodes.loc[coll, "step"] = nodes.loc[coll, "instance"].map(first).to_numpy()
    nodes = nodes.sort_values(["step", "start", "rank"], kind="stable").reset_index(drop=True)
    sync = pd.concat(syncs, ignore_index=True) if syncs else pd.DataFrame(
        {"step": pd.Series(dtype=np.int64), "rank": pd.Series(dtype=np.int64),
         "start": pd.Series(dtype=np.int64), "end": pd.Series(dtype=np.int64)})
    windows = pd.DataFrame(steps, columns=["step", "rank", "start", "end"]).astype(np.int64)
    return {NODES: nodes, SYNCS: sync, STEPS: windows}


def _sync_ops(tl):
    """(starts, ends) on the timeline's clock of the rank's host calls that
    wait for the GPU, sorted by start (the summary keeps the CPU ops of the
    threads that launch collectives: the only ones looked at)."""
    from ..correlate.summary import unpack_ops

    ids = [i for i, n in enumerate(tl.names) if isinstance(n, str) and _SYNC.match(n)]
    starts, ends = [], []
    if ids:
        ids = np.array(ids, dtype=np.int64)
        for part in tl.cpu_ops:   # one part unpacked at a time
            s, e, _, name = unpack_ops(part)
            on = np.isin(name.astype(np.int64), ids)
            starts.append(s[on])
            ends.append(e[on])
    if not starts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    s, e = np.concatenate(starts) + tl.shift, np.concatenate(ends) + tl.shift
    o = np.argsort(s, kind="stable")
    return s[o], e[o]


def instance_rows(coll, pairs=None):
    """correlate's instance rows (collectives, and each matched send/recv
    pair as a two-rank instance) with the ``kind`` and ``label`` the nodes
    carry."""
    from ..correlate.inputs import instances_from_align, instances_from_p2p

    rows = instances_from_align(coll)
    is_p2p = rows["collective_name"].astype(str).isin(["send", "recv", "coalesced"]).to_numpy()
    out = rows[~is_p2p].copy()
    out["kind"] = COLLECTIVE
    out["label"] = [f"{c} ({p})" for c, p in zip(out["collective_name"], out["pg_name"])]
    frames = [out]
    if pairs is not None and len(pairs):
        p = instances_from_p2p(pairs, coll)
        p["kind"] = P2P
        # a pair's bytes are its send's (a batch_isend_irecv kernel's row has none of its own)
        sent = dict(zip([f"p2p_{x}" for x in pairs["pair"].tolist()],
                        pd.to_numeric(pairs["send_bytes"], errors="coerce").tolist()))
        p["nbytes"] = p["instance"].map(sent).astype(np.float64)
        p["label"] = p["collective_name"]
        frames.append(p)
    return pd.concat(frames, ignore_index=True)

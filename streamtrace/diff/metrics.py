"""One run's figures as the diff compares them, from the tables
``chain.correlated_tables`` returns (align, correlate, steps and, when
made, critical).  Every figure is per step, so that runs with different step
counts compare; each comes with its spread within the run (step to step, or
instance to instance), which stands in for the run-to-run spread."""
import re

import numpy as np
import pandas as pd

from ..collectives import bus_factor, size_bucket

_STEP_NAME = re.compile(r"^ProfilerStep#\d+$")


def _num(text):
    return int(text) if text.strip().isdigit() else 1 << 62


#: sigma of a normal sample from its median absolute deviation
MAD_SIGMA = 1.4826


def spread(values):
    """Robust spread of a sample: 1.4826 x its median absolute deviation
    (0 for fewer than two values)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if len(v) < 2:
        return 0.0
    return float(MAD_SIGMA * np.median(np.abs(v - np.median(v))))


def step_spread(values):
    """Spread of a per-step series: its standard deviation (few points: the
    MAD of three steps is often 0)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    return float(np.std(v, ddof=1)) if len(v) >= 2 else 0.0


class Run:
    """A run's tables and the figures the diff reads from them."""

    def __init__(self, tables, label):
        self.tables = tables
        self.label = label
        steps = tables.get("steps")
        self.step_numbers = [] if steps is None else [int(s) for s in steps["step"].tolist()]
        self.n_steps = max(len(self.step_numbers), 1)
        ranks = tables.get("align.ranks")
        self.ranks = [] if ranks is None else sorted(int(r) for r in ranks["rank"].tolist())
        self._instance_step = None

    # ------------------------------------------------------------ steps
    def step_times(self):
        """(the run's step times, us, one per step; {rank: its step times})."""
        steps = self.tables.get("steps")
        run = [] if steps is None else (steps["end_us"] - steps["start_us"]).tolist()
        per_rank = {}
        a = self.tables.get("align.steps")
        if a is not None and len(a):
            for rank, g in a.groupby("rank"):
                per_rank[int(rank)] = ((g["end_ns"] - g["start_ns"]) / 1e3).tolist()
        return run, per_rank

    def step_time_us(self):
        run, _ = self.step_times()
        return float(np.median(run)) if run else float("nan")

    # ------------------------------------------------------------ collectives
    def instance_steps(self):
        """{collective_id: step number} from each instance's earliest row and
        its rank's step windows (align.steps, in the trace's own ns)."""
        if self._instance_step is not None:
            return self._instance_step
        out = {}
        coll, steps = self.tables.get("align.collectives"), self.tables.get("align.steps")
        if coll is not None and steps is not None and len(coll) and len(steps):
            first = coll.sort_values("ts_ns").drop_duplicates("collective_id")
            for rank, rows in first.groupby("rank"):
                w = steps[steps["rank"] == rank].sort_values("start_ns")
                if not len(w):
                    continue
                starts, ends = w["start_ns"].to_numpy(), w["end_ns"].to_numpy()
                ts = rows["ts_ns"].to_numpy()
                i = np.searchsorted(starts, ts, side="right") - 1
                ok = (i >= 0) & (ts < ends[np.clip(i, 0, None)])
                numbers = w["step"].to_numpy()
                for cid, k, good in zip(rows["collective_id"].tolist(), i.tolist(), ok.tolist()):
                    if good:
                        out[cid] = int(numbers[k])
        self._instance_step = out
        return out

    def collective_instances(self):
        """One row per collective instance: its group (kind, process group,
        size bucket), transfer time (mean end after the last member's
        start), mean waiting of its members, bus bandwidth (GB/s)."""
        coll = self.tables.get("align.collectives")
        cols = ["collective_id", "kind", "pg", "bucket", "bytes", "n", "transfer_us", "waiting_us", "busbw_GBps"]
        if coll is None or not len(coll):
            return pd.DataFrame(columns=cols)
        c = coll[coll["collective_id"].notna()]
        start = c["ts_aligned_ns"].astype("float64")
        end = start + c["dur_aligned_ns"].astype("float64")
        full = np.fmax(c["in_bytes"].astype("float64"), c["out_bytes"].astype("float64"))
        pg = c["pg_name"].astype(str) + np.where(c["pg_desc"].notna() & (c["pg_desc"].astype(str) != ""),
                                                  " (" + c["pg_desc"].astype(str) + ")", "")
        df = pd.DataFrame({"collective_id": c["collective_id"].to_numpy(), "kind": c["kind"].astype(str).to_numpy(),
                           "pg": pg.to_numpy(), "start": start.to_numpy(), "end": end.to_numpy(),
                           "bytes": full.to_numpy(), "n": c["group_size"].astype("float64").to_numpy()})
        g = df.groupby("collective_id", sort=False)
        inst = g.agg(kind=("kind", "first"), pg=("pg", "first"), bytes=("bytes", "max"), n=("n", "max"),
                     last_start=("start", "max"), mean_start=("start", "mean"), mean_end=("end", "mean"))
        inst = inst.reset_index()
        inst["transfer_us"] = np.clip(inst["mean_end"] - inst["last_start"], 0, None) / 1e3
        inst["waiting_us"] = (inst["last_start"] - inst["mean_start"]) / 1e3
        factor = np.array([bus_factor(k, n) if k != "alltoallv" else None
                           for k, n in zip(inst["kind"].tolist(), inst["n"].tolist())], dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            inst["busbw_GBps"] = np.where(inst["transfer_us"] > 0,
                                          inst["bytes"] * factor / (inst["transfer_us"] * 1e3), np.nan)
        inst["bucket"] = [size_bucket(b) for b in inst["bytes"].tolist()]
        return inst[cols]

    # ------------------------------------------------------------ waiting
    def waiting_by_rank(self):
        """{rank: (per-step waited-for us, per-step blame us)} over the
        collectives the others waited on (correlate.collective_blockers),
        with the run's totals of each cause of waiting."""
        b = self.tables.get("correlate.collective_blockers")
        out, causes = {}, {}
        if b is None or not len(b):
            return out, causes
        steps = self.instance_steps()
        b = b.assign(step=[steps.get(cid, -1) for cid in b["collective_id"].tolist()])
        numbers = self.step_numbers or sorted(set(b["step"]))
        for rank, g in b.groupby("late_rank"):
            per = g.groupby("step")[["delta_us", "blame_us"]].sum().reindex(numbers, fill_value=0.0)
            out[int(rank)] = (per["delta_us"].tolist(), per["blame_us"].tolist())
        for name, col in (("host launch lateness", "host_launch_lateness_us"),
                          ("GPU dependency wait", "gpu_dependency_wait_us"), ("GPU backlog", "gpu_backlog_us")):
            causes[name] = float(b[col].sum())
        return out, causes

    def straggler(self):
        """The rank the others waited longest for (as blockers says), or None."""
        by_rank, _ = self.waiting_by_rank()
        if not by_rank:
            return None
        return max(sorted(by_rank), key=lambda r: sum(by_rank[r][0]))

    # ------------------------------------------------------------ blockers
    def blockers(self, table, key):
        """{identity: (total blocking us, collectives delayed, ranks)} of a
        correlate blocking table."""
        df = self.tables.get(table)
        if df is None or not len(df):
            return {}
        out = {}
        for row in df.to_dict("records"):
            # a profiler step's op is one op whatever its number (runs number their steps differently)
            ident = tuple(_STEP_NAME.sub("ProfilerStep#N", str(row[k])) for k in key)
            total, n, ranks = out.get(ident, (0.0, 0, ""))
            ranks = ",".join(sorted(set(filter(None, ranks.split(",") + str(row["ranks"]).split(","))), key=_num))
            out[ident] = (total + float(row["total_blocking_us"]), n + int(row["instances_delayed"]), ranks)
        return out

    # ------------------------------------------------------------ GPU time
    def gpu_time(self):
        """{rank: {column: per-step values}} of correlate.exposed_comm (compute,
        communication, exposed communication, idle)."""
        e = self.tables.get("correlate.exposed_comm")
        out = {}
        if e is None or not len(e):
            return out
        e = e[e["step"].astype(str) != "all"]
        for rank, g in e.groupby("rank"):
            out[int(rank)] = {c: g[c].astype(float).tolist() for c in ("compute_us", "comm_us", "exposed_us")}
        return out

    def kernel_time(self):
        """{(kernel identity, rank): per-step GPU time us} of the compute
        kernels: from correlate's timelines (``CORRELATED``) when the tables
        hold them, else from the critical graph's nodes (critical.nodes); {}
        without either."""
        held = self.tables.get(CORRELATED)
        if held is not None:
            return held.kernel_time()
        nodes = self.tables.get("critical.nodes")
        if nodes is None or not len(nodes):
            return {}
        k = nodes[nodes["kind"] == 0]
        ident, idents = pd.factorize(k["identity"])
        rank, ranks = pd.factorize(k["rank"])
        numbers = np.array(sorted(set(nodes["step"].tolist())))
        step = np.searchsorted(numbers, k["step"].to_numpy())
        shape = (len(idents), len(ranks), len(numbers))
        flat = np.ravel_multi_index((ident, rank, step), shape)
        dur = (k["end"].to_numpy() - k["start"].to_numpy()) / 1e3
        total = np.bincount(flat, weights=dur, minlength=int(np.prod(shape))).reshape(shape)
        seen = np.bincount(flat, minlength=int(np.prod(shape))).reshape(shape).any(axis=2)
        return {(str(idents[i]), int(ranks[r])): total[i, r].tolist() for i, r in zip(*np.nonzero(seen))}

    # ------------------------------------------------------------ pipeline
    def pipeline_stages(self):
        """{(pipeline, stage): {column: per-step values}} of align.pipeline."""
        p = self.tables.get("align.pipeline")
        out = {}
        if p is None or not len(p):
            return out
        for (pipe, stage), g in p.groupby(["pipeline", "stage"]):
            out[(int(pipe), int(stage))] = {c: g[c].astype(float).tolist()
                                            for c in ("stage_work_us", "p2p_wait_us", "bubble_us")}
        return out

    def p2p_links(self):
        """{(sender, receiver): (transfer times us, bandwidths GB/s, transfers per step)} of align.p2p."""
        p = self.tables.get("align.p2p")
        out = {}
        if p is None or not len(p):
            return out
        for (s, r), g in p.groupby(["sender", "receiver"]):
            out[(int(s), int(r))] = (g["transfer_us"].astype(float).tolist(),
                                     g["bandwidth_GBps"].astype(float).tolist(), len(g) / self.n_steps)
        return out

    # ------------------------------------------------------------ critical path
    def critical_path(self):
        """critical.compute's ``critical_path``: of the graph in the tables,
        or made now from correlate's timelines (``CORRELATED``); None
        without either."""
        from .. import critical

        if critical.NODES in self.tables:
            graph = self.tables
        elif self.tables.get(CORRELATED) is not None:
            graph = self.tables[CORRELATED].graph()
        else:
            return None
        return critical.compute(graph)["critical_path"]


#: the key of a run's tables that holds its ``Correlated`` (diff.side_tables puts it there)
CORRELATED = "diff.correlated"


def _step_number(name):
    """A step window's number as the critical graph numbers it (-1: not a ProfilerStep)."""
    tail = name.split("#", 1)[1] if name.startswith("ProfilerStep#") else ""
    return int(tail) if tail.isdigit() else -1


def _dims(d):
    return "[" + ",".join(str(int(x)) for x in d) + "]" if d[0] >= 0 else ""


class Correlated:
    """A run's ranks' timelines on correlate's clocks and align's tables as
    correlate read them (what ``chain.correlated_tables`` hands its
    ``finished``): the per-kernel GPU time is read from them, and the
    critical-path graph is made of them only when the diff compares the
    critical paths (``graph``)."""

    def __init__(self, finished):
        self.timelines, self.used = finished
        self._instances = self._graph = None

    def instances(self):
        """critical.instance_rows of the run's collectives and send/recv pairs."""
        if self._instances is None:
            from ..critical import instance_rows

            self._instances = instance_rows(self.used["align.collectives"], self.used.get("align.p2p"))
        return self._instances

    def graph(self):
        """The ``critical.*`` tables (critical.node_tables), made once."""
        if self._graph is None:
            from ..critical import node_tables

            self._graph = node_tables(self.timelines, self.instances())
        return self._graph

    def kernel_time(self):
        """{(kernel identity, rank): per-step GPU time us} of the compute
        kernels, as the critical graph's compute nodes give it (the same
        identity text, step windows, steps and order of summing) without
        making the graph: each rank's kernels summed with one bincount over
        (identity code, step) codes, the identity texts made once per
        distinct kernel identity of the rank."""
        from ..critical.graph import step_windows

        inst = self.instances()
        by_rank = {r: (df["start"].to_numpy(), df["instance"].to_numpy(object))
                   for r, df in inst.groupby("rank")} if len(inst) else {}
        codes = {}   # identity text -> its code across ranks
        per_rank, numbers, members = [], set(), []
        for r, tl in self.timelines.items():
            texts = [f"{tl.names[int(k[0])]} grid {_dims(k[1:4])} block {_dims(k[4:7])}".strip() for k in tl.lkeys]
            of_lcode = np.array([codes.setdefault(t, len(codes)) for t in texts], dtype=np.int64)
            table, index = tl.by_lcode(of_lcode)
            start, end = tl.compute_start, tl.compute_end
            js, steps = [], []
            for name, lo, hi in step_windows(tl):
                step = _step_number(name)
                a, b = np.searchsorted(start, [lo, hi])
                if b > a:
                    js.append(np.arange(a, b))
                    steps.append(np.full(b - a, step, dtype=np.int64))
                    numbers.add(step)
                if r in by_rank:   # the collectives' steps count among the run's steps (as nodes they would)
                    s, ids = by_rank[r]
                    on = (s >= lo) & (s < hi)
                    members += [(i, r, step) for i in ids[on].tolist()]
            if js:
                j, step = np.concatenate(js), np.concatenate(steps)
                order = np.argsort(start[j], kind="stable")   # the graph's nodes are in start order
                j, step = j[order], step[order]
                per_rank.append((r, table[index[j]], step, (end[j] - start[j]) / 1e3))
        if not per_rank:
            return {}
        first = {}   # an instance is in the step of its lowest rank's member
        for i, r, step in sorted(members, key=lambda m: m[1]):
            first.setdefault(i, step)
        numbers = np.array(sorted(numbers | set(first.values())))
        texts = np.array(list(codes), dtype=object)
        out = {}
        for r, code, step, dur in per_rank:
            flat = code * len(numbers) + np.searchsorted(numbers, step)
            size = len(texts) * len(numbers)
            total = np.bincount(flat, weights=dur, minlength=size).reshape(len(texts), len(numbers))
            seen = np.bincount(flat, minlength=size).reshape(len(texts), len(numbers)).any(axis=1)
            out.update({(str(texts[i]), int(r)): total[i].tolist() for i in np.nonzero(seen)[0]})
        return out

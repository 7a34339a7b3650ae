"""``correlate``: which kernels block or contend with NCCL collectives.

The contract is spec blocking-analysis.md.  Three analyses, over GPU and CPU
activity collected from the stream plus align's matched collectives:

1. *Why was the late rank late?*  For every matched collective instance
   (send/recv excepted), the delay Δ of the last arriver L behind the first
   arriver R is split on L into host launch lateness, GPU dependency wait and
   GPU backlog (they add up to Δ);
   backlog is attributed to the compute kernels that ran in the window, by
   their excess over the same kernel on the other ranks, and host lateness to
   the CPU ops on the launching thread by self time.
2. *What ran alongside each collective?*  Per NCCL kernel, its overlap with
   compute kernels on other streams; contention pairs; NCCL and compute
   inflation under overlap; SM share and wave (tail-effect) risk.
3. *How much communication was exposed?*  Per rank (and profiler step): comm
   time hidden under compute vs exposed, split into waiting and transfer, and
   an HTA-style temporal breakdown.

All interval arithmetic runs in the C sweeps (``_native``) over numpy arrays;
Python loops run per collective instance, never per kernel.  Times are
integer ns on the aligned timeline; sheets show µs.
"""
import logging
import math
import re

import numpy as np
import pandas as pd

from . import _native
from .collectives import is_collective_kernel_name, size_bucket

log = logging.getLogger("streamtrace")

NS_PER_US = 1000.0
HIGH_OVERLAP, LOW_OVERLAP = 0.5, 0.05   # buckets of spec §2
MIN_SAMPLES = 3                         # fewer in a bucket: say so, no number
TOP_N = 3
P2P_NAMES = ("send", "recv")
NOISE_FRACTION, NOISE_NS = 0.05, 1000   # excess below max(5 % of baseline, 1 us) is noise

# cat spellings, old and new (trace-format.md §4)
KERNEL_CATS = {"kernel", "Kernel"}
MEMCPY_CATS = {"gpu_memcpy", "Memcpy"}
MEMSET_CATS = {"gpu_memset", "Memset"}
CPU_CATS = {"cpu_op", "user_annotation", "Operator"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime"}
LAUNCH_RE = re.compile(r"(LaunchKernel|launchKernel|LaunchCooperativeKernel|ExtLaunchKernel|GraphLaunch|cuLaunch)")

KIND_NONE, KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET, KIND_CPU, KIND_RUNTIME = range(6)


def _cat_kind(cat):
    if cat in KERNEL_CATS:
        return KIND_KERNEL
    if cat in MEMCPY_CATS:
        return KIND_MEMCPY
    if cat in MEMSET_CATS:
        return KIND_MEMSET
    if cat in CPU_CATS:
        return KIND_CPU
    if cat in RUNTIME_CATS:
        return KIND_RUNTIME
    return KIND_NONE


# ====================================================================== timelines

class Timeline:
    """What correlate keeps of one rank: GPU activities, CPU ops, steps.

    ``gpu`` columns: event, start, end (raw ns), stream, device, name, kind,
    grid, block (tuples as text), ctas, threads, regs, smem, identity.
    ``cpu`` columns: event, start, end, pid, tid, name, kind, correlation.
    """

    def __init__(self, rank, meta, gpu, cpu):
        self.rank, self.meta, self.gpu, self.cpu = rank, meta, gpu, cpu

    @property
    def base_ns(self):
        return int(self.meta.get("trace", {}).get("baseTimeNanoseconds") or 0)

    def device_props(self):
        props = self.meta.get("trace", {}).get("deviceProperties")
        if not isinstance(props, list) or not props:
            return None
        devices = self.gpu["device"][self.gpu["device"] >= 0]
        want = int(devices.mode().iloc[0]) if len(devices) else None
        for p in props:
            if isinstance(p, dict) and p.get("id") == want:
                return p
        return props[0] if isinstance(props[0], dict) else None


class _Collector:
    """Keeps, per rank, the X events correlate needs, as numpy arrays, while
    frames stream past (vectorised filter per EVENTS frame)."""

    def __init__(self, rank):
        self.rank = rank
        self.strings = []
        self.cat_kind = np.zeros(0, dtype=np.int8)
        self.parts = []        # (event index offset, filtered records)
        self.kernels = []
        self.n_events = 0
        self.meta = {}

    def add_strings(self, strings):
        self.strings.extend(strings)
        self.cat_kind = np.concatenate([self.cat_kind, np.array([_cat_kind(s) for s in strings], dtype=np.int8)])

    def add_events(self, records):
        cats = records["cat"].astype(np.int64)
        kind = np.zeros(len(records), dtype=np.int8)
        known = cats < len(self.cat_kind)
        kind[known] = self.cat_kind[cats[known]]
        flags = records["flags"]
        keep = (records["ph"] == ord("X")) & (kind != KIND_NONE) & ((flags & _native.FLAGS["has_ts"]) != 0)
        idx = np.nonzero(keep)[0]
        if len(idx):
            self.parts.append((idx + self.n_events, records[idx].copy(), kind[idx]))
        self.n_events += len(records)

    def finish(self):
        if self.parts:
            events = np.concatenate([p[0] for p in self.parts])
            rec = np.concatenate([p[1] for p in self.parts])
            kind = np.concatenate([p[2] for p in self.parts])
        else:
            events = np.zeros(0, dtype=np.int64)
            rec = np.zeros(0, dtype=_native.EVENT_DTYPE)
            kind = np.zeros(0, dtype=np.int8)
        names = np.array(self.strings + [""], dtype=object)
        name_ids = rec["name"].astype(np.int64)
        name_ids = np.where(name_ids == _native.NOSTR, len(self.strings), name_ids)
        start = rec["ts"].astype(np.int64)
        end = start + rec["dur"].astype(np.int64)
        gpu_mask = np.isin(kind, (KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET))
        gpu = pd.DataFrame({
            "event": events[gpu_mask], "start": start[gpu_mask], "end": end[gpu_mask],
            "stream": rec["stream"][gpu_mask].astype(np.int64),
            "device": np.where(rec["device"][gpu_mask] >= 0, rec["device"][gpu_mask],
                               np.where(rec["flags"][gpu_mask] & _native.FLAGS["pid_str"], -1,
                                        rec["pid"][gpu_mask])).astype(np.int64),
            "name": names[name_ids[gpu_mask]],
            "kind": kind[gpu_mask],
        })
        tid_str = (rec["flags"] & _native.FLAGS["tid_str"]) != 0
        cpu_mask = np.isin(kind, (KIND_CPU, KIND_RUNTIME))
        cpu = pd.DataFrame({
            "event": events[cpu_mask], "start": start[cpu_mask], "end": end[cpu_mask],
            "pid": rec["pid"][cpu_mask].astype(np.int64),
            # a string tid is a string id; negate to keep it apart from int tids
            "tid": np.where(tid_str[cpu_mask], -1 - rec["tid"][cpu_mask], rec["tid"][cpu_mask]).astype(np.int64),
            "name": names[name_ids[cpu_mask]],
            "kind": kind[cpu_mask],
            "correlation": rec["correlation"][cpu_mask].astype(np.int64),
        })
        gpu = _add_geometry(gpu, self.kernels, name_ids[gpu_mask], names)
        return Timeline(self.rank, self.meta, gpu.sort_values("start", kind="stable").reset_index(drop=True),
                        cpu.sort_values("start", kind="stable").reset_index(drop=True))


def _add_geometry(gpu, kernel_parts, name_ids, names):
    """Join launch geometry (by event index) and build the text columns grid,
    block and identity once per distinct (name, grid, block)."""
    k = np.concatenate(kernel_parts) if kernel_parts else np.zeros(0, dtype=_native.KERNEL_DTYPE)
    n = len(gpu)
    dims = np.full((n, 6), -1, dtype=np.int64)
    regs = np.full(n, np.nan)
    smem = np.full(n, np.nan)
    if len(k) and n:
        events = gpu["event"].to_numpy()  # ascending: rows are in stream order
        at = np.clip(np.searchsorted(events, k["event"].astype(np.int64)), 0, n - 1)
        hit = events[at] == k["event"]
        rows = at[hit]
        dims[rows, 0:3] = k["grid"][hit]
        dims[rows, 3:6] = k["block"][hit]
        regs[rows] = np.where(k["registers_per_thread"][hit] >= 0, k["registers_per_thread"][hit], np.nan)
        smem[rows] = np.where(k["shared_memory"][hit] >= 0, k["shared_memory"][hit], np.nan)
    has = (dims[:, 0] >= 0) & (dims[:, 3] >= 0)
    gpu["ctas"] = np.where(has, dims[:, 0] * dims[:, 1] * dims[:, 2], np.nan)
    gpu["threads"] = np.where(has, dims[:, 3] * dims[:, 4] * dims[:, 5], np.nan)
    gpu["regs"], gpu["smem"] = regs, smem
    key = np.column_stack([name_ids, dims]) if n else np.zeros((0, 7), dtype=np.int64)
    uniq, inverse = np.unique(key, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)

    def text(cols):
        return np.array(["[" + ",".join(str(int(x)) for x in row) + "]" if row[0] >= 0 else "" for row in cols],
                        dtype=object)

    grid, block = text(uniq[:, 1:4]), text(uniq[:, 4:7])
    u_names = names[uniq[:, 0]] if len(uniq) else np.zeros(0, dtype=object)
    identity = np.array([f"{a} {b} {c}" for a, b, c in zip(u_names, grid, block)], dtype=object)
    gpu["grid"], gpu["block"], gpu["identity"] = grid[inverse], block[inverse], identity[inverse]
    return gpu


class StreamCollector:
    """Feeds frames to per-rank collectors and keeps the TABLE frames."""

    def __init__(self):
        self.collectors, self.tables = {}, {}

    def add(self, frame):
        from .stream import Kind, decode_strings

        kind = frame.kind
        if kind in (Kind.STRINGS, Kind.EVENTS, Kind.KERNELS, Kind.META):
            c = self.collectors.get(frame.rank)
            if c is None:
                c = self.collectors[frame.rank] = _Collector(frame.rank)
            if kind == Kind.STRINGS:
                c.add_strings(decode_strings(frame.payload)[1])
            elif kind == Kind.EVENTS:
                c.add_events(frame.records())
            elif kind == Kind.KERNELS:
                c.kernels.append(frame.records().copy())
            else:
                c.meta = frame.json()
        elif kind == Kind.TABLE:
            name, df = frame.table()
            self.tables[name] = pd.concat([self.tables[name], df], ignore_index=True) if name in self.tables else df

    def finish(self):
        """({rank: Timeline}, {table name: DataFrame})"""
        return {r: c.finish() for r, c in sorted(self.collectors.items())}, self.tables


def collect(frames):
    """Consume frames; return ``({rank: Timeline}, {table name: DataFrame})``."""
    sc = StreamCollector()
    for frame in frames:
        sc.add(frame)
    return sc.finish()


def instances_from_align(coll):
    """Correlate's instance table from ``align.collectives`` (aligned clock:
    base + ts - clock offset, as align applies it)."""
    coll = coll[coll["collective_id"].notna()]
    offset = coll["clock_offset_ns"].astype("int64").to_numpy()
    base = coll["base_ns"].astype("int64").to_numpy()
    start = coll["ts_aligned_ns"].astype("int64").to_numpy()
    launch_end = (coll["launch_ts_ns"].astype("Float64") + coll["launch_dur_ns"].astype("Float64")
                  + base - offset)
    nbytes = np.where(coll["category"].astype(str) == "allgather", coll["out_bytes"].astype("Float64"),
                      coll["in_bytes"].astype("Float64"))
    return pd.DataFrame({
        "instance": coll["collective_id"].astype(str).to_numpy(),
        "rank": coll["rank"].astype("int64").to_numpy(),
        "event": coll["event"].astype("int64").to_numpy(),
        "start": start,
        "end": start + coll["dur_aligned_ns"].astype("int64").to_numpy(),
        "stream": coll["stream"].to_numpy(),
        "implicit_sync": coll["implicit_sync"].fillna(False).astype(bool).to_numpy(),
        "collective_name": coll["collective_name"].to_numpy(),
        "pg_name": coll["pg_name"].to_numpy(),
        "dtype": coll["dtype"].to_numpy(),
        "nbytes": pd.array(nbytes, dtype="Float64").to_numpy(dtype=float, na_value=np.nan),
        "group_size": coll["group_size"].to_numpy(),
        "kernel_name": coll["kernel_name"].to_numpy(),
        "launch_end": launch_end.to_numpy(dtype=float, na_value=np.nan),
        "launch_tid": coll["launch_tid"].astype("Float64").to_numpy(dtype=float, na_value=np.nan),
    }).reset_index(drop=True)


def offsets_from_align(coll):
    """ns to add to each rank's (base-applied) times to reach the aligned clock."""
    if not len(coll):
        return {}
    per_rank = coll.groupby("rank")["clock_offset_ns"].first()
    return {int(r): -int(v) for r, v in per_rank.items()}


TABLE_PREFIX = "correlate."


def correlate_frames(frames):
    """The correlate stage: yield every input frame as it is read, then the
    ``correlate.*`` result tables and one END frame.

    The input must carry align's tables (run ``align`` first): without them
    there are no matched collectives and every table comes out empty, with a
    data-quality note.
    """
    from .stream import Kind, json_frame, table_frame

    sc = StreamCollector()
    for frame in frames:
        if frame.kind == Kind.END:
            continue
        sc.add(frame)
        yield frame
    sheets = analyze_collected(*sc.finish())
    for name, df in sheets.items():
        yield table_frame(TABLE_PREFIX + name, df)
    yield json_frame(Kind.END, 0, {"stage": "correlate"})


def analyze_collected(timelines, tables):
    """Sheets from collected timelines and align's tables."""
    coll = tables.get("align.collectives")
    if coll is None:
        inputs = Inputs(timelines, _empty_instances(), {})
        inputs.quality.append(("no align tables", None, "the stream has no align.collectives table: "
                                                        "run 'streamtrace align' before correlate"))
    else:
        inputs = Inputs(timelines, instances_from_align(coll), offsets_from_align(coll))
    return analyze(inputs)


def _empty_instances():
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in (
        ("instance", object), ("rank", np.int64), ("event", np.int64), ("start", np.int64), ("end", np.int64),
        ("stream", object), ("implicit_sync", bool), ("collective_name", object), ("pg_name", object),
        ("dtype", object), ("nbytes", float), ("group_size", object), ("kernel_name", object),
        ("launch_end", float), ("launch_tid", float))})


# ====================================================================== sweeps

def _union(starts, ends):
    order = np.argsort(starts, kind="stable")
    return _native.interval_union(np.asarray(starts)[order], np.asarray(ends)[order])


def _union_len(u):
    return int((u[1] - u[0]).sum())


def _intersect_len(a, b):
    """|A ∩ B| for two disjoint sorted unions."""
    if not len(a[0]) or not len(b[0]):
        return 0
    return int(_native.overlap_with_union(a[0], a[1], b[0], b[1]).sum())


def _clip_union(u, lo, hi):
    s, e = np.maximum(u[0], lo), np.minimum(u[1], hi)
    keep = e > s
    return s[keep], e[keep]


# ====================================================================== the analysis

class Inputs:
    """Normalised inputs: per-rank timelines on the aligned clock, plus the
    matched collective kernels (one row per rank per instance)."""

    def __init__(self, timelines, instances, offsets):
        self.timelines = timelines
        self.quality = []
        self.instances = instances.copy()
        # aligned clock: raw + base + offset (offsets from align; 0 when absent)
        for r, tl in timelines.items():
            shift = tl.base_ns + int(offsets.get(r, 0))
            tl.gpu = tl.gpu.assign(start=tl.gpu["start"] + shift, end=tl.gpu["end"] + shift)
            tl.cpu = tl.cpu.assign(start=tl.cpu["start"] + shift, end=tl.cpu["end"] + shift)
        self._classify()

    def _classify(self):
        """Comm activities C (collective kernels + memcpy on their streams)
        and compute kernels K, per rank."""
        inst = self.instances
        for r, tl in self.timelines.items():
            gpu = tl.gpu
            coll_events = set(inst.loc[inst["rank"] == r, "event"].tolist())
            names = pd.unique(gpu["name"])
            nccl_names = [n for n in names if is_collective_kernel_name(n)]
            is_coll = gpu["event"].isin(coll_events) | ((gpu["kind"] == KIND_KERNEL) & gpu["name"].isin(nccl_names))
            coll_streams = set(gpu.loc[is_coll, "stream"].tolist())
            is_comm = is_coll | ((gpu["kind"] == KIND_MEMCPY) & gpu["stream"].isin(coll_streams))
            gpu["comm"] = is_comm
            gpu["compute"] = (gpu["kind"] == KIND_KERNEL) & ~is_comm
            tl.gpu = gpu
            tl.compute_union = _union(gpu.loc[gpu["compute"], "start"].to_numpy(), gpu.loc[gpu["compute"], "end"].to_numpy())


def analyze(inputs):
    """All correlate sheets as ``{name: DataFrame}`` plus ``data_quality`` rows."""
    sheets = {}
    blockers, blocking_kernels, blocking_host_ops = _late_rank_analysis(inputs)
    sheets["collective_blockers"] = blockers
    sheets["blocking_kernels"] = blocking_kernels
    sheets["blocking_host_ops"] = blocking_host_ops
    overlap, pairs = _overlap_analysis(inputs)
    sheets["collective_overlap"] = overlap
    sheets["contention_pairs"] = pairs
    sheets["nccl_inflation"] = _nccl_inflation(inputs, overlap)
    sheets["compute_inflation"] = _compute_inflation(inputs)
    sheets["exposed_comm"] = _exposed_comm(inputs)
    sheets["correlate_quality"] = pd.DataFrame(inputs.quality, columns=["check", "rank", "detail"])
    return sheets


# ---------------------------------------------------------------------- part 1

BLOCKER_COLUMNS = [
    "collective_id", "Process Group Name", "Collective name", "late_rank", "reference_rank", "delta_us", "blame_us",
    "host_launch_lateness_us", "gpu_dependency_wait_us", "gpu_backlog_us", "dominant_cause",
    "top_blockers", "blocker_1", "blocker_1_stream", "blocker_1_excess_us",
    "blocker_2", "blocker_2_stream", "blocker_2_excess_us", "blocker_3", "blocker_3_stream", "blocker_3_excess_us",
]
BLOCKING_KERNEL_COLUMNS = ["kernel", "grid", "block", "total_blocking_us", "instances_delayed", "ranks",
                           "mean_excess_us", "max_excess_us", "mean_duration_us", "baseline_median_us"]
BLOCKING_HOST_COLUMNS = ["op", "total_blocking_us", "instances_delayed", "ranks", "mean_self_us_in_gap",
                         "max_self_us_in_gap"]


class _ComputeArrays:
    """One rank's compute kernels as plain arrays sorted by start (window
    queries by binary search), with identity codes shared by all ranks."""

    def __init__(self, comp, codes):
        self.start = comp["start"].to_numpy(np.int64)
        self.end = comp["end"].to_numpy(np.int64)
        self.stream = comp["stream"].to_numpy(np.int64)
        self.code = codes
        self.max_dur = int((self.end - self.start).max()) if len(self.start) else 0

    def window(self, lo, hi):
        """Indices of kernels intersecting [lo, hi)."""
        a = np.searchsorted(self.start, lo - self.max_dur, side="left")
        b = np.searchsorted(self.start, hi, side="left")
        idx = np.arange(a, b)
        return idx[self.end[a:b] > lo]


class _CpuArrays:
    """One rank's CPU ops per thread, sorted by start."""

    def __init__(self, cpu):
        self.by_tid = {}
        for tid, g in cpu.groupby("tid", sort=False):
            g = g.sort_values("start", kind="stable")
            self.by_tid[int(tid)] = (g["start"].to_numpy(np.int64), g["end"].to_numpy(np.int64),
                                     g["name"].to_numpy(object), int((g["end"] - g["start"]).max()))


def _late_rank_analysis(inputs):
    inst = inputs.instances
    # every matched multi-rank collective makes ranks wait for the last one;
    # point-to-point send/recv only pair two ranks and are left out
    sync = inst[~inst["collective_name"].isin(P2P_NAMES)].sort_values(["instance", "start", "rank"], kind="stable")
    # compute kernels of every rank, identity codes shared across ranks
    comps = {r: _compute_table(tl) for r, tl in inputs.timelines.items()}
    all_ids = pd.concat([c["identity"] for c in comps.values()], ignore_index=True) if comps else pd.Series(dtype=object)
    codes, idents = pd.factorize(all_ids)
    arrays, pos = {}, 0
    for r, c in comps.items():
        arrays[r] = _ComputeArrays(c, codes[pos:pos + len(c)])
        pos += len(c)
    cpus = {}
    coll_ends = {r: np.sort(g["end"].to_numpy()) for r, g in inst.groupby("rank")}

    rows, kernel_hits, host_hits = [], [], []
    inst_ids = sync["instance"].to_numpy()
    ranks, starts = sync["rank"].to_numpy(np.int64), sync["start"].to_numpy(np.int64)
    launch_end, launch_tid = sync["launch_end"].to_numpy(float), sync["launch_tid"].to_numpy(float)
    pgs, names = sync["pg_name"].to_numpy(object), sync["collective_name"].to_numpy(object)
    bounds = np.flatnonzero(np.r_[True, inst_ids[1:] != inst_ids[:-1], True])
    for lo_i, hi_i in zip(bounds[:-1], bounds[1:]):
        if hi_i - lo_i < 2:
            continue
        cid = inst_ids[lo_i]
        last, first = hi_i - 1, lo_i
        L, R = int(ranks[last]), int(ranks[first])
        a_L, a_R = int(starts[last]), int(starts[first])
        delta = a_L - a_R
        blame = a_L - int(starts[last - 1])
        if L not in inputs.timelines:
            continue
        tl = inputs.timelines[L]
        if np.isnan(launch_end[last]):
            host = 0
            if delta > 0:
                inputs.quality.append(("no launch record", L, f"collective {cid}: the late rank's kernel has no launch "
                                                              "record; host lateness counted as 0"))
        else:
            host = int(min(max(int(launch_end[last]) - a_R, 0), delta))
        g0 = a_R + host   # from here the kernel was launched and the GPU side waited
        backlog = min(_union_len(_clip_union(tl.compute_union, g0, a_L)), delta - host)
        dependency = delta - host - backlog
        parts = {"host launch lateness": host, "GPU dependency wait": dependency, "GPU backlog": backlog}
        cause = max(parts, key=parts.get) if delta > 0 else "none"

        # kernels that ran on L between its previous collective's end and a_L,
        # against the same kernels on the other ranks in their own windows
        ca = arrays[L]
        idx = ca.window(_previous_end(coll_ends.get(L), a_L), a_L)
        top = []
        if len(idx):
            k_start, k_end, k_code = ca.start[idx], ca.end[idx], ca.code[idx]
            dur = k_end - k_start
            baseline = _baselines(arrays, coll_ends, ranks[lo_i:last], starts[lo_i:last], k_code)
            excess = dur - baseline
            in_gap = np.clip(np.minimum(k_end, a_L) - np.maximum(k_start, g0), 0, None)
            # a kernel blocks by at most its time in the gap, and only by what it
            # took beyond its usual duration elsewhere (when that is known);
            # an excess within timing noise is no excess
            significant = np.nan_to_num(excess) > np.maximum(NOISE_FRACTION * np.nan_to_num(baseline), NOISE_NS)
            attributed = np.where(np.isnan(excess), in_gap,
                                  np.where(significant, np.minimum(in_gap, np.clip(np.nan_to_num(excess), 0, None)), 0))
            hit = np.flatnonzero(attributed > 0)
            for j in hit[np.argsort(-attributed[hit], kind="stable")]:
                name, grid, block = _identity_parts(comps[L], idx[j])
                kernel_hits.append((name, grid, block, int(attributed[j]), cid, L, excess[j], int(dur[j]), baseline[j]))
                top.append((name, int(ca.stream[idx[j]]), excess[j], int(attributed[j])))

        host_top = []
        if host > 0 and not np.isnan(launch_tid[last]):
            if L not in cpus:
                cpus[L] = _CpuArrays(tl.cpu)
            ops = _host_ops_in_gap(cpus[L], int(launch_tid[last]), a_R, a_R + host)
            host_hits.extend((n, t, cid, L) for n, t in ops)
            host_top = ops[:TOP_N]

        row = {
            "collective_id": cid, "Process Group Name": pgs[last], "Collective name": names[last],
            "late_rank": L, "reference_rank": R, "delta_us": delta / NS_PER_US, "blame_us": blame / NS_PER_US,
            "host_launch_lateness_us": host / NS_PER_US, "gpu_dependency_wait_us": dependency / NS_PER_US,
            "gpu_backlog_us": backlog / NS_PER_US, "dominant_cause": cause,
        }
        if cause == "host launch lateness" and host_top:
            row["top_blockers"] = "; ".join(f"{n} ({t / NS_PER_US:.1f} us)" for n, t in host_top)
        else:
            row["top_blockers"] = "; ".join(f"{n} ({a / NS_PER_US:.1f} us)" for n, _, _, a in top[:TOP_N])
        for i, (name, stream, exc, _) in enumerate(top[:TOP_N], 1):
            row[f"blocker_{i}"] = name
            row[f"blocker_{i}_stream"] = stream
            row[f"blocker_{i}_excess_us"] = None if np.isnan(exc) else exc / NS_PER_US
        rows.append(row)

    blockers_df = pd.DataFrame(rows).reindex(columns=BLOCKER_COLUMNS)
    return blockers_df, _summarize_kernels(kernel_hits), _summarize_host(host_hits)


def _identity_parts(comp, i):
    row = comp.iloc[int(i)]
    return row["name"], row["grid"], row["block"]


def _baselines(arrays, coll_ends, other_ranks, other_starts, codes):
    """Median duration of each kernel identity in ``codes`` over the other
    ranks' windows (previous collective end .. arrival); NaN when unseen."""
    parts_code, parts_dur = [], []
    for r, a in zip(other_ranks, other_starts):
        ca = arrays.get(int(r))
        if ca is None:
            continue
        idx = ca.window(_previous_end(coll_ends.get(int(r)), int(a)), int(a))
        parts_code.append(ca.code[idx])
        parts_dur.append(ca.end[idx] - ca.start[idx])
    out = np.full(len(codes), np.nan)
    if not parts_code:
        return out
    oc, od = np.concatenate(parts_code), np.concatenate(parts_dur)
    order = np.lexsort((od, oc))
    oc, od = oc[order], od[order]
    for code in np.unique(codes):
        a, b = np.searchsorted(oc, code, "left"), np.searchsorted(oc, code, "right")
        if b > a:
            out[codes == code] = np.median(od[a:b])
    return out


def _previous_end(ends, t):
    if ends is None or not len(ends):
        return -(1 << 62)
    i = np.searchsorted(ends, t, side="right")
    return int(ends[i - 1]) if i else -(1 << 62)


def _compute_table(tl):
    """The rank's compute kernels sorted by start; cached on the timeline."""
    comp = getattr(tl, "_compute_sorted", None)
    if comp is None:
        comp = tl.gpu.loc[tl.gpu["compute"], ["start", "end", "stream", "name", "grid", "block", "identity"]] \
            .sort_values("start", kind="stable").reset_index(drop=True)
        tl._compute_sorted = comp
    return comp


def _host_ops_in_gap(cpu, tid, lo, hi):
    """CPU ops on the launching thread during [lo, hi), by self time within it
    (the innermost op at each instant), largest first."""
    if tid not in cpu.by_tid:
        return []
    start, end, name, max_dur = cpu.by_tid[tid]
    a = np.searchsorted(start, lo - max_dur, side="left")
    b = np.searchsorted(start, hi, side="left")
    sel = np.arange(a, b)[end[a:b] > lo]
    if not len(sel):
        return []
    starts, ends = start[sel], end[sel]
    cuts = np.unique(np.clip(np.concatenate([starts, ends, [lo, hi]]), lo, hi))
    totals = {}
    for x, y in zip(cuts[:-1], cuts[1:]):  # a handful of ops per gap
        covering = np.flatnonzero((starts <= x) & (ends >= y))
        if len(covering):
            inner = covering[np.argmin(ends[covering] - starts[covering])]
            totals[name[sel[inner]]] = totals.get(name[sel[inner]], 0) + int(y - x)
    return sorted(totals.items(), key=lambda kv: -kv[1])


def _summarize_kernels(hits):
    if not hits:
        return pd.DataFrame(columns=BLOCKING_KERNEL_COLUMNS)
    df = pd.DataFrame(hits, columns=["kernel", "grid", "block", "attributed", "instance", "rank", "excess", "dur",
                                     "baseline"])
    g = df.groupby(["kernel", "grid", "block"], sort=False)
    out = pd.DataFrame({
        "total_blocking_us": g["attributed"].sum() / NS_PER_US,
        "instances_delayed": g["instance"].nunique(),
        "ranks": g["rank"].agg(lambda s: ",".join(str(r) for r in sorted(set(s)))),
        "mean_excess_us": g["excess"].mean() / NS_PER_US,
        "max_excess_us": g["excess"].max() / NS_PER_US,
        "mean_duration_us": g["dur"].mean() / NS_PER_US,
        "baseline_median_us": g["baseline"].median() / NS_PER_US,
    }).reset_index()
    return out.sort_values(["total_blocking_us", "kernel"], ascending=[False, True]).reset_index(drop=True) \
        .reindex(columns=BLOCKING_KERNEL_COLUMNS)


def _summarize_host(hits):
    if not hits:
        return pd.DataFrame(columns=BLOCKING_HOST_COLUMNS)
    df = pd.DataFrame(hits, columns=["op", "self_ns", "instance", "rank"])
    g = df.groupby("op", sort=False)
    out = pd.DataFrame({
        "total_blocking_us": g["self_ns"].sum() / NS_PER_US,
        "instances_delayed": g["instance"].nunique(),
        "ranks": g["rank"].agg(lambda s: ",".join(str(r) for r in sorted(set(s)))),
        "mean_self_us_in_gap": g["self_ns"].mean() / NS_PER_US,
        "max_self_us_in_gap": g["self_ns"].max() / NS_PER_US,
    }).reset_index()
    return out.sort_values(["total_blocking_us", "op"], ascending=[False, True]).reset_index(drop=True) \
        .reindex(columns=BLOCKING_HOST_COLUMNS)


# ---------------------------------------------------------------------- part 2

OVERLAP_COLUMNS = ["collective_id", "rank", "Collective name", "Process Group Name", "signature", "stream",
                   "ts_us", "dur_us", "overlap_us", "overlap_frac", "overlapping_kernels", "top_overlapping",
                   "nccl_ctas", "sm_share", "top_kernel", "top_kernel_overlap_us", "top_kernel_stream",
                   "top_kernel_grid", "top_kernel_blocks_per_sm", "waves_alone", "waves_with_nccl", "tail_effect_risk"]
PAIR_COLUMNS = ["compute_kernel", "grid", "block", "signature", "overlap_us", "occurrences", "ranks",
                "nccl_ctas", "sm_share", "blocks_per_sm", "waves_alone", "waves_with_nccl", "tail_effect_risk"]


def _signature(row):
    parts = [str(row.get("collective_name") or "?"), f"pg={row.get('pg_name')}", str(row.get("dtype") or "?"),
             size_bucket(row.get("nbytes")), f"n={row.get('group_size')}"]
    algo = _algo_proto(row.get("kernel_name"))
    if algo:
        parts.append(algo)
    return " ".join(parts)


_ALGO_RE = re.compile(r"_(RING|TREE|COLLNET\w*|NVLS\w*|PAT)_(LL128|LL|SIMPLE)|_(LL128|LL|SIMPLE)_(RING|TREE|COLLNET\w*|NVLS\w*|PAT)")


def _algo_proto(name):
    if not isinstance(name, str):
        return None
    m = _ALGO_RE.search(name.split("(")[0])
    if not m:
        return None
    return f"{m.group(1)}/{m.group(2)}" if m.group(1) else f"{m.group(4)}/{m.group(3)}"


def resident_blocks_per_sm(threads, regs, smem, props):
    """Blocks of one kernel that fit on an SM at once, from its geometry and
    the device limits (the occupancy calculation, without allocation
    granularity).  None when something needed is unknown."""
    if props is None or threads is None or not threads or threads != threads or threads <= 0:
        return None
    limits = []
    max_threads = props.get("maxThreadsPerMultiProcessor") or props.get("maxThreadsPerMultiprocessor")
    if max_threads:
        limits.append(int(max_threads) // int(threads))
    regs_sm = props.get("regsPerMultiprocessor")
    if regs_sm and regs is not None and regs == regs and regs > 0:
        limits.append(int(regs_sm) // (int(regs) * int(threads)))
    smem_sm = props.get("sharedMemPerMultiprocessor") or props.get("maxSharedMemoryPerMultiProcessor")
    if smem_sm and smem is not None and smem == smem and smem > 0:
        limits.append(int(smem_sm) // int(smem))
    limits.append(32)  # hardware cap on resident blocks per SM (recent NVIDIA GPUs)
    return max(min(limits), 0) if len(limits) > 1 else None


def wave_risk(blocks, bpsm, num_sms, nccl_ctas):
    """(waves alone, waves with the NCCL kernel's CTAs resident, risk)."""
    if not blocks or blocks != blocks or not bpsm or not num_sms:
        return None, None, None
    alone = math.ceil(blocks / (num_sms * bpsm))
    free = num_sms - (nccl_ctas or 0)
    if free <= 0:
        return alone, None, True
    with_nccl = math.ceil(blocks / (free * bpsm))
    return alone, with_nccl, with_nccl > alone


def _overlap_analysis(inputs):
    """collective_overlap (per NCCL kernel per rank) and contention_pairs;
    vectorised per rank, Python only per output row."""
    frames, pair_frames = [], []
    inst = inputs.instances
    for r, tl in inputs.timelines.items():
        mine = inst[inst["rank"] == r].reset_index(drop=True)
        if not len(mine):
            continue
        gpu = tl.gpu
        props = tl.device_props()
        num_sms = props.get("numSms") if props else None
        if props is None:
            inputs.quality.append(("no deviceProperties", r, "SM share and wave risk left empty"))
        starts, ends = mine["start"].to_numpy(np.int64), mine["end"].to_numpy(np.int64)
        dur = ends - starts
        overlap = _native.overlap_with_union(starts, ends, *tl.compute_union)
        # NCCL kernel CTAs by event index
        ev_sorted = gpu[["event", "ctas"]].sort_values("event")
        at = np.clip(np.searchsorted(ev_sorted["event"].to_numpy(), mine["event"].to_numpy()), 0, max(len(ev_sorted) - 1, 0))
        ctas = ev_sorted["ctas"].to_numpy(float)[at] if len(ev_sorted) else np.full(len(mine), np.nan)
        ctas = np.where(ev_sorted["event"].to_numpy()[at] == mine["event"].to_numpy(), ctas, np.nan) if len(ev_sorted) else ctas
        sig = np.array([_signature(row) for row in mine.to_dict("records")], dtype=object)
        out = pd.DataFrame({
            "collective_id": mine["instance"], "rank": r, "Collective name": mine["collective_name"],
            "Process Group Name": mine["pg_name"], "signature": sig, "stream": mine["stream"],
            "ts_us": starts / NS_PER_US, "dur_us": dur / NS_PER_US, "overlap_us": overlap / NS_PER_US,
            "overlap_frac": np.divide(overlap, dur, out=np.zeros(len(dur)), where=dur > 0),
            "overlapping_kernels": 0,
            "nccl_ctas": pd.arrays.IntegerArray(np.nan_to_num(ctas).astype(np.int64), np.isnan(ctas)),
            "sm_share": ctas / num_sms if num_sms else np.nan,
        })
        comp = _compute_table(tl)
        ia, ib, il = _native.intersecting_pairs(starts, ends, comp["start"].to_numpy(), comp["end"].to_numpy())
        if len(ia):
            pairs = pd.DataFrame({"i": ia, "j": ib, "len": il, "identity": comp["identity"].to_numpy()[ib]})
            out.loc[:, "overlapping_kernels"] = np.bincount(ia, minlength=len(mine))
            per = pairs.groupby(["i", "identity"], sort=False)["len"].sum().reset_index() \
                .sort_values(["i", "len"], ascending=[True, False])
            text = per.groupby("i", sort=False).head(TOP_N).assign(
                t=lambda d: d["identity"].astype(str) + " (" + (d["len"] / NS_PER_US).round(1).astype(str) + " us)") \
                .groupby("i", sort=False)["t"].agg("; ".join)
            out.loc[text.index, "top_overlapping"] = text.to_numpy()
            best = pairs.loc[pairs.groupby("i", sort=False)["len"].idxmax()]
            full = _full_compute(tl)
            bj = best["j"].to_numpy()
            rows_i = best["i"].to_numpy()
            out.loc[rows_i, "top_kernel"] = comp["name"].to_numpy()[bj]
            out.loc[rows_i, "top_kernel_overlap_us"] = best["len"].to_numpy() / NS_PER_US
            out.loc[rows_i, "top_kernel_stream"] = comp["stream"].to_numpy()[bj]
            out.loc[rows_i, "top_kernel_grid"] = comp["grid"].to_numpy()[bj]
            waves = []
            for i, j in zip(rows_i, bj):
                bpsm = resident_blocks_per_sm(full["threads"][j], full["regs"][j], full["smem"][j], props)
                waves.append((bpsm, *wave_risk(full["ctas"][j], bpsm, num_sms, None if np.isnan(ctas[i]) else ctas[i])))
            for k, col in enumerate(("top_kernel_blocks_per_sm", "waves_alone", "waves_with_nccl", "tail_effect_risk")):
                values = np.full(len(out), None, dtype=object)
                values[rows_i] = [w[k] for w in waves]
                out[col] = values
            pair_frames.append(pd.DataFrame({
                "compute_kernel": comp["name"].to_numpy()[ib], "grid": comp["grid"].to_numpy()[ib],
                "block": comp["block"].to_numpy()[ib], "signature": sig[ia], "len": il, "rank": r,
                "blocks": full["ctas"][ib], "threads": full["threads"][ib], "regs": full["regs"][ib],
                "smem": full["smem"][ib], "nccl_ctas": ctas[ia], "num_sms": num_sms}).assign(props=[props] * len(ia)))
        frames.append(out)
    overlap_df = pd.concat(frames, ignore_index=True).reindex(columns=OVERLAP_COLUMNS) if frames \
        else pd.DataFrame(columns=OVERLAP_COLUMNS)
    return overlap_df, _pairs(pd.concat(pair_frames, ignore_index=True) if pair_frames else None)


def _full_compute(tl):
    """Geometry arrays aligned with _compute_table's rows."""
    full = getattr(tl, "_compute_geometry", None)
    if full is None:
        g = tl.gpu.loc[tl.gpu["compute"], ["start", "ctas", "threads", "regs", "smem"]] \
            .sort_values("start", kind="stable").reset_index(drop=True)
        full = {c: g[c].to_numpy(float) for c in ("ctas", "threads", "regs", "smem")}
        tl._compute_geometry = full
    return full


def _pairs(df):
    if df is None or not len(df):
        return pd.DataFrame(columns=PAIR_COLUMNS)
    out = []
    for key, g in df.groupby(["compute_kernel", "grid", "block", "signature"], sort=False):
        first = g.iloc[0]
        bpsm = resident_blocks_per_sm(first["threads"], first["regs"], first["smem"], first["props"])
        ctas = g["nccl_ctas"].max() if g["nccl_ctas"].notna().any() else None
        alone, with_nccl, risk = wave_risk(first["blocks"], bpsm, first["num_sms"], ctas)
        out.append({"compute_kernel": key[0], "grid": key[1], "block": key[2], "signature": key[3],
                    "overlap_us": g["len"].sum() / NS_PER_US, "occurrences": len(g),
                    "ranks": ",".join(str(r) for r in sorted(set(g["rank"]))),
                    "nccl_ctas": ctas, "sm_share": (ctas / first["num_sms"]) if ctas and first["num_sms"] else None,
                    "blocks_per_sm": bpsm, "waves_alone": alone, "waves_with_nccl": with_nccl,
                    "tail_effect_risk": risk})
    return pd.DataFrame(out).sort_values(["overlap_us", "compute_kernel"], ascending=[False, True]) \
        .reset_index(drop=True).reindex(columns=PAIR_COLUMNS)


NCCL_INFLATION_COLUMNS = ["signature", "instances", "overlapped_n", "isolated_n", "median_transfer_overlapped_us",
                          "median_transfer_isolated_us", "inflation", "total_excess_us", "note"]
COMPUTE_INFLATION_COLUMNS = ["kernel", "grid", "block", "occurrences", "overlapped_n", "isolated_n",
                             "median_overlapped_us", "median_isolated_us", "inflation", "time_lost_us", "note"]


def _nccl_inflation(inputs, overlap):
    """Transfer time (end − last arrival) with ≥ 50 % vs < 5 % compute overlap."""
    inst = inputs.instances
    if not len(inst) or not len(overlap):
        return pd.DataFrame(columns=NCCL_INFLATION_COLUMNS)
    last_arrival = inst.groupby("instance")["start"].transform("max")
    transfer = (inst["end"] - np.maximum(inst["start"], last_arrival)).clip(lower=0).to_numpy()
    df = pd.DataFrame({"signature": overlap["signature"].to_numpy(), "frac": overlap["overlap_frac"].to_numpy(),
                       "transfer": _align_to(overlap, inst, transfer)})
    rows = []
    for sig, g in df.groupby("signature", sort=True):
        hi, lo = g[g["frac"] >= HIGH_OVERLAP], g[g["frac"] < LOW_OVERLAP]
        row = {"signature": sig, "instances": len(g), "overlapped_n": len(hi), "isolated_n": len(lo)}
        if len(hi) >= MIN_SAMPLES and len(lo) >= MIN_SAMPLES:
            mh, ml = float(np.median(hi["transfer"])), float(np.median(lo["transfer"]))
            row.update({"median_transfer_overlapped_us": mh / NS_PER_US, "median_transfer_isolated_us": ml / NS_PER_US,
                        "inflation": (mh / ml - 1.0) if ml > 0 else None,
                        "total_excess_us": float(np.clip(hi["transfer"] - ml, 0, None).sum()) / NS_PER_US,
                        "note": ""})
        else:
            row["note"] = f"too few samples (need {MIN_SAMPLES} overlapped and {MIN_SAMPLES} isolated)"
        rows.append(row)
    return pd.DataFrame(rows).reindex(columns=NCCL_INFLATION_COLUMNS)


def _align_to(overlap, inst, values):
    """values (in inst row order) reordered to overlap's rows: both are built
    rank by rank in the same order, so match on (collective_id, rank, ts)."""
    key = pd.DataFrame({"collective_id": inst["instance"].to_numpy(), "rank": inst["rank"].to_numpy(),
                        "ts_us": inst["start"].to_numpy() / NS_PER_US, "v": values})
    merged = overlap[["collective_id", "rank", "ts_us"]].merge(key, on=["collective_id", "rank", "ts_us"], how="left")
    return merged["v"].to_numpy()


def _compute_inflation(inputs):
    """Per compute kernel identity: median duration when ≥ 50 % of it overlaps
    comm vs when < 5 % does."""
    parts = []
    for r, tl in inputs.timelines.items():
        gpu = tl.gpu
        comp = gpu[gpu["compute"]]
        comm = gpu[gpu["comm"]]
        if not len(comp):
            continue
        u = _union(comm["start"].to_numpy(), comm["end"].to_numpy())
        ov = _native.overlap_with_union(comp["start"].to_numpy(), comp["end"].to_numpy(), *u) if len(u[0]) \
            else np.zeros(len(comp), dtype=np.int64)
        dur = (comp["end"] - comp["start"]).to_numpy()
        parts.append(pd.DataFrame({"kernel": comp["name"].to_numpy(), "grid": comp["grid"].to_numpy(),
                                   "block": comp["block"].to_numpy(), "dur": dur,
                                   "frac": np.divide(ov, dur, out=np.zeros(len(dur)), where=dur > 0)}))
    if not parts:
        return pd.DataFrame(columns=COMPUTE_INFLATION_COLUMNS)
    df = pd.concat(parts, ignore_index=True)
    rows = []
    for key, g in df.groupby(["kernel", "grid", "block"], sort=False):
        hi, lo = g[g["frac"] >= HIGH_OVERLAP], g[g["frac"] < LOW_OVERLAP]
        if not len(hi):
            continue  # never overlapped: nothing to say
        row = {"kernel": key[0], "grid": key[1], "block": key[2], "occurrences": len(g),
               "overlapped_n": len(hi), "isolated_n": len(lo)}
        if len(hi) >= MIN_SAMPLES and len(lo) >= MIN_SAMPLES:
            mh, ml = float(np.median(hi["dur"])), float(np.median(lo["dur"]))
            row.update({"median_overlapped_us": mh / NS_PER_US, "median_isolated_us": ml / NS_PER_US,
                        "inflation": (mh / ml - 1.0) if ml > 0 else None,
                        "time_lost_us": float(np.clip(hi["dur"] - ml, 0, None).sum()) / NS_PER_US, "note": ""})
        else:
            row["note"] = f"too few samples (need {MIN_SAMPLES} overlapped and {MIN_SAMPLES} isolated)"
        rows.append(row)
    out = pd.DataFrame(rows).reindex(columns=COMPUTE_INFLATION_COLUMNS)
    return out.sort_values(["time_lost_us", "kernel"], ascending=[False, True], na_position="last").reset_index(drop=True)


# ---------------------------------------------------------------------- part 3

EXPOSED_COLUMNS = ["rank", "step", "window_us", "comm_us", "hidden_us", "exposed_us", "exposed_waiting_us",
                   "exposed_transfer_us", "comp_comm_overlap_pct", "compute_us", "memcpy_memset_us", "idle_us", "note"]


def _exposed_comm(inputs):
    rows = []
    inst = inputs.instances
    last_arrival = inst.groupby("instance")["start"].transform("max") if len(inst) else pd.Series(dtype=np.int64)
    for r, tl in inputs.timelines.items():
        gpu = tl.gpu
        mine = inst["rank"] == r
        wait_s = inst.loc[mine, "start"].to_numpy()
        wait_e = np.minimum(last_arrival[mine].to_numpy(), inst.loc[mine, "end"].to_numpy())
        waiting = _union(wait_s, np.maximum(wait_e, wait_s))
        windows = [("all", int(gpu["start"].min()) if len(gpu) else 0, int(gpu["end"].max()) if len(gpu) else 0)]
        step_names = [n for n in pd.unique(tl.cpu["name"]) if isinstance(n, str) and n.startswith("ProfilerStep#")]
        steps = tl.cpu[tl.cpu["name"].isin(step_names)]
        windows += [(name, int(s), int(e)) for name, s, e in zip(steps["name"], steps["start"], steps["end"])]
        comm_all = _union(gpu.loc[gpu["comm"], "start"].to_numpy(), gpu.loc[gpu["comm"], "end"].to_numpy())
        copy_all = _union(gpu.loc[gpu["kind"] != KIND_KERNEL, "start"].to_numpy(),
                          gpu.loc[gpu["kind"] != KIND_KERNEL, "end"].to_numpy())
        busy_all = _union(gpu["start"].to_numpy(), gpu["end"].to_numpy())
        for step, lo, hi in windows:
            comm = _clip_union(comm_all, lo, hi)
            comp = _clip_union(tl.compute_union, lo, hi)
            c = _union_len(comm)
            hidden = _intersect_len(comm, comp)
            wait_part = _clip_union(waiting, lo, hi)
            wait_in_comm = _intersect_len(wait_part, comm)
            wait_hidden = _intersect_len(_intersect(wait_part, comm), comp)
            exposed = c - hidden
            exposed_wait = wait_in_comm - wait_hidden
            busy = _union_len(_clip_union(busy_all, lo, hi))
            rows.append({
                "rank": r, "step": step, "window_us": (hi - lo) / NS_PER_US, "comm_us": c / NS_PER_US,
                "hidden_us": hidden / NS_PER_US, "exposed_us": exposed / NS_PER_US,
                "exposed_waiting_us": exposed_wait / NS_PER_US, "exposed_transfer_us": (exposed - exposed_wait) / NS_PER_US,
                "comp_comm_overlap_pct": (100.0 * hidden / c) if c else 0.0,
                "compute_us": _union_len(comp) / NS_PER_US,
                "memcpy_memset_us": _union_len(_clip_union(copy_all, lo, hi)) / NS_PER_US,
                "idle_us": max(hi - lo - busy, 0) / NS_PER_US,
                "note": "" if c else "no communication on this rank in this window",
            })
    return pd.DataFrame(rows).reindex(columns=EXPOSED_COLUMNS)


def _intersect(a, b):
    """A ∩ B of two disjoint sorted unions, as a union."""
    if not len(a[0]) or not len(b[0]):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    ia, ib, _ = _native.intersecting_pairs(a[0], a[1], b[0], b[1])
    s = np.maximum(a[0][ia], b[0][ib])
    e = np.minimum(a[1][ia], b[1][ib])
    return _union(s, e)


# ====================================================================== the short answer

def blockers_text(sheets, top=5):
    """What a user reads first: straggler, dominant cause, top blockers, top
    contention pairs -- as plain text lines."""
    lines = []
    b = sheets.get("collective_blockers")
    if b is None or not len(b):
        lines.append("No implicit-sync collective was matched across ranks: nothing waited on anything.")
        return "\n".join(lines)
    by_rank = b.groupby("late_rank").agg(n=("collective_id", "size"), delta=("delta_us", "sum"),
                                         blame=("blame_us", "sum")).sort_values("delta", ascending=False)
    straggler = int(by_rank.index[0])
    lines.append(f"Straggler: rank {straggler} (last to arrive at {int(by_rank.iloc[0]['n'])} of {len(b)} collectives; "
                 f"others waited {by_rank.iloc[0]['delta']:.1f} us for it, blame {by_rank.iloc[0]['blame']:.1f} us)")
    parts = {"host launch lateness": b["host_launch_lateness_us"].sum(), "GPU dependency wait": b["gpu_dependency_wait_us"].sum(),
             "GPU backlog": b["gpu_backlog_us"].sum()}
    total = sum(parts.values())
    cause = max(parts, key=parts.get)
    share = 100.0 * parts[cause] / total if total else 0.0
    lines.append(f"Dominant cause of waiting: {cause} ({parts[cause]:.1f} of {total:.1f} us, {share:.0f}%)  "
                 + "  ".join(f"{k}: {v:.1f} us" for k, v in parts.items() if k != cause))
    k = sheets.get("blocking_kernels")
    lines.append("Top blocking kernels:" if k is not None and len(k) else "Top blocking kernels: none")
    if k is not None:
        for i, row in enumerate(k.head(top).itertuples(), 1):
            excess = f", excess {row.mean_excess_us:.1f} us" if row.mean_excess_us == row.mean_excess_us else ""
            lines.append(f"  {i}. {row.total_blocking_us:10.1f} us  {_short(row.kernel)} grid {row.grid} block {row.block}"
                         f"  ({row.instances_delayed} collectives, rank {row.ranks}{excess})")
    h = sheets.get("blocking_host_ops")
    if h is not None and len(h):
        lines.append("Top blocking host ops:")
        for i, row in enumerate(h.head(top).itertuples(), 1):
            lines.append(f"  {i}. {row.total_blocking_us:10.1f} us  {_short(row.op)}  ({row.instances_delayed} collectives, rank {row.ranks})")
    p = sheets.get("contention_pairs")
    if p is not None and len(p):
        lines.append("Top contention pairs (compute kernel x collective, overlap):")
        for i, row in enumerate(p.head(top).itertuples(), 1):
            risk = "  tail-effect risk" if row.tail_effect_risk is True else ""
            lines.append(f"  {i}. {row.overlap_us:10.1f} us  {_short(row.compute_kernel)} x {row.signature}{risk}")
    return "\n".join(lines)


def _short(name, width=70):
    name = str(name)
    return name if len(name) <= width else name[: width - 3] + "..."


def sheets_from_tables(tables):
    """{sheet: DataFrame} of the correlate.* tables in a stream."""
    return {n[len(TABLE_PREFIX):]: df for n, df in tables.items() if n.startswith(TABLE_PREFIX)}

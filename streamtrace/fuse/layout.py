"""Between the passes: what all ranks' scans decide together (the id stride,
the pid numbering) and the metadata events fuse adds per rank (process names
and sort indices, sibling-lane threads)."""
from ..errors import StreamtraceError
from ..extract import decode_raw_string
from .options import _flags_for, _window_ns

PID_LIMIT = (1 << 31) - 1       # Perfetto and chrome://tracing keep pids as 32-bit ints
SORT_SLOTS = 1000               # process_sort_index = rank * 1000 + slot
GPU_SLOT, STR_SLOT = 100, 900


def _pow10_above(span):
    """Smallest power of ten strictly greater than span (>= 10)."""
    m = 10
    while m <= span:
        m *= 10
    return m


def _id_stride(ranks):
    lo = min((rk.stats["id_min"] for rk in ranks if rk.stats["id_max"] >= rk.stats["id_min"]), default=0)
    hi = max((rk.stats["id_max"] for rk in ranks if rk.stats["id_max"] >= rk.stats["id_min"]), default=0)
    stride = _pow10_above(hi - min(lo, 0))
    top = max(rk.rank for rk in ranks)
    if top * stride + hi > (1 << 63) - 1 or top * stride + lo < -(1 << 63):
        raise StreamtraceError(f"ids up to {hi} and rank {top} do not fit 64-bit ids with a per-rank range; "
                               "fuse fewer or lower ranks")
    return stride


def _process_pids(rk):
    """int pid -> is_gpu, for pids with kept events; string pids (raw) likewise."""
    ints, strs = {}, {}
    for t in rk.tracks:
        if not t["n_kept"]:
            continue
        pid = t["pid"]
        if isinstance(pid, int):
            ints[pid] = ints.get(pid, False) or t["gpu"]
        elif isinstance(pid, bytes):
            strs[pid] = True
    return ints, strs


def _pid_maps(ranks):
    """Per-rank int pid maps: rank * stride + pid (stride a power of ten above
    every kept pid of every rank), or a dense rank * K + ordinal numbering when
    that would not fit 31 bits."""
    per_rank = {rk.rank: _process_pids(rk)[0] for rk in ranks}
    all_pids = [p for pids in per_rank.values() for p in pids]
    lo, hi = (min(all_pids), max(all_pids)) if all_pids else (0, 0)
    stride = _pow10_above(hi - min(lo, 0))
    top = max(rk.rank for rk in ranks)
    dense = top * stride + hi > PID_LIMIT
    if dense:
        stride = _pow10_above(max((len(p) for p in per_rank.values()), default=1) - 1)
    maps = {}
    for rk in ranks:
        pids = sorted(per_rank[rk.rank])
        if dense:
            maps[rk.rank] = {p: rk.rank * stride + i for i, p in enumerate(pids)}
        else:
            maps[rk.rank] = {p: rk.rank * stride + p for p in pids}
    if dense and top * stride + stride > PID_LIMIT:
        raise StreamtraceError(f"rank {top} is too large for 32-bit pids in the fused trace")
    return maps, stride, dense


def rank_pid_string(raw, rank):
    """The fused form of a string pid (raw JSON-escaped bytes): "Spans" ->
    "Spans (rank 3)", "" -> "(rank 3)"."""
    text = decode_raw_string(raw)
    return f"{text} (rank {rank})" if text else f"(rank {rank})"


def _labels(rk, pid_map):
    """The metadata events fuse adds for one rank: process names and sort
    indices, and names for sibling-lane threads.  They carry no args.rank."""
    ints, strs = _process_pids(rk)
    r = rk.rank
    base = r * SORT_SLOTS
    out = []

    def meta(name, pid, tid, args):
        out.append({"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args})

    # names exactly as TraceLens's TraceFuse writes them ("RANK r - CPU" /
    # "RANK r - GPU": scripts match them); what tells a rank's processes
    # apart (the device, or the pid of one of several CPU processes) goes in
    # a process_labels record, which Perfetto shows next to the name
    cpu = sorted(p for p, gpu in ints.items() if not gpu)
    for i, p in enumerate(cpu):
        meta("process_name", pid_map[p], 0, {"name": f"RANK {r} - CPU"})
        if len(cpu) > 1:
            meta("process_labels", pid_map[p], 0, {"labels": f"pid {p}"})
        meta("process_sort_index", pid_map[p], 0, {"sort_index": base + min(i, GPU_SLOT - 1)})
    for p in sorted(p for p, gpu in ints.items() if gpu):
        meta("process_name", pid_map[p], 0, {"name": f"RANK {r} - GPU"})
        meta("process_labels", pid_map[p], 0, {"labels": f"GPU {p}"})
        meta("process_sort_index", pid_map[p], 0,
             {"sort_index": base + GPU_SLOT + min(max(p, 0), STR_SLOT - GPU_SLOT - 1)})
    for i, raw in enumerate(sorted(strs)):
        pid = rank_pid_string(raw, r)
        meta("process_name", pid, 0, {"name": pid})
        meta("process_sort_index", pid, 0, {"sort_index": base + min(STR_SLOT + i, SORT_SLOTS - 1)})
    return out


def _lanes(rk, pid_map):
    """Give each track with sibling lanes its lane tids (in C) and return the
    thread metadata naming them."""
    out = []
    used = {}
    for t in rk.tracks:
        if isinstance(t["pid"], int) and isinstance(t["tid"], int):
            used.setdefault(t["pid"], set()).add(t["tid"])
    next_tid = {p: max(tids) + 1 for p, tids in used.items()}
    for t in sorted(rk.tracks, key=lambda t: (str(t["pid"]), str(t["tid"]))):
        if t["n_lanes"] <= 1:
            continue
        pid, tid = t["pid"], t["tid"]
        if isinstance(pid, int):
            out_pid = pid_map.get(pid, pid)
        elif isinstance(pid, bytes):
            out_pid = rank_pid_string(pid, rk.rank)
        else:
            continue
        name = decode_raw_string(t["name"]).strip() if t["name"] is not None else None
        if isinstance(tid, int):
            first = next_tid.get(pid, tid + 1)
            rk.fz.set_lane_base(t["index"], first)
            next_tid[pid] = first + t["n_lanes"] - 1
            lane_tids = [first + k - 1 for k in range(1, t["n_lanes"])]
            label = name or f"thread {tid}"
        elif isinstance(tid, bytes):
            text = decode_raw_string(tid)
            lane_tids = [f"{text} (lane {k})" for k in range(1, t["n_lanes"])]
            label = name or text
        else:
            continue
        sort = t["sort_index"] if t["sort_index"] is not None else (tid if isinstance(tid, int) else None)
        for k, lt in enumerate(lane_tids, start=1):
            out.append({"name": "thread_name", "ph": "M", "pid": out_pid, "tid": lt,
                        "args": {"name": f"{label} (lane {k})"}})
            if sort is not None:
                out.append({"name": "thread_sort_index", "ph": "M", "pid": out_pid, "tid": lt,
                            "args": {"sort_index": sort}})
    return out


def configure_rank(rk, opts):
    """The rank's rewriter (``rk.fz``, after its scan) set up for the write
    pass with the layout decided (``rk.id_offset``, ``rk.pid_map``, ``rk.shift_ns``)."""
    rk.fz.configure(rank=rk.rank, flags=_flags_for(rk, opts), id_offset=rk.id_offset, ts_shift_ns=rk.shift_ns,
                    window=_window_ns(opts))
    rk.fz.set_pid_map(list(rk.pid_map), list(rk.pid_map.values()))

"""Tiny hand-built Kineto traces for collective-report tests.

``coll_kernel(...)`` makes one NCCL kernel event carrying the comm args of a
2024+ trace; ``write_trace(path, events, rank=..., ...)`` writes a trace file
around a list of events.  Times are given as decimal-string microseconds and
written verbatim, so the analysis sees exactly those values.
"""
import json

NCCL_ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
NCCL_SENDRECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"


class Num(str):
    """A number written verbatim into the JSON (keeps every decimal digit)."""


def coll_kernel(ts, dur, coll="allreduce", dtype="Float", nelems=1048576, out_nelems=None, group_size=4,
                pg="0", ranks=None, stream=20, device=0, corr=1, seq=None, in_split="[]", out_split="[]",
                name=NCCL_ALLREDUCE, ext=None):
    args = {"External id": ext if ext is not None else corr, "device": device, "stream": stream, "correlation": corr}
    if coll is not None:
        args.update({"Collective name": coll, "dtype": dtype, "In msg nelems": nelems,
                     "Out msg nelems": nelems if out_nelems is None else out_nelems, "Group size": group_size,
                     "In split size": in_split, "Out split size": out_split, "Process Group Name": pg,
                     "Process Group Description": "default_pg",
                     "Process Group Ranks": ranks if ranks is not None else str(list(range(group_size)))})
    if seq is not None:
        args["Seq"] = seq
    return {"ph": "X", "cat": "kernel", "name": name, "pid": device, "tid": stream, "ts": Num(ts), "dur": Num(dur),
            "args": args}


def compute_kernel(ts, dur, name="void gemm_kernel<128>(float const*, float*)", stream=7, device=0, corr=1):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": device, "tid": stream, "ts": Num(ts), "dur": Num(dur),
            "args": {"External id": corr, "device": device, "stream": stream, "correlation": corr}}


def _dump(v):
    if isinstance(v, Num):
        return str(v)
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_dump(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_dump(x) for x in v) + "]"
    return json.dumps(v)


def write_trace(path, events, rank=None, world_size=None, gpus=None, base=None, pg_config=None):
    """Write a Kineto-style trace; ``gpus``: number of deviceProperties entries."""
    doc = {"schemaVersion": 1}
    if gpus:
        doc["deviceProperties"] = [{"id": i, "name": "NVIDIA H100", "totalGlobalMem": 85029158912} for i in range(gpus)]
    if rank is not None:
        dist = {"backend": "nccl", "rank": rank, "world_size": world_size}
        if pg_config is not None:
            dist["pg_config"] = pg_config
        doc["distributedInfo"] = dist
    doc["traceEvents"] = events
    if base is not None:
        doc["baseTimeNanoseconds"] = base
    with open(path, "w") as f:
        f.write(_dump(doc))
    return str(path)

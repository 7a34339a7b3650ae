"""Slow, obviously-correct reference extractor: json.load + plain Python.

It states what each record field must hold, independently of the C code:
``json`` parses the whole document (floats as Decimal, so no rounding), and the
rules below turn each event into the same fields ``extract`` writes.  Tests
compare the two on real traces and fixtures.
"""
import gzip
import json
from decimal import ROUND_HALF_EVEN, Decimal, localcontext

import numpy as np

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
NONE = INT64_MIN

COMM_INT_KEYS = {"In msg nelems": "in_nelems", "Out msg nelems": "out_nelems", "Group size": "group_size",
                 "Process Group ID": "pg_id", "Seq": "seq", "Rank": "rank"}
#: int32 fields, -1 when absent or out of range (as st_kernel's)
COMM_INT32_KEYS = {"Dst Rank": "dst_rank", "Src Rank": "src_rank"}
COMM_STR_KEYS = {"Collective name": "collective_name", "dtype": "dtype", "Process Group Name": "pg_name",
                 "Process Group Description": "pg_desc", "Process Group Ranks": "pg_ranks",
                 "In split size": "in_split", "Out split size": "out_split", "Comms Id": "comms_id"}
KERNEL_KEYS = {"grid", "block", "registers per thread", "shared memory", "blocks per SM", "warps per SM",
               "est. achieved occupancy %"}


def load_json(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    elif data[:4] == b"\x28\xb5\x2f\xfd":
        import zstandard

        data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
    return json.loads(data, parse_float=Decimal)


def scaled_int(v, scale):
    """Exact value * 10^scale, half-even, or NONE when not a representable number."""
    if isinstance(v, bool) or not isinstance(v, (int, Decimal)):
        return NONE
    if isinstance(v, Decimal) and not v.is_finite():
        return NONE
    v = Decimal(v)
    if v.adjusted() > 40:  # far outside int64 whatever the scale
        return NONE
    with localcontext() as ctx:
        ctx.prec = 200
        x = int((v.scaleb(scale)).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))
    return x if INT64_MIN <= x <= INT64_MAX else NONE


def int32_or_minus1(v):
    x = scaled_int(v, 0)
    return x if x != NONE and -(2**31) <= x < 2**31 else -1


def as_float32(v):
    if isinstance(v, bool) or not isinstance(v, (int, Decimal)):
        return np.float32("nan")
    return np.float32(float(v))


def dim3(v):
    if isinstance(v, list) and len(v) == 3:
        xs = [scaled_int(x, 0) for x in v]
        if all(x != NONE and -(2**31) <= x < 2**31 for x in xs):
            return xs
    return [-1, -1, -1]


def raw_or_string(v):
    """Comm string args: the string itself; other JSON values as parsed JSON."""
    return v if isinstance(v, str) else ("json", v)


def wants_input_dims(name):
    return isinstance(name, str) and (name.startswith("nccl:") or name.startswith("c10d::")
                                      or name == "record_param_comms")


def id_field(v):
    if isinstance(v, str):
        return v
    return None if scaled_int(v, 0) == NONE else scaled_int(v, 0)


def event_record(ev):
    """(event dict, kernel dict or None, comm dict or None) for one event."""
    args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
    ph = ev.get("ph")
    ts = scaled_int(ev.get("ts"), 3) if "ts" in ev else NONE
    dur = scaled_int(ev.get("dur"), 3) if "dur" in ev else NONE
    rec = {
        "ph": ph[0] if isinstance(ph, str) and ph else "",
        "cat": ev.get("cat") if isinstance(ev.get("cat"), str) else None,
        "name": ev.get("name") if isinstance(ev.get("name"), str) else None,
        "pid": id_field(ev.get("pid")),
        "tid": id_field(ev.get("tid")),
        "id": id_field(ev.get("id")),
        "ts": None if ts == NONE else ts,
        "dur": None if dur == NONE else dur,
        "scope": ev["s"][0] if isinstance(ev.get("s"), str) and ev["s"] else "",
        "bp_e": ev.get("bp") == "e",
        "correlation": NONE, "external_id": NONE, "value": NONE,
        "stream": -1, "device": -1, "cbid": -1, "label": None,
    }
    kernel, comm = None, {}
    dims = {}
    for key, v in args.items():
        if key in ("External id", "external id"):
            rec["external_id"] = _last_number(rec["external_id"], v)
        elif key == "correlation":
            rec["correlation"] = _last_number(rec["correlation"], v)
        elif key in ("bytes", "sort_index"):
            rec["value"] = _last_number(rec["value"], v)
        elif key in ("stream", "device"):
            rec[key] = _last_int32(rec[key], v)
        elif key in ("cbid", "cid"):
            rec["cbid"] = _last_int32(rec["cbid"], v)
        elif key in ("name", "labels"):
            if isinstance(v, str):
                rec["label"] = v
        elif key in KERNEL_KEYS:
            kernel = kernel or {"grid": [-1] * 3, "block": [-1] * 3, "registers_per_thread": -1,
                                "shared_memory": -1, "blocks_per_sm": np.float32("nan"),
                                "warps_per_sm": np.float32("nan"), "occupancy_pct": np.float32("nan")}
            if key in ("grid", "block"):
                kernel[key] = dim3(v)
            elif key == "registers per thread":
                kernel["registers_per_thread"] = int32_or_minus1(v)
            elif key == "shared memory":
                kernel["shared_memory"] = int32_or_minus1(v)
            else:
                field = {"blocks per SM": "blocks_per_sm", "warps per SM": "warps_per_sm",
                         "est. achieved occupancy %": "occupancy_pct"}[key]
                kernel[field] = as_float32(v)
        elif key in COMM_INT_KEYS:
            comm[COMM_INT_KEYS[key]] = _last_number(comm.get(COMM_INT_KEYS[key], NONE), v)
        elif key in COMM_INT32_KEYS:
            comm[COMM_INT32_KEYS[key]] = _last_int32(comm.get(COMM_INT32_KEYS[key], -1), v)
        elif key in COMM_STR_KEYS:
            comm[COMM_STR_KEYS[key]] = raw_or_string(v)
        elif key in ("Input Dims", "Input type"):
            dims[key] = v
    if not (isinstance(ph, str) and ph[:1] == "M"):
        rec["label"] = None
    if dims and wants_input_dims(rec["name"]):
        comm["input_dims"] = ("json", dims["Input Dims"]) if "Input Dims" in dims else None
        comm["input_type"] = ("json", dims["Input type"]) if "Input type" in dims else None
    return rec, kernel, (comm if comm else None)


def _last_number(current, v):
    if isinstance(v, str) or v is None or isinstance(v, (dict, list)):
        return current  # strings, null and containers leave the field as it was
    return scaled_int(v, 0)


def _last_int32(current, v):
    if isinstance(v, str) or v is None or isinstance(v, (dict, list)):
        return current
    return int32_or_minus1(v)


def reference_extract(path, keep_pyfunc=False):
    """(document, [(event, kernel, comm), ...]) for the events extract keeps."""
    doc = load_json(path)
    events = doc if isinstance(doc, list) else doc.get("traceEvents", [])
    out = []
    for ev in events:
        if not keep_pyfunc and ev.get("cat") == "python_function":
            continue
        out.append(event_record(ev))
    return doc, out

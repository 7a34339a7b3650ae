"""Pure-Python reference for the fuse tests: what each rank's fused events must be.

Independent of the C rewriter: inputs are parsed with the stdlib (or ijson for
truncated files), the selection rules of docs/fuse.md are applied in Python,
and fused events are mapped back to their inputs by undoing the documented
rewrites, checking each rewrite on the way.
"""
import io
import json
import re
import zlib
from decimal import Decimal

PROCESS_META = {"process_name", "process_sort_index", "process_labels"}
ADDED_ARGS = ("rank", "pid_raw", "tid_raw", "lane", "id_raw", "correlation_raw", "External id_raw",
              "external id_raw", "args_raw")
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "Kernel", "Memcpy", "Memset"}
ID_ARGS = ("correlation", "External id", "external id")


def read_bytes(path):
    """The decompressed bytes of a (possibly truncated) .json/.gz/.zst file."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        out, d = [], zlib.decompressobj(31)
        while raw:
            try:
                out.append(d.decompress(raw))
            except zlib.error:
                break
            raw = d.unused_data if d.eof else b""
            if d.eof and raw:
                d = zlib.decompressobj(31)
        return b"".join(out)
    if raw[:4] == b"\x28\xb5\x2f\xfd":
        import zstandard

        try:
            return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw), read_across_frames=True).read()
        except zstandard.ZstdError:
            d = zstandard.ZstdDecompressor().decompressobj()
            return d.decompress(raw)
    return raw


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _no_constant(name):
    raise ValueError(f"non-JSON constant {name}")


def _no_lone_surrogates(value):
    """Every string (keys too) encodes as UTF-8: a lone surrogate escape
    ("\\ud800") decodes in Python but is no Unicode text (RFC 8259 8.2)."""
    if isinstance(value, str):
        value.encode("utf-8")
    elif isinstance(value, dict):
        for k, v in value.items():
            k.encode("utf-8")
            _no_lone_surrogates(v)
    elif isinstance(value, list):
        for v in value:
            _no_lone_surrogates(v)


def load_strict(source):
    """Parse with a strict JSON parser: UTF-8 only, no NaN/Infinity, no
    duplicate keys (compared decoded, at any depth), no lone surrogates;
    floats as Decimal (exact)."""
    data = read_bytes(source) if isinstance(source, str) else source
    doc = json.loads(data.decode("utf-8"), parse_float=Decimal, parse_constant=_no_constant,
                     object_pairs_hook=_no_duplicates)
    _no_lone_surrogates(doc)
    return doc


def _last_wins(pairs):
    """Duplicate keys: the last one's value, at the last one's position (the
    place fuse writes it)."""
    out = {}
    for k, v in pairs:
        out.pop(k, None)
        out[k] = v
    return out


def load_last_wins(data):
    """What a lenient reader (Python's json, JSON.parse, Perfetto) makes of a
    document with duplicate keys: the last value of each key, keys compared
    decoded (``"a"`` and ``"\\u0061"`` are one key); floats as Decimal."""
    return json.loads(data.decode("utf-8"), parse_float=Decimal, object_pairs_hook=_last_wins)


def ordered(value):
    """A value with every object as a list of its items: == then compares key
    order too."""
    if isinstance(value, dict):
        return [(k, ordered(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [ordered(v) for v in value]
    return value


def input_events(path, truncated=False):
    """(events, top-level members) of one input trace; floats as Decimal.

    For a truncated file, the complete events before the cut (via ijson)."""
    data = read_bytes(path)
    if not truncated:
        doc = json.loads(data.decode("utf-8"), parse_float=Decimal)
        if isinstance(doc, list):
            return doc, {}
        return doc["traceEvents"], {k: v for k, v in doc.items() if k != "traceEvents"}
    import ijson

    prefix = "item" if data.lstrip()[:1] == b"[" else "traceEvents.item"
    events = []
    try:
        for ev in ijson.items(io.BytesIO(data), prefix, use_float=False):
            events.append(ev)
    except ijson.common.IncompleteJSONError:
        pass
    return events, {}


def _num(v):
    return isinstance(v, (int, Decimal)) and not isinstance(v, bool)


def select(events, include_pyfunc=False, keep_spans=False, cats=None, name_regex=None, window=None,
           nccl_only=False, shift_ns=0):
    """The events fuse keeps from one rank, in file order (docs/fuse.md)."""
    kept = []
    rx = re.compile(name_regex) if name_regex is not None else None
    for e in events:
        if e.get("ph") == "M":
            if e.get("name") in PROCESS_META:
                continue
            kept.append(e)
            continue
        cat = e.get("cat")
        if not include_pyfunc and cat == "python_function":
            continue
        if not keep_spans and cat == "Trace":
            continue
        if cats is not None and cat not in cats:
            continue
        name = e.get("name") if isinstance(e.get("name"), str) else ""
        if nccl_only and not (cat in ("kernel", "Kernel") and "nccl" in name.lower()):
            continue
        if window is not None and _num(e.get("ts")):
            lo, hi = window
            t0 = int(Decimal(e["ts"]) * 1000) + shift_ns
            dur = e.get("dur")
            t1 = t0 + (max(int(Decimal(dur) * 1000), 0) if _num(dur) else 0)
            if (lo is not None and t1 < lo) or (hi is not None and t0 > hi):
                continue
        if rx is not None and not rx.search(name):
            continue
        kept.append(e)
    pids = {e["pid"] for e in kept if e.get("ph") != "M" and type(e.get("pid")) is int}
    return [e for e in kept if not (e.get("ph") == "M" and type(e.get("pid")) is int and e["pid"] not in pids)]


def rank_pid(raw, rank):
    return f"{raw} (rank {rank})" if raw else f"(rank {rank})"


def undo(e, info, rank):
    """The input event a fused event came from, checking every rewrite.

    ``info`` is the rank's entry of ``streamtrace.io.reading`` (id_offset,
    pid_map, ts_shift_ns)."""
    e = dict(e)  # only top-level fields and args are rewritten
    args = e["args"] = dict(e["args"])
    assert args.pop("rank") == rank
    if "pid" in e or "pid_raw" in args:
        raw = args.pop("pid_raw")
        if type(raw) is int:
            assert e["pid"] == info["pid_map"][str(raw)], (e, raw)
        elif isinstance(raw, str):
            assert e["pid"] == rank_pid(raw, rank), (e["pid"], raw)
        else:
            assert e["pid"] == raw
        e["pid"] = raw
    if "lane" in args:
        lane = args.pop("lane")
        assert lane >= 1
        raw = args.pop("tid_raw")
        if isinstance(raw, str):
            assert e["tid"] == f"{raw} (lane {lane})"
        e["tid"] = raw
    off = info["id_offset"]
    if "id" in e or "id_raw" in args:
        raw = args.pop("id_raw")
        assert e["id"] == (raw + off if type(raw) is int else raw), (e, raw, off)
        e["id"] = raw
    for key in ID_ARGS:
        if key + "_raw" in args:
            raw = args.pop(key + "_raw")
            assert args[key] == (raw + off if type(raw) is int else raw), (key, args[key], raw, off)
            args[key] = raw
    if "args_raw" in args:
        e["args"] = args.pop("args_raw")
        assert not args
    if _num(e.get("ts")):
        shift = Decimal(info["ts_shift_ns"]) / 1000
        e["ts"] = Decimal(e["ts"]) - shift
    return e


def rank_events(doc, rank):
    """The fused events that came from ``rank`` (added metadata has no args.rank)."""
    return [e for e in doc["traceEvents"] if isinstance(e.get("args"), dict) and e["args"].get("rank") == rank]


def added_events(doc):
    return [e for e in doc["traceEvents"] if not (isinstance(e.get("args"), dict) and "rank" in e["args"])]


def _canon(e):
    return json.dumps(e, sort_keys=True, default=str)


def _same_keys(a, b):
    """== compares numbers by value (Decimal("1.50") == 1.5); also require the
    same kinds of values at the top level (a string is never a number)."""
    return all(_num(a[k]) == _num(b[k]) and isinstance(a[k], str) == isinstance(b[k], str) for k in a)


def check_rank(doc, rank, expected):
    """Every expected input event appears exactly once, in order, with its
    fields intact except the documented rewrites."""
    info = doc["streamtrace"]["inputs"][str(rank)]
    got = rank_events(doc, rank)
    assert len(got) == len(expected), f"rank {rank}: {len(got)} fused events, expected {len(expected)}"
    for i, (g, x) in enumerate(zip(got, expected)):
        u = undo(g, info, rank)
        if "args" not in x and u.get("args") == {}:
            del u["args"]
        assert u == x and _same_keys(u, x), f"rank {rank} event {i}:\n fused  {_canon(g)}\n undone {_canon(u)}\n input  {_canon(x)}"
    return got


def interval_violations(ivs):
    """How many of the intervals ``(start, -end)`` overlap an earlier one
    without nesting in it (0 for a well-formed Perfetto track)."""
    bad, stack = 0, []
    for t0, neg_end in sorted(ivs):
        end = -neg_end
        while stack and stack[-1] <= t0:
            stack.pop()
        if stack and stack[-1] < end:
            bad += 1
            continue
        stack.append(end)
    return bad

"""``dump``: any part of an event stream as JSON lines or CSV.

One writer (``write_table``) serves every table, so every ``--what`` has the
same formats.  Tables are made frame by frame as the stream is read:
memory is one frame and the strings of the ranks seen, whatever the
stream's length.  ``summary`` unpacks no record at all: extract counted
what it shows into each rank's META frame, and the record counts are in
the frames' envelopes.  Its JSON lines and CSV are written without pandas
(``_summary_rows``): importing pandas would be most of its time.
"""
import csv
import json
import math
import os
import sys

from .stream.format import Kind, RankData, iter_frames


def _summary_row(rank, meta, counts):
    """One row per rank: what extract found."""
    s = meta.get("summary") or {}
    first, end = s.get("first_ts"), s.get("last_end")
    span_ms = float(end - first) / 1e6 if first is not None and end is not None else 0.0
    return {
        "rank": rank,
        "source": os.path.basename(meta.get("source", "")),
        "world_size": meta.get("world_size"),
        "events": counts.get(Kind.EVENTS, 0),
        "kernels": s.get("kernels", 0),
        "nccl_kernels": s.get("nccl_kernels", 0),
        "comm_records": counts.get(Kind.COMMS, 0),
        "gpu_streams": s.get("gpu_streams", 0),
        "span_ms": round(span_ms, 3),
        "pyfunc_skipped": meta.get("counts", {}).get("pyfunc_skipped", 0),
        "warnings": len(meta.get("warnings", [])),
    }


_COLLECTIVE_EVENT_COLUMNS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "stream", "correlation", "external_id"]


class _Rank:
    """What dump keeps of a rank while its frames go by: its strings (the
    records' ids index them), how many events came before the current frame,
    and, for ``collectives``, the event frames that comm records may still
    point into."""

    def __init__(self, rank):
        self.data = RankData(rank)
        self.meta = None
        self.counts = {}
        self.events_before = 0
        self.pending = []   # (first event index, records) of event frames not yet joined

    def view(self, **records):
        """A RankData of this rank's strings and the given records."""
        return RankData(self.data.rank, self.meta or {}, self.data.strings, **records)

    def collectives(self, frame):
        """A COMMS frame's rows joined with their events' identity and
        timing; event frames before the first event it uses are let go."""
        import numpy as np
        import pandas as pd

        from ._native import EVENT_DTYPE
        from .stream.records import comms_frame, events_frame

        comms = frame.records()
        index = comms["event"].astype(np.int64)
        low = int(index.min()) if len(index) else self.events_before
        self.pending = [(start, e) for start, e in self.pending if start + len(e) > low]
        events = np.zeros(len(comms), dtype=EVENT_DTYPE)
        found = np.zeros(len(comms), dtype=bool)
        for start, e in self.pending:
            inside = (index >= start) & (index < start + len(e))
            events[inside] = e[index[inside] - start]
            found |= inside
        if not found.all():
            raise frame.error(f"corrupt COMMS frame: comm record {int(np.argmin(found))} points at event "
                              f"{int(index[np.argmin(found)])}, which the stream does not hold")
        joined = events_frame(self.view(events=events))[_COLLECTIVE_EVENT_COLUMNS]
        return pd.concat([joined, comms_frame(self.view(comms=comms))], axis=1)


def _summary_rows(source, what="summary"):
    """(rank, row) of every rank of one stream, in rank order, once the
    whole stream checked out (every frame's checksum and envelope, as
    iter_frames reads it): only META payloads are decoded.  ``what``:
    "summary" (``_summary_row``) or "meta" (the META object, rank first)."""
    metas, counts = {}, {}
    for frame in iter_frames(source):
        kind = frame.kind
        if kind in (Kind.END, Kind.TABLE):
            continue
        c = counts.setdefault(frame.rank, {})
        if kind == Kind.META:
            metas[frame.rank] = frame.json()
        elif kind in Kind.RECORDS:
            c[kind] = c.get(kind, 0) + frame.count()
    for rank in sorted(counts):
        if what == "meta":
            yield rank, {"rank": rank, **(metas.get(rank) or {})}
        else:
            yield rank, _summary_row(rank, metas.get(rank) or {}, counts[rank])


def _tables(source, what):
    """(rank, DataFrame) pieces of table ``what`` of one stream, in stream order."""
    import pandas as pd

    from .stream.records import events_frame, kernels_frame

    ranks = {}
    for frame in iter_frames(source):
        if frame.kind in (Kind.END, Kind.TABLE):
            continue
        r = ranks.get(frame.rank)
        if r is None:
            r = ranks[frame.rank] = _Rank(frame.rank)
        kind = frame.kind
        if kind == Kind.STRINGS:
            first, strings = frame.strings()
            if first != len(r.data.strings):
                raise frame.error(f"string frame starts at id {first}, expected {len(r.data.strings)}")
            r.data.strings.extend(strings)
            if what == "strings":
                yield frame.rank, pd.DataFrame({"id": range(first, first + len(strings)), "string": strings})
        elif kind == Kind.META:
            r.meta = frame.json()
        elif kind in Kind.RECORDS:
            r.counts[kind] = r.counts.get(kind, 0) + frame.count()
            if what == "events" and kind == Kind.EVENTS:
                yield frame.rank, events_frame(r.view(events=frame.records()))
            elif what == "kernels" and kind == Kind.KERNELS:
                yield frame.rank, kernels_frame(r.view(kernels=frame.records()))
            elif what == "collectives" and kind == Kind.EVENTS:
                r.pending.append((r.events_before, frame.records()))
            elif what == "collectives" and kind == Kind.COMMS:
                yield frame.rank, r.collectives(frame)
            if kind == Kind.EVENTS:
                r.events_before += frame.count()
    # a rank's metadata and summary are a row each: printed once the whole
    # stream checked out, so that a damaged stream prints only its error
    for rank in sorted(ranks):
        r = ranks[rank]
        if what == "summary":
            yield rank, pd.DataFrame([_summary_row(rank, r.meta or {}, r.counts)])
        elif what == "meta":
            yield rank, pd.DataFrame([{"rank": rank, **(r.meta or {})}])


def _jsonable(v):
    if v is None or _is_na(v):
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    if hasattr(v, "item"):
        return v.item()
    return v


def _is_na(v):
    pd = sys.modules.get("pandas")   # pd.NA can only come from pandas, imported then
    return pd is not None and v is pd.NA


def write_rows(rows, fmt, out, header=True):
    """Write dicts of plain values (one set of keys) as JSON lines or CSV,
    the text ``write_table`` gives for the same one-row DataFrames."""
    if fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        for row in rows:
            if header:
                writer.writerow(row)
                header = False
            writer.writerow(["" if v is None else json.dumps(v) if isinstance(v, (dict, list)) else v
                             for v in row.values()])
        return
    for row in rows:
        out.write(json.dumps({c: _jsonable(v) for c, v in row.items()}, default=str))
        out.write("\n")


def write_table(df, fmt, out, header=True):
    """Write a DataFrame as JSON lines, CSV or an aligned text table."""
    if fmt == "table":
        out.write(df.to_string(index=False, header=header) + "\n")
        return
    if fmt == "csv":
        nested = [c for c in df.columns if df[c].map(lambda v: isinstance(v, (dict, list))).any()]
        if nested:
            df = df.copy()
            for c in nested:
                df[c] = df[c].map(lambda v: json.dumps(v) if isinstance(v, (dict, list)) else v)
        df.to_csv(out, index=False, header=header)
        return
    columns = list(df.columns)
    for row in df.itertuples(index=False, name=None):
        out.write(json.dumps({c: _jsonable(v) for c, v in zip(columns, row)}, default=str))
        out.write("\n")


def dump_stream(sources, what, fmt, out, ranks=None):
    """Write table ``what`` of every rank, piece by piece as the stream is
    read (an aligned text table needs every row first, so it is printed
    once, at the end)."""
    if what in ("summary", "meta") and fmt != "table":   # no pandas: a row of plain values per rank
        first = True
        for source in sources:
            rows = [row for r, row in _summary_rows(source, what) if ranks is None or r in ranks]
            write_rows(rows, fmt, out, header=first)
            first = first and not rows
        return
    import pandas as pd

    first, held = True, []
    for source in sources:
        for r, df in _tables(source, what):
            if ranks is not None and r not in ranks:
                continue
            if what not in ("meta", "summary"):
                df.insert(0, "rank", r)
            if fmt == "table":
                held.append(df)
                continue
            write_table(df, fmt, out, header=first)
            first = False
    if held:
        write_table(pd.concat(held, ignore_index=True), fmt, out)

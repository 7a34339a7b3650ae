"""Figures of a collective report, for a notebook or the HTML report.

Every function takes the report's finished sheets -- the ``{sheet name:
DataFrame}`` that ``generate_collective_report`` or ``report.build_report``
return -- and gives a plotly ``Figure``, or None when the sheets hold no
data for it::

    from streamtrace import generate_collective_report, plots
    sheets = generate_collective_report(trace_dir="run/", world_size=8, write_files=False)
    plots.wait_heatmap(sheets).show()

``charts(sheets)`` gives every figure with the one sentence the HTML report
prints under it and the numbers behind it (``Chart``).  Large runs are
binned or cut to their largest rows so that a page stays small and quick to
draw; each chart's ``note`` says which.
"""
import dataclasses
import re

import numpy as np
import pandas as pd

#: most heatmap cells drawn for one process group (ranks x instance columns)
HEATMAP_MAX_CELLS = 150_000
#: most instance columns of a heatmap, whatever the rank count
HEATMAP_MAX_COLUMNS = 1_000
#: most points of the skew and latency chart (two panels), over all kinds; a
#: kind reduced to its share is drawn as a line, one SVG path, where markers
#: are an SVG element each (on the dense set 12,000 markers took 1.5 s of
#: chromium's time)
SCATTER_MAX_POINTS = 3_000
#: most markers of the bandwidth chart, over all series
BANDWIDTH_MAX_POINTS = 1_000
#: per-rank charts above this many ranks draw lines, not a bar or marker per rank
PER_RANK_MARKS = 256
#: most profiler steps marked on the time axis; beyond, every k-th step
STEP_MARKS_MAX = 20
#: most process groups that get a heatmap (the ones with most instances)
HEATMAP_MAX_GROUPS = 4
#: most bars in the per-instance blocking chart (the largest delays)
BLOCKER_MAX_BARS = 300
#: rows in the top-N bar charts
TOP_N = 15
#: rank x rank send matrix: ranks are summed into at most this many bins
MATRIX_MAX_SIDE = 256

_COLOURS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C", "#CCB974",
            "#64B5CD"]
_CAUSE_COLUMNS = [("host_launch_lateness_us", "host launch lateness", "#DD8452"),
                  ("gpu_dependency_wait_us", "GPU dependency wait", "#8172B3"),
                  ("gpu_backlog_us", "GPU backlog", "#C44E52")]


@dataclasses.dataclass
class Chart:
    """One chart of the report: its figure, the sentence under it, the
    numbers it shows (``data``, plain lists; the HTML page embeds them) and
    how a large run was reduced (``note``, empty when every row is drawn)."""
    key: str
    title: str
    figure: object
    sentence: str
    data: dict
    note: str = ""


# ---------------------------------------------------------------------- helpers

def _go():
    try:
        import plotly.graph_objects as go
    except ImportError:
        from .errors import StreamtraceError
        raise StreamtraceError("charts need plotly: pip install 'streamtrace[html]' (or pip install plotly)") \
            from None
    return go


def _sheet(sheets, name):
    df = sheets.get(name)
    if df is None or not len(df):
        return None
    return df


def fmt_us(us):
    """A duration given in microseconds, in the unit that reads best."""
    if us is None or not np.isfinite(us):
        return "n/a"
    a = abs(us)
    if a >= 1e6:
        return f"{us / 1e6:.2f} s"
    if a >= 1e3:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.1f} us"


def fmt_mib(mib):
    b = mib * 2 ** 20
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if b >= size:
            return f"{b / size:.3g} {unit}"
    return f"{b:.0f} B"


def _txt(text):
    """Text as plotly shows it literally: plotly.js reads a subset of HTML in
    titles, names, labels and hover text, so a name such as "<b>x</b>" or
    "<a href=...>" from a trace must reach it with its markup escaped."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _txts(values):
    return [_txt(v) for v in values]


def _short(text, n=60):
    text = str(text)
    return text if len(text) <= n else text[:n - 1] + "\u2026"


def _floats(series):
    return pd.to_numeric(series, errors="coerce").astype(float)


def _list(values):
    """Numbers as JSON-able floats (NaN as None)."""
    out = np.asarray(values, dtype=float).tolist()
    return [v if v == v else None for v in out]


def _layout(fig, title, height=420, **kw):
    fig.update_layout(template="plotly_white", height=height, margin=dict(l=70, r=20, t=40, b=50),
                      title=dict(text=title, x=0.01, font=dict(size=15)), hoverlabel=dict(namelength=-1),
                      legend=dict(orientation="h", y=-0.18), **kw)
    return fig


_WAIT = re.compile(r"^rank_(\d+)_wait_time$")


def _rank_columns(df, pattern):
    out = []
    for c in df.columns:
        m = pattern.match(str(c))
        if m:
            out.append((int(m.group(1)), c))
    return sorted(out)


def _start_times(df):
    """Each instance's first arrival (us): the earliest rank_<r>_ts."""
    cols = [c for _, c in _rank_columns(df, re.compile(r"^rank_(\d+)_ts$"))]
    if not cols:
        return pd.Series(np.arange(len(df), dtype=float), index=df.index)
    return df[cols].apply(pd.to_numeric, errors="coerce").min(axis=1)


def _per_rank(go, ranks, values, name, colour, hover, stack=False, marker=None):
    """One value per rank: bars (or markers) up to PER_RANK_MARKS ranks, else
    one line (a filled, stacked area for ``stack``), which the browser draws
    as one path instead of an element per rank."""
    if len(ranks) <= PER_RANK_MARKS:
        if marker:
            return go.Scatter(x=ranks, y=values, mode="markers", name=name, hovertemplate=hover,
                              marker=dict(color=colour, size=7, symbol=marker))
        return go.Bar(x=ranks, y=values, name=name, marker_color=colour, hovertemplate=hover)
    extra = dict(stackgroup="ranks") if stack else dict(fill="tozeroy") if not marker else {}
    return go.Scatter(x=ranks, y=values, mode="lines", name=name, line=dict(color=colour, width=1),
                      hovertemplate=hover, **extra)


# ---------------------------------------------------------------------- 1. wait heatmap

def _wait_heatmap(sheets):
    imp = _sheet(sheets, "nccl_implicit_sync")
    if imp is None:
        return None
    waits = _rank_columns(imp, _WAIT)
    if not waits:
        return None
    go = _go()
    from plotly.subplots import make_subplots

    imp = imp.assign(_start=_start_times(imp).to_numpy())
    pg = imp["Process Group Name"].astype(str) if "Process Group Name" in imp else pd.Series("all", index=imp.index)
    counts = pg.value_counts(sort=True)
    groups = list(counts.index[:HEATMAP_MAX_GROUPS])
    notes = []
    if len(counts) > len(groups):
        notes.append(f"the {len(groups)} process groups with most instances of {len(counts)}")
    fig = make_subplots(rows=len(groups), cols=1, vertical_spacing=0.12 / max(1, len(groups)),
                        subplot_titles=[_txt(f"process group {_short(g, 40)}") for g in groups])
    data, sentences, height = {"groups": []}, [], 0
    for i, g in enumerate(groups, start=1):
        ranks, z, ids, late = _group_waits(imp[pg == g].sort_values("_start", kind="stable"), waits)
        n = z.shape[1]
        ncols = max(1, min(HEATMAP_MAX_COLUMNS, HEATMAP_MAX_CELLS // max(1, len(ranks)), n))
        labels, binned = ids, ncols < n
        if binned:
            z_shown, late_shown, labels = _binned_waits(z, late, ids, ncols)
            notes.append(f"group {_short(g, 40)}: {n:,} instances in {ncols:,} columns, each the largest wait of "
                         f"about {n / ncols:.0f} consecutive instances, marked with the late rank of its "
                         "most skewed one")
        else:
            z_shown, late_shown = z, late
        _add_wait_panel(fig, go, i, _txts(labels), z_shown, late_shown, ranks)
        height += min(700, 160 + 14 * min(len(ranks), 40))
        data["groups"].append({"group": g, "ranks": ranks, "instances": labels, "binned": binned,
                               "wait_us": [_list(r) for r in z_shown], "late_rank": _list(late_shown)})
        sentence = _late_rank_sentence(g, z, late, ranks)
        if sentence:
            sentences.append(sentence)
    _layout(fig, "Wait time per rank and collective instance", height=max(360, height),
            coloraxis=dict(colorscale="YlOrRd", colorbar=dict(title="wait (us)")))
    sentence = ("; ".join(sentences) + ".") if sentences else "No instance has a late rank."
    return Chart("wait_heatmap", "Wait time: rank \u00d7 collective instance", fig, sentence[0].upper() + sentence[1:],
                 data, "; ".join(notes))


def _group_waits(rows, waits):
    """One process group's instances (in time order): the ranks with a wait,
    their waits (ranks x instances), the instance ids and each one's late rank."""
    present = [(r, c) for r, c in waits if rows[c].notna().any()]
    ranks = [r for r, _ in present]
    z = rows[[c for _, c in present]].apply(pd.to_numeric, errors="coerce").to_numpy(float).T  # ranks x inst
    ids = rows["collective_id"].astype(str).tolist()
    if "straggler_rank" in rows:
        late = pd.to_numeric(rows["straggler_rank"], errors="coerce").to_numpy(float)
    else:   # the last arriver waited least
        late = np.array([ranks[int(np.nanargmin(col))] if np.isfinite(col).any() else np.nan for col in z.T])
    return ranks, z, ids, late


def _binned_waits(z, late, ids, ncols):
    """``ncols`` columns of consecutive instances: each the largest wait per
    rank, marked with the late rank of its most skewed instance."""
    skew = np.nanmax(np.where(np.isfinite(z), z, -np.inf), axis=0) if z.size else np.zeros(0)
    n = z.shape[1]
    edges = np.linspace(0, n, ncols + 1).astype(int)
    zb = np.full((z.shape[0], ncols), np.nan)
    lateb, lab = np.full(ncols, np.nan), []
    for b in range(ncols):
        lo, hi = edges[b], edges[b + 1]
        block = z[:, lo:hi]
        with np.errstate(all="ignore"):
            zb[:, b] = np.where(np.isfinite(block).any(axis=1), np.nanmax(np.where(np.isfinite(block), block,
                                                                                  -np.inf), axis=1), np.nan)
        worst = lo + int(np.argmax(skew[lo:hi]))
        lateb[b] = late[worst]
        lab.append(f"{ids[lo]} \u2026 {ids[hi - 1]}" if hi - lo > 1 else ids[lo])
    return zb, lateb, lab


def _add_wait_panel(fig, go, row, labels, z_shown, late_shown, ranks):
    """One process group's heatmap, with the late ranks as markers over it."""
    fig.add_trace(go.Heatmap(z=z_shown.astype(np.float32), x=labels, y=ranks, colorscale="YlOrRd",
                             coloraxis="coloraxis",
                             hovertemplate="instance %{x}<br>rank %{y}<br>wait %{z:.1f} us<extra></extra>"),
                  row=row, col=1)
    fig.add_trace(go.Scatter(x=labels, y=late_shown, mode="markers", name="late rank", legendgroup="late",
                             showlegend=row == 1, marker=dict(symbol="x-thin", size=7, color="#1f1f1f",
                                                              line=dict(width=1.5, color="#1f1f1f")),
                             hovertemplate="instance %{x}<br>late rank %{y}<extra></extra>"), row=row, col=1)
    fig.update_xaxes(showticklabels=False, title_text="instance, in time order", row=row, col=1)
    fig.update_yaxes(title_text="rank", autorange="reversed", row=row, col=1,
                     type="category" if len(ranks) <= 64 else "linear")


def _late_rank_sentence(g, z, late, ranks):
    """The rank most often last in group ``g``, from every instance (not the
    binned view), and how long the others waited for it; None without one."""
    valid = np.isfinite(late)
    if not valid.any():
        return None
    from .confidence import most_often_last, tie_words

    n = z.shape[1]
    tops, count = most_often_last(late[valid])
    if len(tops) > 1:   # a tie is said as one (the report's header names the same ranks)
        return (f"a tie: {tie_words(tops)} each arrived last at {count:,} of the {n:,} collectives of process "
                f"group {_short(g, 40)}")
    top = tops[0]
    share = count / n
    mine = late == top
    others = np.delete(z, ranks.index(int(top)), axis=0)[:, mine] if int(top) in ranks else z[:, mine]
    with np.errstate(all="ignore"):
        wait = float(np.nanmean(others)) if np.isfinite(others).any() else float("nan")
    return (f"rank {int(top)} arrived last at {share:.0%} of the {n:,} collectives of process "
            f"group {_short(g, 40)}; the others waited {fmt_us(wait)} for it on average")


def wait_heatmap(sheets):
    """Heatmap of each rank's wait (us) per implicit-sync instance in time
    order, one panel per process group, the late rank of each marked."""
    c = _wait_heatmap(sheets)
    return c.figure if c else None


# ---------------------------------------------------------------------- 2. skew and latency over time

def _reduce_points(df, value, cap):
    """At most ``cap`` rows of ``df`` (sorted by time): the row with the
    largest ``value`` of each run of consecutive rows."""
    if len(df) <= cap:
        return df, False
    edges = np.linspace(0, len(df), cap + 1).astype(int)
    v = df[value].to_numpy(float)
    keep = [lo + int(np.nanargmax(v[lo:hi])) if np.isfinite(v[lo:hi]).any() else lo
            for lo, hi in zip(edges[:-1], edges[1:])]
    return df.iloc[keep], True


def _skew_timeline(sheets, steps=None):
    imp = _sheet(sheets, "nccl_implicit_sync")
    if imp is None or "skew in start time" not in imp:
        return None
    go = _go()
    from plotly.subplots import make_subplots

    df = pd.DataFrame({"collective_id": imp["collective_id"].astype(str),
                       "kind": imp["Collective name"].astype(str) if "Collective name" in imp else "collective",
                       "pg": imp["Process Group Name"].astype(str) if "Process Group Name" in imp else "",
                       "start": _start_times(imp).to_numpy(float),
                       "skew": _floats(imp["skew in start time"]).to_numpy(),
                       "latency": _floats(imp["comm_latency"]).to_numpy()})
    t0 = np.nanmin(df["start"]) if df["start"].notna().any() else 0.0
    df["t_s"] = (df["start"] - t0) / 1e6
    df = df.sort_values("start", kind="stable")
    kinds = list(dict.fromkeys(df["kind"]))
    cap = max(100, SCATTER_MAX_POINTS // 2 // max(1, len(kinds)))   # two panels
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=["arrival skew (skew in start time)", "communication latency (comm_latency)"])
    data, reduced = {"kinds": []}, False
    for i, kind in enumerate(kinds):
        part = df[df["kind"] == kind]
        colour = _COLOURS[i % len(_COLOURS)]
        for row, col in ((1, "skew"), (2, "latency")):
            shown, cut = _reduce_points(part, col, cap)
            reduced |= cut
            fig.add_trace(go.Scatter(x=shown["t_s"], y=shown[col], mode="lines" if cut else "markers",
                                     name=_txt(_short(kind, 40)), legendgroup=kind, showlegend=row == 1,
                                     marker=dict(size=5, color=colour), line=dict(color=colour, width=1),
                                     customdata=np.stack([_txts(shown["collective_id"]), _txts(shown["pg"])],
                                                         axis=1),
                                     hovertemplate="%{customdata[0]} (group %{customdata[1]})<br>t %{x:.6f} s<br>"
                                                   + col + " %{y:.1f} us<extra>" + _txt(_short(kind, 30))
                                                   + "</extra>"),
                          row=row, col=1)
            data["kinds"].append({"kind": kind, "metric": col, "collective_id": shown["collective_id"].tolist(),
                                  "t_s": _list(shown["t_s"]), "value_us": _list(shown[col])})
    fig.update_yaxes(title_text="us", row=1, col=1)
    fig.update_yaxes(title_text="us", row=2, col=1)
    fig.update_xaxes(title_text="time since the first collective (s)", row=2, col=1)
    _layout(fig, "Arrival skew and communication latency over time", height=560)
    data["steps"], steps_sentence, steps_note = _step_marks(fig, steps, t0)
    worst = df.loc[df["skew"].idxmax()] if df["skew"].notna().any() else None
    sentence = (f"The largest arrival skew was {fmt_us(worst['skew'])} ({_short(worst['kind'], 40)} "
                f"{worst['collective_id']} at {worst['t_s']:.3f} s); the median skew is "
                f"{fmt_us(np.nanmedian(df['skew']))} and the median communication latency "
                f"{fmt_us(np.nanmedian(df['latency']))}." if worst is not None else "No skew was measured.")
    note = (f"{len(df):,} instances: a kind with more than {cap:,} is drawn as a line through the largest value "
            f"of each of {cap:,} runs of its consecutive instances" if reduced else "")
    note = "; ".join(x for x in (note, steps_note) if x)
    return Chart("skew_timeline", "Arrival skew and latency over time", fig, sentence + " " + steps_sentence, data,
                 note)


def _step_marks(fig, steps, t0):
    """Mark each profiler step's start (``steps``: ``steps.step_table``'s
    DataFrame, on the sheets' timeline; None when there was no step data to
    look in) on both panels as a dotted line, its number at the top:
    (the steps as data, the sentence saying where they come from, a note
    when only every k-th one is marked)."""
    if steps is None:
        return None, ("Profiler steps are not marked: the report had no events to find them in (a stream of "
                      "tables only, or sheets alone)."), ""
    steps = steps[np.isfinite(_floats(steps["start_us"]))].sort_values("step")
    if not len(steps):
        return {"step": []}, "Profiler steps are not marked: the traces hold no ProfilerStep#N annotations.", ""
    number = steps["step"].astype(int).to_numpy()
    t_s = (_floats(steps["start_us"]).to_numpy() - t0) / 1e6
    every = -(-len(steps) // STEP_MARKS_MAX)
    shapes, labels = [], []
    for n, t in zip(number[::every].tolist(), t_s[::every].tolist()):
        for axis in ("", "2"):
            shapes.append(dict(type="line", xref="x" + axis, yref=f"y{axis} domain", x0=t, x1=t, y0=0, y1=1,
                               line=dict(color="#6b7280", width=1, dash="dot"), layer="below"))
        labels.append(dict(text=str(n), xref="x", yref="y domain", x=t, y=1, xanchor="left", yanchor="top",
                           showarrow=False, font=dict(size=10, color="#6b7280")))
    fig.update_layout(shapes=list(fig.layout.shapes) + shapes, annotations=list(fig.layout.annotations) + labels)
    data = {"step": number.tolist(), "start_us": _list(steps["start_us"]), "t_s": _list(t_s),
            "last_start_us": _list(steps["last_start_us"]), "ranks": steps["ranks"].astype(int).tolist(),
            "marked_every": every}
    span = f"#{number[0]}" if len(number) == 1 else f"#{number[0]} to #{number[-1]}"
    sentence = (f"Dotted lines mark where each profiler step starts ({len(number):,} step"
                f"{'s' if len(number) != 1 else ''}, {span}, numbered at the top): the earliest rank's "
                "ProfilerStep#N annotation.")
    note = f"one profiler step in {every} marked, of {len(number):,}" if every > 1 else ""
    return data, sentence, note


def skew_timeline(sheets, steps=None):
    """Arrival skew and communication latency (us) of each implicit-sync
    instance against time, by collective kind; ``steps`` (the report's step
    table, ``streamtrace.steps.step_table``) marks the profiler steps."""
    c = _skew_timeline(sheets, steps)
    return c.figure if c else None


# ---------------------------------------------------------------------- 3. bandwidth against size

def _bandwidth(sheets):
    imp = _sheet(sheets, "nccl_implicit_sync")
    if imp is None or "bus bw (GB/s)" not in imp:
        return None
    df = pd.DataFrame({"collective_id": imp["collective_id"].astype(str),
                       "kind": imp["Collective name"].astype(str),
                       "group_size": pd.to_numeric(imp["Group size"], errors="coerce"),
                       "size_mib": _floats(imp["Full msg size (MB)"]), "bus_bw": _floats(imp["bus bw (GB/s)"])})
    df = df[np.isfinite(df["size_mib"]) & np.isfinite(df["bus_bw"]) & (df["size_mib"] > 0) & (df["bus_bw"] > 0)]
    if not len(df):
        return None
    go = _go()
    fig = go.Figure()
    keys = list(dict.fromkeys(zip(df["kind"], df["group_size"])))
    cap = max(100, BANDWIDTH_MAX_POINTS // max(1, len(keys)))
    data, sampled, best = {"series": []}, False, None
    for i, (kind, n) in enumerate(keys):
        part = df[(df["kind"] == kind) & (df["group_size"] == n)]
        colour = _COLOURS[i % len(_COLOURS)]
        label = _txt(f"{_short(kind, 30)}, {int(n) if n == n else '?'} ranks")
        shown = part
        if len(part) > cap:   # evenly spaced rows, so every size keeps its share
            shown, sampled = part.iloc[np.linspace(0, len(part) - 1, cap).astype(int)], True
        med = part.groupby("size_mib", sort=True)["bus_bw"].median()
        fig.add_trace(go.Scatter(x=shown["size_mib"], y=shown["bus_bw"], mode="markers", name=label,
                                 legendgroup=label, marker=dict(size=5, color=colour, opacity=0.45),
                                 customdata=_txts(shown["collective_id"]),
                                 hovertemplate="%{customdata}<br>%{x:.4g} MiB<br>%{y:.3g} GB/s<extra>" + label
                                               + "</extra>"))
        fig.add_trace(go.Scatter(x=med.index, y=med.to_numpy(), mode="lines+markers", name=f"median, {label}",
                                 legendgroup=label, showlegend=False, line=dict(color=colour, width=2),
                                 marker=dict(size=8, symbol="diamond", color=colour),
                                 hovertemplate="median at %{x:.4g} MiB: %{y:.3g} GB/s<extra>" + label + "</extra>"))
        data["series"].append({"kind": kind, "group_size": None if n != n else int(n),
                               "sizes_mib": _list(med.index), "median_bus_bw": _list(med.to_numpy()),
                               "points": len(part), "shown": len(shown)})
        top = med.idxmax()
        if best is None or med.max() > best[0]:
            best = (med.max(), label, top)
    fig.update_xaxes(type="log", title_text="message size (MiB, log)")
    fig.update_yaxes(type="log", title_text="bus bandwidth (GB/s, log)")
    _layout(fig, "Bus bandwidth against message size", height=480)
    smallest = df.loc[df["size_mib"].idxmin()]
    small_med = df[df["size_mib"] == smallest["size_mib"]]["bus_bw"].median()
    sentence = (f"The highest median bus bandwidth is {best[0]:.3g} GB/s ({best[1]}, {fmt_mib(best[2])}); at the "
                f"smallest size, {fmt_mib(smallest['size_mib'])}, the median is {small_med:.3g} GB/s.")
    note = "bandwidth from comm_latency, the last arriver's kernel time: transfer, not waiting"
    if sampled:
        note += f"; {len(df):,} instances: at most {cap:,} evenly spaced points per series, medians from all"
    return Chart("bandwidth", "Bus bandwidth against message size", fig, sentence, data, note)


def bandwidth(sheets):
    """Bus bandwidth (GB/s) against message size (MiB), log-log, by
    collective kind and group size, with the median per size."""
    c = _bandwidth(sheets)
    return c.figure if c else None


# ---------------------------------------------------------------------- 4. all-to-all-v

def _all2allv(sheets):
    hm = _sheet(sheets, "nccl_all2allv_heatmap")
    a2 = _sheet(sheets, "nccl_all2allv")
    if hm is None and a2 is None:
        return None
    go = _go()
    imb = _floats(a2["size_imbalance"]) if a2 is not None and "size_imbalance" in a2 else pd.Series(dtype=float)
    imb_text = (f"; the size imbalance (largest rank's bytes / mean) of the {len(a2):,} all-to-all-v instances "
                f"has median {np.nanmedian(imb):.2f} and maximum {np.nanmax(imb):.2f}") if imb.notna().any() else ""
    if hm is not None:
        src, dst = hm["src_rank"].astype(int), hm["dst_rank"].astype(int)
        mb = _floats(hm["total_sent_MB"]).fillna(0.0)
        side = int(max(src.max(), dst.max())) + 1
        step = max(1, -(-side // MATRIX_MAX_SIDE))
        nb = -(-side // step)
        m = np.zeros((nb, nb))
        np.add.at(m, (src.to_numpy() // step, dst.to_numpy() // step), mb.to_numpy())
        axis = list(range(0, side, step))
        fig = go.Figure(go.Heatmap(z=m, x=axis, y=axis, colorscale="Blues", colorbar=dict(title="MiB"),
                                   hovertemplate="from rank %{y}<br>to rank %{x}<br>%{z:.4g} MiB<extra></extra>"))
        fig.update_xaxes(title_text="destination rank (position in the split list)")
        fig.update_yaxes(title_text="source rank", autorange="reversed")
        _layout(fig, "All-to-all-v bytes sent, rank \u00d7 rank", height=520)
        sent = m.sum(axis=1)
        top = int(np.argmax(sent))
        mean = sent.mean() if sent.size else 0.0
        sentence = (f"Rank {axis[top]} sends the most, {fmt_mib(sent[top])} in all, "
                    f"{sent[top] / mean:.2f}\u00d7 the mean rank{imb_text}." if mean > 0
                    else f"No bytes were sent{imb_text}.")
        note = (f"ranks summed into bins of {step}" if step > 1 else "")
        return Chart("all2allv", "All-to-all-v send matrix", fig, sentence,
                     {"ranks": axis, "sent_mib": [_list(r) for r in m], "bin": step}, note)
    # no matrix: what each rank sent, from the per-rank sizes of nccl_all2allv
    cols = _rank_columns(a2, re.compile(r"^rank_(\d+)_In msg size \(MB\)$"))
    if not cols:
        return None
    ranks = [r for r, _ in cols]
    sent = a2[[c for _, c in cols]].apply(pd.to_numeric, errors="coerce").sum(axis=0).to_numpy(float)
    fig = go.Figure(_per_rank(go, ranks, sent, "MiB sent", _COLOURS[0],
                              "rank %{x}<br>%{y:.4g} MiB sent<extra></extra>"))
    fig.update_xaxes(title_text="rank", type="category" if len(ranks) <= 64 else "linear")
    fig.update_yaxes(title_text="MiB sent (all instances)")
    _layout(fig, "All-to-all-v bytes sent per rank", height=380)
    top = int(np.argmax(sent))
    sentence = (f"Rank {ranks[top]} sends the most, {fmt_mib(sent[top])} in all, "
                f"{sent[top] / sent.mean():.2f}\u00d7 the mean rank{imb_text}." if sent.mean() > 0
                else f"No bytes were sent{imb_text}.")
    return Chart("all2allv", "All-to-all-v bytes per rank", fig, sentence, {"ranks": ranks, "sent_mib": _list(sent)},
                 "the rank \u00d7 rank matrix needs the nccl_all2allv_heatmap sheet (--all2allv_heatmap)")


def all2allv(sheets):
    """The all-to-all-v send matrix (MiB, source x destination), or the
    bytes each rank sent when the report has no heatmap sheet."""
    c = _all2allv(sheets)
    return c.figure if c else None


# ---------------------------------------------------------------------- 5. blocking analysis

def _blocking_breakdown(sheets):
    cb = _sheet(sheets, "collective_blockers")
    if cb is None:
        return None
    go = _go()
    df = cb.copy()
    df["delta_us"] = _floats(df["delta_us"])
    total = df["delta_us"].sum()
    shown, note = df, ""
    if len(df) > BLOCKER_MAX_BARS:
        shown = df.nlargest(BLOCKER_MAX_BARS, "delta_us").sort_index()
        note = f"the {BLOCKER_MAX_BARS} largest delays of {len(df):,}"
    fig = go.Figure()
    labels = [_txt(f"{cid} (rank {lr})") for cid, lr in zip(shown["collective_id"].astype(str), shown["late_rank"])]
    data = {"collective_id": shown["collective_id"].astype(str).tolist(), "late_rank": _list(shown["late_rank"]),
            "delta_us": _list(shown["delta_us"])}
    shares = []
    for col, name, colour in _CAUSE_COLUMNS:
        v = _floats(shown[col])
        fig.add_trace(go.Bar(x=labels, y=v, name=name, marker_color=colour,
                             hovertemplate="%{x}<br>" + name + " %{y:.1f} us<extra></extra>"))
        data[col] = _list(v)
        shares.append((_floats(df[col]).sum(), name))
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text="instance (late rank)", showticklabels=len(shown) <= 60)
    fig.update_yaxes(title_text="\u0394 = late arrival \u2212 first arrival (us)")
    _layout(fig, "Why the late rank was late", height=440)
    shares.sort(reverse=True)
    parts = ", ".join(f"{name} {v / total:.0%}" for v, name in shares) if total > 0 else ""
    sentence = (f"Over {len(df):,} late instances ({fmt_us(total)} of delay in all) the delay splits into "
                f"{parts}: {shares[0][1]} dominates." if total > 0 else "The late ranks caused no measurable delay.")
    return Chart("blocking_breakdown", "Why the late rank was late", fig, sentence, data, note)


def blocking_breakdown(sheets):
    """Stacked bars: each late instance's delay split into host launch
    lateness, GPU dependency wait and GPU backlog (us)."""
    c = _blocking_breakdown(sheets)
    return c.figure if c else None


def _top_bars(sheets, sheet, label_col, value_col, key, title, what, extra=None):
    df = _sheet(sheets, sheet)
    if df is None:
        return None
    go = _go()
    df = df.assign(**{value_col: _floats(df[value_col])}).nlargest(TOP_N, value_col)
    if extra:
        labels = [f"{_short(a, 55)} \u2194 {_short(b, 45)}" for a, b in zip(df[label_col], df[extra])]
    else:
        labels = [_short(a, 90) for a in df[label_col]]
    # the same short label twice would merge two bars: number them
    labels = [_txt(f"{i + 1}. {lab}") for i, lab in enumerate(labels)]
    full = df[label_col].astype(str).tolist()
    fig = go.Figure(go.Bar(y=labels[::-1], x=df[value_col].to_numpy()[::-1], orientation="h",
                           marker_color=_COLOURS[3 if "blocking" in sheet else 0],
                           customdata=[_txt(_short(s, 300)) for s in full[::-1]],
                           hovertemplate="%{customdata}<br>%{x:.1f} us<extra></extra>"))
    fig.update_xaxes(title_text=f"{value_col} (us)" if not value_col.endswith("_us") else value_col)
    fig.update_yaxes(automargin=True)
    _layout(fig, title, height=max(300, 90 + 28 * len(df)))
    first = df.iloc[0]
    sentence = what(first)
    data = {"label": full, value_col: _list(df[value_col])}
    note = f"the top {TOP_N} of {len(sheets[sheet]):,} rows" if len(sheets[sheet]) > TOP_N else ""
    return Chart(key, title, fig, sentence, data, note)


def _blocking_kernels(sheets):
    return _top_bars(sheets, "blocking_kernels", "kernel", "total_blocking_us", "blocking_kernels",
                     "Top blocking kernels",
                     lambda r: (f"{_short(r['kernel'], 80)} delayed {int(r['instances_delayed'])} instances on "
                                f"rank(s) {r['ranks']} by {fmt_us(r['total_blocking_us'])} in all "
                                f"(excess up to {fmt_us(float(r['max_excess_us']))} over its median elsewhere)."))


def _blocking_host_ops(sheets):
    return _top_bars(sheets, "blocking_host_ops", "op", "total_blocking_us", "blocking_host_ops",
                     "Top blocking host ops",
                     lambda r: (f"{_short(r['op'], 80)} ran in the launch gap of {int(r['instances_delayed'])} "
                                f"late instances on rank(s) {r['ranks']}, {fmt_us(r['total_blocking_us'])} in all."))


def _contention(sheets):
    return _top_bars(sheets, "contention_pairs", "compute_kernel", "overlap_us", "contention_pairs",
                     "Top contention pairs (compute kernel \u2194 collective)",
                     lambda r: (f"{_short(r['compute_kernel'], 80)} shared the GPU with {_short(r['signature'], 60)} "
                                f"for {fmt_us(r['overlap_us'])} over {int(r['occurrences'])} occurrences."),
                     extra="signature")


def blocking_kernels(sheets):
    """The kernels that delayed late collectives most (total us)."""
    c = _blocking_kernels(sheets)
    return c.figure if c else None


def blocking_host_ops(sheets):
    """The host ops in the launch gaps of late collectives (total us)."""
    c = _blocking_host_ops(sheets)
    return c.figure if c else None


def contention_pairs(sheets):
    """The compute kernel / collective pairs that overlapped longest (us)."""
    c = _contention(sheets)
    return c.figure if c else None


def _exposed(sheets):
    ex = _sheet(sheets, "exposed_comm")
    if ex is None:
        return None
    whole = ex[ex["step"].astype(str) == "all"] if "step" in ex else ex
    if not len(whole):
        return None
    go = _go()
    whole = whole.sort_values("rank")
    ranks = whole["rank"].astype(int).tolist()
    fig = go.Figure()
    data = {"rank": ranks}
    for col, name, colour in (("hidden_us", "hidden (under compute)", "#55A868"),
                              ("exposed_waiting_us", "exposed, waiting", "#C44E52"),
                              ("exposed_transfer_us", "exposed, transfer", "#DD8452")):
        v = _floats(whole[col])
        fig.add_trace(_per_rank(go, ranks, v, name, colour, "rank %{x}<br>" + name + " %{y:.1f} us<extra></extra>",
                                stack=True))
        data[col] = _list(v)
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text="rank", type="category" if len(ranks) <= 64 else "linear")
    fig.update_yaxes(title_text="communication time (us)")
    _layout(fig, "Exposed and hidden communication per rank", height=420)
    comm = _floats(whole["comm_us"]).to_numpy()
    exposed = _floats(whole["exposed_us"]).to_numpy()
    i = int(np.nanargmax(exposed))
    sentence = (f"Rank {ranks[i]} has the most exposed communication, {fmt_us(exposed[i])} of its "
                f"{fmt_us(comm[i])} ({exposed[i] / comm[i]:.0%}); over all ranks {np.nansum(exposed) / np.nansum(comm):.0%} "
                "of communication time is not hidden under compute." if np.nansum(comm) > 0
                else "No rank has communication time.")
    return Chart("exposed_comm", "Exposed and hidden communication per rank", fig, sentence, data,
                 "whole run (step 'all' of exposed_comm)")


def exposed_comm(sheets):
    """Hidden and exposed (waiting, transfer) communication per rank (us)."""
    c = _exposed(sheets)
    return c.figure if c else None


# ---------------------------------------------------------------------- 6. clock offsets

def _clocks(sheets):
    ck = _sheet(sheets, "clock_alignment")
    if ck is None or ("collectives" in ck and not (_floats(ck["collectives"]) > 0).any()):
        return None   # no collective to estimate an offset from
    go = _go()
    from plotly.subplots import make_subplots

    ck = ck.sort_values("rank")
    ranks = ck["rank"].astype(int).tolist()
    off, res, mx = _floats(ck["offset_us"]), _floats(ck["residual_us"]), _floats(ck["max_residual_us"])
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                        subplot_titles=["estimated clock offset", "residual end skew after the offset"])
    fig.add_trace(_per_rank(go, ranks, off, "offset", _COLOURS[0], "rank %{x}<br>offset %{y:.3f} us<extra></extra>"),
                  row=1, col=1)
    fig.add_trace(_per_rank(go, ranks, res, "residual (typical)", _COLOURS[1],
                            "rank %{x}<br>residual %{y:.3f} us<extra></extra>", marker="circle"), row=2, col=1)
    fig.add_trace(_per_rank(go, ranks, mx, "residual (max)", _COLOURS[3],
                            "rank %{x}<br>max residual %{y:.3f} us<extra></extra>", marker="triangle-up"),
                  row=2, col=1)
    fig.update_yaxes(title_text="us", row=1, col=1)
    fig.update_yaxes(title_text="us", row=2, col=1)
    fig.update_xaxes(title_text="rank", row=2, col=1)
    fig.update_xaxes(type="category" if len(ranks) <= 64 else "linear")
    _layout(fig, "Clock offsets per rank", height=460)
    i = int(np.nanargmax(np.abs(off.to_numpy()))) if off.notna().any() else 0
    applied = "applied" in ck and ck["applied"].astype(str).str.lower().eq("true").any()
    sentence = (f"The largest estimated offset is rank {ranks[i]}'s, {off.iloc[i]:.3f} us (typical residual "
                f"{res.iloc[i]:.3f} us); the offsets are {'applied to' if applied else 'not applied to'} the "
                "report's times.")
    return Chart("clocks", "Clock offsets per rank", fig, sentence,
                 {"rank": ranks, "offset_us": _list(off), "residual_us": _list(res), "max_residual_us": _list(mx)})


def clock_offsets(sheets):
    """Estimated clock offset and residual end skew per rank (us)."""
    c = _clocks(sheets)
    return c.figure if c else None


_PATH_CATEGORIES = [("compute", "#4C72B0"), ("communication", "#55A868"), ("late rank wait", "#C44E52"),
                    ("p2p wait", "#DA8BC3"), ("host launch gap", "#DD8452"), ("idle", "#8C8C8C")]


def _critical_path(sheets):
    """The critical path of each step as a stacked bar (the time by
    category), the ranks it passed through in the hover and the sentence
    (the critical_path sheet of ``streamtrace whatif`` and ``blockers``)."""
    path = _sheet(sheets, "critical_path")
    if path is None:
        return None
    go = _go()
    per = path.pivot_table(index="step", columns="category", values="dur_us", aggfunc="sum", fill_value=0.0)
    ranks = path.groupby("step")["rank"].agg(lambda r: " ".join(map(str, dict.fromkeys(r.tolist()))))
    steps = [str(s) for s in per.index.tolist()]
    fig = go.Figure()
    data = {"step": per.index.tolist(), "ranks_visited": ranks.reindex(per.index).tolist()}
    for cat, colour in _PATH_CATEGORIES:
        if cat not in per.columns:
            continue
        v = per[cat].astype(float)
        fig.add_trace(go.Bar(x=steps, y=v, name=cat, marker_color=colour,
                             customdata=ranks.reindex(per.index).tolist(),
                             hovertemplate="step %{x}<br>" + cat + " %{y:.1f} us<br>ranks %{customdata}<extra></extra>"))
        data[cat] = _list(v)
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text="profiler step", type="category")
    fig.update_yaxes(title_text="time on the critical path (us)")
    _layout(fig, "The critical path of each step", height=420)
    total = per.to_numpy().sum()
    shares = sorted(((per[c].sum(), c) for c in per.columns), reverse=True)
    parts = ", ".join(f"{c} {v / total:.0%}" for v, c in shares if v > 0) if total > 0 else ""
    sentence = (f"Over {len(per):,} steps the chain that ends each step spends its time on {parts}; "
                f"it passes through ranks {ranks.iloc[0]} in the first step." if total > 0
                else "No step has a critical path.")
    return Chart("critical_path", "The critical path of each step", fig, sentence, data)


def critical_path(sheets):
    """Stacked bars: each step's critical path by category (us)."""
    c = _critical_path(sheets)
    return c.figure if c else None


# ---------------------------------------------------------------------- all of them

_BUILDERS = [_wait_heatmap, _skew_timeline, _bandwidth, _all2allv, _blocking_breakdown, _critical_path,
             _blocking_kernels, _blocking_host_ops, _exposed, _contention, _clocks]


def charts(sheets, steps=None):
    """Every chart the sheets have data for, in the report's order;
    ``steps`` (see ``skew_timeline``) goes to the one with a time axis."""
    built = (build(sheets, steps) if build is _skew_timeline else build(sheets) for build in _BUILDERS)
    return [c for c in built if c is not None]

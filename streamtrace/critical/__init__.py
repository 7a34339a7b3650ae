"""The critical path across ranks and what-if replays (docs/critical-path.md).

``compute(tables)`` -> {"critical_path", "critical_path_summary",
"critical_steps"}: DataFrames from the ``critical.*`` tables the blocking
analysis' reduce makes (``chain.correlated_tables(..., critical=True)``).
``whatif(tables, scenarios=None)`` adds "whatif".  Imports point one way:
this package reads align's and correlate's results; only cli, chain and the
report read it.
"""
import numpy as np
import pandas as pd

from ..errors import StreamtraceError
from .graph import NODES, STEPS, SYNCS, node_tables, instance_rows   # noqa: F401 (the reduce's entry)

PATH_COLUMNS = ["step", "order", "category", "detail", "rank", "waited_for", "start_us", "end_us", "dur_us",
                "share_pct"]


def graphs(tables):
    """[(step, replay.StepGraph)] of the run (every step's graph at once:
    ``iter_graphs`` makes one at a time)."""
    return list(iter_graphs(tables))


def iter_graphs(tables):
    """(step, replay.StepGraph) of each step in turn, each made from the
    step's rows only and let go before the next is made."""
    from .replay import StepGraph

    if NODES not in tables:
        raise StreamtraceError("no critical-path graph in these tables: make them with "
                               "correlated_tables(..., critical=True)")
    nodes, syncs, steps = tables[NODES], tables[SYNCS], tables[STEPS]
    by_step_syncs = dict(tuple(syncs.groupby("step"))) if len(syncs) else {}
    for step, part in nodes.groupby("step", sort=True):
        w = steps[steps["step"] == step]
        starts = dict(zip(w["rank"].tolist(), w["start"].tolist()))
        sy = by_step_syncs.get(step, syncs.iloc[:0])
        yield int(step), StepGraph(part.sort_values(["start", "rank"], kind="stable"), sy, starts)


def compute(tables, _graphs=None):
    """{"critical_path": segments per step (last segment of the step first
    as walked, ``order`` 0 = the step's first), "critical_path_summary": per
    category and detail (kernel identity, collective, rank waited for)
    summed over steps, "critical_steps": per step its time and the ranks its
    path passes through}."""
    gs = iter_graphs(tables) if _graphs is None else _graphs
    parts, steps = [], []
    for step, g in gs:
        segs = g.path()[::-1]
        total = g.step_time()
        if segs:
            cat, detail, rank, s, e, waited = zip(*segs)
            s, e = np.asarray(s, np.float64), np.asarray(e, np.float64)
            parts.append(pd.DataFrame({
                "step": step, "order": np.arange(len(segs)), "category": cat, "detail": detail,
                "rank": np.asarray(rank, np.int64), "waited_for": waited, "start_us": (s - g.ref) / 1e3,
                "end_us": (e - g.ref) / 1e3, "dur_us": (e - s) / 1e3,
                "share_pct": 100.0 * (e - s) / total if total else 0.0}))
        visited = list(dict.fromkeys(int(seg[2]) for seg in segs))
        steps.append((step, total / 1e3, " ".join(map(str, visited)), len(segs)))
    rows = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=PATH_COLUMNS)
    path = rows[PATH_COLUMNS].copy()
    path["waited_for"] = pd.array([None if pd.isna(w) else int(w) for w in path["waited_for"]], dtype="Int64")
    summary = _summary(path)
    return {"critical_path": path, "critical_path_summary": summary,
            "critical_steps": pd.DataFrame(steps, columns=["step", "step_us", "ranks_visited", "segments"])}


def _summary(path):
    if not len(path):
        return pd.DataFrame(columns=["category", "detail", "dur_us", "segments", "steps", "share_pct", "ranks"])
    total = path.groupby("step")["dur_us"].sum().sum()
    g = path.groupby(["category", "detail"], sort=False)
    out = g.agg(dur_us=("dur_us", "sum"), segments=("dur_us", "size"), steps=("step", "nunique"),
                ranks=("rank", lambda r: " ".join(map(str, sorted(set(r.tolist())))))).reset_index()
    out["share_pct"] = 100.0 * out["dur_us"] / total if total else 0.0
    out = out.sort_values("dur_us", ascending=False, kind="stable").reset_index(drop=True)
    return out[["category", "detail", "dur_us", "segments", "steps", "share_pct", "ranks"]]


def whatif(tables, scenarios=None, percent=None, one_per_kind=False):
    """compute()'s DataFrames and "whatif": per step and scenario the
    measured step time, the estimated one with the change and the saving.
    ``scenarios``: names (scenarios.parse) or Scenario objects; None: the
    candidates the run's critical paths suggest (``one_per_kind``: only the
    first of each kind, for a quick answer: blockers' line)."""
    from .scenarios import DEFAULT_PERCENT, RunFacts, candidates, parse

    # two passes a step at a time: the paths (which suggest the scenarios), then the replays
    out = compute(tables)
    run = RunFacts(tables[NODES])
    if scenarios is None:
        chosen = candidates(out["critical_path"], run, percent or DEFAULT_PERCENT)
        if one_per_kind:
            chosen = list({sc.name.split(":")[0]: sc for sc in reversed(chosen)}.values())
    else:
        chosen = [parse(s) if isinstance(s, str) else s for s in scenarios]
    rows = []
    for step, g in iter_graphs(tables):
        measured = g.step_time()
        for sc in chosen:
            _, ends = g.replay(**sc.change(g, run))
            estimated = float(ends.max() - g.ref) if g.n else 0.0
            rows.append((step, sc.name, sc.words, measured / 1e3, estimated / 1e3, (measured - estimated) / 1e3))
    w = pd.DataFrame(rows, columns=["step", "scenario", "description", "measured_step_us", "estimated_step_us",
                                    "saving_us"])
    w["saving_pct"] = 100.0 * w["saving_us"] / w["measured_step_us"].where(w["measured_step_us"] > 0)
    out["whatif"] = w
    return out


def ranked(w):
    """Scenarios by their mean saving per step, largest first:
    DataFrame (scenario, description, measured_step_us, saving_us, saving_pct)."""
    if not len(w):
        return w.iloc[:0]
    g = w.groupby(["scenario", "description"], sort=False).agg(
        measured_step_us=("measured_step_us", "mean"), saving_us=("saving_us", "mean")).reset_index()
    g["saving_pct"] = 100.0 * g["saving_us"] / g["measured_step_us"].where(g["measured_step_us"] > 0)
    # on a tie (to 1 us) the cause first: a rank, a link, contention, then host gaps and speed-ups
    kind = g["scenario"].str.split(":").str[0].map({k: i for i, k in enumerate(_KIND_ORDER)}).fillna(len(_KIND_ORDER))
    order = np.lexsort((kind.to_numpy(), -g["saving_us"].round(0).to_numpy()))
    return g.iloc[order].reset_index(drop=True)


_KIND_ORDER = ("rank", "link", "contention", "host", "kernel", "compute")


def line(row):
    """One scenario in words: "rank 4's late arrivals ... cost 4.5 ms of the
    75.7 ms step: 6 %"."""
    verb = "would save" if row.description.endswith(":") else "cost"
    words = row.description.rstrip(":")
    saving = max(0.0, row.saving_us)   # a replay a hair slower than measured saves nothing
    pct = 100.0 * saving / row.measured_step_us if row.measured_step_us > 0 else 0.0
    name = f"  [--scenario {row.scenario}]" if len(row.scenario) <= 40 else ""
    return f"{words} {verb} {_time(saving)} of the {_time(row.measured_step_us)} step: {pct:.0f} %{name}"


def _time(us):
    if abs(us) >= 1000:
        return f"{us / 1000:.1f} ms"
    return f"{us:.0f} us"

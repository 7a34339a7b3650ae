"""How much communication was exposed (spec blocking-analysis.md, part 3):
per rank and profiler step, comm time hidden under compute vs exposed, split
into waiting and transfer, with an HTA-style temporal breakdown."""
import numpy as np
import pandas as pd

from .columns import EXPOSED_COLUMNS
from .. import _native
from .constants import NS_PER_US
from .inputs import _rows_by_rank
from .timeline import _exposed_windows, _intersect, _union


def _exposed_comm(inputs):
    """Per rank and window (the whole GPU span, then each ProfilerStep#N):
    every length is |W ∩ U| for one union U, so each is one sweep over all
    the rank's windows (intersections of unions are unions).  Those of the
    rank's own unions were taken at its end (``window_lengths``); here only
    the waiting, which needs every rank's arrival."""
    rows = []
    inst = inputs.instances
    start, end = inst["start"].to_numpy(np.int64), inst["end"].to_numpy(np.int64)
    last_arrival = inst.groupby("instance")["start"].transform("max").to_numpy(np.int64) if len(inst) else start
    by_rank = dict(_rows_by_rank(inputs))
    for r, tl in inputs.timelines.items():
        mine = by_rank.get(r, np.zeros(0, dtype=np.int64))
        wait_s = start[mine]
        wait_e = np.minimum(last_arrival[mine], end[mine])
        waiting = _union(wait_s, np.maximum(wait_e, wait_s))
        names = ["all"] + list(tl.steps[0])
        lo, hi = _exposed_windows(tl)
        wait_comm = _intersect(waiting, tl.unions["comm"])
        unions = {"wait_in_comm": wait_comm, "wait_hidden": _intersect(wait_comm, tl.compute_union())}
        length = {k: _native.overlap_with_union(lo, hi, *u).tolist() if len(u[0]) else [0] * len(lo)
                  for k, u in unions.items()}
        length.update(tl.window_lengths)
        for w, step in enumerate(names):
            c, hidden, busy = length["comm"][w], length["hidden"][w], length["busy"][w]
            exposed = c - hidden
            exposed_wait = length["wait_in_comm"][w] - length["wait_hidden"][w]
            span = int(hi[w]) - int(lo[w])
            rows.append({
                "rank": r, "step": step, "window_us": span / NS_PER_US, "comm_us": c / NS_PER_US,
                "hidden_us": hidden / NS_PER_US, "exposed_us": exposed / NS_PER_US,
                "exposed_waiting_us": exposed_wait / NS_PER_US, "exposed_transfer_us": (exposed - exposed_wait) / NS_PER_US,
                "comp_comm_overlap_pct": (100.0 * hidden / c) if c else 0.0,
                "compute_us": length["compute"][w] / NS_PER_US,
                "memcpy_memset_us": length["copy"][w] / NS_PER_US,
                "idle_us": max(span - busy, 0) / NS_PER_US,
                "note": "" if c else "no communication on this rank in this window",
            })
    return pd.DataFrame(rows).reindex(columns=EXPOSED_COLUMNS)

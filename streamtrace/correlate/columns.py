"""Each correlate sheet's columns, and the sheets of a run with nothing to
analyze (no rank, no matched collective) built without pandas (``Columns``),
so that such a run never loads it.  The analyses' modules, which do load
pandas, take their column lists from here."""
import numpy as np

from ..stream.format import Columns

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
OVERLAP_COLUMNS = ["collective_id", "rank", "Collective name", "Process Group Name", "signature", "stream",
                   "ts_us", "dur_us", "overlap_us", "overlap_frac", "overlapping_kernels", "top_overlapping",
                   "nccl_ctas", "sm_share", "top_kernel", "top_kernel_overlap_us", "top_kernel_stream",
                   "top_kernel_grid", "top_kernel_blocks_per_sm", "waves_alone", "waves_with_nccl", "tail_effect_risk"]
PAIR_COLUMNS = ["compute_kernel", "grid", "block", "signature", "overlap_us", "occurrences", "ranks",
                "nccl_ctas", "sm_share", "blocks_per_sm", "waves_alone", "waves_with_nccl", "tail_effect_risk"]
NCCL_INFLATION_COLUMNS = ["signature", "instances", "overlapped_n", "isolated_n", "median_transfer_overlapped_us",
                          "median_transfer_isolated_us", "inflation", "total_excess_us", "note"]
COMPUTE_INFLATION_COLUMNS = ["kernel", "grid", "block", "occurrences", "overlapped_n", "isolated_n",
                             "median_overlapped_us", "median_isolated_us", "inflation", "time_lost_us", "note"]
EXPOSED_COLUMNS = ["rank", "step", "window_us", "comm_us", "hidden_us", "exposed_us", "exposed_waiting_us",
                   "exposed_transfer_us", "comp_comm_overlap_pct", "compute_us", "memcpy_memset_us", "idle_us", "note"]
QUALITY_COLUMNS = ["check", "rank", "detail"]

#: each sheet's columns, in the stage's order, and the dtype its analysis
#: gives them when it has no row: a DataFrame of no row dicts reindexed to
#: its columns is float64, a DataFrame of named columns only is object
EMPTY_SHEETS = {
    "collective_blockers": (BLOCKER_COLUMNS, np.float64),
    "blocking_kernels": (BLOCKING_KERNEL_COLUMNS, object),
    "blocking_host_ops": (BLOCKING_HOST_COLUMNS, object),
    "collective_overlap": (OVERLAP_COLUMNS, object),
    "contention_pairs": (PAIR_COLUMNS, object),
    "nccl_inflation": (NCCL_INFLATION_COLUMNS, object),
    "compute_inflation": (COMPUTE_INFLATION_COLUMNS, object),
    "exposed_comm": (EXPOSED_COLUMNS, np.float64),
    "correlate_quality": (QUALITY_COLUMNS, object),
}


def empty_sheets(quality):
    """Every sheet of a run with no rank and no matched collective, as
    ``Columns``: no rows but the data-quality notes ``quality`` ((check,
    rank, detail) tuples), as ``analyze`` gives them for such a run."""
    sheets = {name: Columns({c: np.zeros(0, dtype=dtype) for c in columns}, 0)
              for name, (columns, dtype) in EMPTY_SHEETS.items()}
    if quality:
        cols = {}
        for j, c in enumerate(QUALITY_COLUMNS):
            cols[c] = np.empty(len(quality), dtype=object)
            cols[c][:] = [q[j] for q in quality]
        sheets["correlate_quality"] = Columns(cols, len(quality))
    return sheets

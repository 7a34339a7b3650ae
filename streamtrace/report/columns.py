"""The columns of every sheet, in order: Part A's (TraceLens's) first, then the
``*_EXTRA`` columns Part B adds at the end of those sheets."""
LONG_COLUMNS = ["collective_id", "index_in_group", "rank", "Process Group Name", "Process Group Ranks",
                "Collective name", "Group size", "dtype", "In msg nelems", "In msg size (MB)", "Out msg nelems",
                "Out msg size (MB)", "In split size", "Out split size", "stream", "ts", "dur"]
LONG_EXTRA = ["instance", "kernel_name", "match_method", "ts_raw", "clock_offset_us", "flags", "user_label"]
SUMMARY_LONG_KEYS = ["rank", "Process Group Name", "Process Group Ranks", "Collective name", "Group size", "dtype",
                     "In msg nelems", "Out msg nelems", "In split size", "Out split size", "stream"]
SUMMARY_LONG_METRICS = ["In msg size (MB)_first", "Out msg size (MB)_first", "dur_sum", "dur_mean", "dur_std",
                        "dur_min", "dur_max", "operation_count"]
IMPLICIT_COLUMNS = ["collective_id", "Process Group Name", "Process Group Ranks", "Collective name", "Group size",
                    "dtype", "In msg nelems", "Out msg nelems", "In msg size (MB)", "Out msg size (MB)",
                    "Full msg size (MB)", "comm_latency", "skew in start time", "earliest arrival rank",
                    "avg_wait_time", "skew in end time", "algo bw (GB/s)", "bus bw (GB/s)"]
IMPLICIT_EXTRA = ["xfer_latency", "straggler_rank", "blame_us", "participants", "metadata_mismatch",
                  "mismatch_fields", "instance", "flags"]
IMPLICIT_CHECK = ["Process Group Name", "Process Group Ranks", "Collective name", "Group size", "dtype",
                  "In msg nelems", "Out msg nelems", "In msg size (MB)", "Out msg size (MB)"]
SUMMARY_IMPLICIT_KEYS = ["Collective name", "dtype", "In msg nelems"]
SUMMARY_IMPLICIT_METRICS = ["comm_latency", "skew in start time", "skew in end time", "algo bw (GB/s)",
                            "bus bw (GB/s)"]
A2AV_COLUMNS = ["collective_id", "Process Group Name", "Process Group Ranks", "Collective name", "Group size",
                "dtype", "stream", "total data communicated (MB)", "total nelems communicated", "wall_time (us)",
                "max_rank_dur (us)", "min_rank_dur (us)", "avg_rank_dur (us)", "throughput (GB/s)",
                "max_rank_throughput (GB/s)", "min_rank_throughput (GB/s)", "size_imbalance",
                "skew in start time", "skew in end time"]
A2AV_RANK_BLOCK = ["ts", "dur", "In msg nelems", "Out msg nelems", "In msg size (MB)", "Out msg size (MB)",
                   "In split size", "Out split size"]
A2AV_CHECK = ["Process Group Name", "Process Group Ranks", "Collective name", "Group size", "dtype", "stream"]
A2AV_EXTRA = ["bus bw (GB/s)", "participants", "metadata_mismatch", "stream_mismatch", "instance", "flags"]
STRAGGLER_COLUMNS = ["rank", "total_wait_time_us", "mean_wait_time_us", "times_arrived_last", "times_arrived_first",
                     "pct_arrived_last", "num_collectives", "total_nccl_dur_us"]
STRAGGLER_EXTRA = ["participated", "pct_arrived_last_of_participated", "total_blame_us"]
HEATMAP_COLUMNS = ["src_rank", "dst_rank", "total_sent_MB", "avg_sent_MB", "count"]
BY_SIZE_COLUMNS = ["Collective name", "Process Group Name", "size_bucket", "count", "total_bytes",
                   "total_latency_us", "avg_latency_us", "p50_latency_us", "p99_latency_us",
                   "avg bus bw (GB/s)", "bus bw (GB/s)"]
CLOCK_SHEET_COLUMNS = ["rank", "offset_us", "residual_us", "max_residual_us", "collectives", "reference_rank",
                       "applied", "method", "note"]

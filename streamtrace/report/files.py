"""The report's sheet names and the files it writes, without pandas (the
one-shot report checks its outputs before it imports ``report``)."""
import os

from ..io.outputs import check_suffix, refuse_input_as_output

#: correlate's sheets (spec blocking-analysis.md), present when the stream
#: went through ``correlate``
BLOCKING_SHEETS = ["collective_blockers", "blocking_kernels", "blocking_host_ops", "collective_overlap",
                   "contention_pairs", "nccl_inflation", "compute_inflation", "exposed_comm"]
SHEET_ORDER = ["nccl_summary_implicit_sync", "nccl_summary_long", "nccl_summary_all2allv", "nccl_all2allv_heatmap",
               "nccl_long", "nccl_implicit_sync", "nccl_all2allv", "straggler_summary",
               "nccl_summary_by_size", "clock_alignment"] + BLOCKING_SHEETS + ["data_quality"]


def check_report_outputs(output_xlsx_path, output_csvs_dir, inputs):
    """Before any work: refuse an output that is one of ``inputs`` -- the
    workbook, or a sheet file the CSV directory would replace or remove --
    and a workbook name asking for a compression."""
    inputs = [str(i) for i in inputs if i is not None]   # "-": stdin
    if output_xlsx_path:
        check_suffix(output_xlsx_path)
        refuse_input_as_output(output_xlsx_path, inputs, what="workbook")
    if output_csvs_dir:
        for name in SHEET_ORDER:
            refuse_input_as_output(os.path.join(output_csvs_dir, f"{name}.csv"), inputs, what="sheet file")

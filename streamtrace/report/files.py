"""The report's sheet names and the files it writes, without pandas (the
one-shot report checks its outputs before it imports ``report``)."""
import os

from ..io.outputs import check_suffix, refuse_input_as_output
from ..remote import is_url

REPORT_NAME = "nccl_analysis_report.xlsx"

#: correlate's sheets (spec blocking-analysis.md), present when the stream
#: went through ``correlate``
BLOCKING_SHEETS = ["collective_blockers", "blocking_kernels", "blocking_host_ops", "collective_overlap",
                   "contention_pairs", "nccl_inflation", "compute_inflation", "exposed_comm", "p2p_blockers"]
#: point-to-point sheets (align.p2p*, align.pipeline): only when the run has send/recv
P2P_SHEETS = ["p2p", "p2p_unmatched", "pipeline"]
SHEET_ORDER = ["nccl_summary_implicit_sync", "nccl_summary_long", "nccl_summary_all2allv", "nccl_all2allv_heatmap",
               "nccl_long", "nccl_implicit_sync", "nccl_all2allv", "straggler_summary",
               "nccl_summary_by_size", "clock_alignment"] + P2P_SHEETS + BLOCKING_SHEETS + ["confidence",
                                                                                             "data_quality"]


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


def default_output_path(paths, trace_dir=None, trace_pattern=None, world_size=None):
    """A1.5: where ``nccl_analysis_report.xlsx`` goes when no output is given."""
    if trace_dir:
        return os.path.join(trace_dir, REPORT_NAME)
    urls = [p for p in ([trace_pattern] if trace_pattern else paths) if p and is_url(str(p))]
    if urls:   # beside the traces on the store: the URLs' common 'directory'
        return os.path.commonprefix([str(u) for u in urls]).rpartition("/")[0] + "/" + REPORT_NAME
    if trace_pattern:
        first = [trace_pattern.replace("*", str(i)) for i in range(min(world_size or 1, 2))]
        common = os.path.commonpath([os.path.abspath(p) for p in first])
    else:
        real = [os.path.abspath(p) for p in paths if p and p != "-"]
        common = os.path.commonpath(real) if real else os.getcwd()
    if os.path.isfile(common) or not os.path.isdir(common):
        common = os.path.dirname(common)
    return os.path.join(common, REPORT_NAME)

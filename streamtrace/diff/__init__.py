"""Two runs compared rank by rank, and a gate for CI (docs/diff.md).

``diff(baseline, candidate)`` -> a ``Diff``: {sheet: DataFrame} (the ranked
changes first, then one sheet per area), with ``text`` (the terminal
summary), ``confidence`` (each run's), ``notes`` (what could not be
compared) and, given ``fail_if``, ``violations``.  Each side is a list of
paths as ``blockers`` takes them (event streams at any stage, trace files,
one directory of traces) or a dict of the trace discovery flags
(``trace_dir``, ``trace_pattern``, ``trace_glob``, ``rank_regex``,
``world_size``, ``allow_missing_ranks``).
"""
import sys
import types

from ..errors import StreamtraceError
from .gate import GATE_METRICS, Condition, evaluate, parse_condition, parse_conditions   # noqa: F401

DISCOVERY = ("trace_dir", "trace_pattern", "trace_glob", "rank_regex", "world_size", "allow_missing_ranks")


class Diff(dict):
    """{sheet name: DataFrame}; ``text``, ``confidence`` (baseline,
    candidate), ``notes``, ``violations`` (the gate's, [] when it passes or
    was not asked), ``tables`` (each run's tables: baseline, candidate)."""

    text = ""
    confidence = (None, None)
    notes = ()
    violations = ()
    tables = (None, None)


def side_tables(side, jobs=None, executor=None, align_clocks=None, critical=True, what="baseline"):
    """A run's align and correlate tables, running what is missing; with
    ``critical``, also correlate's timelines (``metrics.CORRELATED``: the
    per-kernel GPU time, and the critical-path graph when it is compared)."""
    from ..chain import _correlated_tables, correlated_tables
    from .metrics import CORRELATED, Correlated

    held = []
    finished = held.append if critical else None
    if isinstance(side, dict):
        from ..io.ranks import DEFAULT_RANK_REGEX, resolve_inputs

        flags = {k: v for k, v in side.items() if k in DISCOVERY and v not in (None, False, "")}
        unknown = set(side) - set(DISCOVERY)
        if unknown:
            raise StreamtraceError(f"{what}: unknown discovery flag(s) {', '.join(sorted(unknown))}")
        if "trace_glob" in flags:
            flags.setdefault("rank_regex", DEFAULT_RANK_REGEX)
        inputs = resolve_inputs(**flags)
        tables = _correlated_tables(inputs, flags.get("world_size"), jobs, align_clocks, None, False, None,
                                    executor=executor, blocking_clocks=align_clocks, finished=finished)
    else:
        paths = [side] if isinstance(side, str) or hasattr(side, "__fspath__") else list(side)
        if not paths:
            raise StreamtraceError(f"{what}: no input")
        tables = correlated_tables([str(p) for p in paths], jobs=jobs, executor=executor, align_clocks=align_clocks,
                                   finished=finished)
    if held:
        tables[CORRELATED] = Correlated(held[0])
    return tables


def diff(baseline, candidate, fail_if=(), jobs=None, executor=None, align_clocks=None, critical=True, top=3):
    """``baseline`` and ``candidate`` compared (see the module's docstring);
    ``fail_if``: gate conditions (texts such as ``"step_time:+5%"`` or
    Conditions); ``critical``: also the per-kernel GPU time and, when the
    step time changed beyond its spread, the critical paths (each run's
    graph is made then only; False skips both); ``top``: changes the text
    explains."""
    from ..confidence import report_confidence
    from .compare import compare
    from .summary import summary_text

    conditions = parse_conditions(fail_if)
    base = side_tables(baseline, jobs, executor, align_clocks, critical, "baseline")
    cand = side_tables(candidate, jobs, executor, align_clocks, critical, "candidate")
    sheets, comparison = compare(base, cand)
    out = Diff(sheets)
    out.tables = (base, cand)
    out.confidence = (report_confidence(base), report_confidence(cand))
    out.notes = list(sheets["diff_notes"]["note"])
    import pandas as pd

    out["diff_confidence"] = pd.concat([c.table().assign(run=label) for label, c in
                                        zip(("baseline", "candidate"), out.confidence)], ignore_index=True)
    out.violations = evaluate(conditions, out, comparison)
    if conditions:
        failed = {v.condition.text for v in out.violations}
        out["diff_gate"] = pd.DataFrame(
            [dict(condition=c.text, passed=c.text not in failed,
                  detail="; ".join(v.detail for v in out.violations if v.condition.text == c.text))
             for c in conditions], columns=["condition", "passed", "detail"])
    out.text = summary_text(out, comparison, top=top)
    return out


def check_outputs(output_xlsx_path=None, output_csvs_dir=None, output_html_path=None, inputs=()):
    """Before any work: each output can be written and is none of the inputs."""
    from ..io.outputs import check_suffix, refuse_input_as_output

    inputs = [str(i) for i in inputs if i is not None]
    if output_xlsx_path:
        check_suffix(output_xlsx_path)
        refuse_input_as_output(output_xlsx_path, inputs, what="workbook")
    if output_csvs_dir:
        import os

        for name in SHEETS:
            refuse_input_as_output(os.path.join(output_csvs_dir, f"{name}.csv"), inputs, what="sheet file")
    if output_html_path:
        from ..html_report import check_output

        check_output(output_html_path)


#: every sheet a diff may hold, in order
SHEETS = ("diff_changes", "diff_steps", "diff_collectives", "diff_stragglers", "diff_blocking_kernels",
          "diff_blocking_host_ops", "diff_gpu_time", "diff_pipeline", "diff_critical_path", "diff_notes",
          "diff_confidence", "diff_gate")


def write_outputs(d, output_xlsx_path=None, output_csvs_dir=None, output_html_path=None, sources=("", "")):
    """The diff's sheets as a workbook and/or CSVs, and its HTML page, as one
    set (all appear, or none); returns the paths written."""
    from ..io.outputs import OutputSet
    from ..report.writers import CsvDir, write_xlsx

    sheets = {name: d[name] for name in SHEETS if name in d}
    written = []
    with OutputSet() as outputs:
        if output_csvs_dir:
            csvs = CsvDir(output_csvs_dir).stage(outputs, sheets)
            csvs.write(sheets)
            written.append(csvs.path)
        if output_xlsx_path:
            written.append(write_xlsx(sheets, output_xlsx_path, outputs=outputs))
        if output_html_path:
            from ..report.sheets import build_report
            from ..steps import TABLE as STEPS
            from .page import write

            base, cand = d.tables
            written.append(write(d, output_html_path, build_report(base), build_report(cand), outputs=outputs,
                                 steps=(base.get(STEPS), cand.get(STEPS)), sources=sources))
    return written


class _CallableModule(types.ModuleType):
    """``streamtrace.diff`` is this package once any of its modules has been
    imported (Python sets the parent's attribute to the package): calling it
    calls ``diff``, so ``streamtrace.diff(...)`` works whatever was imported first."""

    def __call__(self, *args, **kwargs):
        return diff(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

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
    """A run's align, correlate (and critical) tables, running what is missing."""
    from ..chain import _correlated_tables, correlated_tables

    if isinstance(side, dict):
        from ..io.ranks import DEFAULT_RANK_REGEX, resolve_inputs

        flags = {k: v for k, v in side.items() if k in DISCOVERY and v not in (None, False, "")}
        unknown = set(side) - set(DISCOVERY)
        if unknown:
            raise StreamtraceError(f"{what}: unknown discovery flag(s) {', '.join(sorted(unknown))}")
        if "trace_glob" in flags:
            flags.setdefault("rank_regex", DEFAULT_RANK_REGEX)
        inputs = resolve_inputs(**flags)
        return _correlated_tables(inputs, flags.get("world_size"), jobs, align_clocks, None, False, None,
                                  executor=executor, blocking_clocks=align_clocks, critical=critical)
    paths = [side] if isinstance(side, str) or hasattr(side, "__fspath__") else list(side)
    if not paths:
        raise StreamtraceError(f"{what}: no input")
    return correlated_tables([str(p) for p in paths], jobs=jobs, executor=executor, align_clocks=align_clocks,
                             critical=critical)


def diff(baseline, candidate, fail_if=(), jobs=None, executor=None, align_clocks=None, critical=True, top=3):
    """``baseline`` and ``candidate`` compared (see the module's docstring);
    ``fail_if``: gate conditions (texts such as ``"step_time:+5%"`` or
    Conditions); ``critical``: also compare the critical paths (each run's
    graph is made; False skips it); ``top``: changes the text explains."""
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
    out.violations = evaluate(conditions, out, comparison)
    if conditions:
        import pandas as pd

        failed = {v.condition.text for v in out.violations}
        out["diff_gate"] = pd.DataFrame(
            [dict(condition=c.text, passed=c.text not in failed,
                  detail="; ".join(v.detail for v in out.violations if v.condition.text == c.text))
             for c in conditions], columns=["condition", "passed", "detail"])
    out.text = summary_text(out, comparison, top=top)
    return out

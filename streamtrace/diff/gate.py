"""The CI gate: ``--fail_if`` conditions on named metrics (docs/diff.md).

A condition is ``METRIC:THRESHOLD`` (``step_time:+5%``, ``busbw:-10%``,
``transfer:+200us``) or a bare event (``new_straggler``).  The threshold's
sign is the direction that fails (+: the candidate's value is larger), its
unit a percentage of the baseline's value or an amount (us, ms, s; GB/s for
bandwidths).  A condition fails only on a change that is also beyond the
run-to-run spread (diff.compare): noise never fails a job."""
import re
from dataclasses import dataclass

from ..errors import InvalidArgumentError

#: metric -> (the sheet and metric of its rows, unit kind, what it is)
GATE_METRICS = {
    "step_time": (("diff_steps", "step_time"), "time", "the run's median step time"),
    "rank_step_time": (("diff_steps", "step_time"), "time", "any rank's median step time"),
    "transfer": (("diff_collectives", "transfer"), "time",
                 "any collective group's (kind x process group x size bucket) median transfer time"),
    "waiting": (("diff_collectives", "waiting"), "time", "any collective group's median waiting"),
    "busbw": (("diff_collectives", "busbw"), "bandwidth", "any collective group's median bus bandwidth"),
    "stage_work": (("diff_pipeline", "stage work"), "time", "any pipeline stage's work per step"),
    "link_bandwidth": (("diff_pipeline", "bandwidth"), "bandwidth", "any point-to-point link's median bandwidth"),
    "kernel_time": (("diff_gpu_time", "gpu_time"), "time", "any kernel identity's GPU time per step on a rank"),
    "new_straggler": (None, "event", "a rank that is the straggler in the candidate only, waited for beyond "
                                     "the spread"),
    "new_blocker": (None, "event", "a blocking kernel or host op the baseline did not have"),
}

_THRESHOLD = re.compile(r"^([+-])(\d+(?:\.\d+)?)(%|us|ms|s|GB/s)$")
_TIME_US = {"us": 1.0, "ms": 1e3, "s": 1e6}


@dataclass(frozen=True)
class Condition:
    text: str
    metric: str
    sign: int = 0          # +1: fails on an increase, -1: on a decrease
    amount: float = 0.0
    unit: str = ""


@dataclass
class Violation:
    condition: Condition
    detail: str

    def __str__(self):
        return f"{self.condition.text}: {self.detail}"


def parse_condition(text):
    """A Condition, or InvalidArgumentError naming the condition and what is wrong."""
    if isinstance(text, Condition):
        return text
    raw = str(text).strip()
    metric, _, threshold = raw.partition(":")
    metric = metric.strip()
    if metric not in GATE_METRICS:
        raise InvalidArgumentError(f"--fail_if {raw!r}: unknown metric {metric!r} (known: "
                                   f"{', '.join(GATE_METRICS)})")
    kind = GATE_METRICS[metric][1]
    if kind == "event":
        if threshold:
            raise InvalidArgumentError(f"--fail_if {raw!r}: {metric} takes no threshold")
        return Condition(raw, metric)
    m = _THRESHOLD.match(threshold.replace(" ", ""))
    if not m:
        raise InvalidArgumentError(f"--fail_if {raw!r}: the threshold must be a signed amount such as +5%, "
                                   f"-10%, +200us or +2ms (got {threshold!r})")
    sign, amount, unit = m.groups()
    if unit != "%" and (kind == "time") != (unit in _TIME_US):
        want = "us, ms or s" if kind == "time" else "GB/s"
        raise InvalidArgumentError(f"--fail_if {raw!r}: {metric} is measured in {want} or %, not {unit}")
    return Condition(raw, metric, 1 if sign == "+" else -1, float(amount), unit)


def parse_conditions(texts):
    return [parse_condition(t) for t in texts or ()]


def evaluate(conditions, sheets, comparison=None):
    """The Violations of ``conditions`` over a diff's sheets."""
    out = []
    for c in conditions:
        where, kind, _ = GATE_METRICS[c.metric]
        if c.metric == "new_straggler":
            s = sheets.get("diff_stragglers")
            for row in ([] if s is None else s[s["status"] == "new straggler"].to_dict("records")):
                out.append(Violation(c, row["words"]))
            continue
        if c.metric == "new_blocker":
            for name in ("diff_blocking_kernels", "diff_blocking_host_ops"):
                s = sheets.get(name)
                for row in ([] if s is None else s[s["status"] == "new"].to_dict("records")):
                    out.append(Violation(c, row["words"]))
            continue
        sheet, metric = where
        s = sheets.get(sheet)
        if s is None or not len(s):
            continue
        rows = s[(s["metric"] == metric) & s["beyond_spread"].astype(bool)]
        if c.metric == "step_time":
            rows = rows[rows["item"] == "run"]
        elif c.metric == "rank_step_time":
            rows = rows[rows["item"] != "run"]
        elif c.metric == "kernel_time":
            rows = s[(s["area"] == "kernels") & s["beyond_spread"].astype(bool)]
        for row in rows.to_dict("records"):
            change = row["change"] * c.sign
            if c.unit == "%":
                base = abs(row["baseline"])   # from nothing (a new kernel on a rank): beyond any percentage
                hit = change > 0 and (base == 0 or 100.0 * change / base > c.amount)
            else:
                hit = change > c.amount * _TIME_US.get(c.unit, 1.0)
            if hit:
                unit = row["unit"]
                pct = f"{row['change_pct']:+.1f}%" if row["baseline"] else "new"
                out.append(Violation(c, f"{row['item']} {row['metric']} {row['baseline']:.2f} -> "
                                        f"{row['candidate']:.2f} {unit} ({pct})"))
    return out

"""Two runs compared: one table per area, and the changes ranked.

Every compared figure is a row with the baseline's and the candidate's
value (a median, or a per-step mean), their spreads, the change, its
impact in microseconds per step, and whether it is beyond the spread
(``beyond_spread``).  A change is beyond the spread when

  |change| > max(SPREAD_K x the larger spread, MIN_RELATIVE x |baseline|)
  and |impact| >= MIN_STEP_SHARE x the baseline's step time,

so noise between steps, tiny relative moves and moves too small to matter
for the step are never reported as changes.  Only changes beyond the
spread are ranked (``changes``), by impact; figures that are symptoms of
another change (waiting, the straggler's waited-for time, a rank's total
compute) weigh SYMPTOM_WEIGHT, so the cause that explains them ranks above
them.
"""
import numpy as np
import pandas as pd

from .metrics import Run, spread, step_spread

#: a change must exceed this many times the larger of the two spreads
SPREAD_K = 3.0
#: ... and this fraction of the baseline's value
MIN_RELATIVE = 0.05
#: ... and move the step by at least this fraction of the baseline's step time
MIN_STEP_SHARE = 0.005
#: blocking kernels and host ops have no per-step spread: a change needs this fraction
MIN_RELATIVE_BLOCKERS = 0.25
#: a run has a straggler when the others wait for it at least this fraction of its step time (less is noise)
STRAGGLER_MIN_STEP_SHARE = 0.02
#: symptoms (waiting, waited-for, a rank's total compute) rank at this weight
SYMPTOM_WEIGHT = 0.5

ROW_COLUMNS = ["area", "item", "metric", "unit", "baseline", "baseline_spread", "candidate", "candidate_spread",
               "change", "change_pct", "impact_us_per_step", "beyond_spread", "status", "words"]


def _pct(base, change):
    return 100.0 * change / abs(base) if base and np.isfinite(base) else float("nan")


class Comparison:
    """Rows of two Runs compared (``rows(area)``), the notes on what could
    not be compared (``notes``)."""

    def __init__(self, base, cand):
        self.base, self.cand = base, cand
        self.step_us = base.step_time_us()
        if not np.isfinite(self.step_us) or self.step_us <= 0:
            self.step_us = 0.0
        self.notes = []
        self.tables = {}

    # ------------------------------------------------------------ the rule
    def beyond(self, base, cand, sb, sc, impact, relative=MIN_RELATIVE):
        if not (np.isfinite(base) and np.isfinite(cand)):
            return False
        change = cand - base
        threshold = max(SPREAD_K * max(sb, sc), relative * abs(base))
        return bool(abs(change) > threshold and abs(impact) >= MIN_STEP_SHARE * self.step_us)

    def row(self, area, item, metric, unit, base, sb, cand, sc, impact, status="", words="", relative=MIN_RELATIVE,
            beyond=None):
        change = cand - base if np.isfinite(base) and np.isfinite(cand) else float("nan")
        if beyond is None:
            beyond = self.beyond(base, cand, sb, sc, impact, relative)
        return dict(area=area, item=item, metric=metric, unit=unit, baseline=base, baseline_spread=sb,
                    candidate=cand, candidate_spread=sc, change=change, change_pct=_pct(base, change),
                    impact_us_per_step=impact, beyond_spread=beyond, status=status or ("changed" if beyond else ""),
                    words=words)

    # ------------------------------------------------------------ areas
    def steps(self):
        b_run, b_rank = self.base.step_times()
        c_run, c_rank = self.cand.step_times()
        rows = []
        self.step_changed = False
        if b_run and c_run:
            b, c = float(np.median(b_run)), float(np.median(c_run))
            rows.append(self.row("steps", "run", "step_time", "us", b, step_spread(b_run), c, step_spread(c_run),
                                 c - b))
            self.step_changed = rows[-1]["beyond_spread"]
        for rank in sorted(set(b_rank) & set(c_rank)):
            b, c = float(np.median(b_rank[rank])), float(np.median(c_rank[rank]))
            rows.append(self.row("steps", f"rank {rank}", "step_time", "us", b, step_spread(b_rank[rank]), c,
                                 step_spread(c_rank[rank]), c - b))
        return rows

    def collectives(self):
        bi, ci = self.base.collective_instances(), self.cand.collective_instances()
        nb, nc = self.base.n_steps, self.cand.n_steps
        keys = ["kind", "pg", "bucket"]
        bg = dict(tuple(bi.groupby(keys))) if len(bi) else {}
        cg = dict(tuple(ci.groupby(keys))) if len(ci) else {}
        rows, resized = [], []
        for key in sorted(set(bg) | set(cg), key=str):
            item = f"{key[0]} pg {key[1]} {key[2]}"
            b, c = bg.get(key), cg.get(key)
            if b is None or c is None:
                here, n = (c, nc) if b is None else (b, nb)
                per_step = len(here) / n
                t = float(here["transfer_us"].median())
                status = "new" if b is None else "gone"
                impact = per_step * t * (1 if b is None else -1)
                words = (f"{item}: {status} ({per_step:g} per step, {t:.1f} us each, "
                         f"{'in the candidate' if b is None else 'in the baseline only'})")
                rows.append(self.row("collectives", item, "per_step", "count", 0.0 if b is None else per_step, 0.0,
                                     per_step if b is None else 0.0, 0.0, impact, status=status, words=words,
                                     beyond=abs(impact) >= MIN_STEP_SHARE * self.step_us))
                continue
            pb, pc = len(b) / nb, len(c) / nc
            sizes = (b["n"].median(), c["n"].median())
            if sizes[0] != sizes[1] and all(np.isfinite(sizes)):
                resized.append(f"{item} {sizes[0]:g} -> {sizes[1]:g} ranks")
            if pb != pc:
                impact = (pc - pb) * float(c["transfer_us"].median())
                rows.append(self.row("collectives", item, "per_step", "count", pb, 0.0, pc, 0.0, impact,
                                     status="count", words=f"{item}: {pb:g} -> {pc:g} per step",
                                     beyond=abs(impact) >= MIN_STEP_SHARE * self.step_us))
            for metric, unit, weight in (("transfer", "us", 1.0), ("waiting", "us", SYMPTOM_WEIGHT),
                                         ("busbw", "GB/s", None)):
                col = {"transfer": "transfer_us", "waiting": "waiting_us", "busbw": "busbw_GBps"}[metric]
                vb, vc = float(b[col].median()), float(c[col].median())
                if not (np.isfinite(vb) and np.isfinite(vc)):
                    continue
                if metric == "busbw":   # its impact: the transfer time it costs
                    impact = pc * (float(c["transfer_us"].median()) - float(b["transfer_us"].median()))
                else:
                    impact = pc * (vc - vb)
                r = self.row("collectives", item, metric, unit, vb, spread(b[col]), vc, spread(c[col]), impact)
                r["_weight"] = weight if weight is not None else 0.0   # busbw repeats transfer: not ranked
                if r["beyond_spread"]:
                    r["words"] = f"{item}: {metric} {_fmt(vb, unit)} -> {_fmt(vc, unit)} ({_signed_pct(r)})"
                rows.append(r)
        if resized:
            self.notes.append(f"collective groups of another size (compared as one group; bus bandwidth allows "
                              f"for the size): {'; '.join(resized[:3])}"
                              + (f" and {len(resized) - 3} more" if len(resized) > 3 else ""))
        return rows

    def stragglers(self):
        b_wait, b_causes = self.base.waiting_by_rank()
        c_wait, c_causes = self.cand.waiting_by_rank()
        rows = []
        b_str, c_str = self.base.straggler(), self.cand.straggler()
        # the baseline's straggler counts only when the others waited for it more than noise
        b_real = b_str is not None and np.mean(b_wait[b_str][0]) >= STRAGGLER_MIN_STEP_SHARE * self.step_us
        self.baseline_straggler = b_str if b_real else None
        c_real = c_str is not None and np.mean(c_wait[c_str][0]) >= STRAGGLER_MIN_STEP_SHARE * self.step_us
        self.candidate_straggler = c_str if c_real else None
        for rank in sorted(set(b_wait) | set(c_wait)):
            if rank not in self.base.ranks or rank not in self.cand.ranks:
                continue
            bd, bb = b_wait.get(rank, ([0.0], [0.0]))
            cd, cb = c_wait.get(rank, ([0.0], [0.0]))
            vb, vc = float(np.mean(bd)), float(np.mean(cd))
            r = self.row("stragglers", f"rank {rank}", "waited_for", "us/step", vb, step_spread(bd), vc,
                         step_spread(cd), vc - vb)
            r["_weight"] = SYMPTOM_WEIGHT
            r["baseline_straggler"], r["candidate_straggler"] = rank == b_str, rank == c_str
            r["baseline_blame"], r["candidate_blame"] = float(np.mean(bb)), float(np.mean(cb))
            if rank == c_str and r["beyond_spread"] and r["change"] > 0 and (rank != b_str or not b_real):
                r["status"] = "new straggler"
                r["words"] = (f"rank {rank} is the new straggler: the others wait {vc:.1f} us per step for it "
                              f"(was {vb:.1f} us; baseline straggler: "
                              f"{f'rank {b_str}' if b_real else 'none'})")
            elif r["beyond_spread"]:
                r["words"] = f"waiting for rank {rank}: {vb:.1f} -> {vc:.1f} us per step"
            rows.append(r)
        for cause in sorted(set(b_causes) | set(c_causes)):
            vb, vc = b_causes.get(cause, 0.0) / self.base.n_steps, c_causes.get(cause, 0.0) / self.cand.n_steps
            r = self.row("stragglers", "all ranks", f"cause: {cause}", "us/step", vb, 0.0, vc, 0.0, vc - vb)
            r["_weight"] = SYMPTOM_WEIGHT
            if r["beyond_spread"]:
                r["words"] = f"waiting from {cause}: {vb:.1f} -> {vc:.1f} us per step"
            rows.append(r)
        bd, cd = _dominant(b_causes), _dominant(c_causes)
        self.dominant = (bd, cd)
        return rows

    def blockers(self, table, key, what):
        b = self.base.blockers(table, key)
        c = self.cand.blockers(table, key)
        rows = []
        for ident in sorted(set(b) | set(c)):
            vb = b[ident][0] / self.base.n_steps if ident in b else 0.0
            vc = c[ident][0] / self.cand.n_steps if ident in c else 0.0
            name = " ".join(ident)
            r = self.row(what, name, "blocking", "us/step", vb, 0.0, vc, 0.0, vc - vb,
                         relative=MIN_RELATIVE_BLOCKERS)
            ranks = c[ident][2] if ident in c else b[ident][2]
            r["ranks"] = ranks
            if r["beyond_spread"]:
                r["status"] = ("new" if ident not in b else "gone" if ident not in c
                               else "slower" if vc > vb else "faster")
                label = "blocking kernel" if what == "blocking_kernels" else "blocking host op"
                r["words"] = (f"{label} {_short(ident[0])} ({r['status']}, rank {ranks}): "
                              f"{vb:.1f} -> {vc:.1f} us per step")
            rows.append(r)
        return rows

    def gpu_time(self):
        b, c = self.base.gpu_time(), self.cand.gpu_time()
        rows = []
        for rank in sorted(set(b) & set(c)):
            for col, metric in (("compute_us", "compute"), ("comm_us", "communication"),
                                ("exposed_us", "exposed communication")):
                vb, vc = b[rank][col], c[rank][col]
                mb, mc = float(np.median(vb)), float(np.median(vc))
                r = self.row("gpu_time", f"rank {rank}", metric, "us/step", mb, step_spread(vb), mc,
                             step_spread(vc), mc - mb)
                r["_weight"] = SYMPTOM_WEIGHT if metric == "compute" else 0.0   # comm: the collectives' rows
                if r["beyond_spread"]:
                    r["words"] = f"GPU {metric} time on rank {rank}: {mb:.1f} -> {mc:.1f} us per step"
                rows.append(r)
        bk, ck = self.base.kernel_time(), self.cand.kernel_time()
        both = set(self.base.ranks) & set(self.cand.ranks)
        for key in sorted(k for k in set(bk) | set(ck) if k[1] in both):
            vb, vc = bk.get(key, [0.0]), ck.get(key, [0.0])
            mb, mc = float(np.median(vb)), float(np.median(vc))
            r = self.row("kernels", f"{key[0]} rank {key[1]}", "gpu_time", "us/step", mb, step_spread(vb), mc,
                         step_spread(vc), mc - mb)
            r["kernel"], r["rank"] = key
            if r["beyond_spread"]:
                r["status"] = "new" if key not in bk else "gone" if key not in ck else (
                    "slower" if mc > mb else "faster")
                r["words"] = f"kernel {_short(key[0])} on rank {key[1]}: {mb:.1f} -> {mc:.1f} us per step"
            rows.append(r)
        return rows

    def pipeline(self):
        b, c = self.base.pipeline_stages(), self.cand.pipeline_stages()
        rows = []
        if bool(b) != bool(c):
            self.notes.append("pipeline: only the " + ("baseline" if b else "candidate")
                              + " has point-to-point pipeline stages; not compared")
            return rows
        for key in sorted(set(b) & set(c)):
            for col, metric, weight in (("stage_work_us", "stage work", 1.0), ("p2p_wait_us", "p2p wait",
                                                                                SYMPTOM_WEIGHT),
                                        ("bubble_us", "bubble", 0.0)):
                vb, vc = b[key][col], c[key][col]
                mb, mc = float(np.median(vb)), float(np.median(vc))
                r = self.row("pipeline", f"pipeline {key[0]} stage {key[1]}", metric, "us/step", mb,
                             step_spread(vb), mc, step_spread(vc), mc - mb)
                r["_weight"] = weight
                if r["beyond_spread"]:
                    r["words"] = f"pipeline {key[0]} stage {key[1]}: {metric} {mb:.1f} -> {mc:.1f} us per step"
                rows.append(r)
        bl, cl = self.base.p2p_links(), self.cand.p2p_links()
        for key in sorted(set(bl) & set(cl)):
            (tb, wb, pb), (tc, wc, pc) = bl[key], cl[key]
            mb, mc = float(np.median(tb)), float(np.median(tc))
            r = self.row("p2p", f"link {key[0]}->{key[1]}", "transfer", "us", mb, spread(tb), mc, spread(tc),
                         pc * (mc - mb))
            if r["beyond_spread"]:
                r["words"] = (f"link {key[0]}->{key[1]}: transfer {mb:.1f} -> {mc:.1f} us ({_signed_pct(r)}; "
                              f"{float(np.median(wb)):.1f} -> {float(np.median(wc)):.1f} GB/s)")
            rows.append(r)
            bw_b, bw_c = float(np.median(wb)), float(np.median(wc))
            r = self.row("p2p", f"link {key[0]}->{key[1]}", "bandwidth", "GB/s", bw_b, spread(wb), bw_c, spread(wc),
                         pc * (mc - mb))
            r["_weight"] = 0.0   # the transfer row says it
            rows.append(r)
        return rows

    def critical(self):
        """Per critical-path category and rank, the change in us per step
        (both runs need the critical graph).  Only when the step time
        changed beyond its spread, the one thing these rows explain: the
        critical path's replay costs more than the rest of the diff."""
        if not self.step_changed:
            return []
        pb, pc = self.base.critical_path(), self.cand.critical_path()
        if pb is None or pc is None:
            if (pb is None) != (pc is None):
                self.notes.append("critical path: only one run has it; not compared")
            return []
        rows = []
        nb, nc = max(pb["step"].nunique(), 1), max(pc["step"].nunique(), 1)
        sb = pb.groupby(["category", "rank"])["dur_us"].sum() / nb
        sc = pc.groupby(["category", "rank"])["dur_us"].sum() / nc
        waited = {}
        for path in (pb, pc):   # the rank most waited for, per category and rank (the candidate's wins)
            w = path.dropna(subset=["waited_for"])
            if len(w):
                top = w.groupby(["category", "rank", "waited_for"])["dur_us"].sum().sort_values()
                waited.update({(c, r): int(f) for (c, r, f) in top.index})
        both = set(self.base.ranks) & set(self.cand.ranks)
        for key in sorted((k for k in set(sb.index) | set(sc.index) if k[1] in both), key=str):
            vb, vc = float(sb.get(key, 0.0)), float(sc.get(key, 0.0))
            r = self.row("critical_path", f"{key[0]} on rank {key[1]}", key[0], "us/step", vb, 0.0, vc, 0.0,
                         vc - vb)
            r["_weight"] = 0.0   # explains the step line, not ranked beside the causes
            r["category"], r["rank"] = key
            r["waited_for"] = waited.get(key)
            rows.append(r)
        return rows


def _dominant(causes):
    total = sum(causes.values())
    return max(causes, key=causes.get) if total else None


def _short(name, width=70):
    name = str(name)
    return name if len(name) <= width else name[:width - 3] + "..."


def _fmt(v, unit):
    return f"{v:.1f} {unit}" if unit != "GB/s" else f"{v:.2f} GB/s"


def _signed_pct(r):
    p = r["change_pct"]
    return f"{p:+.0f}%" if np.isfinite(p) else "new"


AREAS = ("steps", "collectives", "stragglers", "blocking_kernels", "blocking_host_ops", "gpu_time", "pipeline",
         "critical")


def compare(base_tables, cand_tables):
    """{sheet name: DataFrame} of two runs' tables compared, and the notes."""
    base, cand = Run(base_tables, "baseline"), Run(cand_tables, "candidate")
    c = Comparison(base, cand)
    notes = c.notes
    if base.n_steps != cand.n_steps:
        notes.append(f"steps: the baseline has {len(base.step_numbers)}, the candidate {len(cand.step_numbers)}; "
                     "figures are per step")
    if base.ranks != cand.ranks:
        only_b = sorted(set(base.ranks) - set(cand.ranks))
        only_c = sorted(set(cand.ranks) - set(base.ranks))
        notes.append(f"ranks: the baseline has {len(base.ranks)}, the candidate {len(cand.ranks)}"
                     + (f"; only in the baseline: {_ranks(only_b)}" if only_b else "")
                     + (f"; only in the candidate: {_ranks(only_c)}" if only_c else "")
                     + "; per-rank figures compare the ranks both have")
    for name in ("correlate.collective_blockers", "correlate.blocking_kernels", "correlate.exposed_comm"):
        missing = [side for side, t in (("baseline", base_tables), ("candidate", cand_tables)) if name not in t]
        if missing:
            notes.append(f"{name.split('.', 1)[1]}: missing from the {' and '.join(missing)}; not compared")
    sheets = {}
    sheets["diff_steps"] = c.steps()
    sheets["diff_collectives"] = c.collectives()
    sheets["diff_stragglers"] = c.stragglers()
    sheets["diff_blocking_kernels"] = c.blockers("correlate.blocking_kernels", ("kernel", "grid", "block"),
                                                 "blocking_kernels")
    sheets["diff_blocking_host_ops"] = c.blockers("correlate.blocking_host_ops", ("op",), "blocking_host_ops")
    sheets["diff_gpu_time"] = c.gpu_time()
    sheets["diff_pipeline"] = c.pipeline()
    sheets["diff_critical_path"] = c.critical()
    out = {}
    ranked = []
    for name, rows in sheets.items():
        for r in rows:
            weight = r.pop("_weight", 1.0)
            if r["beyond_spread"] and weight and r["words"]:
                ranked.append((abs(r["impact_us_per_step"]) * weight, r))
        if not rows and name in ("diff_pipeline", "diff_critical_path"):
            continue
        extra = list(dict.fromkeys(k for r in rows for k in r if k not in ROW_COLUMNS))
        out[name] = pd.DataFrame(rows, columns=ROW_COLUMNS + extra)
    ranked.sort(key=lambda x: -x[0])
    changes = pd.DataFrame([dict(rank=i + 1, score_us_per_step=s, **{k: r[k] for k in ROW_COLUMNS})
                            for i, (s, r) in enumerate(ranked)],
                           columns=["rank", "score_us_per_step"] + ROW_COLUMNS)
    out = {"diff_changes": changes, **out}
    out["diff_notes"] = pd.DataFrame({"note": notes}, columns=["note"])
    return out, c


def _ranks(ranks):
    return ",".join(map(str, ranks[:12])) + ("..." if len(ranks) > 12 else "")

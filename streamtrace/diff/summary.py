"""The diff's terminal summary: each run's confidence first, then the step
time (explained by the critical path when both runs have it), the biggest
changes in words, the straggler, and the gate."""
#: broken-condition lines printed per condition
VIOLATIONS_SHOWN = 5


def _ms(us):
    return f"{us / 1e3:.2f} ms" if abs(us) >= 1000 else f"{us:.1f} us"


def _signed(us):
    return ("+" if us >= 0 else "-") + _ms(abs(us))


def summary_text(d, comparison, top=3):
    lines = []
    for label, conf in zip(("Baseline", "Candidate"), d.confidence):
        if conf is not None:
            lines += [f"{label} " + conf.lines()[0][0].lower() + conf.lines()[0][1:]] + conf.lines()[1:]
    for note in d.notes:
        lines.append(f"Note: {note}")
    steps = d.get("diff_steps")
    run = None if steps is None else steps[steps["item"] == "run"]
    if run is not None and len(run):
        r = run.iloc[0]
        verdict = ("beyond the run-to-run spread" if r["beyond_spread"]
                   else "within the run-to-run spread: no change")
        lines.append(f"Step time: {_ms(r['baseline'])} -> {_ms(r['candidate'])} ({_signed(r['change'])}, "
                     f"{r['change_pct']:+.1f}%; {verdict}, spread "
                     f"{_ms(max(r['baseline_spread'], r['candidate_spread']))})")
        explained = _critical_line(d, r)
        if explained:
            lines.append(explained)
    changes = d["diff_changes"]
    if not len(changes):
        lines.append("No change beyond the run-to-run spread.")
    else:
        lines.append(f"Biggest changes ({min(top, len(changes))} of {len(changes)} beyond the run-to-run spread):")
        for row in changes.head(top).itertuples():
            lines.append(f"  {row.rank}. {row.words}  [{_signed(row.impact_us_per_step)} per step]")
    lines.append(_straggler_line(d, comparison))
    if d.get("diff_gate") is not None:
        if d.violations:
            lines.append(f"Gate: FAILED ({len(d.violations)} violation{'s' if len(d.violations) != 1 else ''}):")
            shown = {}
            for v in d.violations:   # at most VIOLATIONS_SHOWN lines per condition (every one is in diff_gate)
                shown.setdefault(v.condition.text, []).append(v)
            for text, vs in shown.items():
                lines += [f"  {v}" for v in vs[:VIOLATIONS_SHOWN]]
                if len(vs) > VIOLATIONS_SHOWN:
                    lines.append(f"  {text}: ... and {len(vs) - VIOLATIONS_SHOWN} more")
        else:
            lines.append(f"Gate: passed ({len(d['diff_gate'])} condition{'s' if len(d['diff_gate']) != 1 else ''})")
    return "\n".join(lines)


def _critical_line(d, step_row):
    """"step +4.1 ms: 3.2 ms more late rank wait on rank 4": the critical-path
    category whose time per step moved most with the step, and in it the
    rank that moved most."""
    cp = d.get("diff_critical_path")
    if cp is None or not len(cp) or not step_row["beyond_spread"]:
        return None
    sign = 1.0 if step_row["change"] >= 0 else -1.0
    net = cp.groupby("category")["change"].sum() * sign
    category = net.idxmax()
    rows = cp[cp["category"] == category]
    top = rows.loc[(rows["change"] * sign).idxmax()]
    more = "more" if top["change"] >= 0 else "less"
    waited = top.get("waited_for")
    if waited is not None and waited == waited and int(waited) == int(top["rank"]):
        where = f"for rank {top['rank']}"   # a wait's segment is on the rank waited for
    elif waited is not None and waited == waited:
        where = f"on rank {top['rank']} (waiting for rank {int(waited)})"
    else:
        where = f"on rank {top['rank']}"
    return (f"  step {_signed(step_row['change'])}: {_ms(abs(top['change']))} {more} {category} {where} "
            "on the critical path")


def _straggler_line(d, comparison):
    # a straggler the others waited for less than STRAGGLER_MIN_STEP_SHARE of the step is noise: none
    b, c = getattr(comparison, "baseline_straggler", None), getattr(comparison, "candidate_straggler", None)
    bd, cd = getattr(comparison, "dominant", (None, None))
    words = lambda r: "none" if r is None else f"rank {r}"   # noqa: E731
    same = "unchanged" if b == c else "changed"
    s = d.get("diff_stragglers")
    if b != c and s is not None and not (s["status"] == "new straggler").any():
        same = "changed, within the run-to-run spread"
    return (f"Straggler: {words(b)} -> {words(c)} ({same}); dominant cause of waiting: {bd or 'none'} -> "
            f"{cd or 'none'}")

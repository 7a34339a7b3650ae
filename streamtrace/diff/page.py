"""The diff as one self-contained HTML page: both runs' confidence and the
summary, a chart of the ranked changes, then each of the report's charts
for the baseline and the candidate side by side (html_report's page
pieces: plotly.js embedded once, figures as escaped JSON, the same
render script, so tests/browser.py reads it as it reads the report)."""
import gzip
import contextlib

from ..html_report import _RENDER, _STYLE, _esc, _json_script, _safe_figure_json, require_plotly
from ..io.outputs import OutputSet
from ..remote import redact_text, source_label

_SIDE_STYLE = (".sides{display:grid;grid-template-columns:1fr 1fr;gap:12px}.sides h3{font-size:14px;margin:4px}"
               "pre.summary{font-size:13px;white-space:pre-wrap;margin:6px 4px}")


def changes_chart(changes, top=15):
    """A horizontal bar per ranked change: its impact in us per step."""
    import plotly.graph_objects as go

    rows = changes.head(top).iloc[::-1]
    labels = [w if len(w) <= 90 else w[:87] + "..." for w in rows["words"].astype(str)]
    values = rows["impact_us_per_step"].astype(float).tolist()
    fig = go.Figure(go.Bar(x=values, y=labels, orientation="h",
                           marker_color=["#c0392b" if v > 0 else "#2e86de" for v in values]))
    fig.update_layout(title="Changes beyond the run-to-run spread (impact, us per step; + slower)",
                      height=max(260, 40 * len(rows) + 120), margin=dict(l=20, r=20, t=50, b=40),
                      yaxis=dict(automargin=True), template="plotly_white")
    return fig


def _chart_section(parts, key, fig, sentence):
    key = _esc(key)
    parts.append(f"<div><div class=\"chart\" id=\"chart-{key}\" data-key=\"{key}\"></div>"
                 f"<p class=\"sentence\">{_esc(sentence)}</p>"
                 f"<script type=\"application/json\" id=\"fig-{key}\">{_safe_figure_json(fig)}</script>"
                 f"<script type=\"application/json\" id=\"data-{key}\">{_json_script({})}</script></div>")


def render(d, base_sheets, cand_sheets, steps=(None, None), sources=("", "")):
    """The page as a string; ``base_sheets``/``cand_sheets``: each run's report
    sheets (report.build_report), whose charts (plots.charts) are shown side by side."""
    require_plotly()
    from plotly.offline import get_plotlyjs

    from ..plots import charts

    parts = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
             f"<title>streamtrace diff</title><style>{_STYLE}{_SIDE_STYLE}</style>",
             f"<script>{get_plotlyjs()}</script></head><body>",
             "<header><h1>streamtrace diff</h1><dl>"]
    for label, conf, src in zip(("baseline", "candidate"), d.confidence, sources):
        parts.append(f"<dt>{label}</dt><dd>{_esc(source_label(src))}</dd>")   # a URL's credentials never shown
        if conf is not None:
            parts.append(f"<dt>{label} confidence</dt><dd>{_esc(conf.one_line())}</dd>")
    parts.append("</dl></header><main>")
    parts.append(f"<section><h2>Summary</h2><pre class=\"summary\">{_esc(redact_text(d.text))}</pre></section>")
    changes = d["diff_changes"]
    if len(changes):
        parts.append("<section id=\"changes\">")
        _chart_section(parts, "changes", changes_chart(changes),
                       f"{len(changes)} changes beyond the run-to-run spread, largest impact first.")
        parts.append("</section>")
    else:
        parts.append("<section id=\"changes\"><p class=\"empty\">No change beyond the run-to-run spread."
                     "</p></section>")
    base, cand = charts(base_sheets, steps[0]), charts(cand_sheets, steps[1])
    by_key = {c.key: c for c in cand}
    for b in base:
        c = by_key.get(b.key)
        parts.append(f"<section id=\"{_esc(b.key)}\"><h2>{_esc(b.title)}</h2><div class=\"sides\">")
        parts.append("<div><h3>baseline</h3>")
        _chart_section(parts, f"baseline-{b.key}", b.figure, b.sentence)
        parts.append("</div><div><h3>candidate</h3>")
        if c is not None:
            _chart_section(parts, f"candidate-{c.key}", c.figure, c.sentence)
        else:
            parts.append("<p class=\"empty\">Not in the candidate.</p>")
        parts.append("</div></div></section>")
    for c in cand:
        if c.key not in {b.key for b in base}:
            parts.append(f"<section id=\"{_esc(c.key)}\"><h2>{_esc(c.title)}</h2><div class=\"sides\">"
                         "<div><h3>baseline</h3><p class=\"empty\">Not in the baseline.</p></div>"
                         "<div><h3>candidate</h3>")
            _chart_section(parts, f"candidate-{c.key}", c.figure, c.sentence)
            parts.append("</div></div></section>")
    parts.append(f"</main><script>{_RENDER}</script></body></html>")
    return "".join(parts)


def write(d, path, base_sheets, cand_sheets, outputs=None, **kw):
    page = render(d, base_sheets, cand_sheets, **kw).encode("utf-8")
    if str(path).lower().endswith(".gz"):
        page = gzip.compress(page, compresslevel=6, mtime=0)
    with contextlib.ExitStack() as stack:
        if outputs is None:
            outputs = stack.enter_context(OutputSet())
        with outputs.file(path, suffix=".html") as f:
            f.write(page)
    return str(path)

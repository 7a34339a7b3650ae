"""The report as one self-contained HTML page.

A header (the run, the straggler, the dominant cause), the charts of
``streamtrace.plots`` each with its sentence, and the first rows of the
main sheets as HTML tables.  plotly.js is embedded once, so the page opens
offline.  Each chart's figure and the numbers behind it are embedded as JSON
(``<script type="application/json" id="fig-KEY">`` and ``id="data-KEY"``),
escaped so that no text from a trace can close the script element.
"""
import contextlib
import gzip
import html
import json
import os

import numpy as np
import pandas as pd

from .io.outputs import OutputSet, check_suffix
from .remote import is_url, local_path, source_label
from .errors import StreamtraceError
from .plots import _short, charts, fmt_us

#: rows of each main sheet shown as a table
TABLE_ROWS = 10
#: longest text shown in a table cell (the whole text is in the CSV / workbook)
CELL_CHARS = 120
TABLE_SHEETS = [("straggler_summary", "Straggler summary"),
                ("nccl_summary_implicit_sync", "Implicit-sync collectives, summarised"),
                ("nccl_summary_by_size", "Collectives by message size"),
                ("collective_blockers", "Late instances and their causes"),
                ("blocking_kernels", "Blocking kernels"),
                ("data_quality", "Data quality findings")]


def _json_script(obj):
    """JSON that is safe inside a <script> element: <, > and & (and the
    line separators JavaScript once rejected) only as \\u escapes -- they can
    only occur inside JSON strings."""
    text = json.dumps(obj, allow_nan=False, separators=(",", ":"), default=_json_default)
    return (text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o) if np.isfinite(o) else None
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def _cut_texts(obj):
    """A chart's numbers as the page embeds them: every text (a kernel's
    name, a process group's) cut to CELL_CHARS, as the tables cut them; the
    whole texts are in the CSV / workbook."""
    if isinstance(obj, str):
        return _short(obj, CELL_CHARS)
    if isinstance(obj, dict):
        return {k: _cut_texts(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_cut_texts(v) for v in obj]
    return obj


def _figure_json(fig):
    import plotly.io as pio

    return pio.to_json(fig, validate=False, pretty=False, remove_uids=True)


def _safe_figure_json(fig):
    text = _figure_json(fig)
    return (text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _esc(text):
    return html.escape(str(text), quote=True)


def sources_text(sources):
    """The header's ``sources`` value: the first four names and the folder
    (or URL prefix) they share.  Each source as outputs' metadata names it
    (``remote.source_label``): a URL without its user, password or query, a
    local path absolute; split at its last '/' only, so that a URL keeps its
    ``scheme://``."""
    labels = [source_label(s) for s in sources]
    shown = [lab.rstrip("/").rsplit("/", 1)[-1] or lab for lab in labels[:4]]
    more = f" and {len(labels) - 4:,} more" if len(labels) > 4 else ""
    common = ""
    if len(labels) > 1:
        prefix = os.path.commonprefix([lab.rsplit("/", 1)[0] + "/" for lab in labels])
        common = prefix[:prefix.rfind("/") + 1].rstrip("/") or ("/" if prefix.startswith("/") else "")
        if common.endswith(":/") or common.endswith(":"):   # only a scheme in common: no shared place
            common = ""
    return ", ".join(shown) + more + (f" (in {common})" if common else "")


def _summary(sheets, sources, world_size, confidence=None):
    """(label, value) pairs of the header: the confidence first, when given."""
    rows = []
    if confidence is not None:
        rows.append(("confidence", confidence.level + "".join(f"; {r.text}" for r in confidence.reasons)))
    long = sheets.get("nccl_long")
    st = sheets.get("straggler_summary")
    ranks = set()
    if long is not None and len(long):
        ranks |= set(pd.to_numeric(long["rank"], errors="coerce").dropna().astype(int))
    if st is not None and len(st):
        ranks |= set(pd.to_numeric(st["rank"], errors="coerce").dropna().astype(int))
    if confidence is not None:
        rows.append(("ranks", f"{confidence.ranks_words()} present"
                              + ("" if ranks else "; none with collectives")))
    else:
        rows.append(("ranks", f"{len(ranks):,}" if ranks else "none with collectives"))
    if world_size is None and long is not None and "Group size" in long and len(long):
        gs = pd.to_numeric(long["Group size"], errors="coerce")
        world_size = int(max(gs.max(), max(ranks) + 1 if ranks else 0)) if gs.notna().any() else None
    rows.append(("world size", f"{world_size:,}" if world_size else "unknown"))
    if long is not None and len(long):
        ts, dur = pd.to_numeric(long["ts"], errors="coerce"), pd.to_numeric(long["dur"], errors="coerce")
        rows.append(("collectives", f"{len(long):,} kernels, {long['collective_id'].nunique():,} instances, "
                                    f"spanning {fmt_us(float((ts + dur).max() - ts.min()))}"))
    if sources:
        rows.append(("sources", sources_text(sources)))
    if st is not None and len(st):
        rows.append(("straggler", _straggler_words(st, confidence)))
    cb = sheets.get("collective_blockers")
    if cb is not None and len(cb):
        causes = {}
        for col, name in (("host_launch_lateness_us", "host launch lateness"),
                          ("gpu_dependency_wait_us", "GPU dependency wait"), ("gpu_backlog_us", "GPU backlog")):
            causes[name] = float(pd.to_numeric(cb[col], errors="coerce").sum())
        total = sum(causes.values())
        name = max(causes, key=causes.get)
        rows.append(("dominant cause", f"{name} ({causes[name] / total:.0%} of the late ranks' delay)"
                     if total > 0 else "none measurable"))
    else:
        rows.append(("dominant cause", "not analysed (collective-report --blocking_analysis, or a stream "
                                       "through correlate)"))
    return rows


def _straggler_words(st, confidence=None):
    """The header's straggler, from straggler_summary: the rank most often
    last (as the wait heatmap's sentence names it), several on a tie."""
    from .confidence import most_often_last, tie_words

    last = pd.to_numeric(st["times_arrived_last"], errors="coerce").fillna(0).astype(int)
    top, count = most_often_last(np.repeat(st["rank"].astype(int).to_numpy(), last.to_numpy()))
    n = int(st["num_collectives"].iloc[0])
    where = f" ({confidence.ranks_words()} present)" if confidence is not None else ""
    if not top:
        return f"none: no rank arrived last at any of the {n:,} implicit-sync collectives{where}"
    others = pd.to_numeric(st.loc[~st["rank"].astype(int).isin(top), "total_wait_time_us"], errors="coerce")
    wait = fmt_us(float(others.mean()) if len(others) else 0.0)
    if len(top) > 1:
        return (f"a tie: {tie_words(top)} each arrived last at {count:,} of the {n:,} implicit-sync "
                f"collectives{where}; the other ranks waited {wait} each in all")
    return (f"rank {top[0]}: arrived last at {100.0 * count / n:.1f} % of the {n:,} implicit-sync "
            f"collectives{where}; the other ranks waited {wait} each in all")


def _table(df):
    head = df.head(TABLE_ROWS)
    cells = []
    for col in head.columns:
        s = head[col]
        if s.dtype.kind == "f":
            cells.append([("" if v != v else f"{v:.6g}") for v in s.tolist()])
        else:
            cells.append(["" if v is None or (isinstance(v, float) and v != v) else _short(v, CELL_CHARS)
                          for v in s.tolist()])
    out = ["<table><thead><tr>"]
    out += [f"<th>{_esc(_short(c, CELL_CHARS))}</th>" for c in head.columns]
    out.append("</tr></thead><tbody>")
    for row in zip(*cells) if cells else ():
        out.append("<tr>" + "".join(f"<td>{_esc(v)}</td>" for v in row) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


_STYLE = """
body{font-family:-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;margin:0;background:#f4f5f7;
color:#1f2328}
header{background:#1f2a44;color:#fff;padding:18px 32px}
header h1{margin:0 0 10px;font-size:22px;font-weight:600}
header dl{display:grid;grid-template-columns:max-content 1fr;gap:4px 18px;margin:0;font-size:14px}
header dt{color:#aab4c8}header dd{margin:0;overflow-wrap:anywhere}
main{max-width:1280px;margin:0 auto;padding:18px 24px 40px}
section{background:#fff;border-radius:8px;box-shadow:0 1px 3px rgba(0,0,0,.12);margin:0 0 18px;padding:10px 16px}
p.sentence{font-size:15px;margin:6px 4px 2px}p.note{font-size:12px;color:#6b7280;margin:2px 4px 6px}
.chart{width:100%}
h2{font-size:17px;margin:8px 4px}
.tablewrap{overflow-x:auto}
table{border-collapse:collapse;font-size:12px;margin:4px 0 8px}
th,td{border-bottom:1px solid #e5e7eb;padding:3px 8px;text-align:left;white-space:nowrap;max-width:480px;
overflow:hidden;text-overflow:ellipsis}
th{background:#f0f2f5;position:sticky;top:0}
p.empty{font-size:16px;padding:18px 8px}
"""

# Draws every chart from its embedded figure.  For the tests and the bench it
# records on <body> the script errors, each chart's drawing time and, once
# every chart's Plotly.newPlot has finished (its promise resolved: the chart
# drawn, plotly_afterplot fired), performance.now() -- milliseconds since the
# navigation started, parsing the page and plotly.js included.
_RENDER = """
(function(){
  var errors = [], times = {}, body = document.body;
  window.addEventListener('error', function(e){ errors.push(String(e.message)); });
  function done(){
    body.dataset.errors = JSON.stringify(errors);
    body.dataset.chartMs = JSON.stringify(times);
    body.dataset.renderMs = performance.now().toFixed(0);
    body.dataset.rendered = 'yes';
  }
  function failed(e){ errors.push(String(e && e.message || e)); }
  try {
    var divs = document.querySelectorAll('div.chart'), drawn = [];
    for (var i = 0; i < divs.length; i++) {
      var t0 = performance.now(), key = divs[i].dataset.key;
      var fig = JSON.parse(document.getElementById('fig-' + key).textContent);
      var config = {responsive: true, displaylogo: false};
      drawn.push(Plotly.newPlot(divs[i], fig.data, fig.layout, config));
      times[key] = Math.round(performance.now() - t0);
    }
    Promise.all(drawn).then(done, function(e){ failed(e); done(); });
  } catch (e) { failed(e); done(); }
})();
"""


def require_plotly():
    """A StreamtraceError (one line) when plotly is not installed."""
    try:
        import plotly  # noqa: F401
    except ImportError:
        raise StreamtraceError("the HTML report needs plotly, which is not installed: "
                               "pip install 'streamtrace[html]' (or pip install plotly)") from None


def check_output(path):
    """Before the work: plotly is there and ``path`` can be an output file
    (its directory exists, it is not a directory), so that a bad
    ``--output_html_path`` fails at once and before any other output is written."""
    require_plotly()
    path = local_path(str(path))
    check_suffix(path, allowed=(".gz",))
    if path.lower().endswith(".zst"):
        raise StreamtraceError(f"{path}: .zst output is not supported for the HTML report (write .html, or "
                               ".html.gz for a gzip-compressed page)")
    if is_url(path):
        from .remote import check_output as check_url

        return check_url(path)
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise StreamtraceError(f"{path}: the output directory does not exist")
    if os.path.isdir(path):
        raise StreamtraceError(f"{path}: is a directory, not an output file")


def render_html(sheets, title="streamtrace collective report", sources=None, world_size=None, steps=None,
                confidence=None):
    """The report page as a string (see the module's docstring).  ``steps``:
    the run's profiler steps (``streamtrace.steps.step_table``), marked on
    the time axis; None when there was no step data to look in.
    ``confidence``: the answers' confidence.Confidence, first in the header."""
    require_plotly()
    from plotly.offline import get_plotlyjs

    sheets = {k: v for k, v in sheets.items() if v is not None}
    parts = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
             f"<title>{_esc(title)}</title><style>{_STYLE}</style>",
             f"<script>{get_plotlyjs()}</script></head><body>",
             f"<header><h1>{_esc(title)}</h1><dl>"]
    for label, value in _summary(sheets, sources, world_size, confidence):
        parts.append(f"<dt>{_esc(label)}</dt><dd>{_esc(value)}</dd>")
    parts.append("</dl></header><main>")
    found = charts(sheets, steps)
    if not found or not any(len(sheets.get(n, ())) for n in ("nccl_long", "nccl_implicit_sync")):
        parts.append("<section><p class=\"empty\">No collectives were found in this run, so there is nothing to "
                     "chart. The tables below show what the report holds.</p></section>")
    for c in found:
        key = _esc(c.key)
        parts.append(f"<section id=\"{key}\"><div class=\"chart\" id=\"chart-{key}\" data-key=\"{key}\"></div>")
        parts.append(f"<p class=\"sentence\">{_esc(c.sentence)}</p>")
        if c.note:
            parts.append(f"<p class=\"note\">Note: {_esc(c.note)}.</p>")
        parts.append(f"<script type=\"application/json\" id=\"fig-{key}\">{_safe_figure_json(c.figure)}</script>")
        parts.append(f"<script type=\"application/json\" id=\"data-{key}\">{_json_script(_cut_texts(c.data))}"
                     "</script>")
        parts.append("</section>")
    for name, heading in TABLE_SHEETS:
        df = sheets.get(name)
        if df is None or not len(df.columns):
            continue
        rows = f"first {min(TABLE_ROWS, len(df))} of {len(df):,} rows" if len(df) else "no rows"
        parts.append(f"<section><h2>{_esc(heading)} <small>({_esc(name)}, {rows})</small></h2>"
                     f"<div class=\"tablewrap\">{_table(df)}</div></section>")
    parts.append(f"</main><script>{_RENDER}</script></body></html>")
    return "".join(parts)


def write_html(sheets, path, title="streamtrace collective report", sources=None, world_size=None, steps=None,
               outputs=None, confidence=None):
    """Write the page to ``path`` (atomically, as every output; gzip-compressed
    when ``path`` ends in ``.gz``); returns ``path``.  ``outputs``: an
    ``OutputSet`` to stage the page in, committed with the set's other
    outputs, instead of committing it at once."""
    page = render_html(sheets, title=title, sources=sources, world_size=world_size, steps=steps,
                       confidence=confidence).encode("utf-8")
    if str(path).lower().endswith(".gz"):
        page = gzip.compress(page, compresslevel=6, mtime=0)
    with contextlib.ExitStack() as stack:
        if outputs is None:
            outputs = stack.enter_context(OutputSet())
        with outputs.file(path, suffix=".html") as f:
            f.write(page)
    return str(path)

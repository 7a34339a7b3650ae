"""The workbook's styling (issue #27): frozen header rows, filters, fitted
widths, number formats with units, colour scales on the wait and skew
columns and a native scatter chart of bus bandwidth against message size --
with every cell value as before (the CSVs), in openpyxl and in LibreOffice."""
import os
import subprocess
import zipfile

import numpy as np
import openpyxl
import pandas as pd
import pytest
from click.testing import CliRunner

import browser
import generate_fixture
from streamtrace.cli import main


@pytest.fixture(scope="module")
def workbook(tmp_path_factory):
    d = tmp_path_factory.mktemp("xlsx_style")
    generate_fixture.generate(str(d / "traces"), ranks=8, steps=3, straggler_rank=3, straggler_us=300.0,
                              all2allv=True)
    xlsx, csvs = d / "report.xlsx", d / "csvs"
    res = CliRunner().invoke(main, ["collective-report", "--trace_dir", str(d / "traces"), "--world_size", "8",
                                    "--all2allv_heatmap", "--blocking_analysis", "--output_xlsx_path", str(xlsx),
                                    "--output_csvs_dir", str(csvs), "-q"])
    assert res.exit_code == 0, res.output
    return str(xlsx), str(csvs)


# LibreOffice saves a boolean cell as the formula TRUE() / FALSE()
_LO_BOOLEANS = {"=TRUE()": True, "=FALSE()": False}


def _values_equal_csvs(xlsx, csvs, sheets=None):
    wb = openpyxl.load_workbook(xlsx, read_only=True)
    names = sheets or wb.sheetnames
    for name in names:
        rows = list(wb[name].iter_rows(values_only=True))
        expect = pd.read_csv(os.path.join(csvs, f"{name}.csv"), keep_default_na=False, dtype=str)
        assert list(rows[0]) == list(expect.columns), name
        assert len(rows) - 1 == len(expect), name
        for got, want in zip(rows[1:], expect.itertuples(index=False)):
            for g, w in zip(got, want):
                g = _LO_BOOLEANS.get(g, g) if isinstance(g, str) else g
                if isinstance(g, (int, float)) and not isinstance(g, bool):
                    assert float(g) == pytest.approx(float(w), rel=1e-12, abs=1e-12), (name, g, w)
                elif isinstance(g, bool):
                    assert str(g) == w, (name, g, w)
                else:
                    assert (g or "") == w.lstrip("'") or (g or "") == w, (name, g, w)
    wb.close()
    return names


def test_values_are_the_csvs(workbook):
    xlsx, csvs = workbook
    assert len(_values_equal_csvs(xlsx, csvs)) >= 15


def test_header_frozen_filtered_and_widths_fitted(workbook):
    xlsx, _ = workbook
    wb = openpyxl.load_workbook(xlsx)
    for ws in wb.worksheets:
        assert ws.freeze_panes == "A2", ws.title
        assert ws.auto_filter.ref == f"A1:{openpyxl.utils.get_column_letter(ws.max_column)}{ws.max_row}", ws.title
        for i in range(1, ws.max_column + 1):
            width = ws.column_dimensions[openpyxl.utils.get_column_letter(i)].width
            header = str(ws.cell(row=1, column=i).value)
            assert min(60, len(header) + 2) <= width <= 62, (ws.title, header, width)
    # a long kernel name gets a wide column, up to the cap
    ws = wb["contention_pairs"]
    assert ws.column_dimensions["A"].width == 60


def _rules(ws):
    out = {}
    for cf in ws.conditional_formatting:
        for rule in cf.rules:
            out.setdefault(str(cf.sqref), []).append(rule)
    return out


def test_colour_scales_on_wait_and_skew_columns_and_units(workbook):
    xlsx, _ = workbook
    wb = openpyxl.load_workbook(xlsx)
    ws = wb["nccl_implicit_sync"]
    header = [c.value for c in ws[1]]
    rules = _rules(ws)

    def col_rules(name):
        letter = openpyxl.utils.get_column_letter(header.index(name) + 1)
        return rules.get(f"{letter}2:{letter}{ws.max_row}", [])

    for name in ["skew in start time", "skew in end time", "avg_wait_time"] + [f"rank_{r}_wait_time" for r in range(8)]:
        assert any(r.type == "colorScale" for r in col_rules(name)), name
    assert not any(r.type == "colorScale" for r in col_rules("bus bw (GB/s)"))
    units = {"comm_latency": '" us"', "bus bw (GB/s)": '" GB/s"', "Full msg size (MB)": '" MiB"', "rank_0_ts": '" us"'}
    for name, unit in units.items():
        (fmt,) = [r.dxf.numFmt.formatCode for r in col_rules(name) if r.type == "expression"]
        assert fmt.endswith(unit), (name, fmt)
    st = _rules(wb["straggler_summary"])
    header = [c.value for c in wb["straggler_summary"][1]]
    letter = openpyxl.utils.get_column_letter(header.index("pct_arrived_last") + 1)
    (rule,) = st[f"{letter}2:{letter}{wb['straggler_summary'].max_row}"]
    assert rule.dxf.numFmt.formatCode == '0.0"%"'


def test_native_scatter_chart_of_bandwidth_against_size(workbook):
    xlsx, _ = workbook
    wb = openpyxl.load_workbook(xlsx)
    ws = wb["nccl_implicit_sync"]
    (chart,) = ws._charts
    assert type(chart).__name__ == "ScatterChart"
    assert chart.x_axis.scaling.logBase == 10 and chart.y_axis.scaling.logBase == 10
    (series,) = chart.series
    header = [c.value for c in ws[1]]
    x = openpyxl.utils.get_column_letter(header.index("Full msg size (MB)") + 1)
    y = openpyxl.utils.get_column_letter(header.index("bus bw (GB/s)") + 1)
    assert series.xVal.numRef.f == f"'nccl_implicit_sync'!${x}$2:${x}${ws.max_row}"
    assert series.yVal.numRef.f == f"'nccl_implicit_sync'!${y}$2:${y}${ws.max_row}"
    with zipfile.ZipFile(xlsx) as z:
        assert "xl/charts/chart1.xml" in z.namelist()


def test_libreoffice_converts_the_workbook_and_reads_the_same_values(workbook, tmp_path):
    soffice = browser.soffice()
    xlsx, csvs = workbook
    profile = f"-env:UserInstallation=file://{tmp_path}/profile"
    for fmt in ("pdf", "xlsx"):
        out = tmp_path / fmt
        res = subprocess.run([soffice, profile, "--headless", "--convert-to", fmt, "--outdir", str(out), xlsx],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        produced = out / f"report.{fmt}"
        assert produced.exists(), res.stdout + res.stderr
    assert (tmp_path / "pdf" / "report.pdf").read_bytes()[:5] == b"%PDF-"
    # LibreOffice's own copy of the workbook holds the values we wrote, in the main sheets
    _values_equal_csvs(str(tmp_path / "xlsx" / "report.xlsx"), csvs,
                       ["straggler_summary", "nccl_implicit_sync", "nccl_summary_implicit_sync", "clock_alignment"])
    # and our workbook is unchanged by being read
    assert len(_values_equal_csvs(xlsx, csvs)) >= 15

"""What Excel users expect of the workbook, around the cells the fast writer
streams: a frozen header row, filters, fitted column widths, number formats
with units, colour scales on the wait and skew columns, and a native scatter
chart of bus bandwidth against message size.

The cells themselves are not touched (their values and XML stay what
``report._sheet_xml`` writes, with no style index).  So the number formats
come as conditional formats whose rule always holds: a format is then a
property of the column range, not of each of a million cells.
"""
import re

from .cells import xml_escape as _xml_escape

_NS_MAIN = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
_NS_REL = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"

#: (column name pattern, number format) -- the first match wins
_FORMATS = [
    (re.compile(r"pct|_frac$|percent", re.I), '0.0"%"'),
    (re.compile(r"(^|_)ts($|_)|ts_us$|ts_raw", re.I), '0.000" us"'),
    (re.compile(r"GB/s", re.I), '0.00" GB/s"'),
    (re.compile(r"\(MB\)|_MB$|_mib$", re.I), '#,##0.000" MiB"'),
    (re.compile(r"\(ms\)", re.I), '#,##0.00" ms"'),
    (re.compile(r"_us$|\(us\)|_us_|latency|wait|skew|(^|_)dur($|_)|blame|offset|residual", re.I), '#,##0.0" us"'),
    (re.compile(r"_bytes$|^total_bytes$", re.I), '#,##0" B"'),
]
#: columns that get a colour scale (white to red: the larger the wait, the redder)
_SCALED = re.compile(r"wait|skew|delta_us|blame", re.I)
#: rows sampled to fit a column's width
_WIDTH_ROWS = 200


def column_letter(i):
    """0 -> A, 25 -> Z, 26 -> AA."""
    s = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        s = chr(65 + r) + s
    return s


def number_format(name, kind):
    if kind not in "fiu":
        return None
    for pattern, fmt in _FORMATS:
        if pattern.search(name):
            return fmt
    return None


def _width(name, series):
    sample = series.iloc[:_WIDTH_ROWS]
    longest = len(name)
    if sample.dtype.kind == "f":
        longest = max(longest, max((len(f"{v:,.3f}") for v in sample.tolist() if v == v), default=0) + 5)
    else:
        longest = max(longest, max((len(str(v)) for v in sample.tolist()), default=0))
    return min(60, max(8, longest + 2))


class Styles:
    """The styling of one workbook: collects each sheet's number formats as
    dxf entries of styles.xml."""

    def __init__(self):
        self.formats = []   # dxf index -> number format code

    def _dxf(self, fmt):
        if fmt not in self.formats:
            self.formats.append(fmt)
        return self.formats.index(fmt)

    def sheet(self, part, drawing=False):
        """(XML before <sheetData>, XML after </sheetData>) of one sheet."""
        ncols, nrows = len(part.columns), len(part)
        head = ('<sheetViews><sheetView workbookViewId="0"><pane ySplit="1" topLeftCell="A2" activePane="bottomLeft" '
                'state="frozen"/><selection pane="bottomLeft" activeCell="A2" sqref="A2"/></sheetView></sheetViews>')
        if not ncols:
            return head, ""
        cols = "".join(f'<col min="{i + 1}" max="{i + 1}" width="{_width(str(c), part.iloc[:, i])}" customWidth="1"/>'
                       for i, c in enumerate(part.columns))
        head += f"<cols>{cols}</cols>"
        last = column_letter(ncols - 1)
        tail = f'<autoFilter ref="A1:{last}{nrows + 1}"/>'
        if nrows:
            rules, priority = [], 1
            for i, c in enumerate(part.columns):
                kind = part.iloc[:, i].dtype.kind if hasattr(part.iloc[:, i].dtype, "kind") else "O"
                ref = f"{column_letter(i)}2:{column_letter(i)}{nrows + 1}"
                if _SCALED.search(str(c)) and kind in "fiu":
                    rules.append(f'<conditionalFormatting sqref="{ref}"><cfRule type="colorScale" priority="{priority}">'
                                 '<colorScale><cfvo type="min"/><cfvo type="percentile" val="50"/><cfvo type="max"/>'
                                 '<color rgb="FFFFFFFF"/><color rgb="FFFFD966"/><color rgb="FFF8696B"/></colorScale>'
                                 "</cfRule></conditionalFormatting>")
                    priority += 1
                fmt = number_format(str(c), kind)
                if fmt:
                    rules.append(f'<conditionalFormatting sqref="{ref}"><cfRule type="expression" '
                                 f'dxfId="{self._dxf(fmt)}" priority="{priority}"><formula>TRUE</formula></cfRule>'
                                 "</conditionalFormatting>")
                    priority += 1
            tail += "".join(rules)
        if drawing:
            tail += '<drawing r:id="rId1"/>'
        return head, tail

    def dxfs(self):
        """The <numFmts> and <dxfs> of styles.xml (custom format ids from 164)."""
        if not self.formats:
            return "", ""
        num = "".join(f'<numFmt numFmtId="{164 + i}" formatCode="{_attr(f)}"/>' for i, f in enumerate(self.formats))
        dx = "".join(f'<dxf><numFmt numFmtId="{164 + i}" formatCode="{_attr(f)}"/></dxf>'
                     for i, f in enumerate(self.formats))
        return (f'<numFmts count="{len(self.formats)}">{num}</numFmts>',
                f'<dxfs count="{len(self.formats)}">{dx}</dxfs>')


def _attr(s):
    return _xml_escape(s).replace('"', "&quot;")


def styles_xml(styles):
    """styles.xml with the workbook's conditional number formats."""
    numfmts, dxfs = styles.dxfs()
    return ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
            f'<styleSheet xmlns="{_NS_MAIN}">{numfmts}<fonts count="1"><font><sz val="11"/><name val="Calibri"/>'
            '</font></fonts><fills count="2"><fill><patternFill patternType="none"/></fill><fill><patternFill '
            'patternType="gray125"/></fill></fills><borders count="1"><border><left/><right/><top/><bottom/>'
            '<diagonal/></border></borders><cellStyleXfs count="1"><xf numFmtId="0" fontId="0" fillId="0" '
            'borderId="0"/></cellStyleXfs><cellXfs count="1"><xf numFmtId="0" fontId="0" fillId="0" borderId="0" '
            'xfId="0"/></cellXfs><cellStyles count="1"><cellStyle name="Normal" xfId="0" builtinId="0"/>'
            f"</cellStyles>{dxfs}</styleSheet>")


# ---------------------------------------------------------------------- the scatter chart

CHART_SHEET = "nccl_implicit_sync"
_X, _Y = "Full msg size (MB)", "bus bw (GB/s)"


def wants_chart(title, part):
    return title == CHART_SHEET and _X in part.columns and _Y in part.columns and len(part) > 0


def chart_parts(title, part):
    """{zip member: XML} of a scatter chart of bus bandwidth against message
    size (log-log) drawn on the sheet, right of its columns; the sheet's
    rels file included (the sheet's XML refers to it as rId1)."""
    from openpyxl.chart import Reference, ScatterChart, Series
    from openpyxl.chart.axis import ChartLines
    from openpyxl.xml.functions import tostring

    n = len(part)
    quoted = "'" + title.replace("'", "''") + "'"
    xcol = column_letter(list(part.columns).index(_X))
    ycol = column_letter(list(part.columns).index(_Y))
    chart = ScatterChart()
    chart.title = "Bus bandwidth against message size"
    chart.style = 2
    chart.scatterStyle = "lineMarker"
    chart.x_axis.title = "message size (MiB)"
    chart.y_axis.title = "bus bandwidth (GB/s)"
    chart.x_axis.scaling.logBase = 10
    chart.y_axis.scaling.logBase = 10
    chart.x_axis.majorGridlines = ChartLines()
    chart.x_axis.delete = False
    chart.y_axis.delete = False
    chart.legend = None
    xs = Reference(range_string=f"{quoted}!${xcol}$2:${xcol}${n + 1}")
    ys = Reference(range_string=f"{quoted}!${ycol}$2:${ycol}${n + 1}")
    series = Series(ys, xs, title="bus bw (GB/s)")
    series.marker.symbol = "circle"
    series.marker.size = 5
    series.marker.graphicalProperties.solidFill = "4C72B0"
    series.marker.graphicalProperties.line.solidFill = "4C72B0"
    series.graphicalProperties.line.noFill = True
    chart.series.append(series)
    chart_xml = tostring(chart._write())
    if isinstance(chart_xml, bytes):
        chart_xml = chart_xml.decode()
    col = len(part.columns) + 1
    drawing = ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
               '<xdr:wsDr xmlns:xdr="http://schemas.openxmlformats.org/drawingml/2006/spreadsheetDrawing" '
               'xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main">'
               f'<xdr:twoCellAnchor><xdr:from><xdr:col>{col}</xdr:col><xdr:colOff>0</xdr:colOff><xdr:row>1</xdr:row>'
               f'<xdr:rowOff>0</xdr:rowOff></xdr:from><xdr:to><xdr:col>{col + 10}</xdr:col><xdr:colOff>0</xdr:colOff>'
               '<xdr:row>24</xdr:row><xdr:rowOff>0</xdr:rowOff></xdr:to><xdr:graphicFrame macro="">'
               '<xdr:nvGraphicFramePr><xdr:cNvPr id="2" name="Bandwidth chart"/><xdr:cNvGraphicFramePr/>'
               '</xdr:nvGraphicFramePr><xdr:xfrm><a:off x="0" y="0"/><a:ext cx="0" cy="0"/></xdr:xfrm><a:graphic>'
               '<a:graphicData uri="http://schemas.openxmlformats.org/drawingml/2006/chart">'
               '<c:chart xmlns:c="http://schemas.openxmlformats.org/drawingml/2006/chart" '
               f'xmlns:r="{_NS_REL}" r:id="rId1"/></a:graphicData></a:graphic></xdr:graphicFrame><xdr:clientData/>'
               "</xdr:twoCellAnchor></xdr:wsDr>")
    pkg = "http://schemas.openxmlformats.org/package/2006/relationships"

    def rels(kind, target):
        return ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
                f'<Relationships xmlns="{pkg}"><Relationship Id="rId1" Type="{_NS_REL}/{kind}" Target="{target}"/>'
                "</Relationships>")

    return {"xl/drawings/drawing1.xml": drawing,
            "xl/drawings/_rels/drawing1.xml.rels": rels("chart", "../charts/chart1.xml"),
            "xl/charts/chart1.xml": chart_xml,
            "sheet_rels": rels("drawing", "../drawings/drawing1.xml")}


CONTENT_TYPES = ('<Override PartName="/xl/drawings/drawing1.xml" '
                 'ContentType="application/vnd.openxmlformats-officedocument.drawing+xml"/>'
                 '<Override PartName="/xl/charts/chart1.xml" '
                 'ContentType="application/vnd.openxmlformats-officedocument.drawingml.chart+xml"/>')

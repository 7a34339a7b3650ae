"""The report's writers: the workbook (``write_xlsx``: its own streaming
XML engine, or openpyxl) and the CSV directory (``write_csvs`` / ``CsvDir``),
both atomic, both keeping text from being read as a formula; on two cores a
forked child formats about half of a large output.  ``write_report`` writes
whichever outputs were asked for."""
import contextlib
import csv
import functools
import io
import logging
import math
import os
import re
import shutil
import tempfile

import numpy as np
import pandas as pd

from ..errors import StreamtraceError, os_reason
from ..io.outputs import OutputSet, check_suffix, resolve_output, umask
from ..parallel.cpus import available_cpus
from ..remote import is_url, local_path
from ..parallel.fork import Child, balanced, can_fork, split_in_two
from .cells import ILLEGAL_XML as _ILLEGAL_XML, xml_escape as _xml_escape
from .files import SHEET_ORDER

log = logging.getLogger("streamtrace")

EXCEL_MAX_ROWS = 1_048_576  # including the header row
_CHUNK_ROWS = 20000  # rows formatted at a time: bounds the memory of a chunk's cells
#: below this many cells in all sheets (~40 ms of formatting) forking a writer does not pay
_PARALLEL_MIN_CELLS = 200_000

_RISKY = ("=", "+", "-", "@", "\t", "\r")
_RISKY_FIRST = frozenset(_RISKY)


# ---------------------------------------------------------------------- the workbook


def sheet_parts(name, df, max_rows=EXCEL_MAX_ROWS - 1):
    """Excel-sized pieces of a sheet: ``[(title, df)]``; titles are cut to 31
    characters, pieces after the first are named ``name (2)``, ``name (3)``..."""
    if len(df) <= max_rows:
        return [(name[:31], df)]
    parts = []
    for k, start in enumerate(range(0, len(df), max_rows)):
        suffix = "" if k == 0 else f" ({k + 1})"
        parts.append((name[:31 - len(suffix)] + suffix, df.iloc[start:start + max_rows]))
    return parts


def _cell_columns(df):
    """Column-wise Python values for writing: None for missing, Python scalars."""
    cols = []
    for name in df.columns:
        s = df[name]
        if s.dtype.kind == "f":
            vals = s.to_numpy()
            cols.append([None if v != v else float(v) for v in vals.tolist()])
        elif s.dtype.kind in "iub":
            cols.append(s.to_numpy().tolist())
        else:
            cols.append([None if (v is None or v is pd.NA or (isinstance(v, float) and v != v)) else
                         (v.item() if hasattr(v, "item") else v) for v in s.astype(object).tolist()])
    return cols


def write_xlsx(sheets, path, max_rows=EXCEL_MAX_ROWS - 1, engine="fast", outputs=None):
    """Write the sheets to one workbook at ``path`` (atomically: a temporary
    file renamed on success).

    Sheets longer than Excel's row limit are split (``nccl_long``,
    ``nccl_long (2)``, ...) with a warning.  Text is never a formula: cells
    starting with ``=``, ``+``, ``-`` or ``@`` are stored as text.  Control
    characters that XML cannot hold are dropped; NaN and missing values are
    empty cells.

    ``engine="fast"`` (default) streams the sheet XML straight into the zip
    (about 20x faster than openpyxl without lxml, which matters for
    100k-row sheets); ``engine="openpyxl"`` writes through openpyxl's
    write-only workbook.  Both produce workbooks that openpyxl, pandas and
    Excel read identically.

    ``outputs``: an ``OutputSet`` to stage the workbook in (committed with
    the set's other outputs) instead of committing it at once.
    """
    path = str(path)
    target, direct = resolve_output(path)
    if not direct and not os.path.isdir(os.path.dirname(target)):
        raise StreamtraceError(f"{path}: the output directory does not exist")
    check_suffix(path)
    parts = []
    for name, df in sheets.items():
        pieces = sheet_parts(name, df, max_rows)
        if len(pieces) > 1:
            log.warning(f"sheet {name}: {len(df)} rows exceed Excel's limit; split into {len(pieces)} sheets "
                        "(CSV output keeps the whole table)")
        parts += pieces
    if engine not in ("openpyxl", "fast"):
        raise StreamtraceError(f"unknown xlsx engine {engine!r} (fast or openpyxl)")
    # spooled sheets go beside the workbook, or to $TMPDIR when it is a device or a pipe
    spool_dir = tempfile.gettempdir() if direct else os.path.dirname(target)
    with contextlib.ExitStack() as stack:
        if outputs is None:
            outputs = stack.enter_context(OutputSet())
        with outputs.file(path, suffix=".xlsx") as f:
            if engine == "openpyxl":
                _write_openpyxl(parts, f)
            else:
                _write_fast(parts, f, spool_dir)
    return path


def _write_openpyxl(parts, target):
    from openpyxl import Workbook
    from openpyxl.cell import WriteOnlyCell

    wb = Workbook(write_only=True)
    for title, part in parts:
        ws = wb.create_sheet(title)
        ws.append([str(c) for c in part.columns])
        cols = _cell_columns(part)
        text_cols = [i for i, c in enumerate(part.columns) if part[c].dtype.kind not in "fiub"]
        for row in zip(*cols) if cols else ():
            if text_cols:
                row = list(row)
                for i in text_cols:
                    v = row[i]
                    if isinstance(v, str):
                        if _ILLEGAL_XML.search(v):
                            v = _ILLEGAL_XML.sub("", v)
                            row[i] = v
                        if v.startswith(_RISKY):
                            cell = WriteOnlyCell(ws, v)
                            cell.data_type = "s"  # text, never a formula
                            row[i] = cell
                    elif not isinstance(v, (int, float, bool)) and v is not None:
                        row[i] = str(v)
            ws.append(row)
    wb.save(target)


# ---------------------------------------------------------------------- the fast engine

_NS_MAIN = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
_NS_REL = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
_NS_PKG = "http://schemas.openxmlformats.org/package/2006/relationships"
_XML_HEAD = '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
_STYLES = (_XML_HEAD + f'<styleSheet xmlns="{_NS_MAIN}"><fonts count="1"><font><sz val="11"/><name val="Calibri"/>'
           '</font></fonts><fills count="2"><fill><patternFill patternType="none"/></fill><fill><patternFill '
           'patternType="gray125"/></fill></fills><borders count="1"><border><left/><right/><top/><bottom/>'
           '<diagonal/></border></borders><cellStyleXfs count="1"><xf numFmtId="0" fontId="0" fillId="0" '
           'borderId="0"/></cellStyleXfs><cellXfs count="1"><xf numFmtId="0" fontId="0" fillId="0" borderId="0" '
           'xfId="0"/></cellXfs><cellStyles count="1"><cellStyle name="Normal" xfId="0" builtinId="0"/>'
           '</cellStyles></styleSheet>')
_EMPTY = "<c/>"


def _str_cell(s):
    s = _xml_escape(s)
    space = ' xml:space="preserve"' if s[:1].isspace() or s[-1:].isspace() else ""
    return f'<c t="inlineStr"><is><t{space}>{s}</t></is></c>'


#: characters _xml_escape changes (XML-illegal controls, CR, & < >)
_XML_SPECIAL = re.compile(r"[\x00-\x08\x0b-\x1f&<>]")


def _str_cells(values):
    """``_str_cell`` of each str: one search over them all when none needs escaping."""
    if _XML_SPECIAL.search("\t".join(values)):   # tab: legal and never escaped, so it adds no match
        return [_str_cell(s) for s in values]
    return [_str_cell(s) if s[:1].isspace() or s[-1:].isspace() else f'<c t="inlineStr"><is><t>{s}</t></is></c>'
            for s in values]


def _num_cell(v):
    return f"<c><v>{v!r}</v></c>" if v == v and v not in (math.inf, -math.inf) else _EMPTY


def _xml_other(v):
    """The <c> element of a non-str, non-missing object in a mixed column."""
    if isinstance(v, (bool, np.bool_)):
        return '<c t="b"><v>1</v></c>' if v else '<c t="b"><v>0</v></c>'
    if isinstance(v, (int, np.integer)):
        return f"<c><v>{int(v)}</v></c>"
    if isinstance(v, (float, np.floating)):
        return _num_cell(float(v))
    return _str_cell(str(v))


def _xml_style():
    """Cells as <c> elements: numbers as repr/str, text as inline strings
    (never a formula), escaped once per distinct value; NaN and +-inf empty."""
    from .cells import CellStyle

    return CellStyle(na=_EMPTY, true='<c t="b"><v>1</v></c>', false='<c t="b"><v>0</v></c>', text=_str_cell,
                     other=_xml_other, number_open="<c><v>", number_close="</v></c>", nonfinite_na=True,
                     texts=_str_cells)


def _isal_deflating(member):
    """A zip member being written, deflated by ISA-L (python-isal, already a
    dependency for gzip input) instead of zlib: the same raw deflate format at
    several times the speed and a smaller output (docs/performance.md).
    zipfile has no public hook for its compressor, so this swaps the member's
    own deflate object; when zipfile's internals differ, zlib stays."""
    try:
        from isal import isal_zlib
    except ImportError:  # pragma: no cover - isal is a dependency
        return member
    if getattr(member, "_compressor", None) is not None and getattr(member, "_compress_size", None) == 0:
        member._compressor = isal_zlib.compressobj(1, isal_zlib.DEFLATED, -15)
    return member


class _ZipWriterThread:
    """Deflates and writes zip members in a background thread, so the next
    chunk of sheet XML is formatted (Python, GIL) while the previous one is
    compressed (zlib, without the GIL).  Only this thread touches the zip."""

    def __init__(self, zf):
        import queue
        import threading

        self.zf, self.error = zf, None
        self.q = queue.Queue(maxsize=4)  # bounds the formatted-but-unwritten text
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        member = None
        while True:
            item = self.q.get()
            if item is None:
                break
            if self.error is not None:
                continue  # keep draining so the producer never blocks
            try:
                name, data = item
                if name is not None:  # start a member
                    member = _isal_deflating(self.zf.open(name, "w", force_zip64=True))
                elif data is None:  # end it
                    member, m = None, member
                    m.close()
                else:
                    member.write(data)
            except BaseException as exc:  # re-raised in the producer
                self.error = exc
        if member is not None:  # the producer failed mid-member: leave the zip closable
            try:
                member.close()
            except BaseException:
                pass

    def _put(self, item):
        if self.error is not None:
            raise self.error
        self.q.put(item)

    def member(self, name):
        self._put((name, None))

    def write(self, data):
        self._put((None, data))

    def end_member(self):
        self._put((None, None))

    def close(self):
        self.q.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error


def _sheet_xml(part, extras=("", "")):
    """The worksheet XML of one sheet, in pieces (20,000 rows each);
    ``extras``: XML before and after <sheetData> (``xlsx_style``)."""
    yield (_XML_HEAD + f'<worksheet xmlns="{_NS_MAIN}" xmlns:r="{_NS_REL}">{extras[0]}<sheetData>').encode()
    yield ("<row>" + "".join(_str_cell(str(c)) for c in part.columns) + "</row>").encode()
    from .cells import column_cells, table_rows

    style = _xml_style()
    for start in range(0, len(part), _CHUNK_ROWS):
        chunk = part.iloc[start:start + _CHUNK_ROWS]
        if not len(chunk.columns):
            yield b"<row/>" * len(chunk)
            continue
        cols = []
        for c in range(len(chunk.columns)):
            cells = column_cells(chunk.iloc[:, c], style)
            if cells is None:   # a dtype cells does not know: float32 as float64, others value by value
                col = chunk.iloc[:, c]
                wider = np.float64 if isinstance(col.dtype, np.dtype) and col.dtype.kind == "f" else object
                cells = column_cells(col.astype(wider), style)
            cols.append(cells)
        yield from table_rows(cols, style, sep="", row_open="<row>", row_close="</row>")
    yield f"</sheetData>{extras[1]}</worksheet>".encode()


def _spool_sheet_xml(part, path, extras):
    with open(path, "wb") as f:
        for piece in _sheet_xml(part, extras):
            f.write(piece)


def _write_fast(parts, target, spool_dir):
    import zipfile

    from . import xlsx_style

    titles = [title for title, _ in parts]
    styles = xlsx_style.Styles()
    chart = next((i for i, (title, part) in enumerate(parts) if xlsx_style.wants_chart(title, part)), None)
    extras = [styles.sheet(part, drawing=i == chart) for i, (_, part) in enumerate(parts)]
    # on two cores a forked child formats about half of a large workbook's
    # sheets into spooled XML files, which this process then compresses into
    # the zip (formatting holds the GIL; zlib in the writer thread does not)
    cells = [part.shape[0] * max(1, part.shape[1]) for _, part in parts]
    mine, theirs = list(range(len(parts))), []
    spool = child = None
    if len(parts) > 1 and sum(cells) >= _PARALLEL_MIN_CELLS and available_cpus() > 1 and can_fork():
        mine, theirs = (sorted(g) for g in balanced(list(range(len(parts))), cells))
        spool = tempfile.mkdtemp(prefix=".streamtrace-xlsx-", dir=spool_dir)
        child = Child([functools.partial(_spool_sheet_xml, parts[i][1], os.path.join(spool, f"{i}.xml"), extras[i])
                       for i in theirs])
    try:
        with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
            out = _ZipWriterThread(zf)
            try:
                for i in mine:
                    out.member(f"xl/worksheets/sheet{i + 1}.xml")
                    for piece in _sheet_xml(parts[i][1], extras[i]):
                        out.write(piece)
                    out.end_member()
                if child is not None:
                    child.wait()
                for i in theirs:
                    out.member(f"xl/worksheets/sheet{i + 1}.xml")
                    with open(os.path.join(spool, f"{i}.xml"), "rb") as f:
                        for piece in iter(lambda: f.read(4 << 20), b""):
                            out.write(piece)
                    out.end_member()
            finally:
                out.close()
            _write_workbook_parts(zf, titles, styles,
                                  None if chart is None else (chart, xlsx_style.chart_parts(*parts[chart])))
    finally:
        if child is not None:
            child.stop()
        if spool is not None:
            shutil.rmtree(spool, ignore_errors=True)


def _write_workbook_parts(zf, titles, styles=None, chart=None):
    """Every member of the workbook but the worksheets; ``chart``: (sheet
    index, ``xlsx_style.chart_parts``) or None."""
    from . import xlsx_style

    sheets_xml = "".join(f'<sheet name="{_attr(t)}" sheetId="{i}" r:id="rId{i}"/>'
                         for i, t in enumerate(titles, start=1))
    zf.writestr("xl/workbook.xml", _XML_HEAD + f'<workbook xmlns="{_NS_MAIN}" xmlns:r="{_NS_REL}">'
                f"<sheets>{sheets_xml}</sheets></workbook>")
    rels = "".join(f'<Relationship Id="rId{i}" Type="{_NS_REL}/worksheet" Target="worksheets/sheet{i}.xml"/>'
                   for i in range(1, len(titles) + 1))
    rels += f'<Relationship Id="rId{len(titles) + 1}" Type="{_NS_REL}/styles" Target="styles.xml"/>'
    zf.writestr("xl/_rels/workbook.xml.rels", _XML_HEAD + f'<Relationships xmlns="{_NS_PKG}">{rels}</Relationships>')
    zf.writestr("xl/styles.xml", _STYLES if styles is None else xlsx_style.styles_xml(styles))
    chart_types = ""
    if chart is not None:
        index, members = chart
        for name, xml in members.items():
            zf.writestr(f"xl/worksheets/_rels/sheet{index + 1}.xml.rels" if name == "sheet_rels" else name, xml)
        chart_types = xlsx_style.CONTENT_TYPES
    zf.writestr("_rels/.rels", _XML_HEAD + f'<Relationships xmlns="{_NS_PKG}"><Relationship Id="rId1" '
                f'Type="{_NS_REL}/officeDocument" Target="xl/workbook.xml"/></Relationships>')
    ct = "application/vnd.openxmlformats-officedocument.spreadsheetml"
    overrides = "".join(f'<Override PartName="/xl/worksheets/sheet{i}.xml" ContentType="{ct}.worksheet+xml"/>'
                        for i in range(1, len(titles) + 1))
    zf.writestr("[Content_Types].xml", _XML_HEAD + '<Types xmlns="http://schemas.openxmlformats.org/package/2006/'
                'content-types"><Default Extension="rels" ContentType="application/vnd.openxmlformats-package.'
                'relationships+xml"/><Default Extension="xml" ContentType="application/xml"/>'
                f'<Override PartName="/xl/workbook.xml" ContentType="{ct}.sheet.main+xml"/>'
                f'<Override PartName="/xl/styles.xml" ContentType="{ct}.styles+xml"/>{overrides}{chart_types}</Types>')


def _attr(s):
    s = _xml_escape(s).replace('"', "&quot;")
    for ch in '[]:*?/\\':
        s = s.replace(ch, "_")
    return s


# ---------------------------------------------------------------------- the CSV files


#: where a spreadsheet starts a new cell inside a multi-line value -- after a
#: line break (it may split the row there) or a comma (on such a split line
#: the quoting no longer holds) -- followed, past any quotes, by what it
#: would read as the start of a formula
_FORMULA_AFTER_BREAK = re.compile(r'(?<=[\r\n,])(?="*[=+\-@\t])')


def _neutral(v):
    """A text cell that no spreadsheet evaluates: a ``'`` before a leading
    ``= + - @ TAB CR``, and in a value holding CR or LF (which the writers
    also quote) before each cell a spreadsheet could start inside it."""
    if v[:1] in _RISKY_FIRST:
        v = "'" + v
    if "\r" in v or "\n" in v:
        v = _FORMULA_AFTER_BREAK.sub("'", v)
    return v


def _csv_safe(df):
    """Text cells that a spreadsheet would evaluate neutralised (``_neutral``)."""
    out = None
    for col in df.columns:
        s = df[col]
        if s.dtype.kind in "fiub" or isinstance(s.dtype, pd.Int64Dtype):
            continue
        values = s.to_numpy(dtype=object)
        risky = np.fromiter((isinstance(v, str) and (v[:1] in _RISKY_FIRST or "\r" in v or "\n" in v)
                             for v in values), dtype=bool, count=len(values))
        if risky.any():
            if out is None:
                out = df.copy()
            values = values.copy()
            values[risky] = [_neutral(v) for v in values[risky]]
            out[col] = pd.Series(values, dtype=object, index=df.index)
    return df if out is None else out


def _pandas_csv(df, path):
    """``_csv_safe(df).to_csv(path, index=False)``; every field quoted when a
    text holds a CR, which the csv module alone leaves bare (it quotes only
    its own line end, "\n") and at which readers start a new row."""
    safe = _csv_safe(df)
    holds_cr = any(isinstance(v, str) and "\r" in v
                   for col in safe.columns if safe[col].dtype == object for v in safe[col].tolist())
    safe.to_csv(path, index=False, quoting=csv.QUOTE_ALL if holds_cr else csv.QUOTE_MINIMAL)


def _csv_style():
    """Cells as ``to_csv`` writes them: str values formula-neutralised (as
    ``_csv_safe``) and quoted as the csv module quotes them."""
    from . import cells

    quote = cells.CsvQuoter()

    return cells.CellStyle(na="", true="True", false="False", text=lambda v: quote(_neutral(v)),
                           other=lambda v: quote(cells.object_text(v)),
                           texts=lambda values: quote.many([_neutral(v) for v in values]))


def _write_csv(df, path):
    """``_pandas_csv(df, path)``, byte for byte (but for CR, see CsvQuoter), about 10x
    faster: columns become cells (streamtrace.cells: numbers as int64, texts
    made once per distinct value) that the C core writes as rows, instead of
    pandas' per-cell csv-module path.  Frames the fast path does not cover (a
    dtype cells does not format, one column, no rows, non-text column names,
    another line separator) go to pandas itself."""
    from .cells import column_cells, table_rows

    style = _csv_style()

    def chunk_cells(start):
        part = df.iloc[start:start + _CHUNK_ROWS]
        cols = [column_cells(part.iloc[:, j], style) for j in range(len(df.columns))]
        return None if any(c is None for c in cols) else cols

    simple = (len(df.columns) >= 2 and len(df) and os.linesep == "\n" and df.columns.is_unique
              and all(isinstance(c, str) for c in df.columns))
    first = chunk_cells(0) if simple else None   # dtypes are the same in every chunk: the first one decides
    if first is None:
        _pandas_csv(df, path)
        return
    header = io.StringIO()
    csv.writer(header, lineterminator="\n").writerow(list(df.columns))
    with open(path, "wb") as f:
        f.write(header.getvalue().encode("utf-8"))
        for start in range(0, len(df), _CHUNK_ROWS):
            for piece in table_rows(first if start == 0 else chunk_cells(start), style, sep=",", row_close="\n"):
                f.write(piece)


def write_csvs(sheets, directory):
    """One ``<sheet>.csv`` per sheet (full tables, no index) in ``directory``.

    Files are written to a temporary directory next to it and then moved in,
    so a failure leaves no partial output; sheet files of an earlier run that
    this run does not write are removed (see ``CsvDir``).  Text cells that a
    spreadsheet would evaluate get a leading ``'`` (see ``_neutral``).
    """
    out = CsvDir(directory)
    try:
        out.write(sheets)
        return out.commit(sheets)
    finally:
        out.discard()


class CsvDir:
    """A CSV output directory being written (``write_csvs``): ``write``
    puts sheets in a temporary directory beside it (from any process: the
    one-shot report's forked child writes the sheets it builds), ``commit``
    moves them in, ``discard`` removes what was not committed.  Staged in an
    ``OutputSet`` (``stage``), it is moved in with the run's other outputs.

    A new directory is the temporary one renamed.  Into an existing one
    (which may hold the traces or anything else of the user's, or be a
    symlink) only the files the report owns are touched: ``<sheet>.csv`` for
    every sheet name the report can write -- this run's replace theirs, and
    those of an earlier run that this one did not write are removed, so the
    directory never mixes two runs.  Every target is checked before the
    first one is replaced, and the files replaced or removed are kept aside
    until the whole set is in place, so a rollback puts them back.

    A URL (``s3://bucket/run/csv``): the sheets are written in a local
    temporary directory and uploaded when placed, the same owned names
    replaced or removed under the prefix."""

    def __init__(self, directory):
        self.directory = str(directory)   # the user's spelling, for messages
        self.url = None
        self.names = []
        self.remote = False
        self._state = {}   # what place() did, for rollback()
        if is_url(local_path(self.directory)):
            from ..remote import check_output

            self.url = self.path = self.directory
            self.remote = True
            check_output(self.url)   # the bucket exists; not an object
            self._tmp = tempfile.mkdtemp(prefix=".streamtrace-csv-")
            return
        target = os.path.realpath(os.path.abspath(local_path(self.directory)))   # a symlinked directory stays a link
        parent = os.path.dirname(target)
        if not os.path.isdir(parent):
            raise StreamtraceError(f"{self.directory}: the parent directory does not exist")
        if os.path.exists(target) and not os.path.isdir(target):
            raise StreamtraceError(f"{self.directory}: exists and is not a directory")
        self.target = target
        self.path = os.path.abspath(self.directory)
        try:
            self._tmp = tempfile.mkdtemp(prefix=".streamtrace-csv-", dir=parent)
        except OSError as exc:   # read-only, no permission
            raise StreamtraceError(f"{self.directory}: cannot write in its parent directory: "
                                   f"{os_reason(exc)}") from None

    def _write_one(self, name, df):
        try:
            _write_csv(df, os.path.join(self._tmp, f"{name}.csv"))
        except OSError as exc:   # a full disk: the user's directory, not the hidden one
            raise StreamtraceError(f"{os.path.join(self.directory, name + '.csv')}: cannot write it: "
                                   f"{os_reason(exc)}") from None

    def write(self, sheets, parallel=True):
        """Write ``{name: DataFrame}`` (``parallel`` on two cores: a large set
        split with a forked child)."""
        tasks = [functools.partial(self._write_one, name, df) for name, df in sheets.items()]
        cells = [df.shape[0] * max(1, df.shape[1]) for df in sheets.values()]
        if parallel and sum(cells) >= _PARALLEL_MIN_CELLS and available_cpus() > 1:
            split_in_two(tasks, cells)  # two cores: a forked child writes about half
        else:
            for task in tasks:
                task()

    def stage(self, outputs, names):
        """Commit the sheets ``names`` (all written by then) with the other
        outputs of ``outputs`` (an ``OutputSet``); returns self."""
        self.names = list(names)
        return outputs.add(self)

    def commit(self, names):
        """Move the sheets ``names`` (all written) into place, alone; returns
        the directory (absolute, a link not followed), or the URL."""
        with OutputSet() as outputs:
            self.stage(outputs, names)
        return self.path

    def place(self):
        if self.url is not None:
            return self._upload()
        tmp, target, names = self._tmp, self.target, self.names
        for name in names:
            os.chmod(os.path.join(tmp, f"{name}.csv"), 0o666 & ~umask())
        try:
            if not os.path.exists(target):
                os.chmod(tmp, 0o777 & ~umask())
                self._state["created"] = True   # before the rename: a rollback checks where tmp is
                os.rename(tmp, target)
                return
            owned = [f"{n}.csv" for n in dict.fromkeys(names + SHEET_ORDER)]
            for file in owned:   # all checked first: a refusal leaves the directory as it was
                dst = os.path.join(target, file)
                if os.path.lexists(dst) and (os.path.islink(dst) or not os.path.isfile(dst)):
                    raise StreamtraceError(f"{os.path.join(self.directory, file)}: is not a regular file; "
                                           "nothing was replaced")
            aside = self._state["aside"] = os.path.join(tmp, ".previous")
            os.mkdir(aside)
            for file in owned:   # this run's replace them, the others go: all kept aside until finish()
                with contextlib.suppress(FileNotFoundError):
                    os.rename(os.path.join(target, file), os.path.join(aside, file))
            for name in names:
                os.replace(os.path.join(tmp, f"{name}.csv"), os.path.join(target, f"{name}.csv"))
        except OSError as exc:
            raise StreamtraceError(f"{self.directory}: cannot move the sheets into it: "
                                   f"{os_reason(exc)}") from None

    def _upload(self):
        """place() for a URL: each sheet uploaded (an object appears whole),
        then the owned names this run did not write removed."""
        from ..remote import join, object_state, remove, upload

        uploaded = self._state.setdefault("uploaded", {})
        for name in self.names:
            url = join(self.url, f"{name}.csv")
            uploaded[url] = object_state(url)
            upload(os.path.join(self._tmp, f"{name}.csv"), url)
        for name in dict.fromkeys(SHEET_ORDER):
            if name not in self.names:
                remove(join(self.url, f"{name}.csv"))

    def rollback(self):
        """Undo place(), wherever it stopped; the temporary directory goes too."""
        if self.url is not None:
            from ..remote import remove_if_changed

            for url, before in self._state.get("uploaded", {}).items():
                remove_if_changed(url, before)
        elif self._state.get("created"):
            if not os.path.exists(self._tmp):   # renamed into place: the whole directory is this run's
                shutil.rmtree(self.target, ignore_errors=True)
        elif self._state.get("aside"):
            aside = self._state["aside"]
            for name in self.names:   # this run's sheets back out, then the earlier ones back in
                src = os.path.join(self.target, f"{name}.csv")
                if not os.path.lexists(os.path.join(self._tmp, f"{name}.csv")) and os.path.lexists(src):
                    os.unlink(src)
            for file in os.listdir(aside):
                os.replace(os.path.join(aside, file), os.path.join(self.target, file))
        self.discard()

    def finish(self):
        self.discard()

    def discard(self):
        if self._tmp is not None and os.path.exists(self._tmp):
            shutil.rmtree(self._tmp, ignore_errors=True)


def write_report(sheets, output_xlsx_path=None, output_csvs_dir=None, output_html_path=None, html=None,
                 write_html=None):
    """Write the requested outputs as one set (``OutputSet``: all of them
    appear, or none does); returns the paths written.  ``html``: the HTML
    page's options (``html_report.render_html``'s keywords); ``write_html``:
    the page's writer (``html_report.write_html``), given by the caller
    because the page sits above the sheets in the package's layers."""
    written = []
    with OutputSet() as outputs:
        if output_csvs_dir:
            csvs = CsvDir(output_csvs_dir).stage(outputs, sheets)   # the set discards it on any error
            csvs.write(sheets)
            written.append(csvs.path)
        if output_xlsx_path:
            written.append(write_xlsx(sheets, output_xlsx_path, outputs=outputs))
        if output_html_path:
            if write_html is None:
                raise ValueError("write_report needs write_html to write an HTML page")
            written.append(write_html(sheets, output_html_path, outputs=outputs, **(html or {})))
    return written


__all__ = ["write_xlsx", "write_csvs", "write_report", "sheet_parts", "CsvDir"]

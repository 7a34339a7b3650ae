"""Docs stay in step with the code: record layouts, commands and --help."""
import os
import re

import pytest
from click.testing import CliRunner

from streamtrace._native import COMM_DTYPE, EVENT_DTYPE, KERNEL_DTYPE
from streamtrace.cli import main

from conftest import ROOT  # the checkout


def _doc_table(struct):
    text = open(os.path.join(ROOT, "docs", "stream-format.md")).read()
    section = text.split(f"### `{struct}`")[1].split("\n### ")[0].split("\n## ")[0]
    rows = re.findall(r"^\|\s*(\d+)\s*\|\s*(\w+)\s*\|\s*((?:\\\||[^|])*?)\s*\|", section, re.M)
    size = int(re.search(r"\((\d+) bytes\)", text.split(f"### `{struct}`")[1]).group(1))
    return size, [(int(o), name, typ.replace("\\|", "|")) for o, name, typ in rows]


@pytest.mark.parametrize("struct,dtype", [("st_event", EVENT_DTYPE), ("st_kernel", KERNEL_DTYPE),
                                          ("st_comm", COMM_DTYPE)])
def test_stream_format_doc_matches_structs(struct, dtype):
    size, rows = _doc_table(struct)
    assert size == dtype.itemsize
    actual = []
    for name in dtype.names:
        t, off = dtype.fields[name][:2]
        typ = f"{t.base.str}[{t.shape[0]}]" if t.shape else t.str
        actual.append((off, name, typ))
    assert rows == actual


def test_every_command_has_help_and_readme_section():
    readme = open(os.path.join(ROOT, "README.md")).read()
    for name, cmd in main.commands.items():
        assert cmd.help and len(cmd.help) > 20, name
        result = CliRunner().invoke(main, [name, "--help"])
        assert result.exit_code == 0, name
        assert f"streamtrace {name}" in readme, f"README has no example of 'streamtrace {name}'"


def test_readme_starts_with_the_two_commands():
    lines = [line for line in open(os.path.join(ROOT, "README.md")).read().splitlines() if line.strip()]
    head = "\n".join(lines[:12])
    assert "make demo" in head and "make test" in head


def test_cli_reference_is_current():
    """docs/cli.md is what scripts/cli_docs.py makes from today's --help (`make docs` rewrites it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("cli_docs", os.path.join(ROOT, "scripts", "cli_docs.py"))
    cli_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli_docs)
    current = open(os.path.join(ROOT, "docs", "cli.md")).read()
    assert current == cli_docs.render(), "docs/cli.md is out of date: run `make docs`"


def test_stream_format_doc_matches_version_and_frame_header():
    from streamtrace.stream.format import _FRAME, FORMAT_VERSION

    text = open(os.path.join(ROOT, "docs", "stream-format.md")).read()
    assert f"(format version {FORMAT_VERSION})" in text and f"u32 format_version (= {FORMAT_VERSION})" in text
    section = text.split("The frame header, byte by byte:")[1].split("\n\n")[1]
    rows = re.findall(r"^\|\s*(\d+)\s*\|\s*(\w+)\s*\|\s*(<u\d)\s*\|", section, re.M)
    assert [r[1] for r in rows] == ["kind", "rank", "payload_length", "crc32", "reserved"]
    assert "<" + "".join(t[-1].replace("4", "I").replace("8", "Q") for _, _, t in rows) == _FRAME.format
    assert int(rows[-1][0]) + 4 == _FRAME.size

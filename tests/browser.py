"""Headless chromium (Debian's ``chromium``) and LibreOffice for the tests.

Missing programs skip a test on a developer's machine but fail it on CI
(CI=true), where ``make test`` installs them first.
"""
import json
import os
import re
import shutil
import subprocess
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def need(program, package):
    path = shutil.which(program)
    if path:
        return path
    message = f"{program} is not installed (Debian package {package}; make test installs it)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def artifacts_dir():
    """Where screenshots are kept after the run: $STREAMTRACE_ARTIFACTS, else build/test-artifacts."""
    d = os.environ.get("STREAMTRACE_ARTIFACTS") or os.path.join(ROOT, "build", "test-artifacts")
    os.makedirs(d, exist_ok=True)
    return d


def _chromium_args(profile):
    # network off: every host resolves to nothing and any proxy use goes to a closed port
    return [need("chromium", "chromium"), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile}", "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
            "--enable-logging=stderr", "--v=0", "--hide-scrollbars"]


def chromium(page, *args, timeout=120):
    """Run headless chromium on a page file with extra ``args``: (stdout, stderr)."""
    with tempfile.TemporaryDirectory(prefix="streamtrace-chromium-") as profile:
        res = subprocess.run(_chromium_args(profile) + list(args) + ["file://" + os.path.abspath(page)],
                             capture_output=True, text=True, timeout=timeout)
    return res.stdout, res.stderr


def console_errors(stderr):
    """Lines chromium logged for the page's console errors and uncaught exceptions."""
    return [line for line in stderr.splitlines()
            if "CONSOLE" in line or "Uncaught" in line or "SyntaxError" in line]


class Page:
    """What the browser made of a page after its scripts ran."""

    def __init__(self, dom, stderr):
        self.dom, self.stderr = dom, stderr

    def body_attr(self, name):
        m = re.search(r"<body[^>]*\s" + re.escape(name) + r'="([^"]*)"', self.dom)
        return None if m is None else m.group(1)

    def errors(self):
        raw = self.body_attr("data-errors")
        import html
        return (json.loads(html.unescape(raw)) if raw is not None else ["the render script did not run"]) \
            + console_errors(self.stderr)

    def chart_divs(self):
        """{chart key: the text of its div} for every chart container."""
        out = {}
        for m in re.finditer(r'<div class="chart[^"]*" id="chart-([^"]+)"', self.dom):
            end = self.dom.find("<p class=\"sentence\"", m.end())
            out[m.group(1)] = self.dom[m.end():end if end >= 0 else len(self.dom)]
        return out


def load(page):
    """The page's DOM once its scripts ran (``--dump-dom``)."""
    dom, err = chromium(page, "--window-size=1400,1000", "--dump-dom")
    return Page(dom, err)


def screenshot(page, png, height=3000):
    chromium(page, f"--window-size=1400,{height}", f"--screenshot={png}")
    return png


def assert_not_blank(png):
    """The screenshot shows something: many distinct colours, and a fair share
    of pixels that are neither the page's background nor white."""
    import numpy as np
    from PIL import Image

    img = np.asarray(Image.open(png).convert("RGB")).astype(int)
    assert img.shape[0] > 500 and img.shape[1] > 500
    flat = img.reshape(-1, 3)
    colours = len(np.unique(flat[:: max(1, len(flat) // 200_000)], axis=0))
    assert colours > 50, f"{png}: only {colours} colours"
    background = np.array([244, 245, 247])
    ink = (np.abs(flat - background).sum(axis=1) > 30) & (np.abs(flat - 255).sum(axis=1) > 30)
    assert ink.mean() > 0.05, f"{png}: {ink.mean():.1%} of the pixels are drawn"


def soffice():
    return need("soffice", "libreoffice-calc-nogui")

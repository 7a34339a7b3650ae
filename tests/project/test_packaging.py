"""A regular install (``pip install .``, a wheel) ships every package of
streamtrace, not only the top-level one: the editable install the tests run
under would not notice a subpackage left out."""
import os
import subprocess
import sys

from conftest import ROOT  # the checkout


def _packages_in_tree():
    out = set()
    for root, _, files in os.walk(os.path.join(ROOT, "streamtrace")):
        if "__init__.py" in files and "__pycache__" not in root:
            out.add(os.path.relpath(root, ROOT).replace(os.sep, "."))
    return out


def test_build_ships_every_package(tmp_path):
    # build_py copies the Python files setuptools would put in a wheel; it
    # compiles nothing, so it is quick
    result = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    shipped = {os.path.relpath(root, tmp_path).replace(os.sep, ".")
               for root, _, files in os.walk(tmp_path) if "__init__.py" in files}
    assert len(_packages_in_tree()) > 1
    assert shipped == _packages_in_tree()

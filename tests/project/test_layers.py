"""The package's layers: every import inside streamtrace points down the order
below, and no group of modules imports itself round in a circle.

Imports inside functions count as much as those at the top: a cycle that runs
only because an import was moved into a function is still a cycle.
"""
import ast
import os

import pytest

from conftest import ROOT

PACKAGE = os.path.join(ROOT, "streamtrace")

#: lowest first; a unit may import itself and the units before it
LAYERS = [
    "errors", "settings",
    "_core", "_native",
    "collectives", "codes", "userregex",
    "remote",
    "progress",
    "parallel",
    "stream",
    "io",
    "extract",
    "steps",
    "confidence",
    "align",
    "correlate",
    "report",
    "critical",
    "plots", "html_report",
    "chain",
    "diff",
    "dump", "fuse",
    "tracelens",
    "cli",
]
#: the package's own __init__ exports names from every layer (lazily); the
#: build script runs at install time only
EXEMPT = {"streamtrace", "streamtrace._build"}


def _modules():
    out = {}
    for root, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                rel = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].replace(os.sep, ".")
                name = rel[: -len(".__init__")] if rel.endswith(".__init__") else rel
                out[name] = path
    return out


def _imports(name, path):
    """Every streamtrace module ``name`` imports (anywhere in the file)."""
    is_package = path.endswith("__init__.py")
    parts = name.split(".")
    base = parts if is_package else parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                prefix = base[: len(base) - node.level + 1]
                target = ".".join(prefix + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("streamtrace"):
                continue
            if node.module is None or node.level == 0 and target == "streamtrace":
                for alias in node.names:   # from . import x: x may be a module
                    found.add(f"{target}.{alias.name}")
            else:
                found.add(target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("streamtrace"))
    return found


def _unit(module):
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _resolve(target, modules):
    """The module a dotted import target names (``pkg.name`` may be a name in ``pkg``)."""
    while target and target not in modules and target != "streamtrace._core":
        target = target.rsplit(".", 1)[0]
    return target


def _graph():
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        graph[name] = {t for t in (_resolve(t, modules) for t in _imports(name, path)) if t and t != name}
    return modules, graph


def test_every_module_has_a_layer():
    modules, _ = _graph()
    unplaced = sorted(m for m in modules if m not in EXEMPT and _unit(m) not in LAYERS)
    assert not unplaced, f"modules outside the layer order (add them to LAYERS): {unplaced}"


def test_imports_point_down():
    modules, graph = _graph()
    upward = []
    for name, targets in graph.items():
        if name in EXEMPT:
            continue
        here = LAYERS.index(_unit(name))
        for t in targets:
            if t in EXEMPT:
                upward.append(f"{name} -> {t}")
            elif LAYERS.index(_unit(t)) > here:
                upward.append(f"{name} -> {t}")
    assert not upward, "imports that point up the layer order:\n" + "\n".join(sorted(upward))


def test_no_import_cycles():
    _, graph = _graph()
    graph = {m: {t for t in ts if t not in EXEMPT} for m, ts in graph.items() if m not in EXEMPT}
    cycles = []
    state = {}

    def visit(node, trail):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(trail[trail.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("source, expected", [
    ("from ..errors import X", {"streamtrace.errors"}),
    ("from . import stage", {"streamtrace.align.stage"}),
    ("def f():\n    from ..chain import g", {"streamtrace.chain"}),
])
def test_the_checker_sees_imports(tmp_path, source, expected):
    path = tmp_path / "collect.py"
    path.write_text(source)
    assert _imports("streamtrace.align.collect", str(path)) == expected

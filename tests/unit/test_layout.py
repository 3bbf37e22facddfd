"""The package's layout is its architecture; a static scan keeps it so.

Every import counts: at module level, inside functions, under TYPE_CHECKING; relative ones are
resolved. Layers, top down: commands/ and cli -> core/ -> backends/ -> platform/ and image/."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "npusnap_cli"
SRC = Path(__file__).resolve().parents[2] / PACKAGE
MAX_FUNCTION_LINES = 80
# What each layer must never import (a module of that layer, or of a package below it).
FORBIDDEN = {
    "core": ("commands", "cli"),
    "backends": ("commands", "cli", "core"),
    "platform": ("commands", "cli", "core", "backends"),
    "image": ("commands", "cli", "core", "backends"),
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("")
        if "_native" in rel.parts:
            continue
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _package_of(module: str) -> str:
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def _imports(module: str) -> set[str]:
    """The package's modules that `module` imports anywhere in its text."""
    found: set[str] = set()
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package_of(module).split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from pkg import name`: the submodule pkg.name when there is one, else pkg itself
            names = [f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target for a in node.names]
        else:
            continue
        found.update(n for n in names if n in MODULES)
    found.discard(module)
    return found


GRAPH = {m: _imports(m) for m in MODULES}


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_the_scan_sees_the_package() -> None:
    # A scan that found nothing would pass everything: make sure it reads real edges.
    assert {"npusnap_cli.core.checkpoint", "npusnap_cli.backends.base", "npusnap_cli.platform.criu",
            "npusnap_cli.image.format", "npusnap_cli.commands.checkpoint"} <= set(MODULES)
    assert "npusnap_cli.platform.simimages" in GRAPH["npusnap_cli.backends.direct"]  # from ..platform.simimages
    assert "npusnap_cli.core.checkpoint" in GRAPH["npusnap_cli.commands.checkpoint"]  # inside the function


def test_no_import_cycles() -> None:
    assert _cycles() == []


def test_layers_import_only_downwards() -> None:
    wrong = [f"{m} imports {t}" for m, targets in sorted(GRAPH.items()) for t in sorted(targets)
             if _layer(t) in FORBIDDEN.get(_layer(m), ())]
    assert wrong == []


def test_no_function_is_longer_than_a_screen() -> None:
    long = []
    for module, path in sorted(MODULES.items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{module}.{node.name}: {lines} lines")
    assert long == []

"""The import structure: no import cycle anywhere in ``tidal/`` or ``operators/``, and the layer
contracts of ``pyproject.toml`` (``[tool.importlinter]``: tidal never imports Airflow or
operators; entry points > audit > core > scaling > recipe > step kinds > storage/tracking >
step contract > integrity) hold.

Lazy imports inside functions and ``TYPE_CHECKING`` imports count too: a cycle hidden in a
function body is still a cycle a reader has to untangle.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

from tests.conftest import REPO


def import_cycles(*packages: str) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    graph = grimp.build_graph(*packages, include_external_packages=False)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in edges[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for module in edges:
        if module not in index:
            visit(module)
    return cycles


def test_no_import_cycle_in_tidal_or_operators():
    assert import_cycles("tidal", "operators") == []


def test_a_cycle_is_found(tmp_path, monkeypatch):
    pkg = tmp_path / "cyclepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from cyclepkg import b\n")
    (pkg / "b.py").write_text("from cyclepkg import a\n")
    (pkg / "c.py").write_text("from cyclepkg import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_cycles("cyclepkg") == [["cyclepkg.a", "cyclepkg.b"]]


def test_layer_contracts_hold():
    lint = Path(sys.executable).parent / "lint-imports"
    out = subprocess.run([str(lint), "--no-cache"], check=False, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout

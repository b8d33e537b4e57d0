"""The three packages and the bench import each other in one direction: no module imports a
module that imports it back. Every import counts, wherever it stands: at the top level, under
``if TYPE_CHECKING:``, or inside a function (the lean starts' lazy imports), since a lazy import
is still a dependency and a circle through one is still a circle. The daemon and the clients
import the protocol package, never each other. Pure: reads the source."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"memoryd_protocol": ROOT / "protocol" / "memoryd_protocol", "memoryd": ROOT / "daemon" / "memoryd",
            "memoryd_client": ROOT / "client" / "memoryd_client", "bench": ROOT / "bench"}


def _modules() -> dict[str, Path]:
    out = {}
    for package, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            parts = [package, *path.relative_to(root).with_suffix("").parts]
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def graph() -> dict[str, set[str]]:
    mods = _modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            edges[name] |= {t for t in targets if t in mods and t != name}
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert _cycles(graph()) == []


def test_the_daemon_and_the_clients_import_the_protocol_never_each_other() -> None:
    for name, targets in graph().items():
        top = name.partition(".")[0]
        if top == "bench":
            continue
        if top == "memoryd_protocol":
            assert not any(t.startswith(("memoryd.", "memoryd_client")) or t == "memoryd" for t in targets), name
        else:
            other = "memoryd_client" if top == "memoryd" else "memoryd"
            assert not any(t == other or t.startswith(other + ".") for t in targets), name


def test_the_check_sees_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]

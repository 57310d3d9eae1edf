"""The import structure docs/architecture.md promises, read from the source: the layers
point down (cli → fs → views → formats/codecs → cache → stores), and no two modules
import each other, not even for a type or from inside a function. A module that must
reach up is handed what it needs instead (see the architecture's list of such seams)."""

from __future__ import annotations

import ast
from pathlib import Path

import zvfs

PACKAGE = Path(zvfs.__file__).resolve().parent

#: the layers, bottom first: a module may import from its own layer or one below
LAYERS = [
    ("zvfs.stores",),
    ("zvfs.cache",),
    ("zvfs.codecs",),
    ("zvfs.formats",),
    ("zvfs.decoders",),
    ("zvfs.views",),
    ("zvfs.fs",),
    ("zvfs.metrics", "zvfs.daemon", "zvfs.status", "zvfs.cli", "zvfs.entry", "zvfs.__main__"),
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the zvfs modules it imports, wherever the import stands (top, function,
    ``if TYPE_CHECKING``). ``from pkg import name`` counts as the submodule when ``name`` is
    one, else as the package."""
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = edges.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:  # zvfs.x.y.Name -> zvfs.x.y
                    target = target.rpartition(".")[0]
                if target and target != name:
                    found.add(target)
    return edges


def _layer(module: str) -> str | None:
    for name in RANK:
        if module == name or module.startswith(name + "."):
            return name
    return None


def test_no_two_modules_import_each_other() -> None:
    edges = _imports(_modules())
    # Tarjan's strongly connected components: any of more than one module is a circle
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            circle = []
            while True:
                w = stack.pop()
                circle.append(w)
                if w == v:
                    break
            if len(circle) > 1:
                circles.append(sorted(circle))

    for v in edges:
        if v not in index:
            visit(v)
    assert circles == []


def test_the_layers_point_down_and_the_foundations_import_no_layer() -> None:
    edges = _imports(_modules())
    assert edges, "no module read"
    wrong = []
    for a, targets in edges.items():
        la = _layer(a)
        for b in targets:
            lb = _layer(b)
            if lb is None or lb == la:
                continue
            if la is None:  # a foundation (stats, logonce, workers...) imports no layer
                wrong.append(f"{a} -> {b} (a foundation module importing a layer)")
            elif RANK[la] < RANK[lb]:
                wrong.append(f"{a} -> {b} (up from {la} to {lb})")
    assert wrong == []


def test_codecs_import_nothing_of_zvfs_but_codecs() -> None:
    edges = _imports(_modules())
    codecs = {m: t for m, t in edges.items() if m.startswith("zvfs.codecs")}
    assert codecs
    assert {m: sorted(t) for m, t in codecs.items()
            if any(not x.startswith("zvfs.codecs") for x in t)} == {}


def test_the_check_sees_a_circle_and_an_upward_import(tmp_path: Path, monkeypatch) -> None:
    """The reader of imports is not blind: a made-up package with a function-level import
    back, and a store importing a view, are both found."""
    pkg = tmp_path / "zvfs"
    (pkg / "stores").mkdir(parents=True)
    (pkg / "views").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "stores" / "__init__.py").write_text("")
    (pkg / "views" / "__init__.py").write_text("")
    (pkg / "stores" / "a.py").write_text("from zvfs.views.b import thing\n")
    (pkg / "views" / "b.py").write_text("def f():\n    from ..stores import a\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", pkg)
    edges = _imports(_modules())
    assert edges["zvfs.stores.a"] == {"zvfs.views.b"}
    assert edges["zvfs.views.b"] == {"zvfs.stores.a"}
    try:
        test_no_two_modules_import_each_other()
    except AssertionError:
        pass
    else:
        raise AssertionError("the circle was not seen")
    try:
        test_the_layers_point_down_and_the_foundations_import_no_layer()
    except AssertionError:
        pass
    else:
        raise AssertionError("the upward import was not seen")

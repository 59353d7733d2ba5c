"""Imports inside hoplab point one way: no module imports, directly or through others, a
module that imports it.

The graph is read from the source with `ast`, without importing anything. Every import
statement counts, at module level or inside a function: a function-level import is still a
dependency, only a later one, and hiding a cycle in a function is how the lab's cycles grew.
An edge goes to the module an import names: `from . import x` to the submodule x when there
is one, else to the package; `from .pkg.mod import y` to pkg.mod. The package whose
submodule is imported is not an edge of its own (Python runs its __init__ first, but a
package's __init__ that lists its submodules, a registry, is the intended shape).
"""

from __future__ import annotations

import ast
from pathlib import Path

import hoplab

PKG_DIR = Path(hoplab.__file__).resolve().parent
PKG = "hoplab"


def modules(root: Path = PKG_DIR, pkg: str = PKG) -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package's __init__)."""
    out = {}
    for f in sorted(root.rglob("*.py")):
        parts = list(f.relative_to(root).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join([pkg] + parts)] = (f, is_pkg)
    return out


def imports_of(name: str, path: Path, is_pkg: bool, known: set[str]) -> set[str]:
    """The modules of `known` that module `name` imports anywhere in its source."""
    tree = ast.parse(path.read_text(), str(path))
    here = name.split(".") if is_pkg else name.split(".")[:-1]  # the package relative imports start from
    out: set[str] = set()

    def nearest(mod: str) -> str | None:
        # `import hoplab.a.b.c` where c is a name, not a module: the deepest module named
        parts = mod.split(".")
        while parts:
            if ".".join(parts) in known:
                return ".".join(parts)
            parts.pop()
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                m = nearest(a.name)
                if m:
                    out.add(m)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                m = f"{target}.{a.name}" if f"{target}.{a.name}" in known else nearest(target)
                if m:
                    out.add(m)
    out.discard(name)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports_of(m, f, is_pkg, known) for m, (f, is_pkg) in mods.items()}


def components(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm):
    every module of one imports, through the others, every other one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return comps


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a, b, ..., a) in every component of `components`: a shortest path from the
    component's first module back to itself."""
    out = []
    for comp in components(g):
        inside, start = set(comp), comp[0]
        prev: dict[str, str] = {}
        frontier, seen = [start], {start}
        path = None
        while frontier and path is None:
            nxt = []
            for v in frontier:
                for w in sorted(g[v] & inside):
                    if w == start:
                        path = [start]
                        while v != start:
                            path.append(v)
                            v = prev[v]
                        path = [start] + path[1:][::-1] + [start]
                        break
                    if w not in seen:
                        seen.add(w)
                        prev[w] = v
                        nxt.append(w)
                if path:
                    break
            frontier = nxt
        out.append(path)
    return out


def test_the_graph_sees_the_package():
    g = graph()
    assert {"hoplab.cli", "hoplab.lab", "hoplab.spec", "hoplab.experiments"} <= set(g)
    assert "hoplab.errors" in g["hoplab.cli"]
    # function-level imports count
    assert "hoplab.selftest" in g["hoplab.cli"]


def test_cycles_are_found_and_shown():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert cycles(g) == [["a", "b", "c", "a"]]
    assert cycles({"x": {"y"}, "y": set()}) == []


def test_relative_imports_resolve(tmp_path):
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\nfrom .sub import c\n")
    (pkg / "b.py").write_text("def f():\n    from .sub.c import X\n")
    (pkg / "sub" / "__init__.py").write_text("from .. import a\n")
    (pkg / "sub" / "c.py").write_text("from . import X\nimport p.b\n")
    mods = modules(pkg, "p")
    g = {m: imports_of(m, f, ip, set(mods)) for m, (f, ip) in mods.items()}
    assert g == {"p": set(), "p.a": {"p.b", "p.sub.c"}, "p.b": {"p.sub.c"}, "p.sub": {"p.a"},
                 "p.sub.c": {"p.sub", "p.b"}}


def test_no_import_cycle_in_hoplab():
    g = graph()
    found = [(c, comp) for c, comp in zip(cycles(g), components(g))]
    assert not found, "import cycles in hoplab (break them: move what both sides need downward):\n" + "\n".join(
        f"  {' -> '.join(c)}\n    (modules tied together: {', '.join(comp)})" for c, comp in found)

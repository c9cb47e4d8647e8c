"""The layer contract of `src/inhouse`, and a checker over the `ast` of every module.

A top-level package imports only from its own layer or the ones below it, the packages do
not import each other in a circle, no module imports itself around a circle of modules, and
the ones that speak HTTP to the engine never import it. Every import counts, function-level
and `TYPE_CHECKING` ones included.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "inhouse"
ROOT = "inhouse"  # the root package itself (its version) sits at the bottom

LAYERS: tuple[frozenset[str], ...] = (
    frozenset({ROOT, "api", "http", "plan", "manifests", "cost", "scheduling"}),
    frozenset({"engine", "launch"}),
    frozenset({"server", "gateway", "bench", "eval", "observe"}),
    frozenset({"up", "cli", "__main__"}),
)

# They speak HTTP to an engine: importing the engine or the server would load torch.
FORBIDDEN: Mapping[str, frozenset[str]] = {
    name: frozenset({"engine", "server"}) for name in ("gateway", "bench", "eval", "observe")
}


@dataclass(frozen=True, slots=True)
class Edge:
    """One import of another top-level package: where it is and what it names."""

    source: str
    target: str
    path: Path
    line: int

    def where(self, base: Path) -> str:
        return f"{self.path.relative_to(base.parent)}:{self.line}"


def top_level(base: Path) -> set[str]:
    """The top-level packages and modules under `base` (the `inhouse` folder)."""
    names = {p.name for p in base.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    names |= {p.stem for p in base.glob("*.py") if p.stem != "__init__"}
    return names | {ROOT}


def _owner(path: Path, base: Path) -> str:
    parts = path.relative_to(base).with_suffix("").parts
    return ROOT if parts == ("__init__",) else parts[0]


def _imported(node: ast.AST, package: list[str]) -> Iterator[list[str]]:
    """The dotted names an import statement in `package` brings in, relative ones made
    absolute."""
    if isinstance(node, ast.Import):
        yield from (alias.name.split(".") for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        prefix = package[: len(package) - node.level + 1] if node.level else []
        named = prefix + (node.module.split(".") if node.module else [])
        for alias in node.names:
            yield [*named, alias.name]


def edges(base: Path = SRC) -> list[Edge]:
    """Every import from one top-level package of `base` into another."""
    packages = top_level(base)
    found = []
    for path in sorted(base.rglob("*.py")):
        source = _owner(path, base)
        package = [ROOT, *path.relative_to(base).parent.parts]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for name in _imported(node, package):
                if name[0] != ROOT:
                    continue
                target = name[1] if len(name) > 1 and name[1] in packages else ROOT
                if target != source:
                    found.append(Edge(source, target, path, node.lineno))
    return found


def _module(path: Path, base: Path) -> str:
    parts = path.relative_to(base).with_suffix("").parts
    return ".".join((ROOT, *(parts[:-1] if parts[-1] == "__init__" else parts)))


def module_imports(base: Path = SRC) -> dict[str, set[str]]:
    """Each module under `base` (dotted, `inhouse.gateway.call`) and the modules of `base` it
    imports: `from a.b import c` names module `a.b.c` when there is one, else `a.b`."""
    paths = {_module(path, base): path for path in sorted(base.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        targets = graph[module] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for name in _imported(node, package):
                while name and ".".join(name) not in paths:
                    name = name[:-1]
                if name and ".".join(name) != module:
                    targets.add(".".join(name))
    return graph


def module_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The knots of `graph`: each set of two or more modules that reach each other, sorted
    (Tarjan's strongly connected components, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    knots: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, todo = work[-1]
            nxt = next(todo, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                knot = stack[stack.index(node) :]
                del stack[stack.index(node) :]
                if len(knot) > 1:
                    knots.append(sorted(knot))
    return sorted(knots)


def _file(module: str, base: Path) -> str:
    path = base.parent.joinpath(*module.split("."))
    return str(
        (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).relative_to(
            base.parent
        )
    )


def _layer(name: str) -> int | None:
    return next((i for i, layer in enumerate(LAYERS) if name in layer), None)


def cycles(found: list[Edge]) -> list[list[str]]:
    """Each circle of packages importing each other, as the path around it."""
    graph: dict[str, set[str]] = {}
    for edge in found:
        graph.setdefault(edge.source, set()).add(edge.target)
    circles, seen = [], set()
    for start in sorted(graph):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    key = frozenset(path)
                    if key not in seen:
                        seen.add(key)
                        circles.append([*path, start])
                elif nxt not in path and nxt > start:
                    stack.append((nxt, [*path, nxt]))
    return circles


def violations(base: Path = SRC) -> list[str]:
    """What breaks the contract under `base`, one line each (none: it holds)."""
    out = [f"{name}: a top-level package with no layer" for name in sorted(top_level(base))
           if _layer(name) is None]  # fmt: skip
    found = edges(base)
    for edge in found:
        source, target = _layer(edge.source), _layer(edge.target)
        if source is not None and target is not None and target > source:
            out.append(
                f"{edge.where(base)}: {edge.source} (layer {source}) imports "
                f"{edge.target} (layer {target}), a higher layer"
            )
        if edge.target in FORBIDDEN.get(edge.source, ()):
            out.append(f"{edge.where(base)}: {edge.source} must not import {edge.target}")
    out += ["import cycle: " + " -> ".join(circle) for circle in cycles(found)]
    knots = module_cycles(module_imports(base))
    out += ["module import cycle: " + ", ".join(_file(m, base) for m in knot) for knot in knots]
    return out


if __name__ == "__main__":
    import sys

    problems = violations(Path(sys.argv[1]) if len(sys.argv) > 1 else SRC)
    print("\n".join(problems) or "the layer contract holds")
    sys.exit(1 if problems else 0)

#!/usr/bin/env python3
"""Import-graph check: no import circles and no upward arrows between our packages.

The graph is built from the source (``ast``), never by importing anything, so it needs no torch and
sees every import: module level, inside functions, under ``if TYPE_CHECKING:`` and in ``try`` blocks
(a deferred import hides a circle at run time, it does not remove it from the design). An edge
``a -> b`` is a module ``a`` that names module ``b``; ``from pkg import name`` points at
``pkg.name`` when that is a module of ours and at ``pkg`` (its ``__init__``) otherwise. Importing
``a.b.c`` also runs the inits of ``a`` and ``a.b``, so those are edges too, except the inits of the
importer's own packages (already running when it runs): a package init that imports its own submodules
is how Python packages are built, but ``api.metrics`` importing ``api.admin.engines`` runs
``api/admin/__init__``, and when that init imports ``api.metrics`` back, it is a circle even if the first
import sits in a function.

Two rules, both reported with the offending ``file:line`` (and a top-level package that has no layer yet
is reported as ``unlayered``):

1. **No circles.** Every strongly connected component of more than one module is a circle.
2. **No upward arrows.** Each top-level package sits in a layer (``LAYERS``, bottom first) and may
   import only what is listed for it. The order (also in ``docs/architecture.md``), bottom first:
   ``engine`` (the inference core, imports nothing of ours); ``diarist`` (the shared core: settings,
   database, storage, transcript schema; of the engine only the torch-free ``engine.config`` and
   ``engine.checkpoints``);
   ``transcription`` (recording to transcript, on ``engine`` and ``diarist``); ``engine_server`` (the engine
   server on ``transcription``, and its torch-free HTTP client; nothing of ``api``: the error shape and the
   engine's metrics it shares with the API are ``diarist.http``'s); ``worker`` and ``api`` (the service processes, siblings: neither imports the other;
   ``worker`` reaches the engine through ``engine_server``'s client); ``evaluation`` (the eval harness, a
   consumer of ``diarist`` and ``transcription`` that only the CLI runs); ``cli`` (the composition root,
   on everything); ``migrations`` (Alembic's env, on ``diarist``'s models); ``scripts``, ``benchmarks`` and
   ``tests`` are consumers nothing shipped imports.

Exit status 0 when the graph is clean, 1 otherwise. ``--graph`` also prints every package-level
arrow with its count, for the record in ``docs/architecture.md``.

Usage: ``python scripts/check_imports.py [--root DIR] [--graph]``.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

#: Top-level package -> what it may import besides itself: a package name allows all of that package, a
#: dotted module name allows that module (and the package inits above it). Bottom layers first.
LAYERS: dict[str, frozenset[str]] = {
    "engine": frozenset(),
    # the service's settings build an EngineConfig and name packaged checkpoints and their languages; both
    # modules are torch-free by contract (their docstrings)
    "diarist": frozenset({"engine.config", "engine.checkpoints"}),
    "transcription": frozenset({"engine", "diarist"}),
    "worker": frozenset({"engine", "diarist", "transcription", "engine_server"}),
    # api and worker are siblings: neither imports the other (api reaches workers through the injected
    # diarist.services.Dispatcher)
    "api": frozenset({"engine", "diarist", "transcription"}),
    # the engine server (on the pipeline) and its HTTP client (on diarist.contract only, torch-free); the error
    # shape and the Prometheus series it shares with the API are diarist.http's
    "engine_server": frozenset({"engine", "diarist", "transcription"}),
    # the eval harness: a consumer of the core (scores transcripts against references); only the CLI runs it
    "evaluation": frozenset({"engine", "diarist", "transcription"}),
    "cli": frozenset({"engine", "diarist", "transcription", "worker", "api", "engine_server", "evaluation"}),
    "migrations": frozenset({"diarist"}),
    # consumers: nothing of the shipped packages imports them
    "scripts": frozenset({"engine", "diarist", "transcription", "worker", "api", "engine_server", "evaluation",
                          "cli"}),
    "benchmarks": frozenset({"engine", "diarist", "transcription", "worker", "api", "engine_server", "evaluation",
                             "cli", "scripts", "tests"}),
    "tests": frozenset({"engine", "diarist", "transcription", "worker", "api", "engine_server", "evaluation",
                        "cli", "scripts", "benchmarks"}),
}

#: Folders skipped while walking: caches and virtualenvs.
_SKIP_DIRS = {"__pycache__", ".venv", ".git", "node_modules", ".ruff_cache", ".pytest_cache"}


@dataclass(frozen=True)
class Edge:
    """One import statement: module ``src`` names module ``dst`` at ``path:line``."""

    src: str
    dst: str
    path: str
    line: int


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def unlayered(root: Path) -> list[str]:
    """Top-level packages under ``root`` (folders with an ``__init__.py``) that ``LAYERS`` does not place:
    a new package must be given its layer before the check can say what it may import."""
    return sorted(p.parent.name for p in root.glob("*/__init__.py")
                  if p.parent.name not in LAYERS and p.parent.name not in _SKIP_DIRS)


def discover(root: Path) -> dict[str, Path]:
    """Every module of the packages in ``LAYERS`` under ``root``: dotted name -> file."""
    modules: dict[str, Path] = {}
    for top in LAYERS:
        base = root / top
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            if _SKIP_DIRS.intersection(path.relative_to(root).parts):
                continue
            modules[_module_name(root, path)] = path
    return modules


def _resolve_relative(module: str, is_package: bool, level: int, name: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def _target(modules: dict[str, Path], dotted: str) -> str | None:
    """The module of ours that ``dotted`` names (the longest known prefix), or None if not ours."""
    parts = dotted.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def edges_of(root: Path, modules: dict[str, Path]) -> list[Edge]:
    """Every import edge between modules of ours, self-imports of a package's own init excluded."""
    seen: set[Edge] = set()
    edges: list[Edge] = []
    for module, path in modules.items():
        own = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
        if path.name == "__init__.py":
            own.add(module)
        rel = str(path.relative_to(root))
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = (_resolve_relative(module, is_package, node.level, node.module)
                        if node.level else (node.module or ""))
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            else:
                continue
            for dotted in targets:
                dst = _target(modules, dotted)
                if dst is None:
                    continue
                parts = dst.split(".")
                inits = [".".join(parts[:i]) for i in range(1, len(parts))]
                for target in [*inits, dst]:
                    edge = Edge(module, target, rel, node.lineno)
                    if target in modules and target != module and target not in own and edge not in seen:
                        seen.add(edge)
                        edges.append(edge)
    return edges


def cycles(modules: dict[str, Path], edges: list[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative), each sorted."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for e in edges:
        graph[e.src].add(e.dst)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def upward(edges: list[Edge]) -> list[Edge]:
    """Edges from a package to one its layer may not import."""
    bad: dict[tuple[str, int], Edge] = {}
    for e in edges:
        src, dst = e.src.split(".")[0], e.dst.split(".")[0]
        if src == dst or dst in LAYERS[src]:
            continue
        if any(a == e.dst or a.startswith(e.dst + ".") for a in LAYERS[src]):
            continue  # an allowed module, or a package init on the way to one
        key = (e.path, e.line)
        if key not in bad or len(e.dst) > len(bad[key].dst):
            bad[key] = e  # one line per import statement: its deepest target
    return sorted(bad.values(), key=lambda e: (e.path, e.line))


def report(root: Path, show_graph: bool = False) -> tuple[int, str]:
    """Check the tree under ``root``; return (number of problems, the text to print)."""
    modules = discover(root)
    edges = edges_of(root, modules)
    lines: list[str] = []
    circles = cycles(modules, edges)
    for component in circles:
        members = set(component)
        lines.append(f"circle: {' <-> '.join(component)}")
        for e in edges:
            if e.src in members and e.dst in members:
                lines.append(f"    {e.path}:{e.line}: {e.src} -> {e.dst}")
    arrows = upward(edges)
    for e in arrows:
        lines.append(f"upward: {e.path}:{e.line}: {e.src} -> {e.dst} "
                     f"({e.src.split('.')[0]} may not import {e.dst.split('.')[0]})")
    missing = unlayered(root)
    lines.extend(f"unlayered: {name}/ is a package with no layer in LAYERS" for name in missing)
    problems = len(circles) + len(arrows) + len(missing)
    if show_graph:
        counts = Counter((e.src.split(".")[0], e.dst.split(".")[0]) for e in edges
                         if e.src.split(".")[0] != e.dst.split(".")[0])
        lines.append("package arrows (imports):")
        lines.extend(f"    {a} -> {b}: {n}" for (a, b), n in sorted(counts.items()))
    lines.append(f"{len(modules)} modules, {len(edges)} import edges, {len(circles)} circles, "
                 f"{len(arrows)} upward arrows")
    return problems, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="repository root (default: this script's parent folder)")
    parser.add_argument("--graph", action="store_true", help="also print the package-level arrows")
    args = parser.parse_args(argv)
    problems, text = report(args.root.resolve(), args.graph)
    print(text)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

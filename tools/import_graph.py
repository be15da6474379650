"""The import graph between app/'s packages, against the layers declared in pyproject.toml.

    python tools/import_graph.py [--modules]

Prints each package's imports of other packages (how many module imports make each edge), the package-level
cycles (strongly connected components of more than one package), and every import that runs against the
declared layers: up to a higher layer, or across to another package of the same layer. `--modules` lists
the importing and imported module of each such import. An import the contract names in `ignore_imports`
is marked `(named exception)`. The layers are read from the `layers` contract of [tool.importlinter] (the one
place they are written); `lint-imports` checks them (tests/tools/test_import_contracts.py).
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from collections import defaultdict
from fnmatch import fnmatchcase
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
CONTAINER = "app"


def declared_layers(pyproject: Path = ROOT / "pyproject.toml") -> tuple[list[list[str]], list[str]]:
    """The layers contract's layers, top first (each a list of package names: `|` and `:` both split a
    layer), and its ignore_imports expressions."""
    config = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c["type"] == "layers")
    layers = [[p.strip().strip("()") for p in layer.replace(":", "|").split("|")] for layer in contract["layers"]]
    return layers, list(contract.get("ignore_imports", []))


def package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == CONTAINER else None


def package_imports(graph: grimp.ImportGraph) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """(importing package, imported package) -> its module imports (importer, imported)."""
    edges: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
    for importer in sorted(graph.modules):
        src = package(importer)
        if src is None:
            continue
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            dst = package(imported)
            if dst is not None and dst != src:
                edges[(src, dst)].append((importer, imported))
    return edges


def cycles(nodes: set[str], edges: set[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted, largest first."""
    succ: dict[str, list[str]] = defaultdict(list)
    for a, b in edges:
        succ[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in succ[v]:
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
                found.append(sorted(component))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return sorted(found, key=lambda c: (-len(c), c))


def ignored(importer: str, imported: str, expressions: list[str]) -> bool:
    """Whether an ignore_imports expression (`a.b -> c.d`, `*` for one module name part) names this import."""
    for expr in expressions:
        left, right = (s.strip() for s in expr.split("->"))
        if fnmatchcase(importer, left) and fnmatchcase(imported, right):
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modules", action="store_true", help="list the module imports of each wrong-way edge")
    ns = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph(CONTAINER, cache_dir=None)
    layers, ignores = declared_layers()
    level = {p: i for i, layer in enumerate(layers) for p in layer}  # 0: the top
    edges = package_imports(graph)
    packages = sorted({p for m in graph.modules if (p := package(m)) is not None})

    n_imports = sum(len(v) for v in edges.values())
    print(f"app/: {len(packages)} packages, {len(edges)} package edges, {n_imports} module imports between packages")
    print("\nLayers (top first; `|`: packages of one layer, which may not import each other):")
    for layer in layers:
        print("  " + " | ".join(p if p in packages else f"({p}: absent)" for p in layer))
    undeclared = [p for p in packages if p not in level]
    if undeclared:
        print("  not in any layer: " + ", ".join(undeclared))

    print("\nPackage imports (importing -> imported: module imports):")
    for src in packages:
        out = [f"{dst} {len(v)}" for (s, dst), v in sorted(edges.items()) if s == src]
        print(f"  {src:<20} -> " + (", ".join(out) if out else "-"))

    sccs = cycles(set(packages), set(edges))
    kept = {e for e, v in edges.items() if not all(ignored(a, b, ignores) for a, b in v)}
    sccs_kept = cycles(set(packages), kept)
    print(f"\nPackage-level cycles (strongly connected components): {len(sccs)}; "
          f"{len(sccs_kept)} without the named exceptions")
    for c in sccs:
        print(f"  {len(c)} packages: " + ", ".join(c))

    wrong = {(s, d): v for (s, d), v in edges.items() if s in level and d in level and level[d] <= level[s]}
    n_wrong = sum(len(v) for v in wrong.values())
    n_named = sum(ignored(a, b, ignores) for v in wrong.values() for a, b in v)
    print(f"\nImports against the layers (up, or across one layer): {n_wrong} module imports "
          f"in {len(wrong)} package edges, {n_named} of them named exceptions")
    for (s, d), v in sorted(wrong.items()):
        way = "across" if level[d] == level[s] else "up"
        print(f"  {s} -> {d} ({way}): {len(v)}")
        if ns.modules:
            for a, b in v:
                print(f"      {a} -> {b}" + ("  (named exception)" if ignored(a, b, ignores) else ""))
    print(f"\nSummary: {len(sccs)} cycles ({sum(len(c) for c in sccs)} of {len(packages)} packages in them; "
          f"{len(sccs_kept)} without the named exceptions), "
          f"{n_wrong - n_named} of {n_imports} imports between packages against the layers "
          f"(+{n_named} named exceptions)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The tooling's arrows, read from the source (nothing imported): tools/ imports nothing from bench/ (the benches
use the tools, never the other way round), and bench's harness/, load/ and reports/ import no scenario module."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("harness", "load", "reports")


def imported(path: Path, root: Path = ROOT) -> set[str]:
    """The absolute names of what a module imports (relative imports resolved against its package)."""
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return names


def scenarios() -> set[str]:
    return {f"bench.{p.stem}" for p in (ROOT / "bench").glob("*.py") if p.stem != "__init__"}


def test_tools_import_nothing_from_bench():
    found = {str(p.relative_to(ROOT)): sorted(n for n in imported(p) if n == "bench" or n.startswith("bench."))
             for p in (ROOT / "tools").rglob("*.py")}
    assert {p: n for p, n in found.items() if n} == {}


def test_the_harness_load_and_reports_import_no_scenario():
    wanted = scenarios()
    assert {"bench.__main__", "bench.graph", "bench.gpu_check"} <= wanted
    found = {str(p.relative_to(ROOT)): sorted(imported(p) & wanted)
             for part in PARTS for p in (ROOT / "bench" / part).rglob("*.py")}
    assert {p: n for p, n in found.items() if n} == {}


def test_the_check_sees_an_import_against_the_arrows(tmp_path):
    bad = tmp_path / "bench" / "harness" / "bad.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("from .. import graph\nfrom ..reports import tables\nimport bench.spec\n")
    assert {"bench.graph", "bench.reports.tables", "bench.spec"} <= imported(bad, tmp_path)

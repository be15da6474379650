"""The import contracts of pyproject.toml ([tool.importlinter]: app's packages in layers, app never importing
ray or deployments) hold on this tree, and break when code imports against them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tools import import_graph

ROOT = Path(__file__).resolve().parents[2]
# lint-imports in a child: it finds `app` through the import system, which in this process is this tree's.
LINT = ("import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", LINT], cwd=root, env={"PYTHONPATH": str(root), "PATH": ""},
                          capture_output=True, text=True, timeout=300)


def test_the_tree_keeps_every_contract():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 kept, 0 broken" in result.stdout


def test_an_upward_import_a_ray_import_and_a_deployments_import_break_them(tmp_path):
    for part in ("app", "deployments", "pyproject.toml"):
        src = ROOT / part
        if src.is_dir():
            shutil.copytree(src, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, tmp_path / part)
    stop = tmp_path / "app/engine/stop.py"
    stop.write_text(stop.read_text() + "\nfrom ..chat import service  # noqa\n")
    caller = tmp_path / "app/generation/caller.py"
    caller.write_text(caller.read_text() + "\nimport ray  # noqa\nimport deployments.handles  # noqa\n")
    result = lint(tmp_path)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "app.engine is not allowed to import app.chat" in out and "app.engine.stop -> app.chat.service" in out
    assert "app.generation.caller -> ray" in out
    assert "app.generation.caller -> deployments.handles" in out
    assert "0 kept, 3 broken" in out


def test_the_graph_tool_finds_cycles_and_reads_the_declared_layers():
    assert import_graph.cycles({"a", "b", "c", "d"}, {("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == [
        ["a", "b", "c"]]
    assert import_graph.cycles({"a", "b"}, {("a", "b")}) == []
    layers, ignores = import_graph.declared_layers()
    assert layers[-1] == ["model_sources", "transport", "kvstore"] and "engine" in layers[-3]
    assert all("->" in expr for expr in ignores)

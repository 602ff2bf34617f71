"""The house's two walls: engine/ never imports Qt or app/; app/ never imports training libraries."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(folder: Path) -> set[tuple[str, str]]:
    found = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {(str(path), alias.name.split(".")[0]) for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add((str(path), node.module.split(".")[0]))
    return found


def test_engine_never_imports_qt_or_app() -> None:
    bad = {(p, m) for p, m in _imports(ROOT / "engine") if m in {"PySide6", "PyQt5", "PyQt6", "app"}}
    assert not bad


def test_app_never_imports_training_libraries() -> None:
    heavy = {"torch", "transformers", "peft", "mlx", "llama_cpp", "reasoning_gym"}
    bad = {(p, m) for p, m in _imports(ROOT / "app") if m in heavy}
    assert not bad


def test_import_engine_is_cheap() -> None:
    code = (
        "import sys, engine, engine.events, engine.config, engine.errors, engine.paths, engine.device\n"
        "heavy = [m for m in ('torch', 'transformers', 'PySide6', 'reasoning_gym', 'mlx', 'aiohttp') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""


def test_importing_every_app_module_loads_no_training_library() -> None:
    modules = sorted(f"app.{p.stem}" for p in (ROOT / "app").glob("*.py") if p.stem != "__init__")
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "heavy = [m for m in ('torch', 'transformers', 'peft', 'mlx', 'llama_cpp', 'reasoning_gym') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT, env=env)
    assert len(modules) > 10
    assert out.stdout.strip() == "", f"an app module pulled in {out.stdout.strip()}"


def test_the_repository_points_only_at_its_own_files() -> None:
    """Someone who clones the repo has docs/, not the notes it was first written from."""
    tracked = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True, cwd=ROOT).stdout.split()
    bad = []
    for name in tracked:
        path = ROOT / name
        if path.suffix not in {".py", ".md", ".toml", ".sh", ".spec", ".yml", ".nsi", ".cfg"} and path.name != "Makefile":
            continue
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        bad += [name for needle in ("../shared/", "FACTS.md", "DESIGN.md", "STYLE.md") if needle in text and name != "tests/test_boundaries.py"]
    assert not bad, f"references to files outside the repository: {sorted(set(bad))}"

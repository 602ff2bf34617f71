"""The relay installs and runs without the ML stack: nothing heavy on its import path.

`make relay-venv` puts the `relay` extra of pyproject.toml and this checkout
(--no-deps) into build/relay-venv. These tests check, in a fresh interpreter
of the dev venv, that importing every module of the engine/relay package (and
the QR code library its invite command uses) loads no module from torch,
transformers, Qt, reasoning-gym or numpy, and that every third-party module
it does load comes from a distribution the `relay` extra installs. A module
added to engine/relay/ is guarded the day it is added.

    .venv/bin/python -m pytest -q tests/swarm/test_relay_only.py
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "PySide6", "shiboken6", "reasoning_gym", "numpy", "peft", "accelerate",
         "safetensors", "gguf", "llama_cpp", "mlx", "matplotlib", "tqdm", "psutil", "tomlkit", "app")
# Every module of the relay package (its __main__ would start one), and the invite command's QR code library.
RELAY_MODULES = tuple(sorted(f"engine.relay.{p.stem}" for p in (ROOT / "engine" / "relay").glob("*.py")
                             if p.stem not in ("__init__", "__main__")))
IMPORTS = ("engine.relay", *RELAY_MODULES, "segno")

pytestmark = pytest.mark.integration  # starts a Python subprocess


def _loaded_modules(code: str) -> list[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return list(json.loads(out.stdout.splitlines()[-1]))


def _pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _relay_extra() -> list[Requirement]:
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    return [Requirement(text) for text in project["optional-dependencies"]["relay"]]


def _closure(names: set[str]) -> set[str]:
    """The distributions these need, recursively (extras and markers that do not apply left out)."""
    seen: set[str] = set()
    todo = [name.lower() for name in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in metadata.requires(name) or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name.lower())
    return {re.sub(r"[-_.]+", "-", name) for name in seen}


def test_importing_the_relay_loads_nothing_heavy() -> None:
    loaded = _loaded_modules("\n".join(f"import {name}" for name in IMPORTS))
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY)
    assert heavy == [], f"the relay's import chain pulls in {heavy[:10]}"
    assert {"engine.relay.server", "engine.relay.invite", "engine.relay.web"} <= set(RELAY_MODULES) <= set(loaded)


def test_importing_engine_itself_loads_nothing_heavy() -> None:
    loaded = _loaded_modules("import engine, engine.common.rules, engine.common.errors, engine.common.atomicio")
    assert [m for m in loaded if m.split(".")[0] in HEAVY] == []


def test_every_third_party_module_the_relay_loads_comes_from_the_relay_extra() -> None:
    loaded = _loaded_modules("\n".join(f"import {name}" for name in IMPORTS))
    owners = metadata.packages_distributions()
    allowed = _closure({req.name for req in _relay_extra()})
    outside: dict[str, list[str]] = {}
    for top in sorted({m.split(".")[0] for m in loaded}):
        if top in sys.stdlib_module_names or top in ("engine", "__main__") or top.startswith("_"):
            continue
        dists = {re.sub(r"[-_.]+", "-", d.lower()) for d in owners.get(top, [])}
        if dists and not dists & allowed:
            outside[top] = sorted(dists)
    assert outside == {}, f"modules from distributions the relay extra does not install: {outside}"


def test_the_relay_extra_pins_what_the_main_dependencies_pin() -> None:
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    main = {Requirement(text).name.lower(): str(Requirement(text).specifier) for text in project["dependencies"]}
    extra = {req.name.lower(): str(req.specifier) for req in _relay_extra()}
    assert {"aiohttp", "cryptography", "redis", "platformdirs", "segno"} <= set(extra)
    assert {name: spec for name, spec in extra.items() if main.get(name) != spec} == {}
    assert not set(extra) & {"torch", "transformers", "pyside6-essentials", "reasoning-gym"}

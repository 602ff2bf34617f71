"""One settings schema: the engine declares each setting once; the app holds values, never a rule.

engine/common/config.py declares every setting (help, label, where it takes
effect, a number's bounds), engine/common/schema.py reads it, and the app's
dialogs and its settings file go through it. These tests read the app's own
modules for a default, a range, a preset or a restart rule of an engine
setting, and check that saving writes only what the user changed.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.settings import EngineSettings, SettingsError, SettingsStore, validate
from engine.common.config import NodeConfig, SwarmConfig
from engine.common.config_file import build_config, config_toml
from engine.common.paths import Paths
from engine.common.presets import POWER_ENGINE_KEYS, POWER_PRESETS, expand_power
from engine.common.schema import SCHEMA, config_with, person_settings, restart_changes, setting

APP = Path(__file__).resolve().parents[2] / "app"


def _app_modules() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(encoding="utf-8"))) for path in sorted(APP.glob("*.py"))]


def test_the_app_defines_no_default_range_preset_or_restart_rule_of_an_engine_setting() -> None:
    names = {s.name for s in person_settings()} | {s.key for s in person_settings()}
    found = []
    for path, tree in _app_modules():
        for node in ast.walk(tree):
            # a default: `threads: int = 0` or `threads = 0` in a class body
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    target = item.target if isinstance(item, ast.AnnAssign) else \
                        item.targets[0] if isinstance(item, ast.Assign) and len(item.targets) == 1 else None
                    if isinstance(target, ast.Name) and target.id in names | {"KEYS"}:
                        found.append(f"{path.name}:{item.lineno} declares {target.id}")
            # a range: setRange(0, 10_000) on a settings field (the progress bars' 0..1000 are not settings)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "setRange" \
                    and any(isinstance(a, ast.Constant) and a.value not in (0, 1, 1000) for a in node.args):
                found.append(f"{path.name}:{node.lineno} a literal range")
            # a preset: the power bundles by name, or a table of them
            if isinstance(node, ast.Constant) and node.value in POWER_PRESETS:
                found.append(f"{path.name}:{node.lineno} names the power {node.value!r}")
            # a restart rule: a list of the settings that apply live or need a restart
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and sum(
                    isinstance(e, ast.Constant) and e.value in names for e in node.elts) >= 3:
                found.append(f"{path.name}:{node.lineno} lists settings")
    assert found == []


def test_each_setting_the_app_shows_is_declared_once_with_a_label_and_where_it_applies() -> None:
    shown = person_settings()
    assert len({s.name for s in shown}) == len(shown) >= 18
    assert all(s.label and s.help and s.applies in ("live", "restart", "new_run") for s in shown)
    assert set(EngineSettings().values()) == {s.name for s in shown}
    assert EngineSettings().values() == {s.name: getattr(getattr(NodeConfig(), s.section), s.key) for s in shown}
    text = config_toml(NodeConfig())  # what `sapling-node config` prints: the same schema
    for s in shown:
        assert f"in the app: {s.label};" in text
    assert "set by run.power (low, standard, maximum) unless you set it" in text
    assert len([s for s in SCHEMA if s.presets]) == len(POWER_ENGINE_KEYS)


@pytest.mark.parametrize(("name", "value", "words"), [
    ("threads", 5000, "CPU threads for training must be a whole number from 0 to 1024"),
    ("ban_window", 0, "Judged answers the ban rule looks at must be a whole number from 1 to 10000"),
    ("duty_cycle", 0.0, "Share of each minute for training must be a number greater than 0.0"),
    ("ban_strikes", 20, "Strikes before a ban (20) must be at most judged answers the ban rule looks at (12)"),
    ("priority", "realtime", "Priority must be one of background, normal"),
])
def test_the_engine_checks_the_apps_values_and_names_them_by_their_label(name: str, value: object,
                                                                        words: str) -> None:
    with pytest.raises(SettingsError, match=words.replace("(", r"\(").replace(")", r"\)")):
        validate(EngineSettings(**{name: value}))
    with pytest.raises(SettingsError):
        config_with({name: value})


def test_the_bounds_a_field_shows_are_the_ones_the_engine_enforces() -> None:
    for s in person_settings():
        if s.low is None or s.high is None:
            continue
        inside = int(s.high) if s.kind == "int" else float(s.high)
        window = {"ban_window": 10_000} if s.name == "ban_strikes" else {}  # strikes never exceed the window
        config_with({s.name: inside, **window})
        with pytest.raises(SettingsError):
            config_with({s.name: inside + 1, **window})


def test_the_restart_rule_is_the_engines_for_the_app_and_the_node() -> None:
    base = EngineSettings()
    assert not EngineSettings(threads=2).needs_restart(base)  # the node changes its threads live
    assert not EngineSettings(ban_hours=2.0, daily_upload_mb=5.0).needs_restart(base)
    assert EngineSettings(priority="normal").needs_restart(base)  # a process cannot raise its priority again
    assert EngineSettings(swarm_mode="solo").needs_restart(base)
    maximum = EngineSettings(power="maximum", **{k: expand_power("maximum")[k] for k in POWER_ENGINE_KEYS})
    assert maximum.needs_restart(base)  # Maximum raises the priority
    changed = restart_changes(base.config(), maximum.config())
    assert [s.dotted for s in changed] == ["run.priority"]
    assert setting("model_source").applies == "new_run" and setting("threads").applies == "live"


def test_saving_writes_only_the_keys_the_user_changed(paths: Paths) -> None:
    paths.config_dir.mkdir(parents=True)
    paths.config_file.write_text("# mine\n[run]\nthreads = 3\n")
    store = SettingsStore(paths)
    loaded = store.load_engine()
    assert loaded.threads == 3 and loaded.priority == "background"
    store.save_engine(loaded.replace(schedule="22:00-07:00"))
    data = tomllib.loads(paths.config_file.read_text())
    assert data == {"run": {"threads": 3, "schedule": "22:00-07:00"}}
    assert "# mine" in paths.config_file.read_text()
    # A new power: the rows that show its bundle are left to it; a row set by hand stays.
    low = expand_power("low")
    again = SettingsStore(paths)
    chosen = again.load_engine().replace(power="low", threads=low["threads"], priority=low["priority"],
                                         duty_cycle=low["duty_cycle"])
    again.save_engine(chosen)
    data = tomllib.loads(paths.config_file.read_text())
    assert data == {"run": {"schedule": "22:00-07:00", "power": "low"}}
    assert (build_config("default", paths.config_file).run.threads, SettingsStore(paths).load_engine()) == \
        (low["threads"], chosen)


def test_a_reload_changes_the_daily_caps_and_the_ban_rule_live() -> None:
    from engine.swarm.datacap import MB, DataMeter
    from engine.swarm.defence import BanBook
    from engine.swarm.exchange import SwarmExchange

    exchange = SimpleNamespace(bans=BanBook(strikes=6, window=12, hours=24.0, strike_reasons=()),
                               meter=DataMeter(None))
    SwarmExchange.apply_settings(exchange, SwarmConfig(ban_strikes=2, ban_window=5, ban_hours=1.5,  # type: ignore[arg-type]
                                                       daily_upload_mb=3.0, daily_download_mb=0.5))
    assert (exchange.bans.strikes, exchange.bans.window, exchange.bans.hours) == (2, 5, 1.5)
    assert (exchange.meter.upload_cap, exchange.meter.download_cap) == (3 * MB, MB // 2)

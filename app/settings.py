"""What the user chose, on disk: the engine's config.toml and the app's own settings file.

Two files live in the platformdirs config dir (`engine.common.paths.Paths.config_dir`):

- ``config.toml`` is the engine's. The app reads and writes only the keys a
  person picks in the first-run and Settings dialogs (`EngineSettings`) and
  keeps every other key the file already has.
- ``sapling-app.json`` holds what only the window cares about (`AppSettings`):
  idle / AC-power limits, start at login, first run done, whether training was
  running (so a relaunch carries on), window geometry, and the device and
  swarm identity the engine last reported.

Both are written atomically (`engine.common.atomicio`). A file that cannot be read
is moved aside to ``<name>.invalid-<time>`` and the defaults are used; the
loader returns a warning sentence that the window shows.

    python -m app.settings     # print where the files are and what they hold
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from engine.common.atomicio import atomic_write_json, atomic_write_text
from engine.common.config import NodeConfig
from engine.common.config_file import build_config, edit_config_text
from engine.common.errors import ConfigError
from engine.common.paths import Paths
from engine.common.presets import POWER_ENGINE_KEYS, expand_power
from engine.common.rules import Invite, check_model_source, check_relay_url, parse_invite, split_invite
from engine.common.schema import config_with, person_defaults, person_values, restart_changes, setting

__all__ = ["AppSettings", "EngineSettings", "SettingsError", "SettingsStore", "check_model_source",
           "check_relay_url", "parse_invite", "settings_place", "split_invite", "swarm_invite", "validate"]

log = logging.getLogger(__name__)

APP_SETTINGS_NAME = "sapling-app.json"
CONFIG_HEADER = ("Sapling engine settings. The desktop app edits model, swarm, protection and run threads/priority;",
                 "every key is explained by `sapling-node config`. Your own comments here are kept.")


# A value the user typed cannot be used; the message says what to type instead. It is the
# engine's ConfigError: the rules live in engine/common/rules.py and engine/common/config.py, one copy each.
SettingsError = ConfigError


class EngineSettings:
    """The engine settings a person picks, by the names engine/common/schema.py gives them (`person_settings`:
    model_source, swarm_mode, relay_url, threads, ...), read and set as attributes.

    Which settings these are, their defaults, bounds, labels and where each takes effect are declared once,
    in engine/common/config.py; this class only holds values. `EngineSettings()` holds the defaults.
    """

    __slots__ = ("_values",)

    def __init__(self, **values: Any) -> None:
        defaults = person_defaults()
        unknown = set(values) - set(defaults)
        if unknown:
            raise TypeError(f"not a setting the app picks: {', '.join(sorted(unknown))}")
        object.__setattr__(self, "_values", {**defaults, **values})

    def __getattr__(self, name: str) -> Any:
        if name == "_values":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._values:
            raise AttributeError(f"not a setting the app picks: {name}")
        self._values[name] = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EngineSettings) and self._values == other._values

    def __repr__(self) -> str:
        return f"EngineSettings({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"

    def values(self) -> dict[str, Any]:
        """A copy of every value, by name."""
        return {k: list(v) if isinstance(v, list) else v for k, v in self._values.items()}

    def replace(self, **changes: Any) -> EngineSettings:
        """A copy with some values changed."""
        return EngineSettings(**{**self.values(), **changes})

    def config(self) -> NodeConfig:
        """These values over the defaults, checked by the engine (ConfigError naming the setting's label)."""
        return config_with(self.values())

    def needs_restart(self, other: EngineSettings) -> bool:
        """Whether going from `other` to self needs the engine restarted: the engine's own rule
        (engine/common/schema.py, `restart_changes`, which the node's reload follows too)."""
        return bool(restart_changes(other.config(), self.config()))


@dataclass
class AppSettings:
    """Settings only the app uses. Unknown keys in the file are ignored."""

    first_run_done: bool = False
    only_when_idle: bool = False
    only_on_ac_power: bool = False
    start_at_login: bool = False
    # Training was wanted when the app last ran (Start/Resume set it; Pause, Stop and a finished run clear it),
    # so a launch after quitting mid-run carries on by itself. Written at each change.
    resume_training: bool = False
    window_geometry: str = ""  # base64 of QWidget.saveGeometry()
    last_device: dict[str, Any] = field(default_factory=dict)  # the engine's last `status.device`
    last_identity: dict[str, Any] = field(default_factory=dict)  # the engine's last `swarm` peer_id/name


# -- validation ------------------------------------------------------------------------


def validate(settings: EngineSettings) -> None:
    """The engine's checks of the chosen settings (SettingsError with one sentence, naming the setting as the
    dialogs do), and that the model can be used as given on this computer."""
    settings.config()
    check_model_source(settings.model_source)


def swarm_invite(settings: EngineSettings) -> Invite | None:
    """The swarm these settings join, as an invite (its token filled from join_token when it has none);
    None for the local swarm, solo, or a relay_url the engine would refuse."""
    if settings.swarm_mode != "relay":
        return None
    try:
        invite = parse_invite(settings.relay_url)
    except SettingsError:
        return None
    if not invite.token and settings.join_token:
        return Invite(invite.relays, settings.join_token, invite.name)
    return invite


def settings_place(settings: EngineSettings) -> tuple[str, str, str]:
    """The swarm the settings name, for the window before the engine says more: (mode, the invite's swarm
    name, its first relay)."""
    invite = swarm_invite(settings)
    if invite is None:
        return settings.swarm_mode, "", settings.relay_url
    return settings.swarm_mode, invite.name, invite.relays[0]


# -- TOML ------------------------------------------------------------------------------


def _backup(path: Path) -> str:
    """Move an unusable file aside; returns a phrase saying where it went."""
    target = path.with_name(f"{path.name}.invalid-{time.strftime('%Y%m%d-%H%M%S')}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.invalid-{time.strftime('%Y%m%d-%H%M%S')}-{n}")
    try:
        path.replace(target)
    except OSError as exc:
        return f"It could not be moved aside ({exc.strerror or exc}), so it is left as it is"
    return f"It was saved as {target.name}"


def _check_engine_file(text: str) -> None:
    """The engine's own validation of a whole config.toml (ConfigError when it would refuse it)."""
    with tempfile.TemporaryDirectory(prefix="sapling-check-") as tmp:
        candidate = Path(tmp) / "config.toml"
        candidate.write_text(text, encoding="utf-8")
        build_config("default", candidate, [])


class SettingsStore:
    """Loads and saves both files in one config dir."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
        self.warnings: list[str] = []
        self.loaded = EngineSettings()  # what load_engine read: save_engine writes only what differs

    @property
    def config_file(self) -> Path:
        return self.paths.config_file

    @property
    def app_file(self) -> Path:
        return self.paths.config_dir / APP_SETTINGS_NAME

    # -- config.toml --------------------------------------------------------------------
    def _read_toml(self) -> dict[str, Any]:
        path = self.config_file
        if not path.is_file():
            return {}
        try:
            text = path.read_text(encoding="utf-8")
            data = tomllib.loads(text)
            _check_engine_file(text)
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, ConfigError) as exc:
            reason = str(exc).replace(str(path), "it").rstrip(".")
            moved = _backup(path)
            warning = (f"Your engine settings file could not be used ({reason}). "
                       f"{moved} and the default settings are used.")
            log.warning(warning)
            self.warnings.append(warning)
            return {}
        return data

    def load_engine(self) -> EngineSettings:
        """The settings config.toml gives (what it leaves to run.power, expanded as the engine does), and
        remembers them: `save_engine` writes only what changed since."""
        data = self._read_toml()  # checked by the engine; an unusable file was moved aside
        try:
            config = build_config("default", self.config_file if data else None, [])
        except (ConfigError, OSError):  # the file changed since it was checked
            config = NodeConfig()
        self.loaded = EngineSettings(**person_values(config))
        return self.loaded.replace()

    def save_engine(self, settings: EngineSettings) -> None:
        """Validate; set in the existing file only the keys changed since `load_engine` (other keys and comments
        kept); write atomically. A [run] key equal to what the chosen power gives is left to run.power."""
        validate(settings)
        self._read_toml()  # an unusable file is moved aside first
        try:
            old = self.config_file.read_text(encoding="utf-8") if self.config_file.is_file() else ""
        except (OSError, UnicodeDecodeError):
            old = ""
        before, now = self.loaded.values(), settings.values()
        bundle = expand_power(now["power"])  # engine/common/presets.py: the one expansion
        changes: dict[str, dict[str, Any]] = {}
        for name, value in now.items():
            if value == before[name]:
                continue  # not changed here: the file keeps what it has (or lacks)
            item = setting(name)
            changes.setdefault(item.section, {})[item.key] = None if item.presets and value == bundle[item.key] \
                else value
        if now["power"] != before["power"]:  # a new power: its keys are left to it where the rows show its values
            for key in POWER_ENGINE_KEYS:
                changes["run"].setdefault(key, None if now[key] == bundle[key] else now[key])
        text = edit_config_text(old, changes, header=CONFIG_HEADER)
        _check_engine_file(text)
        atomic_write_text(self.config_file, text)
        self.loaded = settings.replace()

    def run_name(self) -> str:
        """The run whose history the charts show ([run] run_name, else 'default')."""
        try:
            data = tomllib.loads(self.config_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            return "default"
        name = data.get("run", {}).get("run_name", "default")
        return name if isinstance(name, str) and name else "default"

    # -- sapling-app.json ---------------------------------------------------------------
    def load_app(self) -> AppSettings:
        path = self.app_file
        settings = AppSettings()
        if not path.is_file():
            return settings
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ValueError("it is not a JSON object")
            for f in fields(AppSettings):
                if f.name not in data:
                    continue
                value, default = data[f.name], getattr(settings, f.name)
                if type(value) is not type(default):
                    raise ValueError(f"{f.name} should be {type(default).__name__}, not {type(value).__name__}")
                setattr(settings, f.name, value)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            moved = _backup(path)
            warning = (f"Your app settings file could not be read ({exc}). "
                       f"{moved} and the default settings are used.")
            log.warning(warning)
            self.warnings.append(warning)
            return AppSettings()
        return settings

    def save_app(self, settings: AppSettings) -> None:
        atomic_write_json(self.app_file, asdict(settings))

    def take_warnings(self) -> list[str]:
        warnings, self.warnings = self.warnings, []
        return warnings


if __name__ == "__main__":
    store = SettingsStore(Paths.default())
    print(f"{store.config_file}: {store.load_engine()}")
    print(f"{store.app_file}: {store.load_app()}")
    for line in store.take_warnings():
        print("warning:", line)

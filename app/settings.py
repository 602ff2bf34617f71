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
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from engine.common.atomicio import atomic_write_json, atomic_write_text
from engine.common.config import POWER_ENGINE_KEYS, POWER_PRESETS, PRIORITIES, SwarmConfig
from engine.common.config_file import build_config, edit_config_text
from engine.common.errors import ConfigError
from engine.common.paths import Paths
from engine.common.rules import Invite, check_model_source, check_relay_url, parse_invite, split_invite
from engine.common.schedule import Schedule

__all__ = ["AppSettings", "EngineSettings", "SettingsError", "SettingsStore", "check_model_source",
           "check_relay_url", "parse_invite", "settings_place", "split_invite", "swarm_invite", "validate"]

log = logging.getLogger(__name__)

APP_SETTINGS_NAME = "sapling-app.json"
CONFIG_HEADER = ("Sapling engine settings. The desktop app edits model, swarm, protection and run threads/priority;",
                 "every key is explained by `sapling-node config`. Your own comments here are kept.")
SWARM_MODES = ("embedded", "relay", "solo")
_SWARM = SwarmConfig()  # the engine's defaults for the protection settings below, one copy


# A value the user typed cannot be used; the message says what to type instead. It is the
# engine's ConfigError: the rules live in engine/common/rules.py and engine/common/config.py, one copy each.
SettingsError = ConfigError


@dataclass
class EngineSettings:
    """The engine settings a person picks; each maps to one key of config.toml."""

    model_source: str = "bundled"  # [model] source
    swarm_mode: str = "embedded"  # [swarm] mode
    relay_url: str = ""  # [swarm] relay_url: the invite link (sapling://join?...) or a bare relay address
    join_token: str = ""  # [swarm] join_token (older settings; an invite carries its own token)
    embedded_lan: bool = False  # [swarm] embedded_lan: this network's computers may join the local swarm
    power: str = "standard"  # [run] power: "low", "standard" or "maximum" (a bundle of the three below)
    threads: int = 0  # [run] threads (0: automatic); left out of the file while it is what power gives
    priority: str = "background"  # [run] priority: "background" or "normal"; likewise
    duty_cycle: float = 1.0  # [run] duty_cycle; likewise
    schedule: str = ""  # [run] schedule: "22:00-07:00", "weekdays 22:00-07:00"; empty: at any hour
    daily_upload_mb: float = 0.0  # [swarm] daily_upload_mb (0: no cap)
    daily_download_mb: float = 0.0  # [swarm] daily_download_mb (0: no cap)
    # Protection from bad peers (Settings ▸ Protection; docs/swarm.md "Poisoning")
    plausibility_check: bool = _SWARM.plausibility_check  # [swarm] plausibility_check
    ban_strikes: int = _SWARM.ban_strikes  # [swarm] ban_strikes (0: never ban automatically)
    ban_window: int = _SWARM.ban_window  # [swarm] ban_window
    ban_hours: float = _SWARM.ban_hours  # [swarm] ban_hours (0: until lifted)
    persist_bans: bool = _SWARM.persist_bans  # [swarm] persist_bans
    banned_peers: list[str] = field(default_factory=list)  # [swarm] banned_peers

    KEYS = (
        ("model", "source", "model_source"),
        ("swarm", "mode", "swarm_mode"),
        ("swarm", "relay_url", "relay_url"),
        ("swarm", "join_token", "join_token"),
        ("swarm", "embedded_lan", "embedded_lan"),
        ("run", "power", "power"),
        ("run", "threads", "threads"),
        ("run", "priority", "priority"),
        ("run", "duty_cycle", "duty_cycle"),
        ("run", "schedule", "schedule"),
        ("swarm", "daily_upload_mb", "daily_upload_mb"),
        ("swarm", "daily_download_mb", "daily_download_mb"),
        ("swarm", "plausibility_check", "plausibility_check"),
        ("swarm", "ban_strikes", "ban_strikes"),
        ("swarm", "ban_window", "ban_window"),
        ("swarm", "ban_hours", "ban_hours"),
        ("swarm", "persist_bans", "persist_bans"),
        ("swarm", "banned_peers", "banned_peers"),
    )

    def needs_restart(self, other: EngineSettings) -> bool:
        """Whether going from `other` to self needs the engine restarted (model, swarm, threads, priority);
        the power choice itself, the schedule, the duty cycle and the data caps apply with a reload."""
        live = ("power", "schedule", "duty_cycle", "daily_upload_mb", "daily_download_mb")
        return {k: v for k, v in asdict(self).items() if k not in live} != \
            {k: v for k, v in asdict(other).items() if k not in live}


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
    """Every check a person can fix in the dialogs; SettingsError with one sentence."""
    check_model_source(settings.model_source)
    if settings.swarm_mode not in SWARM_MODES:
        raise SettingsError(f"Swarm mode must be one of {', '.join(SWARM_MODES)}.")
    if settings.swarm_mode == "relay":
        parse_invite(settings.relay_url)
    if len(settings.join_token) > 256:
        raise SettingsError("The join token is longer than 256 characters; paste just the token.")
    if isinstance(settings.threads, bool) or not isinstance(settings.threads, int) or not 0 <= settings.threads <= 1024:
        raise SettingsError("CPU threads must be 0 (automatic) or a number of threads.")
    if settings.priority not in PRIORITIES:
        raise SettingsError(f"Priority must be one of {', '.join(PRIORITIES)}.")
    if settings.power not in POWER_PRESETS:
        raise SettingsError(f"Power must be one of {', '.join(POWER_PRESETS)}.")
    if not 0.0 < settings.duty_cycle <= 1.0:
        raise SettingsError("The share of each minute for training must be above 0 and at most 1.")
    Schedule.parse(settings.schedule)  # one sentence on what to write
    # The protection settings: the engine's own rules (engine/common/config.py, SwarmConfig), one copy.
    replace(_SWARM, plausibility_check=settings.plausibility_check, ban_strikes=settings.ban_strikes,
            ban_window=settings.ban_window, ban_hours=settings.ban_hours, persist_bans=settings.persist_bans,
            banned_peers=list(settings.banned_peers), daily_upload_mb=settings.daily_upload_mb,
            daily_download_mb=settings.daily_download_mb)


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
        data = self._read_toml()
        settings = EngineSettings()
        power = data.get("run", {}).get("power", "standard")
        for key in POWER_ENGINE_KEYS if power in POWER_PRESETS else ():  # what the file leaves to run.power
            setattr(settings, key, POWER_PRESETS[power][key])
        for section, key, attr in EngineSettings.KEYS:
            value = data.get(section, {}).get(key)
            default = getattr(settings, attr)
            if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)  # ban_hours = 24 in the file
            if value is not None and isinstance(value, type(default)):
                setattr(settings, attr, value)
        return settings

    def save_engine(self, settings: EngineSettings) -> None:
        """Validate, set the keys in the existing file (other keys and comments kept), write atomically."""
        validate(settings)
        self._read_toml()  # an unusable file is moved aside first
        try:
            old = self.config_file.read_text(encoding="utf-8") if self.config_file.is_file() else ""
        except (OSError, UnicodeDecodeError):
            old = ""
        changes: dict[str, dict[str, Any]] = {}
        bundle = POWER_PRESETS[settings.power]
        for section, key, attr in EngineSettings.KEYS:
            value = getattr(settings, attr)
            if section == "run" and key in POWER_ENGINE_KEYS and value == bundle[key]:
                value = None  # what run.power gives: left to it, so a later change of power moves it too
            changes.setdefault(section, {})[key] = value
        text = edit_config_text(old, changes, header=CONFIG_HEADER)
        _check_engine_file(text)
        atomic_write_text(self.config_file, text)

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

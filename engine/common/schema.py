"""The settings as people meet them: one entry per engine setting, read from the config dataclasses.

Each setting is declared once, in engine/common/config.py (`engine.common.fields.declare`): its help,
its label where a person picks it in the app, where it takes effect, and a
number's bounds. This module reads those declarations; nothing here declares a
setting again.

- `SCHEMA`: every setting (`Setting`); `person_settings()` the ones the app's
  first-run and Settings dialogs show, by the name the app calls them
  (`setting(name)`).
- `person_defaults()` and `person_values(config)`: their values, by name.
- `config_with(values)`: a `NodeConfig` with those values, checked by the
  engine's own rules; a `ConfigError` names the setting by its label.
- `restart_changes(old, new)`: the settings whose change does not apply
  live, which the node's reload and the app's "restart to apply" banner both
  ask (one rule).
- `schema_lines(setting)`: how `sapling-node config` describes each key.

    python -m engine.common.schema      # the settings a person picks, with where each takes effect
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields, replace
from typing import Any

from engine.common.config import SECTIONS, NodeConfig
from engine.common.errors import ConfigError
from engine.common.presets import POWER_ENGINE_KEYS, POWER_PRESETS

WHERE = {"live": "applies live, with a reload between rounds", "restart": "applies when the node starts again",
         "new_run": "fixed for a run: a change applies at the next start, and a reload leaves it as it was"}


@dataclass(frozen=True)
class Setting:
    """One engine setting: `section.key`, and what its declaration says of it."""

    section: str
    key: str
    kind: str  # the field's type, as written: "int", "float", "str", "bool", "list[str]", ...
    default: Any
    help: str
    label: str  # "": not shown in the app
    name: str  # what the app's settings call it: the key, or the declared name where the key alone is unclear
    applies: str  # "live", "restart" or "new_run" (engine/common/config.py, APPLIES)
    low: float | None
    high: float | None
    open_low: bool

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.key}"

    @property
    def presets(self) -> tuple[str, ...]:
        """The run.power bundles that set it where the user did not (engine/common/presets.py)."""
        if self.section != "run" or self.key not in POWER_ENGINE_KEYS:
            return ()
        return tuple(POWER_PRESETS)


def _read() -> tuple[Setting, ...]:
    out = []
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            m = f.metadata
            default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc,operator]
            out.append(Setting(section, f.name, str(f.type), default, str(m.get("help", "")), str(m.get("label", "")),
                               str(m.get("name") or f.name), str(m.get("applies", "live")), m.get("low"),
                               m.get("high"), bool(m.get("open_low", False))))
    return tuple(out)


SCHEMA: tuple[Setting, ...] = _read()
_PERSON = {s.name: s for s in SCHEMA if s.label}
assert len(_PERSON) == sum(1 for s in SCHEMA if s.label), "two settings shown in the app share a name"


def person_settings() -> tuple[Setting, ...]:
    """The settings the app's dialogs show, in the order they are declared."""
    return tuple(_PERSON.values())


def setting(name: str) -> Setting:
    """A setting the app shows, by its name (KeyError for any other name)."""
    return _PERSON[name]


def person_defaults() -> dict[str, Any]:
    """Each shown setting's value in a config.toml that sets nothing, run.power's standard bundle included."""
    return person_values(NodeConfig())


def person_values(config: NodeConfig) -> dict[str, Any]:
    """The shown settings' values in `config`, by name."""
    return {s.name: _copy(getattr(getattr(config, s.section), s.key)) for s in _PERSON.values()}


def _copy(value: Any) -> Any:
    return list(value) if isinstance(value, list) else dict(value) if isinstance(value, dict) else value


def config_with(values: dict[str, Any], base: NodeConfig | None = None) -> NodeConfig:
    """`base` (the defaults) with the shown settings in `values` (by name), checked by the engine's rules.

    A bad value raises ConfigError with the engine's sentence, naming the setting by its label (the
    app shows it in the dialog): "CPU threads for training must be a whole number from 0 to 1024, ...".
    """
    base = base or NodeConfig()
    changes: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        s = setting(name)
        changes.setdefault(s.section, {})[s.key] = value
    try:
        return NodeConfig(**{section: replace(getattr(base, section), **changes.get(section, {}))
                             for section in SECTIONS})
    except ConfigError as exc:
        raise ConfigError(_labelled(str(exc))) from None


def _labelled(sentence: str) -> str:
    """The engine's sentence with each shown setting's key (swarm.ban_window) said by its label."""
    for s in sorted(_PERSON.values(), key=lambda s: -len(s.dotted)):
        if sentence.startswith(s.dotted):
            sentence = s.label + sentence[len(s.dotted):]
        sentence = sentence.replace(s.dotted, s.label[0].lower() + s.label[1:])
    return sentence


def restart_changes(old: NodeConfig, new: NodeConfig,
                    applies: tuple[str, ...] = ("restart", "new_run")) -> list[Setting]:
    """The settings that differ between `old` and `new` and take effect only as `applies` says (by default:
    all that a reload does not apply)."""
    return [s for s in SCHEMA if s.applies in applies
            and getattr(getattr(old, s.section), s.key) != getattr(getattr(new, s.section), s.key)]


def schema_lines(s: Setting) -> list[str]:
    """What `sapling-node config` says of a setting besides its help: its label in the app, where it takes
    effect, its bounds and the power bundles that set it."""
    facts = [f"in the app: {s.label}"] if s.label else []
    facts.append(WHERE[s.applies])
    if s.low is not None and s.high is not None:
        facts.append(f"from {s.low:g}{' (excluded)' if s.open_low else ''} to {s.high:g}")
    if s.presets:
        facts.append(f"set by run.power ({', '.join(s.presets)}) unless you set it")
    return ["; ".join(facts) + "."]


if __name__ == "__main__":
    for item in person_settings():
        print(f"{item.dotted:<26} {item.label:<40} {WHERE[item.applies]}")

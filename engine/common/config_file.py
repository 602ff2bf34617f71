"""config.toml, read and written: a `NodeConfig` from the file and the flags, and the file from a config.

`build_config(preset, path, overrides)` is how every node command gets its
settings: defaults < preset < config.toml < ``--set section.key=value`` flags
(`parse_override`), each section and key checked by name; ``run.power``
(`engine.common.presets.expand_power`) gives threads, priority and duty_cycle where none of those set them.
`config_toml(config)` is what `sapling-node config` prints: every section,
each key under its help text and what engine/common/schema.py says of it (its
label in the app, where it takes effect, its bounds). `edit_config_text(text, changes)` is the one
TOML writer the app and the engine share: it sets (or, with None, removes)
some keys and keeps every other key and the user's own comments and layout
(tomlkit). The settings themselves and their checks are engine/common/config.py.

    python -m engine.common.config_file     # the default configuration as TOML
"""

from __future__ import annotations

import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any

import tomlkit

from engine.common.config import SECTIONS, NodeConfig, RunConfig
from engine.common.errors import ConfigError
from engine.common.presets import POWER_ENGINE_KEYS, POWER_PRESETS, PRESETS, expand_power
from engine.common.schema import SCHEMA, schema_lines


def _merge(base: dict[str, dict[str, Any]], extra: dict[str, Any], origin: str) -> None:
    for section, values in extra.items():
        if section not in SECTIONS:
            raise ConfigError(f"{origin}: unknown section [{section}]; allowed: {', '.join(SECTIONS)}.")
        if not isinstance(values, dict):
            raise ConfigError(f"{origin}: [{section}] must be a table of key = value.")
        known = {f.name for f in fields(SECTIONS[section])}
        for key, value in values.items():
            if key not in known:
                raise ConfigError(f"{origin}: unknown key {section}.{key}; allowed: {', '.join(sorted(known))}.")
            base.setdefault(section, {})[key] = value


def parse_override(text: str) -> tuple[str, str, Any]:
    """Parse ``section.key=value``; the value is TOML (numbers, strings, tables), else a bare string."""
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise ConfigError(f"--set takes section.key=value (for example grpo.learning_rate=1e-4), got {text!r}.")
    dotted, raw = text.split("=", 1)
    section, key = dotted.strip().split(".", 1)
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return section, key, value


def build_config(
    preset: str = "default",
    toml_path: Path | None = None,
    overrides: list[str] | None = None,
) -> NodeConfig:
    """Defaults < preset < TOML file < overrides, validated; run.power fills the keys none of them set."""
    if preset not in PRESETS:
        raise ConfigError(f"--preset must be one of {', '.join(PRESETS)}, got {preset!r}.")
    merged: dict[str, dict[str, Any]] = {}
    _merge(merged, PRESETS[preset], f"preset {preset}")
    if toml_path is not None and Path(toml_path).is_file():
        try:
            data = tomllib.loads(Path(toml_path).read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{toml_path} is not valid TOML: {exc}.") from exc
        _merge(merged, data, str(toml_path))
    for text in overrides or []:
        section, key, value = parse_override(text)
        _merge(merged, {section: {key: value}}, f"--set {text}")
    run = merged.setdefault("run", {})
    power = run.get("power", RunConfig.power)
    if power in POWER_PRESETS:  # an unknown power fails in RunConfig, in a sentence
        bundle = expand_power(power)
        for key in POWER_ENGINE_KEYS:  # the keys the user did not set come from run.power
            run.setdefault(key, bundle[key])
    try:
        return NodeConfig(**{name: cls(**merged.get(name, {})) for name, cls in SECTIONS.items()})
    except TypeError as exc:  # a value of the wrong shape for a dataclass field
        raise ConfigError(f"Invalid configuration: {exc}.") from exc


def toml_item(value: Any) -> Any:
    """A value for tomlkit: dicts become inline tables, so a section reads as one line per key."""
    if isinstance(value, dict):
        inline = tomlkit.inline_table()
        inline.update({k: toml_item(v) for k, v in value.items()})
        return inline
    if isinstance(value, (list, tuple)):
        return [toml_item(v) for v in value]
    return value


def config_toml(config: NodeConfig) -> str:
    """The whole configuration as TOML, each key under its help text."""
    doc = tomlkit.document()
    for section in SECTIONS:
        table = tomlkit.table()
        for item in (s for s in SCHEMA if s.section == section):
            table.add(tomlkit.comment(item.help))
            for line in schema_lines(item):
                table.add(tomlkit.comment(line))
            table.add(item.key, toml_item(getattr(getattr(config, section), item.key)))
        doc.add(section, table)
    return tomlkit.dumps(doc)


def edit_config_text(text: str, changes: dict[str, dict[str, Any]], header: tuple[str, ...] = ()) -> str:
    """`text` (a config.toml, possibly empty) with `changes` set, section by section; a value of None
    removes the key (so that a default, or a run.power bundle, applies again). A new file starts with
    the `header` comment lines."""
    doc = tomlkit.parse(text) if text.strip() else tomlkit.document()
    if not text.strip():
        for line in header:
            doc.add(tomlkit.comment(line))
        if header:
            doc.add(tomlkit.nl())
    for section, values in changes.items():
        table = doc.get(section)
        if table is None:
            if all(value is None for value in values.values()):
                continue
            table = tomlkit.table()
            doc.add(section, table)
        for key, value in values.items():
            if value is None:
                if key in table:
                    del table[key]
            else:
                table[key] = toml_item(value)
    return tomlkit.dumps(doc)


if __name__ == "__main__":
    print(config_toml(NodeConfig()))

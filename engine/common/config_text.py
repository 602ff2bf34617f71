"""Writing config.toml: the whole configuration with its help texts, or a few keys changed in a user's file.

`config_toml(config)` is what `sapling-node config` prints: every section,
each key under its help text. `edit_config_text(text, changes)` is the one
TOML writer the app and the engine share: it sets (or, with None, removes)
some keys and keeps every other key and the user's own comments and layout
(tomlkit).

    python -m engine.common.config_text     # the default configuration as TOML
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import tomlkit

from engine.common.config import SECTIONS, NodeConfig


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
        for f in fields(getattr(config, section)):
            table.add(tomlkit.comment(str(f.metadata.get("help", ""))))
            table.add(f.name, toml_item(getattr(getattr(config, section), f.name)))
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

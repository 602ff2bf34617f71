"""Sapling engine: the headless core (config, device, models, tasks, GRPO, swarm).

One package per idea: `node` (the round loop and what runs it), `questions`, `rollouts` (a round's
plain data), `backends`, `models`, `swarm`, `relay`, `gguf`, `experiment`, and `common` (what the app
shares). At this level only the entry point lives beside them: `cli` (`sapling-node`).

Importing `engine` is cheap: torch, transformers and Qt are never imported
here; the backends import what they need when a node starts.
"""

# The one place the version is written: pyproject.toml, the installers and the
# relay handshake all read it from here.
__version__ = "0.1.0"

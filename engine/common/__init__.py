"""What the engine and the app share: the modules the desktop app may import (the only ones).

- `events`: the engine <-> app channel (JSON lines: events out, commands in) and `node_command`;
- `paths`: where Sapling keeps things on disk (platformdirs, or one folder with `--home`);
- `atomicio`: atomic writes; every file Sapling writes goes through here;
- `config`: the node's typed, validated configuration; `config_file`: config.toml read (with the
  preset and --set flags) and written, edits keeping the user's comments;
- `errors`: one hierarchy for every error that crosses the engine's boundary;
- `rules`: rules both sides apply (invites, relay addresses, model sources, stable seeds, the swarm
  protocol's version and completion limit);
- `joining`: a relay's information document, fetched and checked before joining, and the doctor's steps;
- `model_policy`: which models a swarm trains, which model a node runs, and where the bundled one ships;
- `device`: which compute device a node would use (torch and mlx only when a device is picked).

They import the standard library, platformdirs and tomlkit (config_file), and of the engine only
each other and the package root's `__version__`, even inside a function: never the swarm, the relay,
the backends or the model loader, and never torch, transformers, Qt, aiohttp or cryptography at
import time. app/ imports engine.common and nothing else of the engine, bar `engine.cli` for
`sapling node` and the package root's `__version__` (tests/test_boundaries.py). Nothing is imported
here, so `import engine.common.errors` costs that module alone (the relay imports it).
"""

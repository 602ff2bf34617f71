"""Sapling engine: the headless core (config, device, models, tasks, GRPO, swarm).

Importing `engine` is cheap: torch, transformers and Qt are never imported
here; the backends import what they need when a node starts.
"""

# The one place the version is written: pyproject.toml, the installers and the
# relay handshake all read it from here.
__version__ = "0.1.0"

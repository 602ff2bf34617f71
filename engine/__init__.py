"""Sapling engine: the headless core (config, device, models, tasks, GRPO, swarm).

Importing `engine` is cheap: torch, transformers and Qt are never imported
here; the backends import what they need when a node starts.
"""

__version__ = "0.1.0"

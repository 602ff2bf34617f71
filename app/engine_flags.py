"""The flags the app runs its engine with, kept as data: `--home` and the settings flags, and each subcommand's command.

`sapling --home DIR` and the self-test decide them once (`EngineFlags(home, settings)`); the engine child
(`serve`), Try it (`chat`), Export model… (`export`), Check connection (`doctor`) and Settings ▸ Identity
(`identity`) each ask `command(subcommand, ...)` for their command line. Nothing reads a command line back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.common.events import node_command
from engine.common.paths import Paths

# Subcommands that take the settings flags (engine.node.launch.add_settings_flags): the app's settings apply to them.
SETTINGS_SUBCOMMANDS = frozenset({"run", "serve", "chat", "export", "config"})
# Subcommands that only take --home: they read config.toml and the identity from it, and have flags of their own.
HOME_SUBCOMMANDS = frozenset({"doctor", "identity", "stats"})


@dataclass(frozen=True)
class EngineFlags:
    """The engine's home folder (None: the user's own folders, or $SAPLING_HOME) and its other settings flags
    (--model, --relay, --rounds, --set ...), without --home."""

    home: Path | None = None
    settings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.home is not None:
            object.__setattr__(self, "home", Path(self.home).expanduser())
        object.__setattr__(self, "settings", tuple(self.settings))
        if "--home" in self.settings:
            raise ValueError("give the home folder as EngineFlags(home=...), not in the settings flags")

    def paths(self) -> Paths:
        """The folders the engine will use with these flags: all under `home`, or the user's own."""
        return Paths.under(self.home) if self.home is not None else Paths.default()

    def home_flags(self) -> list[str]:
        """`--home DIR`, or nothing: what the autostart entry and the home-only subcommands take."""
        return ["--home", str(self.home)] if self.home is not None else []

    def command(self, subcommand: str, *args: str) -> list[str]:
        """The command line of `sapling-node SUBCOMMAND ARGS...` with the flags it takes from the app.

        run, serve, chat, export and config take every settings flag, before ARGS, so that a flag the caller
        gives wins (argparse keeps the last: Export model…'s --threads while training runs); doctor, identity
        and stats take only --home, after ARGS (`identity show` keeps its action next to its name)."""
        if subcommand in SETTINGS_SUBCOMMANDS:
            return node_command(subcommand, [*self.home_flags(), *self.settings, *args])
        if subcommand in HOME_SUBCOMMANDS:
            return node_command(subcommand, [*args, *self.home_flags()])
        raise ValueError(f"the app does not start `sapling-node {subcommand}`")

"""What `sapling-node run`, `serve`, `export`, `config` and `chat` share: settings flags, logging, signals, a run.

- `add_settings_flags`: the settings flags every node subcommand takes
  (--home, --config, --preset, --set and their shortcuts), one definition.
- `config_from_args`: defaults < preset < config file < flags, as one `NodeConfig`.
- `setup_logging`: a rotating file in the log dir for everything; the
  console (or the app, under `serve`) gets the node's own messages only.
  Library warnings (a transformers FutureWarning, say) go to the file alone:
  they are for developers, not for the person watching the node.
- `stop_on_signals`: the first SIGTERM or Ctrl-C asks the node to stop at
  its next safe point (within about a second, training included); a second
  one ends the process at once. Checkpoints are atomic, so both are safe.
- `run_node`: lower the process to `run.priority` (background by default:
  nice 19 / the idle class, as volunteer-computing clients do), open the
  swarm (handing it `start_embedded_relay`, to host this computer's relay),
  run the node, close the swarm. The relay and the app's window are
  never lowered: only this function calls `apply_priority`.
"""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.common.config import NodeConfig
from engine.common.config_file import build_config
from engine.common.errors import ConfigError
from engine.common.events import Event
from engine.common.paths import Paths
from engine.common.presets import PRESETS

log = logging.getLogger(__name__)

# The exit code of a process ended by a second SIGTERM or Ctrl-C (128 + the signal number).
EXIT_FORCED = {signal.SIGINT: 130, signal.SIGTERM: 143}
LIBRARY_LOGGERS = ("httpx", "urllib3", "huggingface_hub", "filelock")


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """The settings flags (defaults < preset < config file < flags) and -v, as every node subcommand takes them."""
    g = parser.add_argument_group("configuration (defaults < preset < config file < flags)")
    g.add_argument("--home", type=Path, help="keep config, data, cache and logs under this one folder")
    g.add_argument("--config", type=Path, help="config file (default: config.toml in the config dir)")
    g.add_argument("--preset", default="default", choices=sorted(PRESETS),
                   help="starting settings: default fits a CPU laptop; paper is the SAPO paper's")
    g.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one setting, e.g. grpo.learning_rate=1e-4 (repeatable)")
    g.add_argument("--device", help="auto, cuda, mlx or cpu (run.device)")
    g.add_argument("--model", help="'bundled', a local HF folder or a hub id (model.source)")
    g.add_argument("--run-name", help="name of the run; checkpoints are per run (run.run_name)")
    g.add_argument("--seed", type=int, help="node seed (run.seed)")
    g.add_argument("--rounds", type=int, help="stop after this round number; 0 trains until stopped (run.max_rounds)")
    g.add_argument("--threads", type=int, help="CPU threads, 0 for all (run.threads)")
    g.add_argument("--relay", metavar="INVITE",
                   help="join this swarm: an invite link (sapling://join?relay=...) or a relay address (wss://host/ws) "
                        "(swarm.mode=relay)")
    g.add_argument("--solo", action="store_true", default=None, help="train alone, share nothing (swarm.mode=solo)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show debug logs")


def config_from_args(args: argparse.Namespace, paths: Paths) -> NodeConfig:
    """The node's settings: defaults < preset < config file < --set flags and their shortcuts."""
    overrides = list(args.overrides)
    shortcuts = {"device": "run.device", "model": "model.source", "run_name": "run.run_name",
                 "seed": "run.seed", "rounds": "run.max_rounds", "threads": "run.threads"}
    for attr, key in shortcuts.items():
        value = getattr(args, attr, None)
        if value is not None:
            overrides.append(f"{key}={value}" if isinstance(value, int) else f"{key}={quote_toml(str(value))}")
    if getattr(args, "relay", None):
        overrides += ["swarm.mode=relay", f"swarm.relay_url={quote_toml(args.relay)}"]
    if getattr(args, "solo", None):
        overrides.append("swarm.mode=solo")
    toml_path = args.config if args.config is not None else paths.config_file
    if args.config is not None and not args.config.is_file():
        raise ConfigError(f"Config file {args.config} does not exist.")
    return build_config(args.preset, toml_path, overrides)


def quote_toml(text: str) -> str:
    """A TOML basic string holding `text`."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def setup_logging(paths: Paths, verbose: bool, console: logging.Handler | None) -> None:
    """Everything to the rotating log file; the node's own records also to `console`."""
    root = logging.getLogger()
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for handler in list(root.handlers):
        root.removeHandler(handler)
    file_handler: logging.Handler | None = None
    try:
        paths.log_dir.mkdir(parents=True, exist_ok=True)
        file_handler = logging.handlers.RotatingFileHandler(
            paths.log_dir / "sapling-node.log", maxBytes=5 << 20, backupCount=3, encoding="utf-8"
        )
        file_handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"))
        root.addHandler(file_handler)
    except OSError as exc:
        print(f"sapling-node: warning: cannot write logs in {paths.log_dir}: {exc}", file=sys.stderr)
    if console is not None:
        root.addHandler(console)
    for noisy in LIBRARY_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # Python warnings (deprecations in transformers and friends) go to the file only.
    logging.captureWarnings(True)
    warnings_log = logging.getLogger("py.warnings")
    warnings_log.propagate = False
    for handler in list(warnings_log.handlers):
        warnings_log.removeHandler(handler)
    warnings_log.addHandler(file_handler if file_handler is not None else logging.NullHandler())
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def stop_on_signals(stop: Callable[[], None], say: Callable[[str], None] | None = None) -> list[int]:
    """Install SIGTERM and SIGINT handlers: the first asks `stop()`, a second exits at once.

    Returns the list that counts the signals received (the caller's exit code may depend on it).
    """
    received: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        received.append(signum)
        if len(received) == 1:
            if say is not None:
                say("Stopping at the next safe point (the last checkpoint is kept). Send the signal again to stop now.")
            stop()
            return
        logging.shutdown()
        os._exit(EXIT_FORCED.get(signal.Signals(signum), 143))

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return received


def run_node(
    config: NodeConfig,
    paths: Paths,
    emit: Callable[[Event], None],
    control: Any,
    reload_config: Callable[[], NodeConfig] | None = None,
    before_run: Callable[[], None] | None = None,
) -> int:
    """Open the swarm, run the node until it stops, close the swarm; the last completed round.

    `before_run` is called once the swarm is open, just before training starts
    (serve starts reading commands there).
    """
    from engine.common.node_lock import node_lock
    from engine.node.loop import Node
    from engine.node.priority import apply_priority
    from engine.relay.embedded import start_embedded_relay
    from engine.swarm.session import open_swarm

    with node_lock(paths.data_dir):  # one node per data folder: its identity, checkpoints and metrics
        node = Node(config, paths, emit, control, reload_config=reload_config)
        node.status("starting", "Engine started.")
        # Before any worker thread exists (the relay link, torch's pool), so every thread inherits it.
        log.info("Running at %s (run.priority = %s).", apply_priority(config.run.priority), config.run.priority)
        swarm = open_swarm(config, paths.identity_file, emit, host_relay=start_embedded_relay)
        try:
            node.exchange = swarm.exchange
            if before_run is not None:
                before_run()
            return node.run()
        finally:
            swarm.close()

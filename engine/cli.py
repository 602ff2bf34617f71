"""`sapling-node`: the headless node.

    sapling-node run                      # train the bundled model, resume where it left off
    sapling-node run --rounds 40 --preset paper --set grpo.learning_rate=1e-4
    sapling-node serve                    # JSON-lines events on stdout, commands on stdin (the app uses this)
    sapling-node export --out ./my-model  # merged HF folder of the newest checkpoint
    sapling-node config                   # print the effective configuration as TOML

A user's mistake gets one sentence on stderr and a non-zero exit code
(2 for bad settings); Ctrl-C stops at the next safe point, twice stops now.
"""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine import __version__
from engine.config import PRESETS, NodeConfig, build_config
from engine.errors import ConfigError, SaplingError
from engine.events import Event
from engine.paths import Paths

log = logging.getLogger("engine")

EXIT_INTERRUPTED = 130


def _common(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("configuration (defaults < preset < config file < flags)")
    g.add_argument("--home", type=Path, help="keep config, data, cache and logs under this one folder")
    g.add_argument("--config", type=Path, help="config file (default: config.toml in the config dir)")
    g.add_argument("--preset", default="default", choices=sorted(PRESETS), help="starting settings: default fits a CPU laptop; paper is the SAPO paper's")
    g.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override one setting, e.g. grpo.learning_rate=1e-4 (repeatable)")
    g.add_argument("--device", help="auto, cuda, mlx or cpu (run.device)")
    g.add_argument("--model", help="'bundled', a local HF folder or a hub id (model.source)")
    g.add_argument("--run-name", help="name of the run; checkpoints are per run (run.run_name)")
    g.add_argument("--seed", type=int, help="node seed (run.seed)")
    g.add_argument("--rounds", type=int, help="stop after this round number; 0 trains until stopped (run.max_rounds)")
    g.add_argument("--threads", type=int, help="CPU threads, 0 for all (run.threads)")
    g.add_argument("--relay", metavar="URL", help="join this relay (ws://host:port/ws, or an invite with ?token=) (swarm.mode=relay)")
    g.add_argument("--solo", action="store_true", default=None, help="train alone, share nothing (swarm.mode=solo)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show debug logs")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sapling-node", description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"sapling {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="train in this terminal, with progress bars and one line per round")
    _common(run)
    serve = sub.add_parser("serve", help="train driven by JSON lines (used by the desktop app)")
    _common(serve)
    export = sub.add_parser("export", help="write the trained model, merged, as a Hugging Face folder")
    _common(export)
    export.add_argument("--out", type=Path, required=True, help="folder to write (replaced atomically)")
    cfg = sub.add_parser("config", help="print the effective configuration as TOML")
    _common(cfg)
    return parser


def config_from_args(args: argparse.Namespace, paths: Paths) -> NodeConfig:
    overrides = list(args.overrides)
    shortcuts = {"device": "run.device", "model": "model.source", "run_name": "run.run_name",
                 "seed": "run.seed", "rounds": "run.max_rounds", "threads": "run.threads"}
    for attr, key in shortcuts.items():
        value = getattr(args, attr)
        if value is not None:
            overrides.append(f"{key}={value}" if isinstance(value, int) else f"{key}={_quote(str(value))}")
    if getattr(args, "relay", None):
        overrides += ["swarm.mode=relay", f"swarm.relay_url={_quote(args.relay)}"]
    if getattr(args, "solo", None):
        overrides.append("swarm.mode=solo")
    toml_path = args.config if args.config is not None else paths.config_file
    if args.config is not None and not args.config.is_file():
        raise ConfigError(f"Config file {args.config} does not exist.")
    return build_config(args.preset, toml_path, overrides)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def setup_logging(paths: Paths, verbose: bool, console: logging.Handler | None) -> None:
    root = logging.getLogger()
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for handler in list(root.handlers):
        root.removeHandler(handler)
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
    for noisy in ("httpx", "urllib3", "huggingface_hub", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class TerminalView:
    """Renders events for a person: a progress bar per phase and a line per round."""

    def __init__(self) -> None:
        from tqdm import tqdm

        self._tqdm = tqdm
        self.bar: Any = None
        self.phase = ""

    def _close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __call__(self, event: Event) -> None:
        kind = event["type"]
        if kind == "progress":
            if event["phase"] != self.phase or self.bar is None:
                self._close_bar()
                self.phase = event["phase"]
                self.bar = self._tqdm(total=event["total"], desc=f"round {event['round']} {self.phase:<12}",
                                      leave=False, dynamic_ncols=True, file=sys.stderr)
            self.bar.total = event["total"]
            self.bar.n = event["done"]
            self.bar.refresh()
        elif kind == "round":
            self._close_bar()
            m = event["metrics"]
            self._tqdm.write(
                f"round {m['round']:>4} | reward {m['reward_mean']:.3f} | acc {100 * m['accuracy']:5.1f}% | "
                f"{m['tokens_per_second']:6.1f} tok/s | {m['seconds']:6.1f} s | {m['rss_bytes'] / 2**30:4.1f} GB | "
                f"loss {m['loss']:+.4f}",
                file=sys.stdout,
            )
        elif kind == "eval":
            self._close_bar()
            self._tqdm.write(
                f"eval  {event['round']:>4} | held-out accuracy {100 * event['accuracy']:5.1f}% "
                f"({event['questions']} questions, greedy pass@1) | reward {event['reward_mean']:.3f}",
                file=sys.stdout,
            )
        elif kind == "swarm":
            self._close_bar()
            self._tqdm.write(f"[swarm] {event['name']} ({event['peer_id'][:8]}): {event['message']}", file=sys.stderr)
        elif kind == "peers":
            self._close_bar()
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(event.get("rejected_by_reason", {}).items()))
            self._tqdm.write(
                f"[swarm] {event['online']} peers online | received {event['received']} | accepted {event['accepted']} "
                f"| rejected {event['rejected']}" + (f" ({reasons})" if reasons else ""),
                file=sys.stderr,
            )
        elif kind == "status":
            self._close_bar()
            self._tqdm.write(f"[{event['state']}] {event['message']}", file=sys.stderr)
        elif kind == "error":
            self._close_bar()
            self._tqdm.write(f"error: {event['message']}", file=sys.stderr)


class _ConsoleHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        tqdm.write(f"{record.levelname.lower()}: {record.getMessage()}", file=sys.stderr)


def cmd_run(args: argparse.Namespace, paths: Paths, config: NodeConfig) -> int:
    from engine.sapo import Control, Node

    control = Control()
    interrupts = [0]

    def on_sigint(signum: int, frame: Any) -> None:
        interrupts[0] += 1
        if interrupts[0] == 1:
            print("\nStopping after this step (the last checkpoint is kept). Ctrl-C again to stop now.", file=sys.stderr)
            control.stop()
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    signal.signal(signal.SIGTERM, lambda s, f: control.stop())
    from engine.exchange import open_swarm

    view = TerminalView()
    swarm = open_swarm(config, paths.identity_file, view)
    try:
        node = Node(config, paths, view, control, exchange=swarm.exchange,
                    reload_config=lambda: config_from_args(args, paths))
        node.run()
    finally:
        swarm.close()
    return EXIT_INTERRUPTED if interrupts[0] else 0


def cmd_export(args: argparse.Namespace, paths: Paths, config: NodeConfig) -> int:
    from engine.sapo import Node

    node = Node(config, paths, lambda event: None)
    node.setup()
    if node.round == 0:
        raise SaplingError(
            f"Run {config.run.run_name!r} has no checkpoint yet under {node.checkpoint_root}: train first "
            "(sapling-node run), or pick the run with --run-name."
        )
    if node.backend is None:
        raise RuntimeError("setup() left no backend")
    node.backend.export(args.out)
    print(f"Exported round {node.round} of run {config.run.run_name!r} to {args.out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    paths = Paths.under(args.home) if args.home else Paths.default()
    if args.command == "serve":
        from engine.serve import serve

        return serve(args, paths)
    setup_logging(paths, args.verbose, _ConsoleHandler(logging.WARNING if not args.verbose else logging.DEBUG))
    try:
        config = config_from_args(args, paths)
        if args.command == "config":
            print(config.to_toml())
            return 0
        if args.command == "export":
            return cmd_export(args, paths, config)
        return cmd_run(args, paths, config)
    except SaplingError as exc:
        print(f"sapling-node: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("Stopped. The last checkpoint is kept; run the same command to continue.", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())

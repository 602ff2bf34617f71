"""`sapling-node`: the headless node.

    sapling-node run                      # train the bundled model, resume where it left off
    sapling-node run --rounds 40 --preset paper --set grpo.learning_rate=1e-4
    sapling-node serve                    # JSON-lines events on stdout, commands on stdin (the app uses this)
    sapling-node export --out ./my-model  # merged HF folder of the newest checkpoint
    sapling-node config                   # print the effective configuration as TOML
    sapling-node doctor [--relay INVITE]  # check each step of joining the swarm, with its time (docs/swarm.md)
    sapling-node stats [--json]           # what this node's rollouts did for other peers (engine/swarm/node_stats.py)
    sapling-node identity export FILE     # back up this node's key; `identity import FILE` restores it
    sapling-node discover [--json]        # the swarms announced on this network (engine/common/lan.py)

A user's mistake gets one sentence on stderr and a non-zero exit code
(2 for bad settings). Ctrl-C or SIGTERM stops at the next safe point (within
about a second, training included); a second one stops at once.
"""

from __future__ import annotations

import argparse
import errno
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from engine import __version__
from engine.common.config import NodeConfig
from engine.common.errors import SaplingError
from engine.common.node_lock import node_lock
from engine.common.paths import Paths
from engine.gguf.export import DEFAULT_QUANT, export_model
from engine.gguf.export import FORMATS as EXPORT_FORMATS
from engine.gguf.export import QUANTS as EXPORT_QUANTS
from engine.gguf.export import format_for as export_format_for
from engine.node.launch import add_settings_flags, config_from_args, run_node, setup_logging, stop_on_signals
from engine.node.terminal import ConsoleHandler, TerminalView
from engine.swarm import identity_backup, node_stats

log = logging.getLogger("engine")

EXIT_INTERRUPTED = 130


def program() -> str:
    """What to type for the headless node: `sapling node` in the packaged app (one executable serves the window and
    the node, app/main.py), `sapling-node` where Sapling was installed with pip."""
    return "sapling node" if getattr(sys, "frozen", False) else "sapling-node"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=program(), description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"sapling {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="train in this terminal, with progress bars and one line per round")
    add_settings_flags(run)
    serve = sub.add_parser("serve", help="train driven by JSON lines (used by the desktop app)")
    add_settings_flags(serve)
    export = sub.add_parser("export",
                            help="write the trained model, merged, as a Hugging Face folder or a GGUF file "
                                 "(docs/exporting.md)")
    add_settings_flags(export)
    export.add_argument("--out", type=Path, required=True,
                        help="folder (hf) or file (gguf, gguf-lora) to write; it replaces only an earlier export or an "
                             "empty folder, atomically")
    export.add_argument("--format", choices=EXPORT_FORMATS,
                        help="hf: merged Hugging Face folder; gguf: merged GGUF file for llama.cpp, Ollama, LM Studio; "
                             "gguf-lora: the adapter alone, for llama.cpp's --lora (default: gguf when --out ends in "
                             ".gguf, else hf)")
    export.add_argument("--quant", default=DEFAULT_QUANT, choices=EXPORT_QUANTS,
                        help=f"GGUF weight type (default {DEFAULT_QUANT})")
    export.add_argument("--round", dest="export_round", type=int, metavar="N",
                        help="the checkpoint of round N (default: the newest); 0 is the base model before training")
    exp = sub.add_parser("experiment",
                         help="several simulated nodes on this computer, one run per local/external mix, then a report "
                              "(docs/swarm.md)")
    exp.add_argument("--nodes", type=int, help="simulated nodes (default 4; paper 8)")
    exp.add_argument("--mixes", help="I/J mixes to compare, e.g. 8/0,4/4 (default 8/0,4/4; paper 8/0,6/2,4/4,2/6)")
    exp.add_argument("--rounds", type=int, help="rounds per mix (default 25, about two hours on a 2-core CPU); with "
                     "--resume, or the same settings again, more rounds than planned carry the experiment on")
    exp.add_argument("--out", type=Path, required=True,
                     help="folder for checkpoints, rounds and report.json / report.md / reward.png")
    exp.add_argument("--resume", action="store_true", help="carry on the experiment in --out with its saved settings")
    exp.add_argument("--veterans", type=int, default=0, metavar="N",
                     help="the first N nodes are veterans: they train --veteran-rounds rounds alone first (kept in "
                          "OUT/veterans), then every mix starts them from there beside the fresh nodes (docs/swarm.md)")
    exp.add_argument("--veteran-rounds", type=int, default=0, metavar="R",
                     help="rounds the veterans train before the others join")
    exp.add_argument("--preset", default="default",
                     help="default (this CPU, about two hours) or paper (the SAPO paper's 8 nodes and four mixes, for "
                          "a GPU)")
    exp.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                     help="override one node setting, as in run (repeatable)")
    exp.add_argument("--device", help="auto, cuda or cpu (run.device)")
    exp.add_argument("--model", help="'bundled', a local HF folder or a hub id (model.source)")
    exp.add_argument("--seed", type=int, help="experiment seed; node k uses seed + k * 10^7 (run.seed)")
    exp.add_argument("--threads", type=int, help="CPU threads, 0 for all (run.threads)")
    exp.add_argument("--home", type=Path, help="where the converted model cache and logs live (as in run)")
    exp.add_argument("-v", "--verbose", action="store_true", help="show debug logs")
    cfg = sub.add_parser("config", help="print the effective configuration as TOML")
    add_settings_flags(cfg)
    doctor = sub.add_parser("doctor", help="check, step by step, why this computer can or cannot join the swarm")
    doctor.add_argument("--relay", metavar="INVITE",
                        help="an invite link or a relay address (default: the swarm in config.toml)")
    doctor.add_argument("--home", type=Path, help="keep config, data, cache and logs under this one folder")
    doctor.add_argument("--config", type=Path, help="config file (default: config.toml in the config dir)")
    doctor.add_argument("--json", action="store_true", help="one JSON object per step, then one with the verdict")
    doctor.add_argument("--timeout", type=float, default=5.0, metavar="S",
                        help="seconds each step may take (default 5)")
    discover = sub.add_parser("discover", help="list the swarms that announce themselves on this network (mDNS)")
    discover.add_argument("--seconds", type=float, default=3.0, metavar="S", help="how long to listen (default 3)")
    discover.add_argument("--json", action="store_true", help="one JSON object per swarm found")
    node_stats.add_parser(sub)
    identity_backup.add_parser(sub)
    return parser


def cmd_discover(args: argparse.Namespace) -> int:
    """Print each swarm found on this network: its name and the address to join (an invite may be just that)."""
    import json

    from engine.common.lan import discover

    if not 0 < args.seconds <= 60:
        print("sapling-node: error: --seconds must be a number of seconds from 0 to 60.", file=sys.stderr)
        return 2
    try:
        found = discover(args.seconds)
    except OSError as exc:
        print(f"sapling-node: error: cannot listen on this network ({exc.strerror or exc}).", file=sys.stderr)
        return 1
    for swarm in found:
        print(json.dumps(swarm.to_json()) if args.json else f"{swarm.name}\t{swarm.url}")
    if not found and not args.json:
        print(f"No swarm announced itself on this network within {args.seconds:g} s.", file=sys.stderr)
    if found and not args.json:
        print(f"Join one with: {program()} run --set swarm.mode=relay --set swarm.relay_url=ADDRESS", file=sys.stderr)
    return 0


def cmd_run(args: argparse.Namespace, paths: Paths, config: NodeConfig) -> int:
    from engine.node.clock import Control

    control = Control()
    say = lambda text: print(f"\n{text}", file=sys.stderr)  # noqa: E731
    signals = stop_on_signals(control.stop, say)
    run_node(config, paths, TerminalView(), control, reload_config=lambda: config_from_args(args, paths))
    # A stop asked for with Ctrl-C says so in the exit code, as shells expect; SIGTERM is a normal end.
    return EXIT_INTERRUPTED if signal.SIGINT in signals else 0


def cmd_export(args: argparse.Namespace, paths: Paths, config: NodeConfig) -> int:
    fmt = args.format or export_format_for(args.out)
    try:
        result = export_model(config, paths, args.out, fmt, args.quant, args.export_round,
                              report=lambda message: print(message, flush=True))
    except Exception as exc:  # a folder nobody may write in, a full disk: the partial files are already removed
        full = getattr(exc, "errno", None) == errno.ENOSPC or "No space left on device" in str(exc)
        if not (full or isinstance(exc, OSError)):
            raise
        why = "the disk is full" if full else (getattr(exc, "strerror", None) or str(exc))
        print(f"sapling-node: error: {args.out} cannot be written ({why}); nothing was left half-written.",
              file=sys.stderr)
        return 2
    what = "the base model" if result.round == 0 else f"round {result.round}"
    kind = (f"GGUF {result.quant}" if result.format == "gguf" else "GGUF LoRA" if result.format == "gguf-lora"
            else "HF folder")
    print(f"Exported {what} of run {config.run.run_name!r} to {args.out} ({kind}, {result.bytes / 1e6:.0f} MB)",
          flush=True)
    if result.card is not None:
        print(f"Model card: {result.card} (publishing it: docs/exporting.md)", flush=True)
    return 0


def cmd_experiment(args: argparse.Namespace, paths: Paths) -> int:
    from engine.experiment.plan import lengthen, make_plan, plan_config
    from engine.experiment.runner import Experiment
    from engine.experiment.terminal import ExperimentTerminal
    from engine.node.clock import Control
    from engine.node.launch import quote_toml

    overrides = list(args.overrides)
    for attr, key in {"device": "run.device", "model": "model.source", "seed": "run.seed",
                      "threads": "run.threads"}.items():
        value = getattr(args, attr)
        if value is not None:
            overrides.append(f"{key}={value}" if isinstance(value, int) else f"{key}={quote_toml(str(value))}")
    plan = Experiment.saved_plan(args.out) if args.resume else None
    if args.resume and plan is None:
        print(f"sapling-node: error: {args.out} holds no experiment to resume.", file=sys.stderr)
        return 2
    if plan is not None and args.rounds is not None:  # --resume --rounds N: the same experiment, run longer
        plan = lengthen(plan, args.rounds, args.out)
    if plan is None:
        plan = Experiment.widened_plan(args.out, make_plan(args.preset, args.nodes, args.mixes, args.rounds, overrides,
                                                            args.veterans, args.veteran_rounds))
    from engine.node.priority import apply_priority

    log.info("Running at %s.", apply_priority(plan_config(plan).run.priority))
    control = Control()
    signals = stop_on_signals(control.stop, lambda text: print(f"\n{text}", file=sys.stderr))
    view = ExperimentTerminal(len(plan.mixes))
    try:
        with node_lock(args.out, "A second experiment needs a folder of its own (--out)."):
            Experiment(plan, args.out, paths, view.hooks(), control).run()
    finally:
        view.close()
    if control.stopping:
        print(f"Stopped. Every node's last round is kept; run the same command (or --resume --out {args.out}) to "
              "continue.", file=sys.stderr)
        return EXIT_INTERRUPTED if signal.SIGINT in signals else 0
    print(f"Report: {args.out / 'report.md'} (and report.json, reward.png)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["chat"]:  # the app's Try it tab (engine/gguf/chat.py): its own JSON-lines protocol and flags
        from engine.gguf.chat import main as chat_main

        return chat_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "discover":
        return cmd_discover(args)
    paths = Paths.under(args.home) if args.home else Paths.default()
    problem = paths.problem()
    if problem:
        print(f"sapling-node: error: {problem}", file=sys.stderr)
        return 2
    if args.command == "serve":
        from engine.node.serve import serve

        return serve(args, paths)
    if args.command == "stats":
        return node_stats.run(args, paths)
    if args.command == "identity":
        return identity_backup.run(args, paths)
    if args.command == "doctor":
        from engine.swarm.doctor import run_doctor

        if not 0 < args.timeout <= 600:
            print("sapling-node: error: --timeout must be a number of seconds from 0 to 600.", file=sys.stderr)
            return 2
        return run_doctor(args.relay, paths.identity_file, args.config or paths.config_file, args.json, args.timeout)
    setup_logging(paths, args.verbose, ConsoleHandler(logging.WARNING if not args.verbose else logging.DEBUG))
    try:
        if args.command == "experiment":
            return cmd_experiment(args, paths)
        config = config_from_args(args, paths)
        if args.command == "config":
            from engine.common.config_file import config_toml

            print(config_toml(config))
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

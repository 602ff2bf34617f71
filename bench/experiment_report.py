"""Read what `sapling-node experiment` left in its folders: rebuild a report, pair folders, pool seeds, plot.

Does sharing help, and by how much, with what interval? The experiment
writes its own report when it finishes; this command answers the questions
that span folders (a setting changed on the same seeds, several seeds, the
newcomers of a veterans experiment):

    python -m bench.experiment_report DIR                                  # rebuild DIR's report (partial runs too)
    python -m bench.experiment_report --compare DIR_A DIR_B MIX [MIX_B]    # A's MIX against B's MIX_B, same seeds
    python -m bench.experiment_report --pool MIX MIX_B DIR_A,DIR_B ...     # that, pooled over seeds (one pair each)
    python -m bench.experiment_report --paper-metric MIX MIX_B DIR_A,DIR_B ...  # three figures, the paper's beside ours
    python -m bench.experiment_report --horizon OUT.png MIX MIX_B DIR_A,DIR_B ... [--every 25] [--window 25]
                                                                           # --pool read after every 25 rounds, drawn
    python -m bench.experiment_report --plot OUT.png LABEL=DIR:MIX ...     # several folders' mixes in one plot
    python -m bench.experiment_report --plot-hours OUT.png LABEL=DIR:MIX ...  # the same, reward against hours
    python -m bench.experiment_report --plot-held-out OUT.png LABEL=DIR:MIX ...  # held-out accuracy against hours
    ... --nodes 3[,4]                                                      # only these nodes (e.g. the newcomers)
    ... --upto 100                                                         # the records as they stood after round 100

Every comparison prints JSON: the ratio of cumulative rewards with its 95%
bootstrap interval (nodes and rounds resampled; seeds kept apart when
pooled) and the difference per node-round; under "per_hour" the same
at equal time on each node's own computer (engine/experiment/hours.py);
under "round_cost" what A's rounds cost a node against B's (CPU,
generation and training seconds, tokens generated and trained on).
`--paper-metric` prints three figures of MIX against MIX_B, pooled the same
way: the training-batch mean reward as the paper's trainer logs it, under each
definition its text and code allow (engine/experiment/batch_mean.py); the
own-rollout reward (Sapling's); held-out accuracy at equal time.
Definitions: docs/swarm.md, "The experiment".

`--horizon` reads a long pair at every horizon N (engine/experiment/horizon.py): reward per round (rounds 1
to N, and the last rounds only), per CPU hour, held-out at equal time and after round N, each pooled and with
its interval; it writes OUT.png (those against N) and OUT.json, and prints the table in markdown. A seed counts
at a horizon only once both its folders have reached it.

Each DIR may be packed (DIR/records.tar.xz, `python -m bench.records pack DIR`): its records are
read from the archive, unpacked once into the cache (engine/experiment/records.py), and the output names
DIR as given. Rebuilding a packed DIR's report writes it, with its plots, into that unpacked folder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from engine.common.atomicio import atomic_write_bytes
from engine.experiment.batch_mean import paper_metric
from engine.experiment.compare import (
    compare,
    held_out_plot,
    hours_plot,
    pooled_compare,
    variants_plot,
    what_it_measures,
)
from engine.experiment.horizon import EVERY, WINDOW, horizon_markdown, horizon_plot, horizon_table
from engine.experiment.plan import START_EVAL_FILE, plan_config, read_json, saved_plan
from engine.experiment.records import default_cache, experiment_folder, named_back
from engine.experiment.report import build_report, stratified_bootstrap, write_report
from engine.experiment.upto import records_upto

USAGE = (
    "usage: python -m bench.experiment_report DIR\n"
    "       python -m bench.experiment_report --compare DIR_A DIR_B MIX [MIX_B] [--nodes K,...] [--upto N]\n"
    "       python -m bench.experiment_report --pool MIX MIX_B DIR_A,DIR_B ... [--nodes K,...] [--upto N]\n"
    "       python -m bench.experiment_report --paper-metric MIX MIX_B DIR_A,DIR_B ... [--nodes K,...] [--upto N]\n"
    "       python -m bench.experiment_report --horizon OUT.png MIX MIX_B DIR_A,DIR_B ... [--every N] [--window N]\n"
    "       python -m bench.experiment_report --plot OUT.png LABEL=DIR:MIX ...\n"
    "       python -m bench.experiment_report --plot-hours OUT.png LABEL=DIR:MIX ...\n"
    "       python -m bench.experiment_report --plot-held-out OUT.png LABEL=DIR:MIX ..."
)


def _nodes(args: list[str]) -> tuple[list[str], list[int] | None]:
    """The arguments without `--nodes K,...`, and the node indices it names (None: all)."""
    if "--nodes" not in args:
        return args, None
    at = args.index("--nodes")
    if at + 1 >= len(args):
        raise ValueError("--nodes needs node numbers, like --nodes 3 or --nodes 2,3.")
    text = args[at + 1]
    try:
        nodes = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--nodes takes whole numbers separated by commas, got {text!r}.") from None
    return args[:at] + args[at + 2 :], nodes


def _upto(args: list[str]) -> tuple[list[str], int | None]:
    """The arguments without `--upto N`, and N (None: every round finished)."""
    if "--upto" not in args:
        return args, None
    at = args.index("--upto")
    try:
        rounds = int(args[at + 1])
    except (IndexError, ValueError):
        raise ValueError("--upto needs a round number, like --upto 100.") from None
    return args[:at] + args[at + 2 :], rounds


def _count(args: list[str], flag: str, default: int) -> tuple[list[str], int]:
    """The arguments without `FLAG N`, and N (`default` when the flag is not given)."""
    if flag not in args:
        return args, default
    at = args.index(flag)
    try:
        value = int(args[at + 1])
    except (IndexError, ValueError):
        raise ValueError(f"{flag} needs a number of rounds, like {flag} {default}.") from None
    return args[:at] + args[at + 2 :], value


def _pairs(specs: list[str]) -> list[tuple[Path, Path]]:
    """DIR_A,DIR_B arguments as (A, B) paths."""
    pairs = []
    for spec in specs:
        a_dir, comma, b_dir = spec.partition(",")
        if not comma or not a_dir or not b_dir:
            raise ValueError(f"{spec!r} is not DIR_A,DIR_B.")
        pairs.append((Path(a_dir), Path(b_dir)))
    return pairs


def _horizon(args: list[str], nodes: list[int] | None) -> int:
    """--horizon OUT.png MIX MIX_B DIR_A,DIR_B ... [--every N] [--window N]"""
    args, every = _count(args, "--every", EVERY)
    args, window = _count(args, "--window", WINDOW)
    if len(args) < 5:
        print(USAGE, file=sys.stderr)
        return 2
    out, label, label_b, given = Path(args[1]), args[2], args[3], _pairs(args[4:])
    pairs, _ = _readable(given)
    rows = horizon_table(pairs, label, label_b, lambda folder, n: records_upto(folder, n, default_cache() / "upto"),
                         every, window, nodes)
    names = [a.name for a, _ in given]
    measures = {"a": what_it_measures(pairs[0][0], label), "b": what_it_measures(pairs[0][1], label_b)}
    atomic_write_bytes(out, horizon_plot(rows, label, label_b, names))
    atomic_write_bytes(out.with_suffix(".json"), json.dumps(
        {"mix": label, "mix_b": label_b, "measures": measures, "pairs": [[str(a), str(b)] for a, b in given],
         "rows": rows}, indent=1).encode())
    print(f"A = {measures['a']}\nB = {measures['b']}\n")
    print(horizon_markdown(rows, names), end="")
    print(f"wrote {out} and {out.with_suffix('.json')}", file=sys.stderr)
    return 0


def _readable(pairs: list[tuple[Path, Path]], upto: int | None = None) -> tuple[list[tuple[Path, Path]],
                                                                                 dict[Path, Path]]:
    """The pairs' folders where the readers can read them (packed records unpacked; with `upto`, cut after that
    round, engine/experiment/upto.py), and each one's name as given."""
    readable = {path: experiment_folder(path) for pair in pairs for path in pair}
    if upto is not None:
        readable = {path: records_upto(folder, upto, default_cache() / "upto") for path, folder in readable.items()}
    return [(readable[a], readable[b]) for a, b in pairs], {folder: path for path, folder in readable.items()}


def _readable_variant(spec: str) -> str:
    """LABEL=DIR:MIX with DIR where its records can be read; a malformed spec as it is, for the report to refuse."""
    label, equals, rest = spec.partition("=")
    folder, colon, mix = rest.rpartition(":")
    if not equals or not colon or not folder:
        return spec
    return f"{label}={experiment_folder(Path(folder))}:{mix}"


def _run(args: list[str]) -> int:
    args, nodes = _nodes(args)
    args, upto = _upto(args)
    if args[:1] == ["--horizon"]:
        if upto is not None:
            raise ValueError("--horizon reads every horizon itself; --upto goes with --compare, --pool or "
                             "--paper-metric.")
        return _horizon(args, nodes)
    if len(args) in (4, 5) and args[0] == "--compare":
        label_b = args[4] if len(args) == 5 else None
        [(folder_a, folder_b)], names = _readable([(Path(args[1]), Path(args[2]))], upto)
        print(json.dumps(named_back(compare(folder_a, folder_b, args[3], label_b, nodes), names), indent=1))
        return 0
    if len(args) >= 4 and args[0] in ("--pool", "--paper-metric"):
        pairs, names = _readable(_pairs(args[3:]), upto)
        pooled = named_back(pooled_compare(pairs, args[1], args[2], nodes), names)
        if args[0] == "--pool":
            print(json.dumps(pooled, indent=1))
            return 0
        held_out = pooled["held_out_per_hour"] or {}
        print(json.dumps({
            "batch_mean": paper_metric(pairs, args[1], args[2], stratified_bootstrap, nodes),
            "own_reward": {k: pooled[k] for k in ("ratio", "ratio_ci95", "cumulative_a", "cumulative_b")},
            "held_out_at_equal_time": {k: held_out.get(k) for k in ("accuracy_a", "accuracy_b", "difference",
                                                                       "difference_ci95")},
        }, indent=1))
        return 0
    if nodes is not None or upto is not None:
        raise ValueError("--nodes and --upto go with --compare, --pool or --paper-metric.")
    plots = {"--plot": variants_plot, "--plot-hours": hours_plot, "--plot-held-out": held_out_plot}
    if len(args) >= 3 and args[0] in plots:
        atomic_write_bytes(Path(args[1]), plots[args[0]]([_readable_variant(spec) for spec in args[2:]]))
        print(f"wrote {args[1]}")
        return 0
    if len(args) != 1 or args[0].startswith("--"):
        print(USAGE, file=sys.stderr)
        return 2
    given = Path(args[0])
    out = experiment_folder(given)
    plan = saved_plan(out)
    if plan is None:
        raise ValueError(f"{out} holds no experiment ({out / 'experiment.json'} is missing).")
    report = named_back(build_report(plan, plan_config(plan), out, read_json(out / START_EVAL_FILE)), {out: given})
    write_report(report, out)
    if out != given:
        print(f"experiment_report: {given} is packed; its report and plots are in {out}", file=sys.stderr)
    print(json.dumps({k: {"rounds": m["rounds_done"], "cumulative_reward": m["cumulative_reward"]}
                      for k, m in report["mixes"].items()}))
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        return _run(list(sys.argv[1:] if argv is None else argv))
    except (ValueError, OSError) as exc:  # ConfigError is a ValueError: a damaged plan
        print(f"experiment_report: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""Named bundles of values: the specialties and their default weights, the node presets, run.power's bundles.

- `SAPO_SPECIALTIES` and `DEFAULT_WEIGHTS`: the nine ReasoningGYM specialties and the weights the
  default preset draws them by (`tasks.specialties`).
- `PRESETS`: what `--preset` starts from (``default``, ``paper``), before config.toml and ``--set``.
- `POWER_PRESETS` and `expand_power`: what ``run.power`` (Low, Standard, Maximum) gives, for the engine's
  file (engine/common/config_file.py) and the app's Resources box alike: the one place a power bundle is
  expanded.

The settings these name, their help and their checks are engine/common/config.py, which imports this
module (and nothing here imports it).
"""

from __future__ import annotations

from typing import Any

SAPO_SPECIALTIES = (
    "base_conversion",
    "basic_arithmetic",
    "arc_1d",
    "bf",
    "propositional_logic",
    "fraction_simplification",
    "decimal_arithmetic",
    "calendar_arithmetic",
    "binary_matrix",
)


# Tuned for the bundled 135M model on a CPU (docs/results.md). GRPO learns only
# from groups whose rewards differ: in two 40-round runs the model earned mixed
# rewards on basic_arithmetic and calendar_arithmetic, rarely on base_conversion
# and fraction_simplification, never on bf, decimal_arithmetic or arc_1d, and was
# already near 1.0 on propositional_logic. The weights put the rounds where the
# signal is; every specialty keeps some weight so all nine stay in the mix. The
# paper preset uses uniform weights.
DEFAULT_WEIGHTS: dict[str, float] = {
    "base_conversion": 1.5,
    "basic_arithmetic": 3.0,
    "arc_1d": 0.25,
    "bf": 0.25,
    "propositional_logic": 0.5,
    "fraction_simplification": 1.0,
    "decimal_arithmetic": 0.25,
    "calendar_arithmetic": 3.0,
    "binary_matrix": 0.5,
}


TRAIN_ON = ("informative", "passed")  # grpo.train_on; engine/rollouts/groups.py trained_groups applies it
PRIORITIES = ("background", "normal")  # run.priority; engine/node/priority.py applies it
# run.power: one choice for people who will not read twenty settings. Each bundle gives the keys it names
# unless the user set them (config.toml or --set); idle_only and ac_only are the desktop app's pause rules
# (app/power.py), which it takes from the same table. "standard" is what a node did before power existed.
POWER_PRESETS: dict[str, dict[str, Any]] = {
    "low": {"threads": 1, "priority": "background", "duty_cycle": 0.5, "idle_only": True, "ac_only": True},
    "standard": {"threads": 0, "priority": "background", "duty_cycle": 1.0, "idle_only": False, "ac_only": False},
    "maximum": {"threads": 0, "priority": "normal", "duty_cycle": 1.0, "idle_only": False, "ac_only": False},
}
POWER_ENGINE_KEYS = ("threads", "priority", "duty_cycle")  # the bundle's keys that are [run] keys


def expand_power(power: str) -> dict[str, Any]:
    """What run.power `power` gives: threads, priority and duty_cycle (the [run] keys, `POWER_ENGINE_KEYS`)
    and the app's idle_only and ac_only pauses. ValueError for a power that is not one of `POWER_PRESETS`
    (RunConfig says so in a sentence first)."""
    if power not in POWER_PRESETS:
        raise ValueError(f"run.power must be one of {', '.join(POWER_PRESETS)}, got {power!r}")
    return dict(POWER_PRESETS[power])


PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # Fits a CPU laptop: about 30 s a round on 2 cores, under 2 GB of memory (docs/results.md).
    "default": {},
    # The SAPO paper's settings: 8 questions x 8 completions, eps 0.2/0.28, no KL.
    "paper": {
        "tasks": {
            "questions_per_round": 8,
            "completions_per_question": 8,
            "specialties": dict.fromkeys(SAPO_SPECIALTIES, 1.0),
            "difficulty": "fixed",
        },
        "grpo": {"eps_low": 0.2, "eps_high": 0.28, "kl_beta": 0.0, "train_on": "informative"},
        # The paper's best mix: 4 own rollouts and 4 from the swarm per round, uncapped.
        "swarm": {"local_groups": 4, "external_groups": 4, "train_groups": 0},
    },
}

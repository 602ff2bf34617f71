"""The terminal view of `sapling-node experiment`: a bar for the mix's rounds, one for the phase, a line per round.

Used by engine/cli.py; the experiment itself (engine/experiment/runner.py) talks to it only through `Hooks`.
The bars are `engine.node.terminal.StepBar`s: on a terminal, tqdm bars; in a file, one line as each step ends.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from engine.experiment.plan import Mix
from engine.experiment.runner import Hooks, Reward
from engine.node.terminal import StepBar, write_line


class ExperimentTerminal:
    """Bars for the mix (rounds) and the phase, and one line per round with each node's reward."""

    def __init__(self, mixes: int, bars: bool | None = None) -> None:
        self.bars = bars  # None: bars when stderr is a terminal
        self.mixes = mixes
        self.mix_bar: StepBar | None = None
        self.phase_bar: StepBar | None = None
        self.phase = ""
        self.started = time.monotonic()

    def hooks(self, reward: Reward | None = None) -> Hooks:
        return Hooks(say=self.say, progress=self.progress, round_done=self.round_done,
                     mix_started=self.mix_started, reward=reward)

    def _close_phase(self) -> None:
        if self.phase_bar is not None:
            self.phase_bar.close()
            self.phase_bar = None
            self.phase = ""

    def say(self, text: str) -> None:
        write_line(text)

    def mix_started(self, mix: Mix, number: int, start: int, rounds: int) -> None:
        self._close_phase()
        if self.mix_bar is not None:
            self.mix_bar.close()
        self.mix_bar = StepBar(f"mix {mix.label} ({number} of {self.mixes})", rounds, initial=start, bars=self.bars,
                               leave=True, position=0, unit="rounds")

    def progress(self, phase: str, done: int, total: int) -> None:
        if phase != self.phase or self.phase_bar is None:
            self._close_phase()
            self.phase = phase
            self.phase_bar = StepBar(f"  {phase:<11}", total, bars=self.bars, position=1)
        self.phase_bar.update(done, total)

    def round_done(self, mix: Mix, record: dict[str, Any]) -> None:
        self._close_phase()
        rewards = " ".join(f"{r:.3f}" for r in record["rewards"])
        external = sum(record["external_groups"])
        write_line(
            f"mix {mix.label} round {record['round']:>4} | reward by node {rewards} | mean "
            f"{sum(record['rewards']) / len(record['rewards']):.3f} | external groups {external} | "
            f"{record['seconds']:6.1f} s", sys.stdout)
        if self.mix_bar is not None:
            self.mix_bar.advance()

    def close(self) -> None:
        self._close_phase()
        if self.mix_bar is not None:
            self.mix_bar.close()
            self.mix_bar = None

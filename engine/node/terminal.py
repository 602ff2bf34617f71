"""What a person reads of a node in a terminal: a bar per step on a terminal, one line per step in a file.

`TerminalView` renders `sapling-node run`'s events: a progress bar for each phase of a round (generating,
scoring, training, ...), a line per round and per evaluation, the swarm's news. `StepBar` is one step's
progress: a tqdm bar when its stream is a terminal; when the output goes to a file or a pipe
(`sapling-node run > node.log 2>&1`, a service's journal), no carriage returns at all, and one line when the
step ends ("round 2 generating: 48/48 in 21.3 s"). The experiment's view (engine/experiment/terminal.py)
uses `StepBar` too.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

from engine.common.events import Event


def is_terminal(stream: Any) -> bool:
    """Whether `stream` is a terminal (a closed or odd stream is not)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def write_line(text: str, file: TextIO | None = None) -> None:
    """A line that never tears a bar on screen (tqdm.write moves the bars out of the way)."""
    from tqdm import tqdm

    tqdm.write(text, file=file if file is not None else sys.stderr)


class StepBar:
    """One step's progress: a tqdm bar on a terminal, or a single line when the step ends in a file.

    `bars` forces one or the other (None: whether `stream` is a terminal). `leave` keeps a bar on screen once
    it is closed; `position` stacks bars (the experiment's mix bar above its phase bar); `unit` names what is
    counted in the closing line."""

    def __init__(self, desc: str, total: int, *, initial: int = 0, stream: TextIO | None = None,
                 bars: bool | None = None, leave: bool = False, position: int | None = None, unit: str = "") -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.desc, self.total, self.done, self.unit = desc, total, initial, unit
        self.started = time.monotonic()
        self.bar: Any = None
        if is_terminal(self.stream) if bars is None else bars:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=desc, leave=leave, position=position,
                            dynamic_ncols=True, file=self.stream, unit=unit or "it")

    def update(self, done: int, total: int | None = None) -> None:
        """The step stands at `done` of `total` (unchanged when None)."""
        self.done = done
        if total is not None:
            self.total = total
        if self.bar is not None:
            self.bar.total = self.total
            self.bar.n = done
            self.bar.refresh()

    def advance(self, n: int = 1) -> None:
        self.update(self.done + n)

    def close(self) -> None:
        """The bar goes; in a file, the step's one line: what it counted and how long it took."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
            return
        unit = f" {self.unit}" if self.unit else ""
        write_line(f"{self.desc.strip()}: {self.done}/{self.total}{unit} in {time.monotonic() - self.started:.1f} s",
                   self.stream)


# The events that get a line of their own (others, such as `contribution`, leave the bar as it is).
LINES = frozenset({"round", "eval", "swarm", "peers", "status", "error"})


class TerminalView:
    """Renders events for a person: a progress bar per phase (one line per phase in a file) and a line per round."""

    def __init__(self, bars: bool | None = None) -> None:
        self.bars = bars
        self.bar: StepBar | None = None
        self.phase = ""

    def _close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def _progress(self, event: Event) -> None:
        if event["phase"] != self.phase or self.bar is None:
            self._close_bar()
            self.phase = event["phase"]
            self.bar = StepBar(f"round {event['round']} {self.phase:<12}", event["total"], bars=self.bars)
        self.bar.update(event["done"], event["total"])

    def __call__(self, event: Event) -> None:
        kind = event["type"]
        if kind == "progress":
            self._progress(event)
            return
        if kind not in LINES:
            return
        self._close_bar()
        self.phase = ""
        if kind == "round":
            m = event["metrics"]
            write_line(
                f"round {m['round']:>4} | reward {m['reward_mean']:.3f} | acc {100 * m['accuracy']:5.1f}% | "
                f"{m['tokens_per_second']:6.1f} tok/s | {m['seconds']:6.1f} s | {m['rss_bytes'] / 2**30:4.1f} GB | "
                f"loss {m['loss']:+.4f}",
                sys.stdout,
            )
        elif kind == "eval":
            write_line(
                f"eval  {event['round']:>4} | held-out accuracy {100 * event['accuracy']:5.1f}% "
                f"({event['questions']} questions, greedy pass@1) | reward {event['reward_mean']:.3f}",
                sys.stdout,
            )
        elif kind == "swarm":
            write_line(f"[swarm] {event['name']} ({event['peer_id'][:8]}): {event['message']}")
        elif kind == "peers":
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(event.get("rejected_by_reason", {}).items()))
            # Cut off, the last count of peers online is stale: say what is going on instead.
            link = "cut off from the relay, reconnecting" if event.get("connected") is False \
                else f"{event['online']} peers online"
            write_line(f"[swarm] {link} | received {event['received']} | accepted {event['accepted']} "
                       f"| rejected {event['rejected']}" + (f" ({reasons})" if reasons else ""))
        elif kind == "status":
            write_line(f"[{event['state']}] {event['message']}")
        elif kind == "error":
            write_line(f"error: {event['message']}")


class ConsoleHandler(logging.Handler):
    """The node's log records on stderr, one line each, between the bars."""

    def emit(self, record: logging.LogRecord) -> None:
        write_line(f"{record.levelname.lower()}: {record.getMessage()}")

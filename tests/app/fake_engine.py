"""A stand-in for `sapling-node serve`: replays a recorded event stream, obeys commands.

    python tests/app/fake_engine.py --fixture tests/app/fixtures/session.jsonl [--rate 100]
        [--commands FILE] [--crash-after N] [--hold] [--exit-code N] [--ignore-stop]
    python tests/app/fake_engine.py --synthetic 2000 --first-round 10001 --rate 100 --hold  # gui_responsiveness

Lines of the fixture are written to stdout as they are (malformed ones too).
Commands read on stdin are appended to --commands; pause stops the replay
(status paused), resume continues, stop exits 0 after a `stopped` status,
end of stdin exits 0. --crash-after N writes a traceback to stderr and exits
1 after N lines; --hold skips the fixture's final `stopped` status and waits
for a command instead of exiting when the replay is done. --ignore-stop
answers stop with a log line and goes on (an engine slow to reach a safe point).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.common.errors import EventError
from engine.common.events import encode, make_event, parse_command

DEVICE = {"kind": "cpu", "name": "Fake CPU (2 threads)", "memory_bytes": 8 << 30, "bf16": False,
          "reason": "fake engine"}


class Fake:
    def __init__(self, commands: Path | None, ignore_stop: bool = False) -> None:
        self.commands = commands
        self.ignore_stop = ignore_stop
        self.running = threading.Event()
        self.running.set()
        self.lock = threading.Lock()
        self.round = 0

    def write(self, line: str) -> None:
        with self.lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def status(self, state: str, message: str) -> None:
        self.write(encode(make_event("status", state=state, message=message, device=DEVICE, model="tiny-llama",
                                     run="default", round=self.round)))

    def read_commands(self) -> None:
        for line in sys.stdin:
            if self.commands is not None:
                with open(self.commands, "a", encoding="utf-8") as handle:
                    handle.write(line if line.endswith("\n") else line + "\n")
            try:
                cmd = parse_command(line)["cmd"]
            except EventError as exc:
                self.write(encode(make_event("log", level="warning", logger="fake", message=f"bad command: {exc}")))
                continue
            if cmd == "pause":
                self.running.clear()
                self.status("paused", "Paused.")
            elif cmd == "resume":
                self.running.set()
                self.status("training", "Resumed.")
            elif cmd == "reload":
                self.status("training", "Settings reloaded.")
            elif cmd == "stop" and self.ignore_stop:
                self.write(encode(make_event("log", level="info", logger="fake", message="stop: not yet")))
            elif cmd == "stop":
                self.status("stopped", f"Stopped after round {self.round}; the last checkpoint holds it.")
                os._exit(0)
        os._exit(0)  # stdin closed: the app went away


def synthetic(n: int, first_round: int = 1, seed: int = 0) -> Iterator[str]:
    """A plausible mix: mostly progress and log lines, a round every 20 events, peers after it."""
    rng = random.Random(seed)
    yield encode(make_event("status", state="training", message="Training from round 1.", device=DEVICE,
                            model="tiny-llama", run="default", round=0))
    round_index = first_round - 1
    for i in range(n):
        if i % 20 == 19:
            round_index += 1
            reward = 0.2 + 0.3 * (1 - math.exp(-round_index / 200)) + rng.gauss(0, 0.08)
            metrics = {"kind": "round", "run": "default", "round": round_index, "reward_mean": reward,
                       "swarm_reward_mean": reward + rng.gauss(0.02, 0.05), "accuracy": max(0.0, reward - 0.1),
                       "tokens_per_second": 40 + rng.gauss(0, 3), "seconds": 20 + rng.gauss(0, 2)}
            yield encode(make_event("round", round=round_index, metrics=metrics))
        elif i % 20 == 10:
            yield encode(make_event("peers", online=3, received=8 * i, accepted=6 * i, rejected=2 * i,
                                    rejected_by_reason={"zero_advantage": i, "duplicate": i},
                                    by_peer={"a1b2c3d4": {"name": "mossy-oak", "accepted": 6 * i, "rejected": 2 * i}}))
        elif i % 4 == 0:
            yield encode(make_event("log", level="info", logger="engine.node.loop", message=f"synthetic log line {i}"))
        else:
            yield encode(make_event("progress", phase="generating", done=i % 96, total=96, round=round_index + 1))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fixture", type=Path)
    parser.add_argument("--synthetic", type=int, default=0)
    parser.add_argument("--first-round", type=int, default=1, help="first round of --synthetic")
    parser.add_argument("--rate", type=float, default=0.0, help="lines per second (0: as fast as possible)")
    parser.add_argument("--commands", type=Path)
    parser.add_argument("--crash-after", type=int, default=-1)
    parser.add_argument("--hold", action="store_true")
    parser.add_argument("--exit-code", type=int, default=0)
    parser.add_argument("--ignore-stop", action="store_true")
    args = parser.parse_args()
    fake = Fake(args.commands, args.ignore_stop)
    threading.Thread(target=fake.read_commands, daemon=True).start()
    print("fake engine: replaying", args.fixture or f"{args.synthetic} synthetic events", file=sys.stderr, flush=True)
    lines: Iterator[str] = synthetic(args.synthetic, args.first_round) if args.synthetic else iter(
        args.fixture.read_text(encoding="utf-8").splitlines() if args.fixture else [])
    start = time.perf_counter()
    for n, line in enumerate(lines):
        if n == args.crash_after:
            print("Traceback (most recent call last):\n  File \"fake_engine.py\"\nRuntimeError: boom (fake crash)",
                  file=sys.stderr, flush=True)
            os._exit(1)
        fake.running.wait()
        if args.rate > 0:
            delay = start + n / args.rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if isinstance(event, dict) and event.get("type") == "status" and event.get("state") == "stopped" and args.hold:
            continue
        if isinstance(event, dict) and isinstance(event.get("round"), int) and event.get("type") == "round":
            fake.round = event["round"]
        fake.write(line)
    if args.hold:
        while True:
            time.sleep(1)
    sys.stdout.flush()
    os._exit(args.exit_code)


if __name__ == "__main__":
    sys.exit(main())

"""Does Sapling stay out of the way? A CPU-bound foreground job, alone and beside a training node.

    .venv/bin/python -m bench.background_impact [--reps 5] [--rounds 2] [--foreground one,all]
                                                [--engine-arg=--set --engine-arg=run.priority=normal]

The node is the one the app starts: `sapling-node serve` with the default
settings, in a throwaway --home (the converted bundled model is hard-linked
from your cache when it is there, else converted once). Two settings differ
from a fresh install: the embedded relay takes a free port (so the node never
joins a swarm already running on this computer) and the held-out evaluation is
off (it would add minutes before round 1 and says nothing about contention).

The foreground is pure-Python arithmetic in worker processes, sized to about
`--work` seconds alone: "one" is one worker (a single busy program), "all" one
worker per CPU (a parallel build). For each:

1. Slowdown, measured alternately so both sides see the same background noise:
   the job runs while the node trains, then again while the node is paused
   (`pause` on stdin, timed once the engine reports `paused`), `--reps` times.
   Slowdown = median(beside the node) / median(alone). Target: at most 1.10.
2. Sapling under that load: the job runs without a break while the node
   finishes `--rounds` rounds; each round's time, generating and training, as
   the node reports them, and the share of a CPU the node got. At background
   priority a node beside programs that fill every core gets almost none, so
   after `--round-timeout` seconds the bench says how far it got instead.

The node's nice value per thread (read from the OS) and its thread-count log
lines are printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from engine.common.events import encode, make_command, node_command, parse_event  # noqa: E402
from engine.common.paths import Paths  # noqa: E402
from engine.node.priority import niceness  # noqa: E402

WORKER = """
import sys, time
for line in sys.stdin:
    n = int(line)
    t = time.perf_counter()
    x = 0
    for i in range(n):
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF
    print(time.perf_counter() - t, flush=True)
"""


class Worker:
    """One foreground process: `run(n)` does n steps of arithmetic and returns the seconds it took."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)

    def start(self, n: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()

    def result(self) -> float:
        assert self.proc.stdout is not None
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


class Foreground:
    """`count` workers started together: a job's time is the slowest worker's (the job is done when all are)."""

    def __init__(self, count: int) -> None:
        self.workers = [Worker() for _ in range(count)]
        self.steps = 0

    def job(self) -> float:
        for worker in self.workers:
            worker.start(self.steps)
        return max(worker.result() for worker in self.workers)

    def calibrate(self, seconds: float) -> None:
        self.steps = 200_000
        while True:
            took = self.job()
            if took > 0.25:
                break
            self.steps *= 4
        self.steps = int(self.steps * seconds / took)

    def close(self) -> None:
        for worker in self.workers:
            worker.close()


class Node:
    """`sapling-node serve` as the app starts it; events parsed on a thread."""

    def __init__(self, home: Path, extra: list[str]) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", PYTHONIOENCODING="utf-8")
        self.cmd = node_command("serve", ["--home", str(home), "--set", "swarm.embedded_port=0",
                                          "--set", "tasks.eval_every=0", *extra])
        self.stderr = open(home / "engine-stderr.txt", "wb")
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr)
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.rounds: list[dict[str, Any]] = []
        self.thread_lines: list[str] = []
        self.last_progress: dict[str, Any] = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = parse_event(line)
            if event is None:
                continue
            if event["type"] == "round":
                self.rounds.append(event["metrics"])
            if event["type"] == "progress":
                self.last_progress = event
            if event["type"] == "log" and event["logger"] == "engine.node.priority":
                self.thread_lines.append(f"{time.strftime('%H:%M:%S')} {event['message']}")
            if event["type"] == "error" and event.get("fatal"):
                print(f"engine error: {event['message']}", file=sys.stderr)
            self.events.put(event)

    def send(self, cmd: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((encode(make_command(cmd)) + "\n").encode())
        self.proc.stdin.flush()

    def wait_for(self, pred: Callable[[dict[str, Any]], bool], timeout: float = 1800.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None and self.events.empty():
                raise RuntimeError(f"the engine exited with code {self.proc.returncode}; see {self.stderr.name}")
            try:
                event = self.events.get(timeout=max(0.01, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError("no such event from the engine") from None
                continue
            if pred(event):
                return event

    def pause(self) -> None:
        self.send("pause")
        self.wait_for(lambda e: e["type"] == "status" and e["state"] == "paused")

    def resume(self) -> None:
        self.send("resume")
        self.wait_for(lambda e: e["type"] == "status" and e["state"] == "training")

    def stop(self) -> None:
        self.send("stop")
        try:
            self.proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


def throwaway_home() -> Path:
    """A temporary --home; the converted bundled model is hard-linked in from the user's cache when present."""
    home = Path(tempfile.mkdtemp(prefix="sapling-impact-"))
    cache = Paths.default().models_cache
    for folder in sorted(cache.glob("SmolLM2-*")) if cache.is_dir() else []:
        target = Paths.under(home).models_cache / folder.name
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copytree(folder, target, copy_function=os.link)
        except OSError:
            shutil.copytree(folder, target, dirs_exist_ok=True)
    return home


def continuous(foreground: Foreground, stop: threading.Event, times: list[float]) -> None:
    while not stop.is_set():
        times.append(foreground.job())


def measure(node: Node, kind: str, args: argparse.Namespace) -> dict[str, Any]:
    count = 1 if kind == "one" else os.cpu_count() or 1
    foreground = Foreground(count)
    node.pause()  # calibrate alone
    foreground.calibrate(args.work)
    node.resume()
    beside: list[float] = []
    alone: list[float] = []
    for _ in range(args.reps):
        time.sleep(args.settle)  # the node trains beside nothing for a moment, as before a program starts
        beside.append(foreground.job())
        node.pause()
        alone.append(foreground.job())
        node.resume()
    result = {"foreground": kind, "workers": count, "steps": foreground.steps, "beside": beside, "alone": alone}
    report_slowdown(result)
    first_round = len(node.rounds)
    stop = threading.Event()
    loaded: list[float] = []
    engine = psutil.Process(node.proc.pid)
    cpu_before, wall_before = sum(engine.cpu_times()[:2]), time.monotonic()
    runner = threading.Thread(target=continuous, args=(foreground, stop, loaded))
    runner.start()
    try:
        node.wait_for(lambda e: e["type"] == "round" and len(node.rounds) >= first_round + args.rounds + 1,
                      timeout=args.round_timeout)
    except TimeoutError:
        result["timed_out"] = {"seconds": args.round_timeout, "last_progress": node.last_progress}
    result["engine_cpu_share"] = (sum(engine.cpu_times()[:2]) - cpu_before) / (time.monotonic() - wall_before)
    stop.set()
    runner.join()
    foreground.close()
    # The first round under load began before the load did; the later ones ran under it throughout.
    result["rounds"] = node.rounds[first_round + 1 : first_round + 1 + args.rounds]
    result["loaded_jobs"] = loaded
    report_rounds(result)
    return result


def report_slowdown(result: dict[str, Any]) -> None:
    beside, alone = statistics.median(result["beside"]), statistics.median(result["alone"])
    pairs = [b / a for b, a in zip(result["beside"], result["alone"], strict=True)]
    print(f"\nforeground '{result['foreground']}': {result['workers']} worker(s), {result['steps']:,} steps each")
    print(f"  alone (node paused):  median {alone:6.2f} s   {' '.join(f'{t:.2f}' for t in result['alone'])}")
    print(f"  beside the node:      median {beside:6.2f} s   {' '.join(f'{t:.2f}' for t in result['beside'])}")
    print(f"  slowdown: {beside / alone:.3f}x (median of pairs {statistics.median(pairs):.3f}x; target <= 1.10)",
          flush=True)


def report_rounds(result: dict[str, Any]) -> None:
    share = result["engine_cpu_share"]
    print(f"  while the foreground ran without a break, Sapling used {share:.2f} of a CPU")
    if result["loaded_jobs"]:
        print(f"  foreground jobs meanwhile: median {statistics.median(result['loaded_jobs']):.2f} s "
              f"({len(result['loaded_jobs'])} jobs)")
    for m in result["rounds"]:
        print(f"  Sapling round {m['round']:>3} under this load: {m['seconds']:6.1f} s "
              f"(generating {m['generate_seconds']:.1f} s, training {m['train_seconds']:.1f} s)")
    if "timed_out" in result:
        last = result["timed_out"]["last_progress"]
        where = f"round {last['round']} {last['phase']} {last['done']}/{last['total']}" if last else "no progress yet"
        print(f"  no round finished under this load within {result['timed_out']['seconds']:.0f} s (it was at {where})")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--reps", type=int, default=5, help="alternations of beside/alone per foreground")
    parser.add_argument("--rounds", type=int, default=2, help="rounds timed under continuous load per foreground")
    parser.add_argument("--work", type=float, default=3.0, help="seconds one foreground job takes alone")
    parser.add_argument("--round-timeout", type=float, default=1200.0,
                        help="seconds to wait for the rounds under continuous load before giving up on them")
    parser.add_argument("--settle", type=float, default=1.0, help="seconds the node trains alone before each job")
    parser.add_argument("--foreground", default="one,all", help="'one', 'all' (a worker per CPU) or both")
    parser.add_argument("--engine-arg", action="append", default=[], help="extra flag for sapling-node serve")
    parser.add_argument("--keep-home", action="store_true", help="keep the throwaway home (its logs)")
    parser.add_argument("--json", type=Path, help="also write every measurement to this file")
    args = parser.parse_args()
    home = throwaway_home()
    node = Node(home, args.engine_arg)
    print(f"engine: {' '.join(node.cmd)}", flush=True)
    try:
        node.wait_for(lambda e: e["type"] == "progress" and e["phase"] == "generating")
        nice = niceness(node.proc.pid) if os.name == "posix" else {}
        print(f"engine pid {node.proc.pid}: nice per thread {sorted(set(nice.values()))} over {len(nice)} threads",
              flush=True)
        results = [measure(node, kind, args) for kind in args.foreground.split(",")]
    finally:
        node.stop()
        if not args.keep_home:
            shutil.rmtree(home, ignore_errors=True)
    if node.thread_lines:
        print("\nengine priority and thread-count lines:\n  " + "\n  ".join(node.thread_lines))
    if args.json:
        args.json.write_text(json.dumps({"command": node.cmd, "results": results, "cpus": os.cpu_count()}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

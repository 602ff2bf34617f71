"""The soak (issue 38): a small swarm left running, every process's RSS, open files, threads and disk sampled.

    nice -n 5 .venv/bin/python -m bench.soak --minutes 120 --out /tmp/soak      # the 2-hour run (docs/results.md)
    .venv/bin/python -m bench.soak --ci --out build/soak-ci                      # make soak-ci: about 10 minutes

What runs, all real processes on loopback: one redis-server (no persistence),
two relay processes on it, and three `sapling-node run` nodes (tiny random
models built from a config, 2 questions x 4 completions of 16 tokens a round,
`keep_checkpoints` 2, a small `metrics_max_kb` so the metrics bound acts
within the run) joined to both relays through one invite. Beside them,
`--churn` lightweight peers (bench/relay_peers.py's `Peer`: the real
handshake, a signed publish and a sample) join and leave the relays, spread
over the run, each staying a few seconds.

Every `--sample-s` seconds (60 s; 15 s with --ci) it reads each process's
RSS, open file descriptors and threads (psutil) and the disk each node's home
and each relay's data dir take, into samples.jsonl. At the end it writes
table.md: per process the start and end after the warm-up (`--warmup-minutes`,
default a sixth of the run but at least the relays' receipt window plus 5
minutes: Redis keeps what the relays handed out that long, so it grows until
then) and the least-squares slope per hour over the samples after it; and it
exits 1 when a goal fails:

- RSS: at most 5% growth after the warm-up; open files: none (below);
- disk: each node home under its bound (keep_checkpoints + 1 checkpoints of
  the largest size seen, four 5 MB log files, metrics_max_kb, and 1 MB for the
  rest), with no more than keep_checkpoints + 1 checkpoints and metrics.jsonl
  under its bound at every sample, still holding MIN_HELD rounds after the
  warm-up; each relay's data dir not growing;
- every process still running at the end, every node past its first rounds,
  connected and receiving batches from the swarm.

"Start" and "end" in the table are the medians of the first and the last third
of the samples after the warm-up. RSS: the end at most 5% above the start.
Open files: growth is the fewest in the last third above the most in the first
(a file open for a moment, a checkpoint being written or a pool's next
connection, is not growth; FD_JITTER allows one). The warm-up also lasts
until every node has played a round, and a minute more.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from bench.harness.servers import RedisServer, stop_process
from bench.relay_peers import Peer, RelayProcess, batch_items
from engine.common.rules import Invite
from engine.swarm.identity import Identity

ROOT = Path(__file__).resolve().parents[1]
KEEP_CHECKPOINTS = 2
METRICS_MAX_KB = 2048
LOG_BOUND = 4 * (5 << 20)  # engine/node/launch.py's RotatingFileHandler: 5 MB, three backups
OTHER_BOUND = 1 << 20  # identity, seed, relay memory, config, bans: small files
RSS_GROWTH = 0.05
WINDOW = 512  # the relays' window, and so Redis's stream: full within the warm-up
FD_JITTER = 1  # open files a process may hold more at the end than ever in the first third (Redis's next client)
MIN_HELD = 50  # rounds metrics.jsonl must still hold: its bound is for old rounds, not for lines that grow
LINE_SLACK = 8192  # metrics.jsonl passes its bound by the line just appended, until that append trims it


def node_settings(home: Path, model: Path, seed: int) -> list[str]:
    return ["--home", str(home), "--model", str(model), "--threads", "1", "--seed", str(seed),
            "--set", "tasks.questions_per_round=2", "--set", "tasks.completions_per_question=4",
            "--set", "tasks.max_new_tokens=16", "--set", "tasks.eval_every=0", "--set", "run.device='cpu'",
            "--set", f"run.keep_checkpoints={KEEP_CHECKPOINTS}", "--set", f"run.metrics_max_kb={METRICS_MAX_KB}",
            "--set", "run.priority='normal'"]  # the soak's own nice (the caller's) is the node's priority


def folder_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue  # a checkpoint replaced while we walked
    return total


@dataclass
class Watched:
    """One process of the soak and the folder whose disk use counts for it."""

    name: str
    proc: subprocess.Popen[bytes]
    folder: Path | None = None
    home: Path | None = None  # a node's home: checkpoints, metrics.jsonl and logs are checked too
    ps: psutil.Process = field(init=False)

    def __post_init__(self) -> None:
        self.ps = psutil.Process(self.proc.pid)

    def sample(self) -> dict[str, Any]:
        row: dict[str, Any] = {"alive": self.proc.poll() is None}
        if row["alive"]:
            try:
                with self.ps.oneshot():
                    row.update(rss=self.ps.memory_info().rss, fds=self.ps.num_fds(), threads=self.ps.num_threads(),
                               cpu_s=sum(self.ps.cpu_times()[:2]))
            except psutil.Error:
                row["alive"] = False
        if self.folder is not None:
            row["disk"] = folder_bytes(self.folder)
        if self.home is not None:
            data = self.home / "data"
            checkpoints = [p for p in (data / "checkpoints").glob("*/round-*") if p.is_dir()]
            row["checkpoints"] = len(checkpoints)
            row["checkpoint_max"] = max((folder_bytes(p) for p in checkpoints), default=0)
            metrics = data / "metrics.jsonl"
            row["metrics"] = metrics.stat().st_size if metrics.exists() else 0
            row["logs"] = folder_bytes(self.home / "logs")
            row["rounds"], row["received"], row["connected"], row["held"] = rounds_of(metrics)
        return row


def rounds_of(metrics: Path) -> tuple[int, int, bool, int]:
    """From metrics.jsonl: the last round, the batches received from the swarm in the rounds it still holds,
    whether the last round had the relay connected, and how many rounds it holds."""
    last, received, connected, held = 0, 0, False, 0
    if not metrics.exists():
        return 0, 0, False, 0
    for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("kind") == "round":
            last = max(last, int(record.get("round", 0)))
            held += 1
            swarm = record.get("swarm") or {}
            received += int(swarm.get("received", 0))
            connected = bool(swarm.get("connected"))
    return last, received, connected, held


@dataclass
class Churn:
    joined: int = 0
    failed: int = 0
    published: int = 0
    sampled: int = 0
    errors: dict[str, int] = field(default_factory=dict)


async def churn(urls: list[str], total: int, seconds: float, stats: Churn, rng: random.Random) -> None:
    """`total` short-lived peers spread evenly over `seconds`, each on a random relay for 2-15 s."""
    interval = seconds / max(1, total)
    payloads = [batch_items(rng, 2000) for _ in range(8)]
    async with aiohttp.ClientSession() as session:
        async def visit(k: int) -> None:
            peer = Peer([rng.choice(urls)], Identity.generate())
            try:
                await asyncio.wait_for(peer.connect(session), 30)
                stats.joined += 1
                await peer.publish(payloads[k % len(payloads)])
                await peer.sample(4)
                stats.sampled += 1
                await asyncio.sleep(rng.uniform(2, 15))
                stats.published += peer.published
            except (TimeoutError, OSError, ConnectionError, RuntimeError, aiohttp.ClientError) as exc:
                stats.failed += 1
                stats.errors[type(exc).__name__] = stats.errors.get(type(exc).__name__, 0) + 1
            finally:
                await peer.close()
                for code, n in peer.errors.items():
                    stats.errors[code] = stats.errors.get(code, 0) + n

        tasks = []
        start = time.monotonic()
        for k in range(total):
            await asyncio.sleep(max(0.0, start + k * interval - time.monotonic()))
            tasks.append(asyncio.create_task(visit(k)))
        await asyncio.gather(*tasks)


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per hour; 0 with fewer than two."""
    if len(points) < 2:
        return 0.0
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return 0.0 if den == 0 else 3600.0 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den


def thirds(values: list[float]) -> tuple[list[float], list[float]]:
    """The first and the last third of the values (at least one each)."""
    n = max(1, len(values) // 3)
    return values[:n], values[-n:]


def judge(samples: list[dict[str, Any]], warmup_s: float, watched: list[dict[str, Any]],
          metrics_max_kb: int = METRICS_MAX_KB) -> tuple[list[str], list[str]]:
    """The table's lines and the failed goals; `watched` names each process and whether it has a folder or home."""
    homes = [meta["name"] for meta in watched if meta["home"]]
    running = [s["t"] for s in samples if all(s["procs"][n].get("rounds", 0) >= 1 for n in homes)]
    if running:  # a node still loading its model (a busy machine) is not warm yet either
        warmup_s = max(warmup_s, running[0] + 60.0)
    after = [s for s in samples if s["t"] >= warmup_s] or samples[-1:]
    lines = ["| process | RSS MB start → end | RSS MB/h | open files start → end | files/h | threads start → end "
             "| disk MB start → end | disk MB/h |", "|---|---|---|---|---|---|---|---|"]
    failed: list[str] = []
    mb = 1 << 20
    for w in (argparse.Namespace(**meta) for meta in watched):
        rows = [(s["t"], s["procs"][w.name]) for s in after]
        live = [(t, r) for t, r in rows if r["alive"]]
        if not rows[-1][1]["alive"]:
            failed.append(f"{w.name} is not running at the end")
        if len(live) < 2:
            failed.append(f"{w.name}: fewer than two samples after the warm-up")
            continue
        rss = [r["rss"] / mb for _t, r in live]
        fds = [float(r["fds"]) for _t, r in live]
        threads = [r["threads"] for _t, r in live]
        rss0, rss1 = (statistics.median(part) for part in thirds(rss))
        fd_first, fd_last = thirds(fds)
        fd0, fd1 = statistics.median(fd_first), statistics.median(fd_last)
        cell_disk, cell_disk_h = "", ""
        if w.folder:
            disk = [r["disk"] / mb for _t, r in rows]
            cell_disk = f"{disk[0]:.2f} → {disk[-1]:.2f}"
            cell_disk_h = f"{slope_per_hour([(t, r['disk'] / mb) for t, r in rows]):+.2f}"
        lines.append(f"| {w.name} | {rss0:.1f} → {rss1:.1f} | "
                     f"{slope_per_hour([(t, r['rss'] / mb) for t, r in live]):+.1f} "
                     f"| {fd0:g} → {fd1:g} | {slope_per_hour([(t, float(r['fds'])) for t, r in live]):+.1f} "
                     f"| {threads[0]} → {threads[-1]} | {cell_disk} | {cell_disk_h} |")
        if rss1 > rss0 * (1 + RSS_GROWTH):
            failed.append(f"{w.name}: RSS grew {100 * (rss1 / rss0 - 1):.1f}% after the warm-up (goal: at most 5%)")
        if min(fd_last) > max(fd_first) + FD_JITTER:  # a file open for a moment, a pool's next connection
            failed.append(f"{w.name}: open files grew: at least {min(fd_last):g} in the last third of the run, "
                          f"at most {max(fd_first):g} in the first third after the warm-up")
        if w.home:
            every = [s["procs"][w.name] for s in samples]
            biggest = max(r["checkpoint_max"] for r in every)
            bound = (KEEP_CHECKPOINTS + 1) * biggest + LOG_BOUND + metrics_max_kb * 1024 + OTHER_BOUND
            if max(r["disk"] for r in every) > bound:
                failed.append(f"{w.name}: its home took {max(r['disk'] for r in every) / mb:.1f} MB, over its bound "
                              f"{bound / mb:.1f} MB")
            if max(r["checkpoints"] for r in every) > KEEP_CHECKPOINTS + 1:
                failed.append(f"{w.name}: {max(r['checkpoints'] for r in every)} checkpoints on disk "
                              f"(keep_checkpoints {KEEP_CHECKPOINTS})")
            if max(r["metrics"] for r in every) > metrics_max_kb * 1024 + LINE_SLACK:  # sampled mid-append
                failed.append(f"{w.name}: metrics.jsonl passed its bound")
            if any(r.get("held", MIN_HELD) < min(MIN_HELD, r["rounds"]) for _t, r in rows):  # a few long lines left
                failed.append(f"{w.name}: metrics.jsonl held fewer than {MIN_HELD} rounds after the warm-up")
            if max(r["logs"] for r in every) > LOG_BOUND:
                failed.append(f"{w.name}: its logs passed their rotation bound")
            if rows[-1][1]["rounds"] < 3:
                failed.append(f"{w.name}: only {rows[-1][1]['rounds']} rounds")
        elif w.folder and rows[-1][1]["disk"] > rows[0][1]["disk"]:
            failed.append(f"{w.name}: its data dir grew after the warm-up")
    for name in (meta["name"] for meta in watched if meta["home"]):
        last = samples[-1]["procs"][name]
        if not last.get("connected") or not last.get("received"):
            failed.append(f"{name}: not sharing at the end (connected: {last.get('connected')}, batches received "
                          f"in the rounds its metrics hold: {last.get('received')})")
    return lines, failed


async def soak(args: argparse.Namespace) -> int:
    from bench.harness.tiny import make_tiny_model

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    seconds = args.minutes * 60.0
    warmup_s = args.warmup_minutes * 60.0
    model = make_tiny_model(out / "model")
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)  # stop: the processes too
    redis = RedisServer(log=out / "redis.log")
    redis.start()
    watched: list[Watched] = []
    relays: list[RelayProcess] = []
    nodes: list[subprocess.Popen[bytes]] = []
    stats = Churn()
    started = time.monotonic()
    samples: list[dict[str, Any]] = []
    try:
        assert redis.proc is not None
        watched.append(Watched("redis-server", redis.proc))
        for name in ("relay-a", "relay-b"):
            relay = RelayProcess(out, name, redis_url=redis.url, log_level="warning", window=WINDOW,
                                 extra=["--receipt-window", f"{args.receipt_window:g}"])
            await relay.ready()
            relays.append(relay)
            watched.append(Watched(name, relay.proc, folder=out / f"{name}-data"))
        invite = Invite(tuple(r.url for r in relays), "", "Soak swarm").link()
        for k in range(args.nodes):
            home = out / f"node-{k}"
            argv = [sys.executable, "-m", "engine.cli", "run", *node_settings(home, model, k), "--relay", invite]
            with (out / f"node-{k}.out").open("wb") as log:
                proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            nodes.append(proc)
            watched.append(Watched(f"node-{k}", proc, folder=home, home=home))
        (out / "meta.json").write_text(json.dumps({
            "warmup_s": warmup_s, "sample_s": args.sample_s, "churn": args.churn, "argv": sys.argv,
            "metrics_max_kb": METRICS_MAX_KB,
            "watched": [{"name": w.name, "folder": w.folder is not None, "home": w.home is not None}
                        for w in watched]}))
        churner = asyncio.create_task(churn([r.url for r in relays], args.churn, seconds * 0.95, stats,
                                            random.Random(args.seed)))
        with (out / "samples.jsonl").open("w") as log:
            while True:
                t = time.monotonic() - started
                procs = {w.name: await asyncio.to_thread(w.sample) for w in watched}
                sample = {"t": round(t, 1), "procs": procs, "churn": vars(stats).copy()}
                samples.append(sample)
                log.write(json.dumps(sample) + "\n")
                log.flush()
                brief = " ".join(f"{n}:{p.get('rss', 0) >> 20}M/{p.get('fds', 0)}f" for n, p in procs.items())
                print(f"[soak {t / 60:5.1f} min] {brief} | churned {stats.joined}+{stats.failed} failed", flush=True)
                if t >= seconds or any(not p["alive"] for p in procs.values()):
                    break
                await asyncio.sleep(max(0.0, started + (len(samples)) * args.sample_s - time.monotonic()))
        if not churner.done():
            churner.cancel()
        await asyncio.gather(churner, return_exceptions=True)
    finally:
        for proc in nodes:
            await asyncio.to_thread(stop_process, proc, 60)
        for relay in relays:
            await asyncio.to_thread(relay.stop)
        redis.stop()

    return report(out)


def default_warmup_s(args: argparse.Namespace) -> float:
    """A sixth of the run, and at least the relays' receipt window and 5 minutes: Redis keeps what each relay
    handed out for a receipt window (engine/relay/credit.py), so it grows that long before it levels off."""
    return max(args.minutes * 60.0 / 6, args.receipt_window + 300.0)


def report(out: Path, warmup_minutes: float | None = None) -> int:
    """table.md from out/meta.json and out/samples.jsonl (also on its own: --judge, where `warmup_minutes` may
    replace the run's warm-up); 1 when a goal failed."""
    meta = json.loads((out / "meta.json").read_text())
    if warmup_minutes is not None:
        meta["warmup_s"] = warmup_minutes * 60.0
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines() if line.strip()]
    lines, failed = judge(samples, meta["warmup_s"], meta["watched"], meta.get("metrics_max_kb", 256))
    churned = samples[-1]["churn"]
    if churned["joined"] < meta["churn"] * 0.9:
        failed.append(f"only {churned['joined']} of {meta['churn']} churned peers joined")
    rounds = {w["name"]: samples[-1]["procs"][w["name"]].get("rounds") for w in meta["watched"] if w["home"]}
    summary = (f"{samples[-1]['t'] / 60:.0f} min, sampled every {meta['sample_s']:g} s, warm-up "
               f"{meta['warmup_s'] / 60:g} min; churned peers: {churned['joined']} joined, {churned['failed']} failed "
               f"({churned['errors'] or 'no errors'}); rounds: {rounds}")
    text = "\n".join([summary, "", *lines, "", "goals: " + ("all met" if not failed else "; ".join(failed))])
    (out / "table.md").write_text(text + "\n")
    print(text)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="working folder: homes, logs, samples.jsonl, table.md")
    parser.add_argument("--minutes", type=float, default=120.0)
    parser.add_argument("--sample-s", type=float, default=60.0, help="seconds between samples (default 60)")
    parser.add_argument("--warmup-minutes", type=float,
                        help="samples before this are not judged (default: a sixth, at least the receipt window + 5)")
    parser.add_argument("--receipt-window", type=float, default=3600.0,
                        help="the relays' --receipt-window in seconds (default 3600, the relay's; --ci: 60)")
    parser.add_argument("--churn", type=int, default=1000, help="short-lived peers over the run (default 1000)")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ci", action="store_true", help="the CI version: 10 minutes, a sample every 15 s")
    parser.add_argument("--judge", action="store_true", help="only write table.md again from --out's samples")
    args = parser.parse_args(argv)
    if args.judge:
        return report(args.out, args.warmup_minutes)
    if args.ci:
        args.minutes, args.sample_s, args.receipt_window = 10.0, 15.0, 60.0
        if args.warmup_minutes is None:
            args.warmup_minutes = 3.0
    if not (0 < args.minutes < math.inf and 0 < args.sample_s < math.inf) or args.churn < 0 or args.nodes < 1:
        print("soak: --minutes and --sample-s must be positive numbers, --churn at least 0 and --nodes at least 1",
              file=sys.stderr)
        return 2
    if not 0 < args.receipt_window < math.inf:
        print("soak: --receipt-window must be a positive number of seconds", file=sys.stderr)
        return 2
    if args.warmup_minutes is None:
        args.warmup_minutes = default_warmup_s(args) / 60.0
    if not 0 <= args.warmup_minutes < args.minutes:
        print(f"soak: the warm-up ({args.warmup_minutes:g} min) must be at least 0 and shorter than the run: give "
              "--warmup-minutes, or a shorter --receipt-window", file=sys.stderr)
        return 2
    return asyncio.run(soak(args))


if __name__ == "__main__":
    sys.exit(main())

"""Relay load on loopback: how many peers a relay process holds, and what scale-out through Redis costs.

    .venv/bin/python -m bench.relay_load                          # one process: 2000 peers, 100 publishes/s, 30 s
    .venv/bin/python -m bench.relay_load --peers 200 --seconds 10
    .venv/bin/python -m bench.relay_load --processes 3 --redis    # scale-out: under 5 minutes on 2 cores

Every relay runs as its own process (`python -m engine.relay`), so its
CPU and RSS are measured alone. Every peer does the real protocol: Ed25519
handshake, signed ~20 KB batches, `sample` of 4 batches. The load generator
is this process, on the same cores, so each number is printed beside a peer
measured in the same run.

One process (the default) asks: does one relay process hold 2,000 peers with
the sample round trip's p99 under 250 ms at 100 publishes/s, in under 1 GB?
Peers are spread evenly over the round period (peers / rate seconds), and
the round trip on the idle relay, measured first, is the reference.

Scale-out (`--processes N --redis`) starts a real redis-server and N relay
processes and measures, in one run: the CPU per delivered batch with Redis
against the in-memory broker, what following the swarm's stream costs a
process, a process killed with SIGKILL (its peers move on, no acknowledged
batch lost), a Redis restart (the relays reconnect and say so), and the
peers one process holds; bench/relay_scaleout.py says how (its fault phase,
the kill and the restart, is bench/relay_faults.py), and the relay and peer
parts are in bench/relay_peers.py.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp

from bench.relay_peers import TARGET_P99_MS, Peer, RelayProcess, batch_items, connect_all, drive, idle_round_trips, pct
from bench.relay_scaleout import run_scaleout
from engine.swarm.identity import Identity

TARGET_PEERS = 2000
TARGET_RSS_BYTES = 1 << 30


# -- one process ------------------------------------------------------------------------------
async def run_single(args: argparse.Namespace) -> int:
    rng = random.Random(0)
    with tempfile.TemporaryDirectory(prefix="relay-load-") as tmp:
        relay = RelayProcess(Path(tmp), "relay", max_conn=args.peers + 100, window=1024, log_level="warning")
        peak_rss = 0
        try:
            await relay.ready()
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                idle = await idle_round_trips(session, relay.url, rng, args.batch_bytes)
                print(f"connecting {args.peers} peers ...", flush=True)
                t0 = time.perf_counter()
                held = await connect_all(session, [Peer([relay.url], Identity.generate()) for _ in range(args.peers)])
                print(f"held {len(held)}/{args.peers} connections after {time.perf_counter() - t0:.1f} s", flush=True)
                relay.ps.cpu_percent(None)
                payloads = [batch_items(rng, args.batch_bytes) for _ in range(16)]
                before = sum(peer.published for peer in held)

                async def watch_rss() -> None:
                    nonlocal peak_rss
                    while relay.proc.poll() is None:
                        peak_rss = max(peak_rss, relay.rss())
                        await asyncio.sleep(0.5)

                watcher = asyncio.create_task(watch_rss())
                load = await drive(held, len(held) / args.rate, args.seconds, payloads)
                watcher.cancel()
                cpu = relay.ps.cpu_percent(None)
                published = sum(peer.published for peer in held) - before
                still_open = sum(1 for peer in held if peer.connected)
                errors: Counter[str] = Counter()
                for peer in held:
                    errors.update(peer.errors)
                for peer in held:
                    await peer.close()
        finally:
            relay.stop()

    p50, p99 = pct(load.rtts, 0.50) * 1000, pct(load.rtts, 0.99) * 1000
    idle50, idle99 = pct(idle, 0.50) * 1000, pct(idle, 0.99) * 1000
    print()
    print(f"peers held at the end     {still_open} of {args.peers} (target {TARGET_PEERS})")
    print(f"publishes/s               {published / load.seconds:.1f} (asked {args.rate:g}; batch "
          f"~{args.batch_bytes // 1024} KB)")
    print(f"sample round trip, load   p50 {p50:.1f} ms, p99 {p99:.1f} ms over {len(load.rtts)} samples (target p99 < "
          f"{TARGET_P99_MS:g} ms)")
    print(f"sample round trip, idle   p50 {idle50:.1f} ms, p99 {idle99:.1f} ms (same relay, before the load)")
    print(f"p99 ratio load/idle       {p99 / idle99:.1f}x")
    print(f"relay CPU                 {cpu:.0f}% of one core (2-core machine; the load generator shares it)")
    print(f"relay peak RSS            {peak_rss / 2**20:.0f} MB (target < {TARGET_RSS_BYTES // 2**20} MB)")
    print(f"failed round trips        {load.failures}; errors {dict(errors) or 'none'}")
    met = still_open >= min(args.peers, TARGET_PEERS) and p99 < TARGET_P99_MS and peak_rss < TARGET_RSS_BYTES
    print(f"targets                   {'met' if met else 'NOT met'}")
    print(f"(median {statistics.median(load.rtts) * 1000:.1f} ms)" if load.rtts else "")
    return 0


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="relay_load", description=__doc__.split("\n")[0])
    parser.add_argument("--peers", type=int, default=TARGET_PEERS, help="one process: peers held (1-5000)")
    parser.add_argument("--rate", type=float, default=100.0, help="publishes per second across all peers")
    parser.add_argument("--seconds", type=float, default=None,
                        help="measured load duration (one process: 30; scale-out: 15 for each broker; at most 300)")
    parser.add_argument("--batch-bytes", type=int, default=20_000)
    parser.add_argument("--processes", type=int, default=1, help="relay processes (scale-out; above 1 needs --redis)")
    parser.add_argument("--redis", action="store_true", help="scale-out: share the swarm through a real redis-server")
    parser.add_argument("--peers-per-process", type=int, default=200, help="scale-out: peers per process (1-2000)")
    parser.add_argument("--round-seconds", type=float, default=30.0,
                        help="scale-out capacity steps: each peer publishes and samples once per this many seconds")
    parser.add_argument("--step-seconds", type=float, default=10.0,
                        help="scale-out: measured seconds per capacity step")
    parser.add_argument("--max-peers-per-process", type=int, default=10_000, help="scale-out: the last capacity step")
    parser.add_argument("--budget", type=float, default=280.0, help="scale-out: seconds for the whole run (30-3600)")
    return parser.parse_args(argv)


def check(args: argparse.Namespace) -> str:
    """One sentence naming what is wrong with the arguments, or ''."""
    scale = args.redis or args.processes != 1
    if args.seconds is None:
        args.seconds = 15.0 if scale else 30.0
    if not 0 < args.seconds <= 300 or args.rate <= 0 or args.batch_bytes < 1000:
        return "seconds must be 0-300, rate positive and batch-bytes at least 1000"
    if not scale:
        return "" if 1 <= args.peers <= 5000 else "peers must be 1-5000"
    if not args.redis:
        return "--processes above 1 needs --redis: separate processes share batches only through Redis"
    if not 2 <= args.processes <= 8:
        return "--redis runs 2-8 processes (one of them is killed mid-run)"
    if (not 1 <= args.peers_per_process <= 2000 or not 2 <= args.round_seconds <= 600
        or not 2 <= args.step_seconds <= 120):
        return "peers-per-process must be 1-2000, round-seconds 2-600 and step-seconds 2-120"
    if not 100 <= args.max_peers_per_process <= 15_000 or not 30 <= args.budget <= 3600:
        return "max-peers-per-process must be 100-15000 and budget 30-3600 seconds"
    if shutil.which("redis-server") is None:
        return "--redis needs redis-server on PATH (apt-get install redis-server)"
    return ""


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    problem = check(args)
    if problem:
        print(f"relay_load: {problem}", file=sys.stderr)
        return 2
    if args.redis or args.processes != 1:
        return asyncio.run(run_scaleout(args, shutil.which("redis-server") or "redis-server"))
    return asyncio.run(run_single(args))


if __name__ == "__main__":
    sys.exit(main())

"""Failover through the real Caddy: a relay process killed under running nodes, how soon every node is back.

    .venv/bin/python -m bench.relay_failover                  # 10 kills, 8 nodes, the kit's Caddyfile and a control
    .venv/bin/python -m bench.relay_failover --kills 3 --no-control

The deployment kit's topology on loopback (bench/harness/caddy.py): Debian's
caddy serving installers/relay/Caddyfile with a local CA, in front of two
relay processes on one redis-server. Nodes are bench/relay_peers.py's
`Peer` (the real handshake and signed publishes, over wss:// through Caddy,
reconnecting with the node client's backoff), each publishing a small batch
every half second. Then, `--kills` times: the relay process holding the most
nodes is killed with SIGKILL, the time from the kill to each of its nodes'
next welcome is taken, the process is started again on its port, and the
stack settles before the next kill.

Reported: the time until every node of a killed process is back (per kill:
its slowest node), p50/p99/max over all kills and the target (p99 < 2 s);
and every acknowledged batch looked up in Redis's stream (an acknowledgement
is sent only after the batch is stored, so none may be missing). The control,
measured in the same run on the same machine, is the kit's Caddyfile with
the passive health checks taken out and the old intervals put back (active
/healthz checks every 5 s, retries every 250 ms): what the kit did before.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import shutil
import ssl
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.harness.caddy import KIT_CADDYFILE, start_caddy
from bench.harness.servers import RedisServer, stop_process
from bench.relay_peers import Peer, RelayProcess, batch_items, close_all, connect_all, pct
from engine.swarm.identity import Identity

TARGET_P99_S = 2.0
PUBLISH_EVERY_S = 0.5
SETTLE_S = 5.0  # after a restart: past the passive checks' fail_duration (3 s) and an active check (every 2 s)
BACK_TIMEOUT_S = 30.0
STREAM = "sapling:default:batches"  # the relays' Redis stream (engine/relay/brokers.py, swarm "default")


def control_caddyfile() -> str:
    """The kit's Caddyfile as it was before passive health checks: active checks every 5 s, retries every 250 ms."""
    text = KIT_CADDYFILE.read_text()
    edits = [(r"\n\t\tfail_duration [^\n]+", ""), (r"\n\t\tmax_fails [^\n]+", ""),
             (r"lb_try_interval [^\n]+", "lb_try_interval 250ms"), (r"health_interval [^\n]+", "health_interval 5s"),
             (r"health_timeout [^\n]+", "health_timeout 3s")]
    for pattern, replacement in edits:
        text, count = re.subn(pattern, replacement, text)
        if count != 1:
            raise RuntimeError(f"the kit's Caddyfile changed: {pattern!r} matched {count} times, not once")
    return text


@dataclass
class Run:
    label: str
    back_s: list[float] = field(default_factory=list)  # per kill: until the last node of the killed process is back
    per_node_s: list[float] = field(default_factory=list)  # every moved node, every kill
    moved: list[int] = field(default_factory=list)  # nodes on the killed process, per kill
    acked: int = 0
    missing: int = 0


async def publish_loop(peer: Peer, stop: asyncio.Event) -> None:
    items = batch_items(random.Random(0), 2000)
    while not stop.is_set():
        if peer.connected:
            try:
                await peer.publish(items)
            except (ConnectionError, RuntimeError, aiohttp.ClientError):
                pass  # the link just dropped: the peer is moving
        try:
            await asyncio.wait_for(stop.wait(), PUBLISH_EVERY_S)
        except TimeoutError:
            pass


async def connections(session: aiohttp.ClientSession, relay: RelayProcess) -> int:
    try:
        async with session.get(f"http://127.0.0.1:{relay.port}/healthz") as response:
            return int((await response.json())["connections"])
    except (aiohttp.ClientError, OSError, ValueError, KeyError):
        return 0


async def kill_once(relays: list[RelayProcess], peers: list[Peer], session: aiohttp.ClientSession,
                    redis_url: str, workdir: Path, out: Run, settle: bool) -> None:
    counts = [await connections(session, relay) for relay in relays]
    victim_at = counts.index(max(counts))
    victim = relays[victim_at]
    before = {id(peer): len(peer.moves) for peer in peers}
    killed_at = time.perf_counter()
    victim.kill()
    deadline = killed_at + BACK_TIMEOUT_S
    await asyncio.sleep(0.2)  # Caddy notices the dead upstream and closes its nodes' links
    while time.perf_counter() < deadline and not all(peer.connected for peer in peers):
        await asyncio.sleep(0.02)
    moved = [peer.moves[before[id(peer)]][1] - killed_at for peer in peers if len(peer.moves) > before[id(peer)]]
    if not all(peer.connected for peer in peers):
        moved.append(BACK_TIMEOUT_S)  # someone never came back: counted as the timeout
    out.moved.append(len(moved))
    out.per_node_s.extend(moved)
    out.back_s.append(max(moved) if moved else 0.0)
    print(f"  {out.label}: killed {victim.name} with {counts[victim_at]} nodes; every node back after "
          f"{out.back_s[-1]:.2f} s", flush=True)
    relays[victim_at] = RelayProcess(workdir, victim.name, redis_url=redis_url, port=victim.port,
                                     extra=["--trusted-proxy", "127.0.0.1"])
    await relays[victim_at].ready()
    if settle:  # Caddy takes the restarted process back before the next kill
        await asyncio.sleep(SETTLE_S)


def stored(redis_url: str) -> set[tuple[str, int]]:
    import redis

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        entries: list[tuple[str, dict[str, str]]] = client.xrange(STREAM)  # type: ignore[assignment]
        return {(fields["peer"], int(fields["seq"])) for _id, fields in entries}
    finally:
        client.close()


async def measure(label: str, caddyfile: str | None, args: argparse.Namespace) -> Run:
    out = Run(label)
    with tempfile.TemporaryDirectory(prefix="relay-failover-") as tmp:
        workdir = Path(tmp)
        redis = RedisServer(log=workdir / "redis.log")
        await asyncio.to_thread(redis.start)
        relays = [RelayProcess(workdir, f"relay{i}", redis_url=redis.url, extra=["--trusted-proxy", "127.0.0.1"])
                  for i in (1, 2)]
        caddy = None
        try:
            for relay in relays:
                await relay.ready()
            caddy, https_port, ca = await asyncio.to_thread(start_caddy, workdir, workdir, [r.port for r in relays],
                                                            caddyfile)
            connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=str(ca)), limit=0)
            async with aiohttp.ClientSession(connector=connector) as session:
                url = f"wss://localhost:{https_port}/ws"
                peers = await connect_all(session, [Peer([url], Identity.generate(), failover=True)
                                                    for _ in range(args.nodes)])
                if len(peers) != args.nodes:
                    raise RuntimeError(f"only {len(peers)} of {args.nodes} nodes joined through Caddy")
                stop = asyncio.Event()
                publishers = [asyncio.create_task(publish_loop(peer, stop)) for peer in peers]
                await asyncio.sleep(1.0)  # a couple of acknowledged batches each before the first kill
                for kill in range(args.kills):
                    await kill_once(relays, peers, session, redis.url, workdir, out, settle=kill < args.kills - 1)
                stop.set()
                await asyncio.gather(*publishers)
                await asyncio.sleep(1.0)  # the last acknowledgements
                have = await asyncio.to_thread(stored, redis.url)
                acked = {(peer.identity.peer_id, seq) for peer in peers for seq, _when in peer.acked}
                out.acked, out.missing = len(acked), len(acked - have)
                await close_all(peers)
        finally:
            if caddy is not None:
                stop_process(caddy)
            for relay in relays:
                relay.stop()
            await asyncio.to_thread(redis.stop)
    return out


def report(run: Run) -> bool:
    p50, p99, worst = pct(run.back_s, 0.5), pct(run.back_s, 0.99), max(run.back_s, default=float("nan"))
    met = p99 < TARGET_P99_S and run.missing == 0
    print(f"{run.label:<28} every node back: p50 {p50:.2f} s, p99 {p99:.2f} s, max {worst:.2f} s over "
          f"{len(run.back_s)} kills ({sum(run.moved)} node moves; per node p50 {pct(run.per_node_s, 0.5):.2f} s); "
          f"acknowledged batches {run.acked}, missing from Redis {run.missing}")
    return met


async def main_async(args: argparse.Namespace) -> int:
    print(f"{args.kills} kills of a relay process behind Caddy, {args.nodes} nodes publishing every "
          f"{PUBLISH_EVERY_S:g} s", flush=True)
    kit = await measure("kit Caddyfile", None, args)
    control = await measure("control (no passive checks)", control_caddyfile(), args) if args.control else None
    print()
    met = report(kit)
    if control is not None:
        report(control)
        ratio = pct(kit.back_s, 0.99) / max(1e-9, pct(control.back_s, 0.99))
        print(f"p99 ratio kit/control: {ratio:.2f}x")
    print(f"target (kit): p99 < {TARGET_P99_S:g} s and no acknowledged batch missing: {'met' if met else 'NOT met'}")
    print("command: .venv/bin/python -m bench.relay_failover " + " ".join(sys.argv[1:]))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="relay_failover", description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=10, help="relay processes killed, one after the other (1-50)")
    parser.add_argument("--nodes", type=int, default=8, help="nodes publishing through Caddy (2-200)")
    parser.add_argument("--no-control", dest="control", action="store_false",
                        help="leave out the control run (the Caddyfile without passive health checks)")
    args = parser.parse_args(argv)
    if not 1 <= args.kills <= 50 or not 2 <= args.nodes <= 200:
        print("relay_failover: kills must be 1-50 and nodes 2-200", file=sys.stderr)
        return 2
    for program in ("caddy", "redis-server"):
        if shutil.which(program) is None:
            print(f"relay_failover: {program} is not installed (apt-get install {program})", file=sys.stderr)
            return 2
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())

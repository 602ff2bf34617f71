"""The fault phase of the relay's scale-out run: a relay process killed, then redis-server restarted.

    .venv/bin/python -m bench.relay_load --processes 3 --redis    # the whole scale-out run, this phase included

bench/relay_scaleout.py's `run_scaleout` (what `--processes N --redis` runs)
calls `fault_run` on the N relay processes that share one Redis, after the
broker comparison and before the capacity steps, under the same peers, and
prints `report_kill` and `report_redis` as items 2 and 3 of its report. It
asks:

2. Does a relay process killed with SIGKILL lose acknowledged batches? A
   checker on every process samples everything new (with cursors); every
   batch a publisher got `published` for must reach every checker. The
   killed process's peers must join another process within 5 s (they move
   on as the node's client does: next address, its backoff).
3. Does a Redis restart need a person? redis-server is stopped and started
   again; every relay must log "redis connection lost" and "redis
   connection restored", and publishing must resume.

`rotated` is here too: it is the order in which a peer moves on when its
relay process dies, which bench/relay_scaleout.py's peers use as well.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from bench.harness.servers import RedisServer
from bench.relay_peers import Load, Peer, RelayProcess, close_all, connect_all, drive, pct
from engine.swarm import protocol
from engine.swarm.identity import Identity

TARGET_REJOIN_S = 5.0
CHECK_EVERY_S = 0.02  # a checker's pause between two samples (within the bench relays' 50 requests/s)
# The fault phase's publishes per second, all peers together. A checker sees everything only while
# fewer than 16 new batches (one sample's most) arrive between two of its samples, bursts included:
# a checker that moves to another process, a relay's tail catching up after Redis came back.
FAULT_RATE = 8.0
KILL_AT_S = 3.0  # into the fault phase: SIGKILL to one relay process
REDIS_STOP_AT_S = 8.0  # then redis-server is stopped ...
REDIS_DOWN_S = 2.0  # ... and started again on the same port this much later
FAULT_SECONDS = 16.0  # the fault phase's load
SETTLE_S = 10.0  # after it, at most this long for every checker to catch up
# A batch acknowledged just before redis-server stops may not have reached every relay's tail yet;
# a Redis without persistence comes back without it (docs/relay-operators.md, "Backups").
RESTART_MARGIN_S = 0.25
AROUND_RESTART = "around the Redis restart"


def rotated(urls: list[str], start: int) -> list[str]:
    """The relay addresses starting at `start`: a peer's home first, then where it moves if that one dies."""
    return urls[start:] + urls[:start]


@dataclass
class FaultRun:
    victim_peers: int = 0
    rejoin_s: list[float] = field(default_factory=list)  # per peer of the killed process: kill to its next welcome
    never_rejoined: int = 0
    others_moved: int = 0  # peers of the other processes that lost their connection (should be 0)
    acked: int = 0
    missing: dict[str, Counter[str]] = field(default_factory=dict)  # checker -> when the missing batches were acked
    full_answers: int = 0
    refused_internal: int = 0
    acked_after_restart: int = 0
    lost_logged: list[bool] = field(default_factory=list)  # per surviving relay
    restored_after_s: list[float | None] = field(default_factory=list)  # redis start to the relay's "restored" line
    load: Load = field(default_factory=Load)


async def keep_checking(checker: Peer, stop: asyncio.Event) -> None:
    """A checker samples everything newer than its cursor, every CHECK_EVERY_S, until `stop`."""
    while not stop.is_set():
        if checker.connected:
            try:
                await checker.sample(protocol.MAX_SAMPLE_BATCHES, after=checker.cursor)
            except (TimeoutError, RuntimeError, ConnectionError, aiohttp.ClientError):
                pass
        await asyncio.sleep(CHECK_EVERY_S)


async def inject_faults(victim: RelayProcess, redis: RedisServer, events: dict[str, float]) -> float:
    """SIGKILL the victim relay at KILL_AT_S, stop redis-server at REDIS_STOP_AT_S and start it again REDIS_DOWN_S
    later; each moment in `events` (perf_counter); the wall time at which Redis answered again."""
    await asyncio.sleep(KILL_AT_S)
    events["kill"] = time.perf_counter()
    victim.kill()
    print(f"  killed {victim.name} (SIGKILL)", flush=True)
    await asyncio.sleep(REDIS_STOP_AT_S - KILL_AT_S)
    events["redis_stop"] = time.perf_counter()
    redis.stop()
    print("  stopped redis-server", flush=True)
    await asyncio.sleep(REDIS_DOWN_S)
    await asyncio.to_thread(redis.start)
    events["redis_start"] = time.perf_counter()
    started_wall = time.time()
    print("  started redis-server again on the same port", flush=True)
    return started_wall


def phase_of(events: dict[str, float]) -> Callable[[float], str]:
    """When an acknowledgement came, in words: before the kill, after it, around the Redis restart, after it."""
    def phase(when: float) -> str:
        if when < events["kill"]:
            return "before the kill"
        if when < events["redis_stop"] - RESTART_MARGIN_S:
            return "after the kill"
        if when < events["redis_start"]:
            return AROUND_RESTART
        return "after Redis was back"
    return phase


def count_moves(out: FaultRun, peers: list[Peer], victim: RelayProcess, killed_at: float) -> None:
    """Who was on the killed relay and how soon it rejoined another; who else moved."""
    for peer in peers:
        moved_after_kill = [joined - killed_at for dropped, joined in peer.moves if dropped >= killed_at - 0.5]
        if peer.urls[0] == victim.url:
            out.victim_peers += 1
            if moved_after_kill:
                out.rejoin_s.append(moved_after_kill[0])
            else:
                out.never_rejoined += 1
        elif peer.moves:
            out.others_moved += 1


def read_relay_logs(out: FaultRun, relays: list[RelayProcess], redis_started_wall: float) -> None:
    """Whether each surviving relay logged losing Redis, and how long after its restart it logged it restored."""
    for relay in relays:
        lines = relay.log()
        out.lost_logged.append(any(str(line.get("msg", "")).startswith("redis connection lost") for line in lines))
        restored = [float(line["ts"]) for line in lines
                    if str(line.get("msg", "")).startswith("redis connection restored") and "ts" in line]
        # redis_started_wall is taken once its port answers, so a quick relay may log a little before it
        later = [max(0.0, ts - redis_started_wall) for ts in restored if ts >= redis_started_wall - 1.0]
        out.restored_after_s.append(later[0] if later else None)


async def fault_run(relays: list[RelayProcess], peers: list[Peer], redis: RedisServer, args: argparse.Namespace,
                    session: aiohttp.ClientSession, payloads: list[list[protocol.Item]]) -> FaultRun:
    """Under the same load: one relay process SIGKILLed, then redis-server restarted; checkers on every process."""
    out = FaultRun()
    urls = [relay.url for relay in relays]
    checkers = [Peer(rotated(urls, k), Identity.generate(), failover=True, watch=True) for k in range(len(relays))]
    if len(await connect_all(session, checkers)) < len(checkers):
        raise RuntimeError("a checker could not connect")
    for checker in checkers:
        await checker.sample(1)  # takes the cursor: from here on each is handed only newer batches
        checker.full_answers = 0
    marks = {id(peer): len(peer.acked) for peer in peers}
    events: dict[str, float] = {}
    stop = asyncio.Event()
    checks = [asyncio.create_task(keep_checking(checker, stop)) for checker in checkers]
    errors_before = sum(peer.errors[protocol.E_INTERNAL] for peer in peers)
    out.load, redis_started_wall = await asyncio.gather(
        drive(peers, len(peers) / FAULT_RATE, FAULT_SECONDS, payloads), inject_faults(relays[-1], redis, events))
    acked = {(peer.key_b64, seq): when for peer in peers for seq, when in peer.acked[marks[id(peer)]:]}
    deadline = time.perf_counter() + SETTLE_S
    while time.perf_counter() < deadline and any(acked.keys() - checker.seen for checker in checkers):
        await asyncio.sleep(0.2)
    stop.set()
    await asyncio.gather(*checks)
    phase = phase_of(events)
    out.acked = len(acked)
    for k, checker in enumerate(checkers):
        where = f"checker {k} (home {relays[k].name}" + (", moved" if checker.moves else "") + ")"
        out.missing[where] = Counter(phase(acked[key]) for key in acked.keys() - checker.seen)
        out.full_answers += checker.full_answers
    count_moves(out, [*peers, *checkers], relays[-1], events["kill"])
    out.refused_internal = sum(peer.errors[protocol.E_INTERNAL] for peer in peers) - errors_before
    out.acked_after_restart = sum(1 for when in acked.values() if when >= events["redis_start"])
    read_relay_logs(out, relays[:-1], redis_started_wall)
    await close_all(checkers)
    return out
def report_kill(faults: FaultRun) -> tuple[int, int, int]:
    """2. A relay process killed: who rejoined where and how soon, what a checker missed. (missing batches,
    the killed relay's peers back within the target, batches missing that were acknowledged around the restart)"""
    rejoin = faults.rejoin_s
    within = sum(1 for s in rejoin if s <= TARGET_REJOIN_S)
    print(f"2. One relay process killed with SIGKILL mid-run ({FAULT_SECONDS:g} s of load at {FAULT_RATE:g} "
          "publishes/s, a checker on every process)")
    if rejoin:
        print(f"   its peers on another process within {TARGET_REJOIN_S:g} s: {within} of {faults.victim_peers}; "
              f"kill to welcome p50 {pct(rejoin, 0.5):.2f} s, p99 {pct(rejoin, 0.99):.2f} s, max {max(rejoin):.2f} s")
    print(f"   never rejoined: {faults.never_rejoined}; peers of the other processes that lost their connection: "
          f"{faults.others_moved}")
    lost = sum(n for c in faults.missing.values() for when, n in c.items() if when != AROUND_RESTART)
    restart_lost = sum(c[AROUND_RESTART] for c in faults.missing.values())
    print(f"   batches acknowledged (`published`) during the faults: {faults.acked}; missing at a checker: {lost} "
          f"(every checker must see every one)" + (f", and {restart_lost} acknowledged {AROUND_RESTART} (item 3)"
                                                   if restart_lost else ""))
    for where, counts in faults.missing.items():
        if counts:
            print(f"     {where}: {dict(counts)}")
    if faults.full_answers:
        print(f"   inconclusive: {faults.full_answers} checker answers held 16 batches, so newer ones may have been "
              "skipped unseen (a burst); the missing count is an upper bound")
    return lost, within, restart_lost


def report_redis(faults: FaultRun, restart_lost: int) -> tuple[int, int]:
    """3. redis-server restarted: what the relays logged and refused. (surviving relays, those that logged it
    restored)"""
    print(f"3. redis-server stopped and started again ({REDIS_DOWN_S:g} s down)")
    survivors = len(faults.lost_logged)
    restored = [s for s in faults.restored_after_s if s is not None]
    print(f"   relays that logged 'redis connection lost': {sum(faults.lost_logged)} of {survivors}; "
          f"'redis connection restored': {len(restored)} of {survivors}"
          + (f" ({', '.join(f'{s:.1f}' for s in restored)} s after redis-server was back)" if restored else ""))
    print(f"   publishes refused as `internal` while it was down: {faults.refused_internal}; acknowledged after it "
          f"came back: {faults.acked_after_restart}")
    print(f"   acknowledged within {RESTART_MARGIN_S:g} s before the stop and missing at some checker (stored, but not "
          f"yet read by every relay when Redis went): {restart_lost} checker-batches")
    return survivors, len(restored)

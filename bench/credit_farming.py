"""Credit farming: many identities from one address sampling each other and sending receipts (issue 38).

    .venv/bin/python -m bench.credit_farming                    # 20 farm keys, 3 honest nodes, 60 s
    .venv/bin/python -m bench.credit_farming --farm 20 --seconds 30 --round-s 10 --json out.json

A real relay (`EmbeddedRelay` on loopback, trusting loopback as its reverse
proxy so that each peer's `X-Forwarded-For` is its address, as behind
Caddy). The farm: `--farm` keys, all from one address, each as fast as the
relay's rate limit lets it: publish a batch, sample, and send receipts
calling every farm item it was handed `used` (and the others `not_picked`).
The honest side: `--honest` nodes, each from its own address, a round every
`--round-s` seconds: publish a batch of 4 items, sample, and call the first
4 items of other honest nodes `used`, the rest `not_picked`.

Credit is read back from the relay's `GET /stats/peers.json` (what the
status page shows): items credited as used, per key and per hour (the
run's count x 3600 / its seconds), for the farm (each key, and all of them
together) against an honest node's, and the receipts the relay refused,
by why.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from engine.common.atomicio import atomic_write_text
from engine.swarm import protocol
from engine.swarm.identity import Identity
from engine.swarm.receipts import NOT_PICKED, USED, Verdict, receipts_payload

FARM_ADDRESS = "203.0.113.66"  # documentation addresses (RFC 5737)
HONEST_ADDRESS = "198.51.100.{}"
ITEMS = 4


def items(tag: str, n: int) -> list[protocol.Item]:
    return [protocol.Item({"dataset": "basic_arithmetic", "config": {}, "seed": 0, "index": i}, f"{tag} {n}.{i}",
                          ("<answer>2</answer>", "<answer>3</answer>"), (1.0, 0.0)) for i in range(ITEMS)]


@dataclass
class Key:
    """One identity on the wire: its socket (from `address`), and what the relay answered."""

    address: str
    identity: Identity = field(default_factory=Identity.generate)
    ws: Any = None
    ids: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    sent_used: Counter[str] = field(default_factory=Counter)  # `used` receipts the relay counted, by sender
    seen: set[tuple[str, int, int]] = field(default_factory=set)  # items receipted already (sent once each)

    async def connect(self, session: aiohttp.ClientSession, url: str) -> None:
        self.ws = await session.ws_connect(url, headers={"X-Forwarded-For": self.address},
                                           max_msg_size=protocol.MAX_RESPONSE_BYTES)
        challenge = json.loads((await self.ws.receive()).data)
        hello = protocol.hello_payload(self.identity.public_key, challenge["nonce"], time.time(), "", "bench/1")
        await self.ws.send_str(protocol.encode(protocol.msg_hello(self.identity.signed(hello))))
        welcome = json.loads((await self.ws.receive()).data)
        if welcome["type"] != "welcome":
            raise RuntimeError(f"the relay refused a bench key: {welcome}")

    async def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send and wait for the answer of this request id (stats pushes and the like are skipped)."""
        self.ids += 1
        message["id"] = self.ids
        await self.ws.send_str(protocol.encode(message))
        while True:
            answer = json.loads((await self.ws.receive()).data)
            if answer.get("id") == self.ids or (message["type"] == "publish" and answer["type"] in ("published",
                                                                                                    "error")):
                if answer["type"] == "error" and answer["code"] != protocol.E_RATE:
                    raise RuntimeError(f"the relay answered an error: {answer}")
                return answer

    async def publish(self, tag: str, n: int) -> None:
        payload = protocol.batch_payload(self.identity.public_key, int(time.time() * 1000), time.time(), "bench",
                                         items(tag, n))
        await self.ask(protocol.msg_publish(self.identity.signed(payload)))

    async def round(self, used: set[str], take: int | None) -> None:
        """Sample, then call items of the peers in `used` used (at most `take`; None: all) and the rest not picked."""
        answer = await self.ask(protocol.msg_sample(0, protocol.MAX_SAMPLE_BATCHES))
        verdicts: list[Verdict] = []
        for batch in answer.get("batches", []):
            payload = json.loads(batch["payload"])
            sender = protocol.peer_id(base64.b64decode(payload["key"]))
            for i in range(len(payload["items"])):
                if (sender, payload["seq"], i) in self.seen:
                    continue
                self.seen.add((sender, payload["seq"], i))
                good = sender in used and (take is None or sum(v.verdict == USED for v in verdicts) < take)
                verdicts.append(Verdict(sender, payload["seq"], i, USED if good else NOT_PICKED, 1 if good else 0))
        if verdicts:
            signed = self.identity.signed(receipts_payload(self.identity.public_key, time.time(), verdicts))
            answer = await self.ask(protocol.msg_receipts(signed))
            self.refused.update(answer.get("refused", {}))
            if not answer.get("refused") and answer.get("type") == "receipted":  # all of them counted
                self.sent_used.update(v.sender for v in verdicts if v.verdict == USED)


async def farm_loop(key: Key, ring: set[str], until: float, rate: float) -> None:
    n = 0
    while time.time() < until:
        n += 1
        await key.publish("farm", n)
        await key.round(ring - {key.identity.peer_id}, None)
        await asyncio.sleep(3 / rate)  # three requests a loop, at the relay's rate


async def honest_loop(key: Key, honest: set[str], until: float, round_s: float) -> None:
    n = 0
    while time.time() < until:
        n += 1
        started = time.time()
        await key.publish("honest", n)
        await key.round(honest - {key.identity.peer_id}, ITEMS)
        await asyncio.sleep(max(0.0, round_s - (time.time() - started)))


async def measure(url: str, farm: int, honest: int, seconds: float, round_s: float, rate: float) -> dict[str, Any]:
    farm_keys = [Key(FARM_ADDRESS) for _ in range(farm)]
    honest_keys = [Key(HONEST_ADDRESS.format(i + 1)) for i in range(honest)]
    async with aiohttp.ClientSession() as session:
        for key in farm_keys + honest_keys:
            await key.connect(session, url)
        ring = {k.identity.peer_id for k in farm_keys}
        good = {k.identity.peer_id for k in honest_keys}
        t0 = time.time()
        until = t0 + seconds
        await asyncio.gather(*[farm_loop(k, ring, until, rate) for k in farm_keys],
                             *[honest_loop(k, good, until, round_s) for k in honest_keys])
        elapsed = time.time() - t0
        await asyncio.sleep(0.5)
        async with session.get(url.replace("ws://", "http://").replace("/ws", "/stats/peers.json")) as response:
            board = await response.json()
        for key in farm_keys + honest_keys:
            await key.ws.close()
    used = {p["peer"]: p["all"]["used"] for p in board["peers"]}
    per_hour = 3600 / elapsed
    farm_used = [used.get(peer, 0) for peer in ring]
    honest_used = [used.get(peer, 0) for peer in good]
    honest_hour = sum(honest_used) / len(honest_used) * per_hour
    farm_hour = sum(farm_used) / len(farm_used) * per_hour
    return {
        "farm_keys": farm, "honest_nodes": honest, "seconds": round(elapsed, 1), "round_s": round_s,
        "farm_used_per_key_hour": round(farm_hour, 1), "farm_used_all_keys_hour": round(sum(farm_used) * per_hour, 1),
        "honest_used_per_node_hour": round(honest_hour, 1),
        "farm_per_key_vs_honest": round(farm_hour / honest_hour, 2) if honest_hour else None,
        "farm_refused": dict(sum((k.refused for k in farm_keys), Counter())),
        "honest_refused": dict(sum((k.refused for k in honest_keys), Counter())),
        "honest_credit": sorted(honest_used),
        "honest_receipts": sorted(sum((k.sent_used for k in honest_keys), Counter())[p] for p in good),
        "board": [{"name": p["name"], "used": p["all"]["used"],
                   "same_address": p["all"].get("same_address", 0)} for p in board["peers"]],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="credit_farming", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--farm", type=int, default=20, help="farm keys, all from one address (default 20)")
    ap.add_argument("--honest", type=int, default=3, help="honest nodes, each from its own address (default 3)")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long to run (default 60)")
    ap.add_argument("--round-s", type=float, default=10.0, help="an honest node's round, in seconds (default 10)")
    ap.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args(argv)
    if args.farm < 2 or args.honest < 2 or args.seconds <= 0 or args.round_s <= 0:
        print("credit_farming: --farm and --honest must be at least 2, --seconds and --round-s positive.",
              file=sys.stderr)
        return 2
    from engine.relay.embedded import EmbeddedRelay
    from engine.relay.settings import RelaySettings

    settings = RelaySettings(host="127.0.0.1", port=0, trusted_proxy=["127.0.0.1"],
                             max_conn_per_ip=max(protocol.DEFAULT_MAX_CONN_PER_IP, args.farm))
    relay = EmbeddedRelay(settings)
    relay.start()
    try:
        result = asyncio.run(measure(relay.url, args.farm, args.honest, args.seconds, args.round_s, settings.rate))
    finally:
        relay.stop()
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        atomic_write_text(args.json, text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

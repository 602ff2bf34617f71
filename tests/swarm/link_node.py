"""A node's relay link on its own, as a child process for tests/swarm/test_link_loss.py.

It runs the real `SwarmClient` (run it under `ip netns exec` to put it behind
a link the test can cut) and plays rounds: every `--period` seconds it
publishes a one-item batch whose question is "round N" and samples up to 4
batches. It writes one JSON line per round (`kind` "round": the round, whether
the publish went out, how long publish and sample took, the questions it
sampled, whether the link is up) and one per link change (`kind` "link").

    python -m tests.swarm.link_node ws://10.203.1.1:8765/ws /tmp/node.key --heartbeat 4
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

from engine.swarm import protocol
from engine.swarm.client import LinkState, SwarmClient
from engine.swarm.identity import Identity

ITEM_TASK = {"dataset": "basic_arithmetic", "config": {}, "seed": 0, "index": 1}
_write = threading.Lock()  # lines come from the round loop and from the link's own thread


def say(**fields: Any) -> None:
    """One JSON line on stdout, whole."""
    with _write:
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()


def batch(client: SwarmClient, identity: Identity, question: str, pad: int = 0) -> str:
    """A signed-to-be batch payload with one item asking `question`, its two answers padded by `pad` characters
    (a real round's batch is some 20 kB)."""
    filler = "x" * (pad // 2)
    item = protocol.Item(ITEM_TASK, question, (f"{filler}<answer>7</answer>", f"{filler}<answer>8</answer>"),
                         (1.0, 0.0))
    return protocol.batch_payload(identity.public_key, client.next_seq(), time.time(), "m", [item])


def on_change(state: LinkState) -> None:
    say(kind="link", connected=state.connected, error=state.last_error, lost_at=state.lost_at, since=state.since,
        resent=state.resent, resend_expired=state.resend_expired, stalled_s=state.stalled_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    parser.add_argument("key", type=Path)
    parser.add_argument("--heartbeat", type=float, default=protocol.HEARTBEAT_S)
    parser.add_argument("--period", type=float, default=0.5)
    parser.add_argument("--sample-timeout", type=float, default=2.0)
    parser.add_argument("--pad", type=int, default=0, help="characters added to each batch's answers")
    parser.add_argument("--tag", default="", help="put before each question ('a: ' makes 'a: round 3')")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    identity = Identity.load_or_create(args.key)
    client = SwarmClient(args.url, identity, on_change=on_change, heartbeat=args.heartbeat)
    client.start()
    for round_ in range(1, 10**9):
        start = time.monotonic()
        published = client.publish(batch(client, identity, f"{args.tag}round {round_}", args.pad))
        publish_s = time.monotonic() - start
        start = time.monotonic()
        sampled = [protocol.decode_batch(s.payload).items[0].question for s in client.sample(4, args.sample_timeout)]
        say(kind="round", round=round_, published=published, publish_s=publish_s, sample_s=time.monotonic() - start,
            sampled=sampled, connected=client.state.connected)
        time.sleep(args.period)


if __name__ == "__main__":
    main()

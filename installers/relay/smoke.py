"""Check a running relay from outside: two nodes join, one publishes a batch, the other samples it.

    python installers/relay/smoke.py wss://relay.example.org/ws
    python installers/relay/smoke.py wss://relay.example.org/ws --token JOIN_TOKEN
    python installers/relay/smoke.py wss://relay.example.org/ws --second wss://relay.example.org/ws
    SSL_CERT_FILE=root.crt python installers/relay/smoke.py wss://localhost:8443/ws   # a test CA

Both nodes are the node's own client (engine.swarm.client.SwarmClient) with fresh
keys, so this needs the Sapling source installed (the relay's venv is enough). The
second node joins `--second` (default: the same address); behind Caddy's
least_conn it lands on another relay process than the first, so the batch has
gone through Redis. A test CA (Caddy's `tls internal`) is trusted through
SSL_CERT_FILE, which OpenSSL reads.

Prints one line per step with its time, then one JSON line with the results
(tests/swarm/test_relay_stack.py and .github/workflows/relay-image.yml read it).
Exit 0 when the second node got the batch, 1 when a step failed (the line names
it), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from engine.swarm import protocol
from engine.swarm.client import SwarmClient
from engine.swarm.identity import Identity


def batch(identity: Identity, seq: int) -> str:
    item = protocol.Item(task={"dataset": "basic_arithmetic", "config": {}, "seed": 0, "index": 0},
                         question="What is 2 + 2?", completions=("<answer>4</answer>", "<answer>5</answer>"),
                         rewards=(1.0, 0.0))
    return protocol.batch_payload(identity.public_key, seq, time.time(), "relay-smoke", [item])


def run(first_url: str, second_url: str, token: str, timeout: float) -> dict[str, Any]:
    result: dict[str, Any] = {"ok": False, "failed": "", "relays": []}
    t0 = time.monotonic()

    def step(text: str) -> None:
        print(f"{time.monotonic() - t0:6.2f} s  {text}", flush=True)

    publisher = SwarmClient(first_url, Identity.generate(), token=token)
    reader = SwarmClient(second_url, Identity.generate(), token=token)
    try:
        for name, client, url in (("first", publisher, first_url), ("second", reader, second_url)):
            client.start()
            if not client.wait_connected(timeout):
                result["failed"] = f"the {name} node could not join {url}: {client.state.last_error or 'no answer'}"
                step(result["failed"])
                return result
            step(f"the {name} node joined {url} (relay {client.state.relay!r}, {client.state.online} online)")
        result["relays"] = [publisher.state.relay, reader.state.relay]  # the names the relays gave
        reader.sample(1)  # takes the relay's cursor: from now on it is handed only batches newer than this
        seq = publisher.next_seq()
        if not publisher.publish(batch(publisher.identity, seq)):
            result["failed"] = f"the first node could not send its batch: {publisher.state.last_error}"
            step(result["failed"])
            return result
        deadline = time.monotonic() + timeout
        while publisher.state.published < 1 and not publisher.state.publish_errors and time.monotonic() < deadline:
            time.sleep(0.05)
        if publisher.state.published < 1:
            errors = dict(publisher.state.publish_errors) or "no answer"
            result["failed"] = f"the relay did not acknowledge the batch: {errors}"
            step(result["failed"])
            return result
        step(f"the relay acknowledged batch {seq}")
        while time.monotonic() < deadline:
            for signed in reader.sample(protocol.MAX_SAMPLE_BATCHES, timeout=min(5.0, timeout)):
                payload = json.loads(signed.payload)
                if payload["seq"] == seq and payload["key"] == protocol.b64encode(publisher.identity.public_key):
                    result["ok"] = True
                    result["seconds"] = round(time.monotonic() - t0, 2)
                    step("the second node sampled that batch: the relay works")
                    return result
            time.sleep(0.1)
        result["failed"] = f"the second node did not get the batch within {timeout:g} s"
        step(result["failed"])
        return result
    finally:
        publisher.close()
        reader.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="smoke.py", description=__doc__.split("\n")[0])
    parser.add_argument("url", help="the relay's websocket address, ws:// or wss://")
    parser.add_argument("--second", default="", help="the second node's address (default: the same)")
    parser.add_argument("--token", default="", help="the join token of a private swarm")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds allowed for each step (default 20)")
    args = parser.parse_args(argv)
    for url in (args.url, args.second or args.url):
        if not url.startswith(("ws://", "wss://")):
            print(f"smoke.py: {url!r} is not a ws:// or wss:// address", file=sys.stderr)
            return 2
    if not 0 < args.timeout <= 600:
        print("smoke.py: --timeout must be between 0 and 600 seconds", file=sys.stderr)
        return 2
    result = run(args.url, args.second or args.url, args.token, args.timeout)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""`sapling-node stats`: what this node's rollouts did for the other peers of its swarm.

    sapling-node stats                          # this identity on the swarm in config.toml
    sapling-node stats --relay INVITE --json    # on another swarm; one JSON object for scripts
    sapling-node stats --home DIR               # the node whose folders are under DIR

The numbers come from the relay, which counts them from the receipts other
peers send about this node's rollouts (docs/protocol.md, "Credit"): shared,
sampled by others, used by others (and by how many peers), not picked, and
rejected by others with the reasons, over the last day and all time. The
command asks the relay over its websocket: the signed handshake proves this
identity, and the relay answers a `stats` request with this peer's own
credit. When the relay cannot be reached (an embedded relay runs only while
a node trains), it prints the numbers the node last got from the relay,
kept in the data dir (`swarm/credit.json`), and says how old they are.
Exit codes: 0; 1 when neither the relay nor a kept copy has numbers; 2 for
a bad --relay or no identity yet.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from engine.common.errors import ConfigError, RelayError, SaplingError
from engine.common.paths import Paths
from engine.common.rules import Invite, parse_invite
from engine.swarm import protocol
from engine.swarm.contribution import CREDIT_FILE, read_kept, rejection_warning, summary, swarm_key
from engine.swarm.identity import Identity
from engine.swarm.identity_backup import current

SOFTWARE = "sapling-stats/1"
ROWS = (("shared", "Rollouts shared"), ("sampled", "Sampled by others"), ("used", "Used by others"),
        ("not_picked", "Not picked"))


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`sapling-node stats ...` (engine/cli.py adds it)."""
    stats = sub.add_parser("stats",
                           help="what this node's rollouts did for other peers: used, by how many, rejected and why")
    stats.add_argument("--relay", metavar="URL|INVITE",
                       help="a relay address or invite link (default: the swarm in config.toml)")
    stats.add_argument("--home", type=Path, help="keep config, data, cache and logs under this one folder")
    stats.add_argument("--config", type=Path, help="config file (default: config.toml in the config dir)")
    stats.add_argument("--json", action="store_true", help="one JSON object for scripts")
    stats.add_argument("--timeout", type=float, default=10.0, metavar="S",
                       help="seconds to wait for the relay (default 10)")


def swarm_of(relay: str | None, config_file: Path) -> tuple[Invite, str]:
    """The swarm to ask: its invite and its key in the kept credit (engine/swarm/contribution.py, swarm_key)."""
    if relay:
        invite = parse_invite(relay)
        return invite, swarm_key(invite.relays)
    from engine.common.config_file import build_config

    sw = build_config("default", config_file).swarm
    if sw.mode == "relay":
        invite = parse_invite(sw.relay_url)
        return Invite(invite.relays, invite.token or sw.join_token, invite.name), swarm_key(invite.relays)
    if sw.mode == "solo":
        raise ConfigError("This node trains alone (swarm.mode = solo): it shares nothing; name a swarm with --relay.")
    return Invite((f"ws://{sw.embedded_host}:{sw.embedded_port}/ws",), sw.join_token, ""), swarm_key(())


async def _ask(url: str, identity: Identity, token: str, timeout: float) -> dict[str, Any]:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.ws_connect(
            url, max_msg_size=protocol.MAX_RESPONSE_BYTES, heartbeat=protocol.HEARTBEAT_S) as ws:
        async def next_message() -> dict[str, Any]:
            msg = await ws.receive()
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise ConnectionError("the relay closed the connection")
            return protocol.decode_relay(msg.data)

        challenge = await next_message()
        if challenge["type"] != "challenge":
            raise ConnectionError("the relay did not send its challenge")
        hello = protocol.hello_payload(identity.public_key, challenge["nonce"], time.time(), token, SOFTWARE)
        await ws.send_str(protocol.encode(protocol.msg_hello(identity.signed(hello))))
        welcome = await next_message()
        if welcome["type"] != "welcome":
            raise ConnectionError(f"the relay refused this node ({welcome.get('code')}: {welcome.get('message')})")
        await ws.send_str(protocol.encode(protocol.msg_stats_request()))
        while True:
            answer = await next_message()
            if answer["type"] == "stats" and answer["credit"] is not None:
                credit: dict[str, Any] = answer["credit"]
                return credit
            if answer["type"] == "error":
                raise ConnectionError(f"{answer['code']}: {answer['message']}")


def ask_relay(invite: Invite, identity: Identity, timeout: float) -> tuple[dict[str, Any], str]:
    """This identity's credit from the first relay of the swarm that answers: (credit, that relay's URL)."""
    import aiohttp

    problems = []
    for url in invite.relays:
        try:
            return asyncio.run(asyncio.wait_for(_ask(url, identity, invite.token, timeout), timeout)), url
        except (OSError, TimeoutError, protocol.ProtocolError, aiohttp.ClientError) as exc:
            problems.append(f"{url}: {str(exc) or type(exc).__name__}")
    raise RelayError("; ".join(problems))


def _age(seconds: float) -> str:
    if seconds < 90:
        return "just now"
    if seconds < 5400:
        return f"{seconds / 60:.0f} minutes ago"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.0f} hours ago"
    return f"{seconds / 86400:.0f} days ago"


def render(report: dict[str, Any]) -> str:
    """The report for a person: one row per number, last day and all time, then what it means."""
    credit = report["credit"]
    day, all_time = credit.get("day") or {}, credit.get("all") or {}
    lines = [f"{report['name']} (peer id {report['peer_id']}) on {report['swarm']}", "",
             f"{'':<26}{'last day':>10}{'all time':>10}"]
    for key, label in ROWS:
        extra = ""
        if key == "used":
            extra = f"   by {day.get('peers', 0)} peers today, {all_time.get('peers', 0)} in all"
        lines.append(f"{label:<26}{day.get(key, 0):>10}{all_time.get(key, 0):>10}{extra}")
    day_rejected, all_rejected = day.get("rejected") or {}, all_time.get("rejected") or {}
    lines.append(f"{'Rejected by others':<26}{sum(day_rejected.values()):>10}{sum(all_rejected.values()):>10}")
    for reason in sorted(all_rejected, key=lambda r: -all_rejected[r]):
        lines.append(f"{'  ' + reason:<26}{day_rejected.get(reason, 0):>10}{all_rejected[reason]:>10}")
    lines += ["", report["message"]]
    if report["warning"]:
        lines.append(report["warning"])
    if report["source"] == "relay":
        lines.append(f"From the relay {report['relay']}, just now.")
    else:
        lines.append(f"As the relay last sent them to this node, {_age(time.time() - report['at'])} "
                     f"({time.strftime('%Y-%m-%d %H:%M', time.localtime(report['at']))}): {report['why']}.")
    return "\n".join(lines)


def report_for(args: argparse.Namespace, paths: Paths) -> dict[str, Any]:
    identity = current(paths)
    invite, key = swarm_of(args.relay, args.config or paths.config_file)
    base: dict[str, Any] = {"name": identity.name, "peer_id": identity.peer_id, "swarm": invite.name or key}
    try:
        credit, url = ask_relay(invite, identity, args.timeout)
        out: dict[str, Any] = {**base, "source": "relay", "relay": url, "at": time.time(), "credit": credit}
    except RelayError as exc:
        kept = read_kept(paths.data_dir / "swarm" / CREDIT_FILE, identity.peer_id, key)
        if kept is None:
            raise RelayError(f"The relay did not answer ({exc}) and this node has no numbers from it yet; "
                             "try again while the relay is up.") from None
        out = {**base, "source": "kept", "relay": None, "at": kept["at"], "credit": kept["credit"],
               "why": f"the relay did not answer ({exc})"}
    credit = out["credit"]
    out["message"] = summary(credit)
    out["warning"] = rejection_warning(credit)
    return out


def run(args: argparse.Namespace, paths: Paths) -> int:
    if not 0 < args.timeout <= 600:
        print("sapling-node: error: --timeout must be a number of seconds from 0 to 600.", file=sys.stderr)
        return 2
    try:
        report = report_for(args, paths)
    except SaplingError as exc:  # a bad --relay, no identity yet, no numbers anywhere: one sentence
        print(f"sapling-node: error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(report) if args.json else render(report))
    return 0

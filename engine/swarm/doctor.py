"""`sapling-node doctor`: why can't this computer join the swarm? Each step of a connection, timed.

    sapling-node doctor                                   # the swarm in config.toml
    sapling-node doctor --relay 'sapling://join?relay=...'  # an invite, or a bare ws(s):// relay address
    sapling-node doctor --relay wss://relay.example.org/ws --json   # one JSON object per step (the app reads these)

The steps, one by one, each with its own deadline (5 s) so nothing hangs:
parse the address, DNS, TCP connect, TLS (the certificate's name and expiry),
the websocket upgrade, hello/welcome (protocol version, join token, clock),
a sample round trip, and this node's key and peer id. The first failure ends
the check with the step's name and one sentence saying what to do ("the relay
needs a join token", "port 443 is blocked on this network: try another
network") and exit code 1 (2 for an address that is not one); all steps
passed is exit code 0. No traceback for anything the network can do.

The websocket is spoken here with the standard library (a few lines of RFC
6455) rather than aiohttp, so that TCP, TLS and the upgrade are separate,
separately timed steps. The handshake itself is the node's own
(`engine.swarm.protocol`, signed with this node's key; a node without a key
yet is checked with a throwaway one and never writes a file).
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import socket
import ssl
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from engine.common.errors import ConfigError, RelayError, SaplingError
from engine.common.joining import DOCTOR_STEPS, Deadline, connect, read_head, resolve, start_tls
from engine.common.rules import Invite, parse_invite
from engine.swarm import protocol
from engine.swarm.link import SOFTWARE

STEP_TIMEOUT_S = 5.0
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MAX_MESSAGE_BYTES = 1 << 20  # the doctor reads a challenge, a welcome and one small sample answer
CERT_WARN_DAYS = 14

STEPS = DOCTOR_STEPS
TITLES = dict(STEPS)


@dataclass
class StepResult:
    step: str
    status: str  # "ok", "failed" or "skipped"
    ms: float
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "title": TITLES[self.step], "status": self.status, "ms": round(self.ms, 1),
                "detail": self.detail}


class StepFailed(Exception):
    """A step's failure: the step and one sentence for a person."""

    def __init__(self, step: str, sentence: str) -> None:
        super().__init__(sentence)
        self.step = step
        self.sentence = sentence


# -- a small websocket client (RFC 6455), enough for a handshake and one request -----------------
class WebSocket:
    def __init__(self, sock: socket.socket, buffered: bytes, where: str) -> None:
        self.sock = sock
        self.buffer = buffered
        self.where = where

    def _read(self, n: int, deadline: Deadline) -> bytes:
        while len(self.buffer) < n:
            try:
                self.sock.settimeout(deadline.left())
                chunk = self.sock.recv(65536)
            except TimeoutError:
                raise RelayError(f"{self.where} stopped answering for {deadline.seconds:g} s.") from None
            except OSError as exc:
                raise RelayError(f"{self.where} broke off the connection ({exc}).") from None
            if not chunk:
                raise RelayError(f"{self.where} closed the connection.")
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        head = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + struct.pack("!H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack("!Q", n)
        mask = secrets.token_bytes(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(head + mask + masked)

    def send_text(self, text: str) -> None:
        self._send_frame(0x1, text.encode("utf-8"))

    def recv_text(self, deadline: Deadline) -> str:
        """The next text (or binary) message; pings are answered, pongs skipped, a close is a RelayError."""
        message = b""
        while True:
            first, second = self._read(2, deadline)
            fin, opcode = first & 0x80, first & 0x0F
            n = second & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._read(2, deadline))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._read(8, deadline))[0]
            if n > MAX_MESSAGE_BYTES:
                raise RelayError(f"{self.where} sent a message of {n:,} bytes, more than a relay's answer can be.")
            mask = self._read(4, deadline) if second & 0x80 else b""
            payload = self._read(n, deadline)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if opcode == 0x9:
                self._send_frame(0xA, payload)
                continue
            if opcode == 0xA:
                continue
            if opcode == 0x8:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                reason = payload[2:].decode("utf-8", errors="replace")
                raise RelayError(f"{self.where} closed the connection (code {code}{': ' + reason if reason else ''}).")
            message += payload
            if len(message) > MAX_MESSAGE_BYTES:
                raise RelayError(f"{self.where} sent a message over {MAX_MESSAGE_BYTES:,} bytes.")
            if fin:
                return message.decode("utf-8", errors="replace")

    def close(self) -> None:
        try:
            self._send_frame(0x8, struct.pack("!H", 1000))
        except OSError:
            pass
        self.sock.close()


# -- the checks ---------------------------------------------------------------------------------
def _load_identity(path: Path | None) -> tuple[Any, str]:
    """This node's identity from its key file, read only; a throwaway one (and why) when there is none."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from engine.swarm.identity import Identity

    if path is None or not path.exists():
        return Identity.generate(), "no key yet: it is made when training first starts (checked with a throwaway key)"
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError, OSError) as exc:
        return Identity.generate(), f"the key file {path} cannot be read ({exc}); the node will make a new one"
    if not isinstance(key, Ed25519PrivateKey):
        return Identity.generate(), f"the key file {path} holds no Ed25519 key; the node will make a new one"
    return Identity(key, path), ""


def _cert_detail(sock: ssl.SSLSocket) -> str:
    cert: dict[str, Any] = dict(sock.getpeercert() or {})
    names = [str(value) for kind, value in cert.get("subjectAltName", ()) if kind == "DNS"]
    if not names:
        names = [str(value) for rdn in cert.get("subject", ()) for key, value in rdn if key == "commonName"]
    expires = cert.get("notAfter")
    when = ""
    if isinstance(expires, str):
        stamp = ssl.cert_time_to_seconds(expires)
        days = (stamp - time.time()) / 86400
        date = datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%d")
        when = f", valid until {date} ({days:.0f} days)"
        if days < CERT_WARN_DAYS:
            when += ": renew it soon"
    return f"{sock.version()}, certificate for {', '.join(names[:3]) or 'no name'}{when}"


class Doctor:
    """Runs the steps for one relay address, reporting each as it ends."""

    def __init__(self, report: Callable[[StepResult], None], identity_file: Path | None,
                 timeout: float = STEP_TIMEOUT_S, context: ssl.SSLContext | None = None) -> None:
        self.report = report
        self.identity_file = identity_file
        self.timeout = timeout
        self.context = context
        self.results: list[StepResult] = []

    def _step(self, step: str, run: Callable[[Deadline], str]) -> None:
        started = time.monotonic()
        deadline = Deadline(self.timeout, f"The relay ({TITLES[step]})")
        try:
            detail = run(deadline)
        except (RelayError, ConfigError) as exc:
            self._done(step, "failed", started, str(exc))
            raise StepFailed(step, str(exc)) from None
        except OSError as exc:  # a socket that broke between two reads
            sentence = f"The connection broke during this step ({exc.strerror or exc}): try again, or another network."
            self._done(step, "failed", started, sentence)
            raise StepFailed(step, sentence) from None
        self._done(step, "skipped" if detail.startswith("skipped") else "ok", started, detail)

    def _done(self, step: str, status: str, started: float, detail: str) -> None:
        result = StepResult(step, status, 1000 * (time.monotonic() - started), detail)
        self.results.append(result)
        self.report(result)

    def check(self, invite: Invite, relay: str) -> None:
        """Every step against `relay` (one of `invite.relays`); StepFailed at the first that fails."""
        parts = urlsplit(relay)
        host = parts.hostname or ""
        secure = parts.scheme == "wss"
        port = parts.port or (443 if secure else 80)
        path = (parts.path or "/ws") + (f"?{parts.query}" if parts.query else "")
        where = f"{host}:{port}"
        state: dict[str, Any] = {}

        def address(_d: Deadline) -> str:
            extra = ([f"{len(invite.relays)} relays, this is #{invite.relays.index(relay) + 1}"]
                     if len(invite.relays) > 1 else [])
            extra.append("join token given" if invite.token else "no join token")
            if invite.name:
                extra.append(f"swarm {invite.name!r}")
            return f"{parts.scheme}://{where}{path} ({'; '.join(extra)})"

        def dns(d: Deadline) -> str:
            state["addresses"] = resolve(host, port, d)
            found = sorted({str(a[4][0]) for a in state["addresses"]})
            return f"{host} -> {', '.join(found[:3])}"

        def tcp(d: Deadline) -> str:
            state["sock"] = connect(state["addresses"], host, port, d)
            return f"connected to {state['sock'].getpeername()[0]} port {port}"

        def tls(d: Deadline) -> str:
            if not secure:
                return "skipped: ws:// is not encrypted (fine on this computer or a local network)"
            state["sock"] = start_tls(state["sock"], host, d, self.context)
            return _cert_detail(state["sock"])

        def upgrade(d: Deadline) -> str:
            sock = state["sock"]
            key = base64.b64encode(secrets.token_bytes(16)).decode()
            request = (f"GET {path} HTTP/1.1\r\nHost: {parts.netloc.rsplit('@', 1)[-1]}\r\nUpgrade: websocket\r\n"
                       f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                       f"User-Agent: {SOFTWARE}\r\n\r\n")
            try:
                sock.settimeout(d.left())
                sock.sendall(request.encode("ascii"))
            except OSError as exc:
                raise RelayError(f"{where} closed the connection before the websocket request ({exc}).") from None
            status, headers, rest = read_head(sock, d, where)
            kind = headers.get("content-type", "")
            if status != 101:
                if status == 404:
                    raise RelayError(f"{where} is a web server but has no Sapling relay at {parts.path or '/'} "
                                     "(HTTP 404): check the address (it usually ends in /ws).")
                if "html" in kind or status == 200:
                    raise RelayError(f"{where} answered with a web page (HTTP {status}), not a Sapling relay: "
                                     "check the address.")
                raise RelayError(f"{where} refused the websocket upgrade (HTTP {status}): it is not a Sapling relay, "
                                 "or a proxy in front of it does not pass websockets on.")
            accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
            if headers.get("sec-websocket-accept") != accept:
                raise RelayError(f"{where} answered the upgrade with a wrong Sec-WebSocket-Accept: a proxy on this "
                                 "network may be interfering; try another network.")
            state["ws"] = WebSocket(sock, rest, f"The relay at {where}")
            return f"upgraded at {parts.path or '/'}"

        def hello(d: Deadline) -> str:
            ws: WebSocket = state["ws"]
            identity, note = _load_identity(self.identity_file)
            state["identity"], state["note"] = identity, note
            raw = ws.recv_text(d)
            try:
                first = json.loads(raw)
            except ValueError:
                raise RelayError(f"{where} sent something that is not JSON after the upgrade: it is not a Sapling "
                                 "relay.") from None
            if isinstance(first, dict) and first.get("v") not in (None, protocol.VERSION):
                raise RelayError(f"The relay speaks swarm protocol {first.get('v')} and this Sapling speaks "
                                 f"{protocol.VERSION}: update Sapling, or ask the operator to update the relay.")
            try:
                challenge = protocol.decode_relay(raw)
            except protocol.ProtocolError as exc:
                raise RelayError(f"{where} did not send a valid challenge ({exc.message}): it is not a Sapling relay "
                                 "of this version.") from None
            if challenge["type"] != "challenge":
                raise RelayError(f"{where} sent {challenge['type']!r} instead of a challenge.")
            now = time.time()
            skew = float(challenge["time"]) - now
            if abs(skew) > protocol.TIMESTAMP_WINDOW_S:
                raise RelayError(f"This computer's clock is {abs(skew):.0f} s {'behind' if skew > 0 else 'ahead of'} "
                                 "the relay's: turn on setting the time automatically, then try again.")
            payload = protocol.hello_payload(identity.public_key, challenge["nonce"], now, invite.token, SOFTWARE)
            ws.send_text(protocol.encode(protocol.msg_hello(identity.signed(payload))))
            try:
                answer = protocol.decode_relay(ws.recv_text(d))
            except protocol.ProtocolError as exc:
                raise RelayError(f"{where} answered the hello with something malformed ({exc.message}).") from None
            if answer["type"] == "error":
                raise RelayError(_refusal(answer["code"], answer["message"], invite, identity.peer_id))
            if answer["type"] != "welcome":
                raise RelayError(f"{where} answered the hello with {answer['type']!r} instead of a welcome.")
            clock = "clock in step" if abs(skew) < 1 else f"clock {abs(skew):.1f} s {'behind' if skew > 0 else 'ahead'}"
            token = "join token accepted" if invite.token else "open swarm"
            return (f"protocol {protocol.VERSION}, relay {challenge['relay']!r}, welcome as peer "
                    f"{answer['peer'][:8]}, {answer['online']} online, {token}, {clock}")

        def round_trip(d: Deadline) -> str:
            ws: WebSocket = state["ws"]
            started = time.monotonic()
            ws.send_text(protocol.encode(protocol.msg_sample(1, 1, None)))
            while True:
                try:
                    msg = protocol.decode_relay(ws.recv_text(d))
                except protocol.ProtocolError as exc:
                    raise RelayError(f"{where} answered the sample with something malformed ({exc.message}).") from None
                if msg["type"] == "batches" and msg["id"] == 1:
                    n = len(msg["batches"])
                    took = 1000 * (time.monotonic() - started)
                    return f"sample answered in {took:.0f} ms ({n} batch{'es' if n != 1 else ''})"
                if msg["type"] == "error":
                    raise RelayError(f"The relay refused a sample request ({msg['code']}: {msg['message']}).")

        def key(_d: Deadline) -> str:
            identity = state.get("identity")
            if identity is None:
                identity, note = _load_identity(self.identity_file)
                state["note"] = note
            where_key = f"key in {identity.path}" if identity.path is not None else state.get("note", "")
            return f"{identity.name}, peer id {identity.peer_id}, {where_key}"

        try:
            for step, run in (("address", address), ("dns", dns), ("tcp", tcp), ("tls", tls),
                              ("websocket", upgrade), ("hello", hello), ("round_trip", round_trip), ("key", key)):
                self._step(step, run)
        finally:
            if "ws" in state:
                state["ws"].close()
            elif "sock" in state:
                state["sock"].close()


def _refusal(code: str, message: str, invite: Invite, peer_id: str) -> str:
    """One sentence for a relay's `error` answer to the hello."""
    if code == protocol.E_FORBIDDEN:
        if "allow" in message:
            return (f"This swarm is private and this node's key is not on its list: send your peer id {peer_id} to "
                    "the swarm's organiser.")
        if invite.token:
            return "The relay refused this join token: ask the swarm's organiser for a fresh invite."
        return ("The relay needs a join token: use the full invite link from the swarm's organiser (it carries the "
                "token).")
    if code == protocol.E_BANNED:
        return f"The relay has banned this node's key (peer id {peer_id}): ask the relay's operator why."
    if code == protocol.E_STALE:
        return "The relay says this computer's clock is wrong: turn on setting the time automatically, then try again."
    if code == protocol.E_VERSION:
        return "The relay speaks another version of the swarm protocol: update Sapling."
    return f"The relay refused the handshake ({code}: {message})."


# -- command line -------------------------------------------------------------------------------
def relay_to_check(relay: str | None, config_file: Path | None) -> tuple[Invite | None, str]:
    """The invite to check: `--relay`, else the swarm in config.toml. (None, why) when there is none."""
    if relay:
        return parse_invite(relay), "--relay"
    from engine.common.config_file import build_config

    swarm = build_config("default", config_file).swarm
    if swarm.mode == "solo":
        return None, "This node trains alone (swarm.mode = solo): there is no relay to check."
    if swarm.mode == "relay":
        invite = parse_invite(swarm.relay_url)
        if not invite.token and swarm.join_token:
            invite = Invite(invite.relays, swarm.join_token, invite.name)
        return invite, "config.toml"
    url = f"ws://{swarm.embedded_host}:{swarm.embedded_port}/ws"
    return Invite((url,), swarm.join_token, "this computer's local swarm (it runs while a node trains)"), "config.toml"


def _marks() -> dict[str, str]:
    try:
        "✓✗–".encode(sys.stdout.encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        return {"ok": "ok  ", "failed": "FAIL", "skipped": "--  "}
    return {"ok": "✓", "failed": "✗", "skipped": "–"}


def run_doctor(relay: str | None, identity_file: Path | None, config_file: Path | None, as_json: bool = False,
               timeout: float = STEP_TIMEOUT_S, out: Any = None) -> int:
    """Check the relays to join, print each step (text or JSON lines); the exit code."""
    out = out or sys.stdout
    marks = _marks()

    def say(obj: dict[str, Any] | str) -> None:
        out.write((json.dumps(obj) if isinstance(obj, dict) else obj) + "\n")
        out.flush()

    def report(result: StepResult) -> None:
        if as_json:
            say(result.to_json())
        else:
            say(f"  {marks[result.status]} {TITLES[result.step]:<14} {result.ms:7.0f} ms  {result.detail}")

    def finish(ok: bool, step: str | None, message: str, relay_url: str = "") -> int:
        if as_json:
            say({"done": True, "ok": ok, "failed_step": step, "message": message, "relay": relay_url})
        else:
            say(message)
        return 0 if ok else 1

    started = time.monotonic()
    try:
        invite, why = relay_to_check(relay, config_file)
    except ConfigError as exc:
        result = StepResult("address", "failed", 1000 * (time.monotonic() - started), str(exc))
        report(result)
        if as_json:
            say({"done": True, "ok": False, "failed_step": "address", "message": str(exc), "relay": ""})
        else:
            say(f'Failed at "Address": {exc}')
        return exc.exit_code
    if invite is None:
        return finish(True, None, why)
    doctor = Doctor(report, identity_file, timeout)
    for relay_url in invite.relays:
        if as_json:
            say({"checking": relay_url, "source": why})
        else:
            say(f"Checking {relay_url}" + (f" (from {why})" if why != "--relay" else ""))
        try:
            doctor.check(invite, relay_url)
        except StepFailed as failed:
            return finish(False, failed.step, f'Failed at "{TITLES[failed.step]}": {failed.sentence}', relay_url)
        except SaplingError as exc:  # anything else a relay or this computer can do, still one sentence
            return finish(False, None, f"Failed: {exc}", relay_url)
    return finish(True, None, f"All checks passed: this computer can join the swarm at {', '.join(invite.relays)}.",
                  invite.relays[-1])

"""Before joining a swarm: what its relay says about itself, fetched and checked with the standard library.

A relay serves an *information document* at `GET /.well-known/sapling-relay`
(docs/protocol.md, "Relay information"): its name, operator contact, policy
(open, or a join token), limits, software and protocol version, and live
numbers (peers online, batches in the last hour). The "Join this swarm?"
dialog, Settings ▸ Swarm and `sapling-node doctor` read it here:

    preview = preview_invite("sapling://join?relay=wss%3A%2F%2Frelay.example.org%2Fws&name=Lab")
    preview.info.name, preview.info.live.peers_online, preview.relay

    python -m engine.common.joining 'sapling://join?relay=...'     # print what the dialog would show

Everything a relay sends is untrusted: the document is refused, with one
sentence, when it is over 64 kB (without reading more), when it is a web page
instead of JSON, when it names another protocol version, and when any field
has the wrong type or size. Each fetch has one deadline (5 s) for the whole
exchange (DNS, connect, TLS, request, answer), so a relay that never answers
or drips its answer costs at most that. Stdlib only: the app imports this
module (it must not load aiohttp or cryptography).
"""

from __future__ import annotations

import json
import math
import re
import socket
import ssl
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from engine import __version__
from engine.common.errors import ConfigError, RelayError, SaplingError
from engine.common.rules import PROTOCOL_VERSION, Invite, parse_invite

INFO_PATH = "/.well-known/sapling-relay"
MAX_INFO_BYTES = 64 * 1024  # a larger information document is refused without reading it
MAX_HEAD_BYTES = 16 * 1024  # the status line and headers of an HTTP answer
STEP_TIMEOUT_S = 5.0
USER_AGENT = f"sapling/{__version__}"

# What joining shares, in plain words (the dialog lists these; docs/swarm.md "What is shared").
SHARED = (
    "The practice questions your computer answers, its answers and their scores, as plain text",
    "Your public name and peer id (made from a random key, nothing about you)",
)
NEVER_SHARED = ("Your files", "Your model's weights", "Anything else about you or this computer")

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # tab and newline allowed (descriptions)
_LINE_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_LICENSE = re.compile(r"[a-z0-9][a-z0-9.+-]{0,63}")  # a Hugging Face license id, as the relay checks it


# -- the document -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Live:
    peers_online: int = 0
    batches_last_hour: int = 0
    publishes_per_minute: float = 0.0
    joined_today: int = 0


@dataclass(frozen=True)
class RelayInfo:
    """A relay's information document, checked field by field."""

    software: str
    version: str
    protocol: int
    name: str
    description: str = ""
    contact: str = ""
    operator: str = ""  # who runs it, as the relay says (relays before the field: "")
    join: str = "open"  # "open" or "token"
    allow_list: bool = False
    models: Any = None
    dataset_license: str | None = None  # the swarm's dataset's license (app/join.py); None: it keeps none
    limits: dict[str, Any] = field(default_factory=dict)
    public_key: str | None = None
    urls: tuple[str, ...] = ()
    live: Live = field(default_factory=Live)

    @property
    def private(self) -> bool:
        return self.join == "token" or self.allow_list

    def policy_words(self) -> str:
        if self.join == "token" and self.allow_list:
            return "Private: a join token and a key on the operator's list are needed"
        if self.join == "token":
            return "Private: a join token is needed"
        if self.allow_list:
            return "Private: only keys on the operator's list may join"
        return "Open: anyone may join"


def _fail(where: str, text: str) -> RelayError:
    return RelayError(f"The relay information from {where} is malformed: {text}.")


def _text(doc: dict[str, Any], key: str, where: str, limit: int, *, required: bool = False,
          multiline: bool = False) -> str:
    value = doc.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise _fail(where, f"{key} must be text")
    if len(value) > limit:
        raise _fail(where, f"{key} is longer than {limit} characters")
    if (_CONTROL if multiline else _LINE_CONTROL).search(value):
        raise _fail(where, f"{key} contains control characters")
    return value


def _count(live: dict[str, Any], key: str, where: str) -> int:
    value = live.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**53:
        raise _fail(where, f"live.{key} must be a whole number of at least 0")
    return value


def parse_relay_info(doc: Any, where: str) -> RelayInfo:
    """Check a decoded information document; `where` names the relay in the error sentence."""
    if not isinstance(doc, dict):
        raise _fail(where, "it is not a JSON object")
    software = _text(doc, "software", where, 64, required=True)
    if software != "sapling-relay":
        raise RelayError(f"{where} is not a Sapling relay (it calls itself {software[:40]!r}).")
    proto = doc.get("protocol")
    if isinstance(proto, bool) or not isinstance(proto, int):
        raise _fail(where, "protocol must be a whole number")
    if proto != PROTOCOL_VERSION:
        raise RelayError(
            f"The relay at {where} speaks swarm protocol {proto} and this Sapling speaks {PROTOCOL_VERSION}: "
            + ("update Sapling to join it." if proto > PROTOCOL_VERSION else "its operator needs to update the relay.")
        )
    policy = doc.get("policy")
    if not isinstance(policy, dict):
        raise _fail(where, "policy must be an object")
    join = policy.get("join")
    if join not in ("open", "token"):
        raise _fail(where, "policy.join must be 'open' or 'token'")
    allow_list = policy.get("allow_list", False)
    if not isinstance(allow_list, bool):
        raise _fail(where, "policy.allow_list must be true or false")
    limits = doc.get("limits", {})
    if not isinstance(limits, dict):
        raise _fail(where, "limits must be an object")
    models = doc.get("models")
    if models is not None and not isinstance(models, (dict, list)):
        raise _fail(where, "models must be null, an object or a list")
    dataset = doc.get("dataset")  # null, or {"license": a license id, "url": ...}
    dataset_license = dataset.get("license") if isinstance(dataset, dict) else None
    if dataset is not None and not (isinstance(dataset_license, str) and _LICENSE.fullmatch(dataset_license)):
        raise _fail(where, "dataset must be null or an object whose license is an id such as cc-by-4.0")
    public_key = doc.get("public_key")
    if public_key is not None and (not isinstance(public_key, str) or len(public_key) > 256):
        raise _fail(where, "public_key must be null or text of at most 256 characters")
    urls = doc.get("urls", [])
    if not isinstance(urls, list) or len(urls) > 16 or not all(isinstance(u, str) and len(u) <= 2048 for u in urls):
        raise _fail(where, "urls must be a list of at most 16 addresses")
    live = doc.get("live")
    if not isinstance(live, dict):
        raise _fail(where, "live must be an object")
    rate = live.get("publishes_per_minute", 0.0)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate < 0:
        raise _fail(where, "live.publishes_per_minute must be a number of at least 0")
    return RelayInfo(
        software=software,
        version=_text(doc, "version", where, 64, required=True),
        protocol=proto,
        name=_text(doc, "name", where, 120, required=True),
        description=_text(doc, "description", where, 2000, multiline=True),
        contact=_text(doc, "contact", where, 200),
        operator=_text(doc, "operator", where, 200),
        join=str(join),
        allow_list=allow_list,
        models=models,
        dataset_license=dataset_license,
        limits=limits,
        public_key=public_key,
        urls=tuple(urls),
        live=Live(_count(live, "peers_online", where), _count(live, "batches_last_hour", where), float(rate),
                  _count(live, "joined_today", where)),
    )


# -- fetching, with one deadline ----------------------------------------------------------------
class Deadline:
    """Seconds left until a fixed moment; `left()` raises RelayError once it has passed."""

    def __init__(self, seconds: float, what: str) -> None:
        self.end = time.monotonic() + seconds
        self.seconds = seconds
        self.what = what

    def left(self) -> float:
        remaining = self.end - time.monotonic()
        if remaining <= 0:
            raise RelayError(f"{self.what} did not answer within {self.seconds:g} s.")
        return remaining


def resolve(host: str, port: int, deadline: Deadline) -> list[tuple[Any, ...]]:
    """getaddrinfo with a deadline (it has no timeout of its own, so it runs on a helper thread)."""
    result: list[Any] = []
    error: list[BaseException] = []

    def look_up() -> None:
        try:
            result.extend(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except (OSError, UnicodeError) as exc:
            error.append(exc)

    worker = threading.Thread(target=look_up, name="dns", daemon=True)
    worker.start()
    worker.join(deadline.left())
    if worker.is_alive():
        raise RelayError(f"Looking up {host} took more than {deadline.seconds:g} s: this network's DNS is not "
                         "answering.")
    if error or not result:
        raise RelayError(f"The name {host} was not found: check the address for a typo, or this network's DNS.")
    return result


def connect(addresses: list[tuple[Any, ...]], host: str, port: int, deadline: Deadline) -> socket.socket:
    """A TCP connection to the first address that accepts one."""
    last: OSError | None = None
    for family, kind, proto, _name, address in addresses:
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(deadline.left())
            sock.connect(address)
            return sock
        except TimeoutError:
            sock.close()
            raise RelayError(
                f"Connecting to {host}:{port} took more than {deadline.seconds:g} s: port {port} is blocked on this "
                "network or the relay is down; try another network.") from None
        except OSError as exc:
            sock.close()
            last = exc
    if isinstance(last, ConnectionRefusedError):
        raise RelayError(f"Nothing accepts connections at {host}:{port}: the relay is down or the port is wrong.")
    raise RelayError(f"{host}:{port} cannot be reached from this network ({last}).")


def start_tls(sock: socket.socket, host: str, deadline: Deadline,
              context: ssl.SSLContext | None = None) -> ssl.SSLSocket:
    """TLS on a connected socket, the certificate checked against `host`; one sentence when it fails."""
    context = context or ssl.create_default_context()
    try:
        sock.settimeout(deadline.left())
        return context.wrap_socket(sock, server_hostname=host)
    except ssl.SSLCertVerificationError as exc:
        sock.close()
        code = getattr(exc, "verify_code", 0)
        if code == 62:  # X509_V_ERR_HOSTNAME_MISMATCH
            raise RelayError(f"The relay's certificate is for another name than {host}: check the address, "
                                   "or tell the relay's operator.") from None
        if code == 10:  # X509_V_ERR_CERT_HAS_EXPIRED
            raise RelayError(f"The certificate of {host} has expired: tell the relay's operator.") from None
        raise RelayError(f"The certificate of {host} is not from an authority this computer trusts "
                               f"({getattr(exc, 'verify_message', exc)}).") from None
    except TimeoutError:
        sock.close()
        raise RelayError(f"The TLS handshake with {host} took more than {deadline.seconds:g} s.") from None
    except (ssl.SSLError, OSError) as exc:
        sock.close()
        raise RelayError(f"{host} does not speak TLS on this port ({exc.__class__.__name__}): try ws:// "
                               "instead of wss://, or check the port.") from None


def read_head(sock: socket.socket, deadline: Deadline, where: str) -> tuple[int, dict[str, str], bytes]:
    """An HTTP answer's status code, headers (lower-case names) and the bytes already read past them."""
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD_BYTES:
            raise RelayError(f"{where} sent an answer whose headers are over {MAX_HEAD_BYTES // 1024} kB.")
        try:
            sock.settimeout(deadline.left())
            chunk = sock.recv(4096)
        except TimeoutError:
            raise RelayError(f"{where} accepted the connection but did not answer within "
                                   f"{deadline.seconds:g} s.") from None
        if not chunk:
            raise RelayError(f"{where} closed the connection without answering.")
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise RelayError(f"{where} does not speak HTTP: it is not a Sapling relay.")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers, rest


def _open(url: str, deadline: Deadline, context: ssl.SSLContext | None) -> tuple[socket.socket, str]:
    parts = urlsplit(url)
    secure = parts.scheme in ("wss", "https")
    host = parts.hostname or ""
    port = parts.port or (443 if secure else 80)
    sock = connect(resolve(host, port, deadline), host, port, deadline)
    if secure:
        sock = start_tls(sock, host, deadline, context)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return sock, netloc


def info_url(relay_url: str) -> str:
    """Where the relay at `relay_url` (ws:// or wss://) serves its information document."""
    parts = urlsplit(relay_url)
    scheme = "https" if parts.scheme in ("wss", "https") else "http"
    return f"{scheme}://{parts.netloc}{INFO_PATH}"


def fetch_relay_info(relay_url: str, timeout: float = STEP_TIMEOUT_S,
                     context: ssl.SSLContext | None = None) -> RelayInfo:
    """The checked information document of the relay at `relay_url`; RelayError with
    one sentence. The whole exchange shares one deadline of `timeout` seconds."""
    where = urlsplit(relay_url).netloc or relay_url
    deadline = Deadline(timeout, f"The relay at {where}")
    sock, netloc = _open(relay_url, deadline, context)
    with sock:
        request = (f"GET {INFO_PATH} HTTP/1.0\r\nHost: {netloc}\r\nAccept: application/json\r\n"
                   f"User-Agent: {USER_AGENT}\r\nConnection: close\r\n\r\n")
        try:
            sock.settimeout(deadline.left())
            sock.sendall(request.encode("ascii"))
        except OSError as exc:
            raise RelayError(f"The relay at {where} closed the connection ({exc}).") from None
        status, headers, body = read_head(sock, deadline, f"The relay at {where}")
        kind = headers.get("content-type", "").split(";")[0].strip().lower()
        if "html" in kind:
            raise RelayError(f"{where} answered with a web page, not a Sapling relay's information: check the address.")
        if status != 200:
            raise RelayError(f"{where} has no Sapling relay information (HTTP {status} for {INFO_PATH}): it is not "
                               "a Sapling relay, or one too old to describe itself.")
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > MAX_INFO_BYTES:
            raise RelayError(f"The relay information from {where} is {int(length):,} bytes, more than the "
                               f"{MAX_INFO_BYTES // 1024} kB allowed.")
        while len(body) <= MAX_INFO_BYTES:
            try:
                sock.settimeout(deadline.left())
                chunk = sock.recv(16384)
            except TimeoutError:
                raise RelayError(f"The relay at {where} did not finish its answer within {timeout:g} s.") from None
            except OSError as exc:
                raise RelayError(f"The relay at {where} broke off its answer ({exc}).") from None
            if not chunk:
                break
            body += chunk
        if len(body) > MAX_INFO_BYTES:
            raise RelayError(f"The relay information from {where} is more than the {MAX_INFO_BYTES // 1024} kB "
                             "allowed.")
    if body.lstrip()[:1] == b"<":
        raise RelayError(f"{where} answered with a web page, not a Sapling relay's information: check the address.")
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise RelayError(f"The relay information from {where} is not valid JSON.") from None
    return parse_relay_info(doc, where)


# -- an invite, previewed ----------------------------------------------------------------------
@dataclass(frozen=True)
class Preview:
    """An invite and what its first answering relay says about the swarm."""

    invite: Invite
    info: RelayInfo
    relay: str  # the relay that answered

    @property
    def name(self) -> str:
        """The swarm's name as the relay that answered gives it (else its host), never the link's: anyone can
        write any name into a link, so "Riverside Maths Club" in an invite proves nothing."""
        return self.info.name or urlsplit(self.relay).hostname or self.relay

    def link(self) -> str:
        """The invite to store (swarm.relay_url), named as the relay that answered names its swarm (the app's swarm
        panel shows that name), not as the link did."""
        return Invite(self.invite.relays, self.invite.token, self.info.name[:80]).link()


def preview_invite(text: str, timeout: float = STEP_TIMEOUT_S, context: ssl.SSLContext | None = None) -> Preview:
    """Parse an invite (ConfigError) and fetch its relays' information, first answering relay wins (each relay
    gets `timeout`). A private swarm whose invite has no token is refused here, before anything is saved."""
    invite = parse_invite(text)
    first: RelayError | None = None
    for relay in invite.relays:
        try:
            info = fetch_relay_info(relay, timeout, context)
        except RelayError as exc:
            first = first or exc
            continue
        if info.join == "token" and not invite.token:
            raise ConfigError(f"{info.name or 'This swarm'} is private and this invite has no join token: ask its "
                              "organiser for the full invite link.")
        return Preview(invite, info, relay)
    assert first is not None
    if len(invite.relays) > 1:
        raise type(first)(f"None of the swarm's {len(invite.relays)} relays answered; the first: {first}")
    raise first


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m engine.common.joining INVITE", file=sys.stderr)
        return 2
    try:
        preview = preview_invite(args[0])
    except SaplingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    info = preview.info
    print(f"{preview.name}: {info.policy_words()}; {info.live.peers_online} online; operator {info.contact or '?'}; "
          f"{info.software} {info.version}, protocol {info.protocol}; via {preview.relay}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


# The connection doctor's steps, in order (engine/swarm/doctor.py runs them; app/doctor.py shows them): here,
# because the app may import this stdlib-only module and not engine/swarm/doctor.py (which loads cryptography).
DOCTOR_STEPS = (
    ("address", "Address"),
    ("dns", "DNS"),
    ("tcp", "TCP connect"),
    ("tls", "TLS"),
    ("websocket", "Websocket"),
    ("hello", "Hello/welcome"),
    ("round_trip", "Round trip"),
    ("key", "This node"),
)

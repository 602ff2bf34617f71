"""Rules the app and the engine both apply, in one stdlib-only home.

The app may import this module (it loads nothing heavy), so a rule written
here is the same on both sides of the process boundary:

- invites and relay addresses (`parse_invite`, `Invite`, `split_invite`,
  `check_relay_url`): the one parser the relay, the node and the app use;
- what a model source names (`model_source_kind`): the bundled model, a
  folder, or a Hugging Face hub id;
- stable seeds (`stable_seed`): the same integer in every process, on every OS;
- the swarm protocol's version and completion limit (`PROTOCOL_VERSION`,
  `MAX_COMPLETION_CHARS`): the wire (engine/swarm/protocol.py) takes them
  from here, and so do the join check (`joining`) and a question's scorer
  (engine/questions/tasks.py), which must agree with it.

A broken rule raises `ConfigError` with one sentence a person can act on.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from engine.common.errors import ConfigError

BUNDLED = "bundled"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
RELAY_EXAMPLE = "for example wss://relay.example.org/ws"

# -- the swarm protocol (docs/protocol.md) ----------------------------------------------------------
PROTOCOL_VERSION = 1  # the `v` of every message; a relay speaking another one is refused before joining
MAX_COMPLETION_CHARS = 8192  # characters in one completion: the wire refuses longer, the scorer gives them 0.0


# -- relays and invites ---------------------------------------------------------------------------
def split_invite(text: str) -> tuple[str, str]:
    """A relay address or an invite (the address carrying ``?token=...``) -> (address, token).

    The other query parameters are kept; an address with no path gets ``/ws``.
    """
    try:
        parts = urlsplit(text.strip())
    except ValueError as exc:  # "wss://[": urllib's "Invalid IPv6 URL"
        raise ConfigError(f"The relay address is not a valid URL ({exc}), {RELAY_EXAMPLE}.") from None
    query = parse_qsl(parts.query, keep_blank_values=True)
    token = next((v for k, v in query if k == "token"), "")
    rest = urlencode([(k, v) for k, v in query if k != "token"])
    path = parts.path or ("/ws" if parts.netloc else "")
    return urlunsplit((parts.scheme, parts.netloc, path, rest, parts.fragment)), token


def check_relay_url(url: str) -> str:
    """The address unchanged when it is a ws:// or wss:// URL with a host; else ConfigError."""
    url = url.strip()
    if not url:
        raise ConfigError(f"Enter the relay address you were given, {RELAY_EXAMPLE}.")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ConfigError(f"The relay address is not a valid URL ({exc}), {RELAY_EXAMPLE}.") from None
    if parts.scheme not in ("ws", "wss"):
        raise ConfigError(f"The relay address must start with ws:// or wss://, {RELAY_EXAMPLE}; got {url!r}.")
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"The relay address has an invalid port number: {url!r}.") from None
    if not parts.hostname or (port is not None and not 0 < port < 65536) or " " in url:
        raise ConfigError(f"The relay address has no valid host name, {RELAY_EXAMPLE}; got {url!r}.")
    return url


# -- invites --------------------------------------------------------------------------------------
# An invite names a swarm: one or more relay addresses (tried in turn: failover), the join token of a
# private swarm, and the swarm's name as its organiser wrote it. Three spellings are accepted:
#   sapling://join?relay=wss%3A%2F%2Fhost%2Fws&relay=...&token=T&name=N   (opens Sapling)
#   https://HOST/join?relay=...&token=T&name=N                          (the relay's own web page)
#   wss://HOST/ws[?token=T]                                             (a bare relay address)
INVITE_SCHEME = "sapling"
INVITE_MAX_CHARS = 4096  # a whole invite; a relay address alone must fit in it
INVITE_MAX_RELAYS = 8
INVITE_MAX_TOKEN = 256
INVITE_MAX_NAME = 80
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Invite:
    """A swarm to join: relay addresses in order of preference, its join token and its name."""

    relays: tuple[str, ...]
    token: str = ""
    name: str = ""

    def _query(self) -> str:
        pairs = [("relay", url) for url in self.relays]
        if self.token:
            pairs.append(("token", self.token))
        if self.name:
            pairs.append(("name", self.name))
        return urlencode(pairs, quote_via=quote)

    def link(self) -> str:
        """The `sapling://join?...` link that opens Sapling."""
        return f"{INVITE_SCHEME}://join?{self._query()}"

    def page_url(self, base: str = "") -> str:
        """The `https://HOST/join?...` page a relay serves (for people without Sapling yet).

        base: the site, e.g. https://relay.example.org; by default the first relay's host
        (wss -> https, ws -> http)."""
        if not base:
            first = urlsplit(self.relays[0])
            base = urlunsplit(("https" if first.scheme == "wss" else "http", first.netloc, "", "", ""))
        return f"{base.rstrip('/')}/join?{self._query()}"


def _invite_text(value: str, what: str, limit: int) -> str:
    if _CONTROL.search(value):
        raise ConfigError(f"The invite's {what} contains control characters; ask for a fresh invite.")
    if len(value) > limit:
        raise ConfigError(f"The invite's {what} is longer than {limit} characters; ask for a fresh invite.")
    return value


def parse_invite(text: str) -> Invite:
    """A `sapling://join?...` link, an `https://HOST/join?...` page address or a bare ws(s):// relay
    address -> Invite; anything else is a ConfigError naming what is wrong, in one sentence."""
    text = str(text).strip()
    if not text:
        raise ConfigError("Paste the invite link you were given (sapling://join?...) or a relay address, "
                          f"{RELAY_EXAMPLE}.")
    if len(text) > INVITE_MAX_CHARS:
        raise ConfigError(f"The invite is {len(text)} characters long, more than the {INVITE_MAX_CHARS} an invite may "
                          "have.")
    if _CONTROL.search(text):
        raise ConfigError("The invite contains control characters; copy it again from the message you got.")
    try:
        parts = urlsplit(text)
    except ValueError as exc:
        raise ConfigError(f"The invite is not a valid link ({exc}); copy it again from the message you got.") from None
    scheme = parts.scheme.lower()
    if scheme in ("ws", "wss"):
        url, token = split_invite(text)
        return Invite((check_relay_url(url),), _invite_text(token, "join token", INVITE_MAX_TOKEN))
    if scheme == INVITE_SCHEME:
        if (parts.netloc or parts.path.strip("/")) != "join":
            raise ConfigError(f"A Sapling link must start with sapling://join?, got {text[:40]!r}.")
    elif scheme in ("https", "http"):
        if parts.path.rstrip("/") != "/join":
            raise ConfigError(f"That web address is not an invite page (its path is not /join): {text[:80]!r}.")
    elif scheme:
        raise ConfigError(f"An invite starts with sapling://, https:// or wss://, not {scheme}:.")
    else:
        raise ConfigError(f"That is not an invite link or a relay address, {RELAY_EXAMPLE}.")
    query = parse_qsl(parts.query, keep_blank_values=True)
    relays = [value.strip() for key, value in query if key == "relay"]
    if not relays:
        raise ConfigError("The invite names no relay (it has no relay=... part); ask for a fresh invite.")
    if len(relays) > INVITE_MAX_RELAYS:
        raise ConfigError(f"The invite lists {len(relays)} relays, more than the {INVITE_MAX_RELAYS} allowed.")
    checked: list[str] = []
    for relay in relays:
        url, inner_token = split_invite(relay)
        url = check_relay_url(url)
        if inner_token:
            raise ConfigError("A relay address inside an invite must not carry its own token; ask for a fresh invite.")
        if url not in checked:
            checked.append(url)
    values = dict(query)
    token = _invite_text(values.get("token", "").strip(), "join token", INVITE_MAX_TOKEN)
    name = _invite_text(values.get("name", "").strip(), "swarm name", INVITE_MAX_NAME)
    return Invite(tuple(checked), token, name)


# -- model sources --------------------------------------------------------------------------------
ModelSourceKind = Literal["bundled", "folder", "hub"]


def model_source_kind(source: str) -> ModelSourceKind:
    """What a model source names. A folder is explicit path syntax (``.``, ``/``, ``~``, a
    backslash, a drive colon, more than one ``/``) or a path that exists; otherwise a hub id."""
    source = source.strip()
    if source == BUNDLED:
        return "bundled"
    if source.startswith((".", "/", "~")) or "\\" in source or ":" in source or source.count("/") > 1:
        return "folder"
    if Path(source).expanduser().exists():
        return "folder"
    return "hub"


def check_model_source(source: str) -> ModelSourceKind:
    """The kind of `source` when it can be used as given; else ConfigError saying what to pick."""
    kind = model_source_kind(source)
    stripped = source.strip()
    if not stripped:
        raise ConfigError("Choose a model: the bundled one, a folder, or a Hugging Face id like org/name.")
    if kind == "folder":
        folder = Path(stripped).expanduser()
        if not folder.is_dir():
            raise ConfigError(f"The model folder {folder} does not exist.")
        if not (folder / "config.json").is_file():
            raise ConfigError(
                f"The folder {folder} has no config.json: choose a Hugging Face model folder "
                "(one made by save_pretrained or by `sapling-node export`)."
            )
    elif kind == "hub" and not HUB_ID.match(stripped):
        raise ConfigError(
            f"{stripped!r} is not a Hugging Face id: it looks like org/name, e.g. HuggingFaceTB/SmolLM2-135M-Instruct."
        )
    return kind


# -- seeds ----------------------------------------------------------------------------------------
def stable_seed(*parts: int | str) -> int:
    """A 64-bit seed from its parts, the same in every process (Python's hash() is salted)."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big")

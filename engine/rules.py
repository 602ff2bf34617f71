"""Rules the app and the engine both apply, in one stdlib-only home.

The app may import this module (it loads nothing heavy), so a rule written
here is the same on both sides of the process boundary:

- invites and relay addresses (`split_invite`, `check_relay_url`);
- what a model source names (`model_source_kind`): the bundled model, a
  folder, or a Hugging Face hub id;
- stable seeds (`stable_seed`): the same integer in every process, on every OS.

A broken rule raises `ConfigError` with one sentence a person can act on.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from engine.errors import ConfigError

BUNDLED = "bundled"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
RELAY_EXAMPLE = "for example wss://relay.example.org/ws"


# -- relays and invites ---------------------------------------------------------------------------
def split_invite(text: str) -> tuple[str, str]:
    """A relay address or an invite (the address carrying ``?token=...``) -> (address, token).

    The other query parameters are kept; an address with no path gets ``/ws``.
    """
    parts = urlsplit(text.strip())
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
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss"):
        raise ConfigError(f"The relay address must start with ws:// or wss://, {RELAY_EXAMPLE}; got {url!r}.")
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"The relay address has an invalid port number: {url!r}.") from None
    if not parts.hostname or (port is not None and not 0 < port < 65536) or " " in url:
        raise ConfigError(f"The relay address has no valid host name, {RELAY_EXAMPLE}; got {url!r}.")
    return url


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

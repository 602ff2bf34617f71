"""The relay's information document (`GET /.well-known/sapling-relay`) and the relay's own key.

    curl -H 'Accept: application/json' https://relay.example.org/
    curl https://relay.example.org/.well-known/sapling-relay

The document tells a person or an app which swarm a relay serves before
they join it: its name, description, operator contact, software and
protocol version, policy, limits, public key, public addresses and live
numbers. Every field is described in docs/protocol.md ("The relay's
information document"); `info_document` is the one place it is built.

A relay run by `sapling-relay` has a persistent Ed25519 key in its data
folder (`relay.key`, mode 0600), made on first start; processes that share
the folder share the key (the first one to create it wins, the others read
it). An embedded relay (no data folder) makes a fresh key each start.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from engine import __version__
from engine.common.atomicio import atomic_write_bytes
from engine.relay.settings import KEY_FILE_NAME, RelaySettings
from engine.swarm import protocol
from engine.swarm.identity import KEY_FILE_MODE, Identity

SOFTWARE = "sapling-relay"
WELL_KNOWN_PATH = "/.well-known/sapling-relay"
# The fields of the document, in order; docs/protocol.md describes each and a test keeps the two equal.
INFO_FIELDS = ("software", "version", "protocol", "name", "description", "operator", "contact", "policy", "models",
               "dataset", "limits", "public_key", "urls", "live")
LIVE_FIELDS = ("peers_online", "batches_last_hour", "publishes_per_minute", "joined_today")


def relay_identity(data_dir: str) -> Identity:
    """The relay's key from `data_dir`/relay.key, created there on first use; a fresh one if no folder is set."""
    if not data_dir:
        return Identity.generate()
    path = Path(data_dir).expanduser() / KEY_FILE_NAME
    if not path.exists():
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        fresh = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.new")  # threads share a pid
        atomic_write_bytes(fresh, pem, mode=KEY_FILE_MODE)
        try:
            # A hard link creates the name only if it is free: of several relay processes starting
            # at once on one folder, the first key wins and every process then reads that one.
            os.link(fresh, path)
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links: a plain atomic rename
            if not path.exists():
                os.replace(fresh, path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(fresh)
    return Identity.load_or_create(path)


def policy(settings: RelaySettings) -> dict[str, Any]:
    return {"join": "token" if settings.join_token else "open", "allow_list": bool(settings.allow_keys)}


def dataset_policy(settings: RelaySettings) -> dict[str, Any] | None:
    """Whether the relay keeps the swarm's dataset (engine/relay/dataset.py), under which license, and where its
    latest export is published ("" when not said); null when it keeps none."""
    if not settings.dataset_dir:
        return None
    return {"license": settings.dataset_license, "url": settings.dataset_url}


def info_document(settings: RelaySettings, public_key: bytes, live: dict[str, Any]) -> dict[str, Any]:
    """The information document: what docs/protocol.md lists, in INFO_FIELDS order."""
    doc: dict[str, Any] = {
        "software": SOFTWARE,
        "version": __version__,
        "protocol": protocol.VERSION,
        "name": settings.name,
        "description": settings.description,
        "operator": settings.operator,
        "contact": settings.contact,
        "policy": policy(settings),
        "models": settings.model_policy().to_document(),  # null: not declared (engine/common/model_policy.py)
        "dataset": dataset_policy(settings),
        "limits": settings.limits(),
        "public_key": protocol.b64encode(public_key),
        "urls": list(settings.public_url),
        "live": {name: live[name] for name in LIVE_FIELDS},
    }
    assert tuple(doc) == INFO_FIELDS
    return doc

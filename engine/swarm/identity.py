"""A node's swarm identity: an Ed25519 key kept in the data dir, mode 0600.

The peer id and the readable name both derive from the public key, so
they survive reinstalls as long as `identity.key` does, and nobody can
claim another node's name without its key. Signatures cover the exact
payload bytes (see protocol.py); `verify` is what every receiver calls.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from engine.common.atomicio import atomic_write_bytes
from engine.swarm import protocol

log = logging.getLogger(__name__)

KEY_FILE_MODE = 0o600

_ADJECTIVES = (
    "amber", "brave", "calm", "clever", "coral", "crisp", "daring", "eager", "fern", "gentle", "golden",
    "happy", "hazel", "jolly", "keen", "lively", "lucky", "mellow", "misty", "noble", "olive", "plucky",
    "quiet", "rapid", "rosy", "rustic", "sandy", "silver", "sly", "snowy", "steady", "sunny", "swift",
    "tidy", "velvet", "vivid", "warm", "wild", "wise", "zesty", "bold", "bright", "cosy", "dusky",
    "frosty", "glad", "humble", "ivory", "jade", "kind", "lunar", "merry", "nimble", "proud", "quick",
    "royal", "shy", "solar", "tawny", "urban", "vast", "witty", "young", "zen",
)
_ANIMALS = (
    "otter", "badger", "heron", "lynx", "marten", "newt", "owl", "panda", "quokka", "raven", "seal",
    "tapir", "urchin", "vole", "wren", "yak", "zebra", "bison", "crane", "dingo", "egret", "ferret",
    "gecko", "hare", "ibis", "jackal", "koala", "lemur", "moose", "narwhal", "ocelot", "puffin",
    "robin", "stoat", "toucan", "walrus", "alpaca", "beaver", "cougar", "dolphin", "falcon", "gopher",
    "hedgehog", "iguana", "kestrel", "llama", "magpie", "nightjar", "oriole", "pelican", "quail",
    "salmon", "tortoise", "weasel", "finch", "mole", "sparrow", "swan", "lark", "bat", "fox", "elk",
)


def readable_name(public_key: bytes) -> str:
    """adjective-animal-xxxx from the key's hash: easy to say, hard to collide by accident."""
    digest = hashlib.sha256(b"sapling-name:" + public_key).digest()
    adjective = _ADJECTIVES[digest[0] % len(_ADJECTIVES)]
    animal = _ANIMALS[digest[1] % len(_ANIMALS)]
    return f"{adjective}-{animal}-{digest[2:4].hex()}"


def verify(public_key: bytes, data: bytes, signature: bytes) -> bool:
    """True when `signature` is the key's Ed25519 signature of exactly `data`."""
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, data)
    except (InvalidSignature, ValueError):
        return False
    return True


class Identity:
    def __init__(self, private_key: Ed25519PrivateKey, path: Path | None = None) -> None:
        self._key = private_key
        self.path = path
        self.public_key: bytes = private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.peer_id = protocol.peer_id(self.public_key)
        self.name = readable_name(self.public_key)

    @classmethod
    def generate(cls) -> Identity:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load_or_create(cls, path: Path) -> Identity:
        """Load the key at `path`, or create it (mode 0600) on first run.

        An unreadable key file is never overwritten: it is moved aside to
        `identity.key.unreadable-<time>` with a warning, and a new key is made.
        """
        path = Path(path)
        if path.exists():
            try:
                key = serialization.load_pem_private_key(path.read_bytes(), password=None)
                if not isinstance(key, Ed25519PrivateKey):
                    raise ValueError("not an Ed25519 key")
                if os.name == "posix" and path.stat().st_mode & 0o077:
                    path.chmod(KEY_FILE_MODE)
                    log.warning("Tightened the permissions of %s to 0600.", path)
                return cls(key, path)
            except (ValueError, TypeError, OSError) as exc:
                aside = path.with_name(f"{path.name}.unreadable-{int(time.time())}")
                try:
                    path.replace(aside)
                except OSError:
                    aside = path
                log.warning("Swarm identity %s could not be read (%s); kept it as %s and made a new one.", path, exc,
                            aside)
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, pem, mode=KEY_FILE_MODE)
        identity = cls(key, path)
        log.info("Created swarm identity %s (%s) in %s.", identity.name, identity.peer_id, path)
        return identity

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(data)

    def signed(self, payload: str) -> protocol.Signed:
        return protocol.Signed(payload, self.sign(payload.encode("utf-8")))


def verify_signed(signed: protocol.Signed, public_key: bytes) -> bool:
    try:
        data = signed.payload.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return verify(public_key, data, signed.sig)

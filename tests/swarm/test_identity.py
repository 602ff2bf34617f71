"""Swarm identities: created once with mode 0600, stable across restarts, never silently lost."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from engine.swarm.identity import Identity, readable_name, verify


def test_created_once_with_0600_and_reloaded_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "data" / "identity.key"
    first = Identity.load_or_create(path)
    if os.name == "posix":
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = Identity.load_or_create(path)
    assert (again.peer_id, again.name, again.public_key) == (first.peer_id, first.name, first.public_key)
    assert len(first.peer_id) == 20 and first.name == readable_name(first.public_key)
    assert first.name.count("-") == 2


def test_signatures_cover_exact_bytes() -> None:
    me = Identity.generate()
    sig = me.sign(b"payload")
    assert verify(me.public_key, b"payload", sig)
    assert not verify(me.public_key, b"payload ", sig)
    assert not verify(me.public_key, b"payload", sig[:-1] + bytes([sig[-1] ^ 1]))
    assert not verify(b"short", b"payload", sig)


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_loose_permissions_are_tightened(tmp_path: Path) -> None:
    path = tmp_path / "identity.key"
    me = Identity.load_or_create(path)
    path.chmod(0o644)
    assert Identity.load_or_create(path).peer_id == me.peer_id
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_an_unreadable_key_is_kept_aside_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "identity.key"
    path.write_bytes(b"garbage that is not a PEM key")
    me = Identity.load_or_create(path)
    kept = list(tmp_path.glob("identity.key.unreadable-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == b"garbage that is not a PEM key"
    assert Identity.load_or_create(path).peer_id == me.peer_id

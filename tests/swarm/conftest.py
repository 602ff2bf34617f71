"""Relays for the swarm tests: the `start_relay` fixture lives in tests/conftest.py (the app's and the
doctor's tests use it too); `StartRelay` is importable from here as before."""

from __future__ import annotations

from tests.conftest import StartRelay

__all__ = ["StartRelay"]

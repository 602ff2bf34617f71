"""Two fresh nodes with default settings on one relay are not clones: they share questions the other lacks.

Before each install had a seed of its own, every fresh node used seed 0 and
refused every rollout of the other as `duplicate` (the same questions, drawn
in the same rounds). The clone case runs beside it, so the count is shown to
catch duplicates when there are some.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.node.loop import Node
from engine.swarm.exchange import R_DUPLICATE
from tests.swarm.conftest import StartRelay
from tests.swarm.test_mix import relay_node

ROUNDS = 5


def fresh_node(model_dir: Path, home: Path, url: str, *seed: str) -> tuple[Node, Any]:
    """A node as a new install starts it: no run.seed unless `seed` gives one, its own data dir."""
    return relay_node(model_dir, home, url, *seed)


def duplicate_share(model_dir: Path, tmp_path: Path, url: str, *seed: str) -> tuple[float, int]:
    """(share of received items refused as duplicate, items received) over both nodes' first ROUNDS rounds."""
    pair = [fresh_node(model_dir, tmp_path / name, url, *seed) for name in ("a", "b")]
    received = duplicates = 0
    try:
        for _node, session in pair:
            assert session.exchange.client.wait_connected(10)
        for _ in range(ROUNDS):
            for node, _session in pair:
                report = node.run_round()["swarm"]
                received += report["received"]
                duplicates += report["rejected"].get(R_DUPLICATE, 0)
    finally:
        for _node, session in pair:
            session.close()
    return duplicates / max(received, 1), received


@pytest.mark.integration
def test_two_fresh_default_nodes_refuse_under_a_tenth_as_duplicate(
    tiny_model_dir: Path, tmp_path: Path, start_relay: StartRelay
) -> None:
    fresh, fresh_received = duplicate_share(tiny_model_dir, tmp_path / "fresh", start_relay().url)
    clones, clone_received = duplicate_share(tiny_model_dir, tmp_path / "clones", start_relay().url, "run.seed=0")
    assert fresh_received >= ROUNDS and clone_received >= ROUNDS
    assert fresh < 0.10, fresh
    assert clones > 0.5, clones  # the same seed on both: the old default, which shared nothing new

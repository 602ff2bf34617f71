"""`sapling-node stats` without a relay to ask: the numbers the node kept, or one sentence (engine/swarm/node_stats.py).

The relay path (a real relay, two real nodes) is tests/swarm/test_credit.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from bench.harness.servers import free_port
from engine.cli import main
from engine.common.paths import Paths
from engine.swarm.contribution import CREDIT_FILE, Contribution, swarm_key
from engine.swarm.identity import Identity


def closed_port() -> str:
    return f"ws://127.0.0.1:{free_port()}/ws"


def numbers(used: int, peers: int, **rejected: int) -> dict[str, object]:
    return {"shared": 20, "sampled": 16, "used": used, "positive": used, "not_picked": 2, "peers": peers,
            "rejected": rejected}


def test_with_the_relay_away_it_shows_the_kept_numbers_and_says_how_old(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    identity = Identity.load_or_create(Paths.under(home).identity_file)
    url = closed_port()
    book = Contribution(Paths.under(home).data_dir / "swarm" / CREDIT_FILE, identity.peer_id, swarm_key([url]),
                        lambda event: None)
    credit = {"peer": identity.peer_id, "name": identity.name, "hour": numbers(0, 0),
              "day": numbers(3, 2, implausible=6), "all": numbers(9, 3, implausible=6)}
    at = time.time() - 7200
    assert book.update(credit, at)
    assert main(["stats", "--home", str(home), "--relay", url, "--json", "--timeout", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["source"] == "kept" and report["at"] == at and report["credit"] == credit
    assert report["message"] == "Your rollouts were used by 2 peers today (3 rollouts)."
    assert report["warning"].startswith("Peers rejected 67% of the rollouts of yours they judged today")
    assert main(["stats", "--home", str(home), "--relay", url, "--timeout", "2"]) == 0
    text = capsys.readouterr().out
    assert "Used by others" in text and "2 hours ago" in text and "the relay did not answer" in text
    assert "  implausible" in text


def test_no_numbers_anywhere_no_identity_or_a_bad_relay_is_one_sentence(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    assert main(["stats", "--home", str(home), "--relay", closed_port()]) == 2
    assert "no swarm identity yet" in capsys.readouterr().err
    Identity.load_or_create(Paths.under(home).identity_file)
    assert main(["stats", "--home", str(home), "--relay", closed_port(), "--timeout", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sapling-node: error: The relay did not answer") and err.count("\n") == 1
    assert main(["stats", "--home", str(home), "--relay", "http://example.org"]) == 2
    assert capsys.readouterr().err.count("\n") == 1

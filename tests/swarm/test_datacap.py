"""Daily data caps (engine/swarm/datacap.py): counting frames, the midnight reset, persistence, a node at its cap."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest

from engine.common.config_file import build_config
from engine.common.errors import ConfigError
from engine.common.events import Event
from engine.common.paths import Paths
from engine.swarm.datacap import DataMeter
from tests.swarm.conftest import StartRelay
from tests.swarm.test_fresh_nodes import fresh_node
from tests.swarm.test_mix import relay_node


class Days:
    def __init__(self) -> None:
        self.day = date(2026, 12, 3)

    def __call__(self) -> date:
        return self.day


def test_the_meter_counts_resets_at_midnight_and_survives_a_restart(tmp_path: Path) -> None:
    days, path = Days(), tmp_path / "data-today.json"
    meter = DataMeter(path, upload_cap=1000, download_cap=0, today=days, save_every=3600)
    meter.sent(600)
    meter.received(5000)
    assert not meter.upload_blocked() and not meter.download_blocked()  # 0: no download cap
    meter.sent(400)
    assert meter.upload_blocked() and "upload cap (0.0 MB a day" in meter.blocked_reason()
    assert not path.exists()  # saved at most every save_every seconds...
    meter.flush()  # ...and when the link closes
    assert json.loads(path.read_text())["sent_bytes"] == 1000
    again = DataMeter(path, upload_cap=1000, today=days)  # a restart the same day
    assert (again.sent_bytes, again.received_bytes, again.upload_blocked()) == (1000, 5000, True)
    days.day = date(2026, 12, 4)  # local midnight passed
    assert not again.upload_blocked() and again.blocked_reason() == ""
    assert (again.sent_bytes, again.received_bytes) == (0, 0)
    again.flush()
    assert json.loads(path.read_text())["day"] == "2026-12-04"
    days.day = date(2026, 12, 5)
    assert DataMeter(path, today=days).sent_bytes == 0  # a file from an earlier day counts for nothing


def test_an_unreadable_file_counts_from_zero(tmp_path: Path) -> None:
    path = tmp_path / "data-today.json"
    path.write_text('{"day": "2026-12-03", "sent_bytes": -4}')
    assert DataMeter(path, today=Days()).sent_bytes == 0
    with pytest.raises(ConfigError, match=r"swarm\.daily_upload_mb must be a number at least 0\.0"):
        build_config(overrides=["swarm.daily_upload_mb=-1"])


@pytest.mark.integration
def test_a_node_at_its_caps_trains_on_its_own_groups_and_says_why(tiny_model_dir: Path, tmp_path: Path,
                                                                    start_relay: StartRelay) -> None:
    url = start_relay().url
    giver, giver_session = fresh_node(tiny_model_dir, tmp_path / "giver", url)
    events: list[Event] = []
    node, session = relay_node(tiny_model_dir, tmp_path / "capped", url, events=events)
    try:
        assert giver_session.exchange.client.wait_connected(10) and session.exchange.client.wait_connected(10)
        meter = session.exchange.meter
        assert meter is not None and meter.sent_bytes > 0 and meter.received_bytes > 0  # the handshake's frames
        giver.run_round()
        first = node.run_round()  # no caps yet: takes the giver's groups and shares its own
        assert first["swarm"]["received"] > 0, first["swarm"]
        assert giver.run_round()["swarm"]["received"] > 0  # the capped node's round 1 reached the giver
        meter.upload_cap, meter.download_cap = meter.sent_bytes, meter.received_bytes  # today's caps, reached
        second = node.run_round()
        assert second["swarm"]["received"] == 0 and second["external_groups"] == 0  # trains on its own groups
        assert second["local_groups"] > 0
        assert giver.run_round()["swarm"]["received"] == 0  # and shared nothing
        said = [e["message"] for e in events if e["type"] == "swarm" and "cap" in e["message"]]
        assert said == ["Today's upload cap (" + said[0].split("upload cap (", 1)[1]]
        assert "not sharing or taking rollouts until midnight" in said[0] and "own rollouts" in said[0]
        today = [e for e in events if e["type"] == "peers"][-1]["data_today"]
        assert today["sent_bytes"] == meter.upload_cap and today["received_bytes"] >= meter.download_cap
    finally:
        session.close()
        giver_session.close()
    saved = json.loads((Paths.under(tmp_path / "capped").data_dir / "swarm" / "data-today.json").read_text())
    assert saved["sent_bytes"] >= meter.upload_cap and saved["day"] == date.today().isoformat()

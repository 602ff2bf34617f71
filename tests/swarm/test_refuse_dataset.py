"""swarm.refuse_dataset_swarms: a node never joins a swarm whose relay keeps a dataset of what is shared."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.join import JoinDialog
from engine.common.config import NodeConfig, with_changes
from engine.common.errors import ConfigError
from engine.common.rules import Invite
from engine.swarm.session import open_swarm
from tests.conftest import StartRelay


def relay_config(url: str, refuse: bool) -> NodeConfig:
    return with_changes(NodeConfig(), swarm={"mode": "relay", "relay_url": Invite((url,), "", "").link(),
                                             "refuse_dataset_swarms": refuse})


@pytest.mark.integration  # real relays on loopback
def test_a_node_that_refuses_dataset_swarms_joins_only_one_that_keeps_none(start_relay: StartRelay,
                                                                          tmp_path: Path) -> None:
    keeping = start_relay(name="Open data lab", dataset_dir=str(tmp_path / "dataset"), dataset_license="cc0-1.0")
    plain = start_relay(name="Quiet lab")
    with pytest.raises(ConfigError, match=r"Open data lab keeps a dataset .*license cc0-1\.0.*refuse_dataset_swarms"):
        open_swarm(relay_config(keeping.url, True), tmp_path / "a" / "identity.key", lambda event: None)
    session = open_swarm(relay_config(plain.url, True), tmp_path / "b" / "identity.key", lambda event: None)
    try:
        assert session.exchange is not None
    finally:
        session.close()
    session = open_swarm(relay_config(keeping.url, False), tmp_path / "c" / "identity.key", lambda event: None)
    session.close()  # the setting off (the default): joined as before


def test_a_relay_that_does_not_answer_is_not_joined_while_refusing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="could not ask the swarm's relay whether it keeps a dataset"):
        open_swarm(relay_config("ws://127.0.0.1:9/ws", True), tmp_path / "identity.key", lambda event: None)


@pytest.mark.integration
def test_the_join_dialog_refuses_a_dataset_swarm_when_the_settings_say_so(qtbot, start_relay: StartRelay,  # type: ignore[no-untyped-def]
                                                                          tmp_path: Path) -> None:
    keeping = start_relay(name="Open data lab", dataset_dir=str(tmp_path / "dataset"), dataset_license="cc0-1.0")
    dialog = JoinDialog(Invite((keeping.url,), "", "").link(), refuse_datasets=True)
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: "refuse swarms that publish a dataset" in dialog.card.status.text(), timeout=10_000)
    assert not dialog.join_button.isEnabled() and dialog.preview is None
    assert "license cc0-1.0" in dialog.card.values["dataset"].text()
    dialog.done(1)  # Join cannot be forced either
    assert dialog.result() != 1

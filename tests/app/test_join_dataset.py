"""The join dialog shows a swarm's dataset policy, as its relay's information document gives it (issue 53)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.join import JoinDialog
from engine.common.errors import RelayError
from engine.common.joining import parse_relay_info
from engine.common.rules import Invite
from tests.app.conftest import StartRelay


@pytest.mark.integration
def test_the_join_dialog_shows_the_dataset_and_its_license(qtbot, start_relay: StartRelay,  # type: ignore[no-untyped-def]
                                                            tmp_path: Path) -> None:
    keeping = start_relay(name="Open data lab", dataset_dir=str(tmp_path / "dataset"), dataset_license="cc0-1.0")
    plain = start_relay(name="Quiet lab")
    shown = {}
    for relay in (keeping, plain):
        dialog = JoinDialog(Invite((relay.url,), "", "").link())
        qtbot.addWidget(dialog)
        qtbot.waitUntil(lambda d=dialog: d.preview is not None, timeout=10_000)
        label = dialog.card.values["dataset"]
        assert label.isVisibleTo(dialog) and dialog.card.form.labelForField(label).text() == "Dataset"
        shown[relay.relay.settings.name] = label.text()
        assert dialog.join_button.isEnabled()
        dialog.cancel_button.click()
    assert shown == {"Open data lab": "Answers you share may be published in this swarm's dataset, license cc0-1.0",
                     "Quiet lab": "None: the relay says it keeps no dataset of what is shared"}


def test_a_malformed_dataset_field_is_one_sentence() -> None:
    base = {"software": "sapling-relay", "version": "1", "protocol": 1, "name": "x",
            "policy": {"join": "open", "allow_list": False}, "live": {}}
    assert parse_relay_info({**base, "dataset": None}, "r").dataset_license is None
    assert parse_relay_info({**base, "dataset": {"license": "mit", "url": ""}}, "r").dataset_license == "mit"
    for bad in ("yes", {"license": "MIT <b>"}, {"url": ""}):
        with pytest.raises(RelayError, match="malformed: dataset must be null or an object whose license"):
            parse_relay_info({**base, "dataset": bad}, "r")

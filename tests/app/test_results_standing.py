"""Issue 53: where this node's model stands on the relay's results table (Your contribution) and Settings ▸ Swarm's
"Put my model on the swarm's results table", offscreen."""

from __future__ import annotations

import pytest

from app.contribution import ContributionCard
from app.settings import EngineSettings
from engine.common.config_file import build_config
from engine.common.paths import Paths
from engine.swarm.results import standing, standing_sentence
from tests.app.conftest import MakeGui

SCORED = {"type": "scored", "v": 1, "checked": True, "place": 2, "of": 3,
          "result": {"seed": 11, "round": 40, "model": "bundled@sha256:9c1f", "checkpoint": "", "questions": 36,
                     "correct": 14, "accuracy": 0.39, "reward_mean": 0.4, "ts": 1.0}}


def test_the_card_shows_the_engines_standing_sentence_and_skips_a_bad_one(qtbot) -> None:  # type: ignore[no-untyped-def]
    card = ContributionCard()
    qtbot.addWidget(card)
    assert card.standing.isHidden() and card.place is None
    numbers = standing(SCORED)
    assert numbers is not None
    message = standing_sentence(numbers)
    assert message == ("On the relay's evaluation at round 40, this node's answers earned 14 of 36 (39%; 95% "
                       "interval 25% to 55%), re-scored by the relay: place 2 of 3 on the swarm's results table.")
    card.handle({"type": "standing", "v": 1, "peer_id": "p" * 20, "message": message, "result": numbers})
    assert not card.standing.isHidden() and card.standing.text() == f"Results table: {message}"
    assert card.place == (2, 3)
    card.handle({"type": "standing", "v": 1, "peer_id": "p" * 20, "message": "x", "result": "nonsense"})
    assert card.standing.text() == f"Results table: {message}"  # a bad event changes nothing
    unchecked = standing({"type": "scored", "v": 1, "checked": False})
    assert unchecked == {"checked": False}
    card.handle({"type": "standing", "v": 1, "peer_id": "p" * 20, "message": standing_sentence(unchecked),
                 "result": unchecked})
    assert card.place is None and "cannot re-score" in card.standing.text()


@pytest.mark.integration
def test_the_window_tab_carries_the_place_and_settings_turn_taking_part_off(
        qtbot, make_gui: MakeGui, paths: Paths) -> None:  # type: ignore[no-untyped-def]
    assert EngineSettings().report_results is True and build_config().swarm.report_results is True
    gui = make_gui()
    w = gui.window
    w.show()
    numbers = standing(SCORED)
    assert numbers is not None
    w.contribution.handle({"type": "standing", "v": 1, "peer_id": "p" * 20, "message": standing_sentence(numbers),
                           "result": numbers})
    assert w.tabs.tabText(w.tabs.indexOf(w.contribution)).endswith(" · place 2 of 3")
    w.open_settings()
    dialog = w.dialog
    assert dialog is not None
    box = dialog.form.report_results
    assert box.isChecked() and box.text() == "Put my model on the swarm's results table"
    box.setChecked(False)
    assert dialog.try_accept()
    assert build_config("default", paths.config_file).swarm.report_results is False  # the engine reads it
    w.open_settings()
    assert not w.dialog.form.report_results.isChecked()  # type: ignore[union-attr]
    w.dialog.reject()  # type: ignore[union-attr]

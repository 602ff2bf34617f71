"""The "Your contribution" card and Settings ▸ Identity, offscreen.

The card is filled by a real engine (the app's own `sapling-node serve`) whose
rollouts a second real node (`sapling-node run`) samples and judges through a
real relay; the identity panel drives real `sapling-node identity` children.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from app.contribution import EMPTY, ContributionCard
from app.identity import IdentityPanel
from engine.common.events import node_command
from engine.common.paths import Paths
from tests.app.conftest import MakeGui, StartRelay, fake_command

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--device", "cpu", "--threads", "1", "--set", "tasks.questions_per_round=2",
        "--set", "tasks.completions_per_question=2", "--set", "tasks.max_new_tokens=8", "--set", "tasks.eval_every=0"]


def period(**values: Any) -> dict[str, Any]:
    return {"shared": 0, "sampled": 0, "used": 0, "positive": 0, "not_picked": 0, "peers": 0, "rejected": {},
            **values}


def test_the_card_shows_the_engines_sentences_and_numbers_and_skips_bad_events(qtbot) -> None:  # type: ignore[no-untyped-def]
    card = ContributionCard()
    qtbot.addWidget(card)
    assert card.message.text() == EMPTY and card.warning.isHidden()
    credit = {"peer": "p" * 20, "name": "quiet-fern-3f9a", "hour": period(),
              "day": period(sampled=400, used=312, peers=7, rejected={"implausible": 120}),
              "all": period(used=1204, peers=9, shared=1630)}
    card.handle({"type": "contribution", "v": 1, "peer_id": "p" * 20, "credit": credit,
                 "message": "Your rollouts were used by 7 peers today (312 rollouts).",
                 "warning": "Peers rejected 28% of the rollouts of yours they judged today, mostly as implausible: x.",
                 "at": time.time(), "history": [[1.0, 1000.0, 3.0, 5.0], [2.0, 1204.0, 3.0, 7.0]]})
    assert card.message.text() == "Your rollouts were used by 7 peers today (312 rollouts)."
    assert card.numbers.text().startswith("Today: 400 sampled by peers, 312 used, 120 rejected.")
    assert "All time: 1,204 used by 9 peers, 1,630 shared." in card.numbers.text()
    assert not card.warning.isHidden() and "mostly as implausible" in card.warning.text()
    assert card.chart.points == [(1.0, 1000.0), (2.0, 1204.0)]
    card.handle({"type": "contribution", "v": 1, "peer_id": "p" * 20, "credit": "nonsense", "message": "x"})
    card.handle({"type": "peers", "v": 1, "online": 3})
    assert card.message.text().startswith("Your rollouts were used by 7 peers")  # neither changed it
    card.handle({"type": "contribution", "v": 1, "peer_id": "p" * 20, "credit": credit, "message": "m",
                 "warning": None})
    assert card.warning.isHidden()


@pytest.mark.integration
def test_the_contribution_card_fills_from_a_real_engine_run(qtbot, tiny_model_dir: Path, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                            make_gui: MakeGui, start_relay: StartRelay) -> None:
    relay = start_relay()
    # Another node: it samples this app's rollouts, judges them with its own checks and sends receipts.
    # (A random tiny model answers nothing right, so it rejects them all: zero_advantage, or duplicate text.)
    other = subprocess.Popen([sys.executable, "-m", "engine.cli", "run", "--home", str(tmp_path / "other"),
                              "--model", str(tiny_model_dir), "--relay", relay.url, "--rounds", "400", *FAST],
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        gui = make_gui(settings=["--model", str(tiny_model_dir), "--relay", relay.url, *FAST])
        card = gui.window.contribution
        gui.controller.start()
        # filled: the relay counted receipts from the other node about at least 8 of this node's rollouts
        qtbot.waitUntil(lambda: sum(card.credit.get("day", {}).get("rejected", {}).values()) >= 8, timeout=300_000)
        day = card.credit["day"]
        assert day["sampled"] >= 8 and day["used"] == 0
        assert card.credit["peer"] == gui.session.swarm["peer_id"]
        assert card.message.text().startswith("Peers sampled ") and card.message.text().endswith("none was used yet.")
        assert card.numbers.text().startswith(f"Today: {day['sampled']} sampled by peers, 0 used,")
        assert not card.warning.isHidden()  # every judged rollout was rejected: the card says why, and what to do
        # A random tiny model's 8-token answers are all wrong (zero advantage) and often the same text (duplicate):
        # either way the card names the reason and says it is harmless.
        assert any(f"mostly as {why}" in card.warning.text() for why in ("zero advantage", "duplicate"))
        assert "nothing to fix" in card.warning.text()
        assert card.chart.points
        tabs = gui.window.tabs
        assert tabs.tabText(tabs.indexOf(card)) == f"⚠ Your contribution · {day['used']:,} used today"
        kept = json.loads((Paths.under(tmp_path / "home").data_dir / "swarm" / "credit.json").read_text())
        assert [entry["credit"]["peer"] for entry in kept["entries"].values()] == [card.credit["peer"]]
    finally:
        other.terminate()
        other.wait(timeout=60)


@pytest.mark.integration
def test_settings_identity_backs_up_refuses_a_damaged_file_and_restores(qtbot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    def identity_panel(home: Path) -> IdentityPanel:
        panel = IdentityPanel(lambda args: node_command("identity", [*args, "--home", str(home)]))
        qtbot.addWidget(panel)
        return panel

    theirs = tmp_path / "theirs.key"
    subprocess.run([sys.executable, "-m", "engine.cli", "identity", "export", str(theirs), "--home",
                    str(tmp_path / "other")], cwd=ROOT, check=True, capture_output=True)
    home = tmp_path / "home"
    subprocess.run([sys.executable, "-m", "engine.cli", "identity", "export", str(tmp_path / "first.key"), "--home",
                    str(home)], cwd=ROOT, check=True, capture_output=True)
    panel = identity_panel(home)
    qtbot.waitUntil(lambda: bool(panel.peer_id), timeout=60_000)
    mine = panel.peer_id
    with qtbot.waitSignal(panel.finished, timeout=60_000):
        panel.back_up_to(tmp_path / "backup.txt")
    assert "Backed up to" in panel.status.text()
    assert stat.S_IMODE((tmp_path / "backup.txt").stat().st_mode) == 0o600
    assert f"peer id {mine}" in (tmp_path / "backup.txt").read_text()
    damaged = tmp_path / "damaged.txt"
    damaged.write_bytes(theirs.read_bytes()[:-30])
    with qtbot.waitSignal(panel.finished, timeout=60_000):
        panel.restore_from(damaged)
    assert "damaged" in panel.status.text() and panel.peer_id == mine
    with qtbot.waitSignals([panel.restored, panel.finished], timeout=60_000):
        panel.restore_from(theirs)
    assert panel.peer_id != mine and "previous key is kept as" in panel.status.text()
    again = identity_panel(home)  # a fresh panel reads the restored identity
    qtbot.waitUntil(lambda: bool(again.peer_id), timeout=60_000)
    assert again.peer_id == panel.peer_id


@pytest.mark.integration
def test_settings_has_an_identity_tab_and_a_restore_restarts_the_engine(qtbot, make_gui: MakeGui) -> None:  # type: ignore[no-untyped-def]
    gui = make_gui(command=fake_command("--hold"))
    gui.controller.start()
    qtbot.waitUntil(lambda: gui.engine.proc is not None and int(gui.engine.proc.processId()) > 0, timeout=30_000)
    assert gui.engine.proc is not None
    first = int(gui.engine.proc.processId())
    gui.window.open_settings()
    dialog = gui.window.dialog
    assert dialog is not None
    tabs = dialog.tabs  # type: ignore[union-attr]
    assert [tabs.tabText(i) for i in range(tabs.count())][-1] == "Identity"
    tabs.widget(tabs.count() - 1).restored.emit("quiet-fern-3f9a", "3f9a2c7e51b04d8e9a6c")
    qtbot.waitUntil(lambda: gui.engine.proc is not None and int(gui.engine.proc.processId()) not in (0, first),
                    timeout=30_000)  # a new engine process, which reads the restored key
    dialog.reject()

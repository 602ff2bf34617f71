"""Switch swarm… lists the swarms announced on this network (app/lan.py) and previews the one picked, offscreen."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator

import pytest

from app.dialogs import SettingsDialog
from app.settings import EngineSettings, SettingsStore
from engine.common.config_file import build_config
from engine.common.lan import Announcement, lan_addresses
from engine.common.paths import Paths
from engine.common.rules import parse_invite
from engine.relay.embedded import EmbeddedRelay
from engine.relay.settings import RelaySettings
from tests.app.conftest import MakeGui


@pytest.fixture
def announced_relay() -> Iterator[EmbeddedRelay]:
    """A real relay on this computer's network address, announced as "Maths club"."""
    addresses = lan_addresses()
    if not addresses:
        pytest.skip("this computer has no network address besides loopback to announce on")
    relay = EmbeddedRelay(RelaySettings(host="0.0.0.0", port=0, name="Maths club", contact="club@example.org"))
    relay.start()
    announcement = Announcement("Maths club", relay.port, addresses[:1])
    announcement.start()
    try:
        yield relay
    finally:
        announcement.stop()
        relay.stop()


@pytest.mark.integration
def test_switch_swarm_lists_this_networks_swarms_and_previews_the_one_picked(  # type: ignore[no-untyped-def]
        qtbot, make_gui: MakeGui, paths: Paths, announced_relay: EmbeddedRelay) -> None:
    gui = make_gui()
    w = gui.window
    w.show()
    w.peers.switch_button.click()
    dialog = w.dialog
    assert isinstance(dialog, SettingsDialog)
    nearby = dialog.form.nearby
    nearby.seconds = 2.0
    with qtbot.waitSignal(nearby.finished, timeout=20_000):
        nearby.look_button.click()
    url = f"ws://{lan_addresses()[0]}:{announced_relay.port}/ws"
    rows = [nearby.list.item(i).text() for i in range(nearby.list.count())]
    assert f"Maths club  ·  {url}" in rows and nearby.list.isVisibleTo(dialog)
    row = rows.index(f"Maths club  ·  {url}")
    nearby.list.itemClicked.emit(nearby.list.item(row))
    form = dialog.form
    assert form.swarm_relay.isChecked() and form.invite.text() == url
    qtbot.waitUntil(lambda: form.invite.preview is not None, timeout=10_000)  # the invite's own preview card
    assert form.invite.card.values["swarm"].text() == "Maths club"
    assert form.invite.card.values["operator"].text() == "club@example.org"
    assert dialog.try_accept()
    saved = SettingsStore(paths).load_engine()
    assert saved.swarm_mode == "relay" and parse_invite(saved.relay_url).relays == (url,)


def test_the_local_swarm_is_announced_only_when_its_switch_is_on(qtbot, paths: Paths) -> None:  # type: ignore[no-untyped-def]
    store = SettingsStore(paths)
    store.save_engine(EngineSettings())
    assert "embedded_lan" not in paths.config_file.read_text()  # unchanged: the engine's default (off) applies
    assert not build_config("default", paths.config_file).swarm.embedded_lan
    dialog = SettingsDialog(EngineSettings(), store.load_app(), False, False, str(paths.config_file))
    qtbot.addWidget(dialog)
    form = dialog.form
    assert form.swarm_embedded.isChecked() and form.lan.isEnabled() and not form.lan.isChecked()
    form.lan.setChecked(True)
    engine, _app = form.values(EngineSettings(), store.load_app())
    store.save_engine(engine)
    assert tomllib.loads(paths.config_file.read_text())["swarm"]["embedded_lan"] is True
    assert build_config("default", paths.config_file).swarm.embedded_lan
    form.swarm_solo.setChecked(True)
    assert not form.lan.isEnabled()

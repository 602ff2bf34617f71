"""Settings on disk and in the dialogs: round trips, recovery from bad files, clear errors for bad input."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from app.dialogs import FirstRunDialog, SettingsDialog
from app.settings import (
    AppSettings,
    EngineSettings,
    SettingsError,
    SettingsStore,
    check_model_source,
    check_relay_url,
    split_invite,
    validate,
)
from engine.common.config_file import build_config
from engine.common.paths import Paths
from engine.common.rules import Invite, parse_invite
from tests.app.conftest import MakeGui, StartRelay


def test_engine_settings_survive_a_save_and_load_and_keep_other_keys(paths: Paths) -> None:
    paths.config_dir.mkdir(parents=True)
    paths.config_file.write_text("[grpo]\nlearning_rate = 0.0001\n\n[run]\nrun_name = \"mine\"\n")
    store = SettingsStore(paths)
    chosen = EngineSettings(model_source="HuggingFaceTB/SmolLM2-135M-Instruct", swarm_mode="relay",
                            relay_url="wss://relay.example.org/ws", join_token="s3cret \"quoted\"", threads=2)
    store.save_engine(chosen)
    assert SettingsStore(paths).load_engine() == chosen
    data = tomllib.loads(paths.config_file.read_text())
    assert data["grpo"]["learning_rate"] == 0.0001 and data["run"]["run_name"] == "mine"
    config = build_config("default", paths.config_file)  # the engine reads what the app wrote
    assert (config.swarm.mode, config.swarm.relay_url, config.run.threads) == ("relay", "wss://relay.example.org/ws", 2)
    assert config.model.source == chosen.model_source and store.run_name() == "mine"
    assert not store.take_warnings()


def test_saving_keeps_the_users_comments_and_layout(paths: Paths) -> None:
    paths.config_dir.mkdir(parents=True)
    original = ("# my notes: lr tuned on 2026-11-30\n[grpo]\nlearning_rate = 0.0001  # halved after run D\n\n"
                "[model]\n# which model\nsource = \"bundled\"\n")
    paths.config_file.write_text(original)
    SettingsStore(paths).save_engine(EngineSettings(model_source="HuggingFaceTB/SmolLM2-135M-Instruct"))
    text = paths.config_file.read_text()
    for kept in ("# my notes: lr tuned on 2026-11-30", "learning_rate = 0.0001  # halved after run D", "# which model"):
        assert kept in text
    assert 'source = "HuggingFaceTB/SmolLM2-135M-Instruct"' in text


def test_the_app_knows_which_engine_errors_need_the_user_from_the_engine_itself() -> None:
    from app.controller import USER_ERRORS
    from engine.common import errors

    assert {"ConfigError", "ModelError", "DeviceError", "CheckpointError", "TaskError"} <= USER_ERRORS
    assert "EventError" not in USER_ERRORS
    assert all(issubclass(getattr(errors, kind), errors.SaplingError) for kind in USER_ERRORS)


def test_app_settings_survive_a_save_and_load(paths: Paths) -> None:
    store = SettingsStore(paths)
    chosen = AppSettings(first_run_done=True, only_when_idle=True, start_at_login=True, window_geometry="AAA=",
                         last_device={"kind": "cpu", "name": "x"}, last_identity={"name": "quiet-fern"})
    store.save_app(chosen)
    assert SettingsStore(paths).load_app() == chosen


@pytest.mark.parametrize("text", ["[model\nsource = 'bundled'\n", "[swarm]\nmode = \"carrier-pigeon\"\n",
                                  "[swarm]\nmode = \"relay\"\n", b"\xff\xfe[model]"])
def test_a_bad_config_file_is_backed_up_and_defaults_are_used(paths: Paths, text: str | bytes) -> None:
    paths.config_dir.mkdir(parents=True)
    raw = text if isinstance(text, bytes) else text.encode()
    paths.config_file.write_bytes(raw)
    store = SettingsStore(paths)
    assert store.load_engine() == EngineSettings()
    (warning,) = store.take_warnings()
    backups = list(paths.config_dir.glob("config.toml.invalid-*"))
    assert len(backups) == 1 and backups[0].read_bytes() == raw
    assert backups[0].name in warning and "default settings are used" in warning
    assert not paths.config_file.exists()
    store.save_engine(EngineSettings())  # and saving works again
    assert build_config("default", paths.config_file).swarm.mode == "embedded"


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"first_run_done": "yes"}'])
def test_a_bad_app_settings_file_is_backed_up_and_defaults_are_used(paths: Paths, text: str) -> None:
    paths.config_dir.mkdir(parents=True)
    store = SettingsStore(paths)
    store.app_file.write_text(text)
    assert store.load_app() == AppSettings()
    (warning,) = store.take_warnings()
    assert "app settings file could not be read" in warning
    assert len(list(paths.config_dir.glob("sapling-app.json.invalid-*"))) == 1


def test_unknown_keys_in_app_settings_are_ignored(paths: Paths) -> None:
    store = SettingsStore(paths)
    paths.config_dir.mkdir(parents=True)
    store.app_file.write_text(json.dumps({"first_run_done": True, "from_the_future": 1}))
    assert store.load_app().first_run_done and not store.take_warnings()


@pytest.mark.parametrize(("url", "words"), [
    ("", "Enter the relay address"), ("http://relay.example.org", "must start with ws:// or wss://"),
    ("relay.example.org:8765", "must start with ws://"), ("ws://", "no valid host"),
    ("ws://relay.example.org:99999/ws", "invalid port"), ("wss://relay example.org", "no valid host"),
])
def test_bad_relay_addresses_get_a_sentence_that_says_what_to_type(url: str, words: str) -> None:
    with pytest.raises(SettingsError, match=words):
        check_relay_url(url)


def test_good_relay_addresses_and_invites() -> None:
    check_relay_url("wss://relay.example.org/ws")
    check_relay_url("ws://127.0.0.1:8765/ws")
    assert split_invite("wss://relay.example.org/ws?token=abc&x=1") == ("wss://relay.example.org/ws?x=1", "abc")
    assert split_invite(" ws://h/ws ") == ("ws://h/ws", "")


def test_model_sources(tmp_path: Path) -> None:
    check_model_source("bundled")
    check_model_source("HuggingFaceTB/SmolLM2-135M-Instruct")
    with pytest.raises(SettingsError, match="does not exist"):
        check_model_source(str(tmp_path / "nowhere"))
    with pytest.raises(SettingsError, match=r"no config\.json"):
        check_model_source(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    check_model_source(str(tmp_path))
    with pytest.raises(SettingsError, match="not a Hugging Face id"):
        check_model_source("just-a-name")


@pytest.mark.integration
@pytest.mark.parametrize(("invite", "words"), [
    ("http://relay.example.org", "not an invite page"),
    ("javascript:alert(1)", "not javascript:"),
    ("file:///etc/passwd", "not file:"),
    ("wss://relay.example.org/ws" + "a" * 10_000, "more than the 4096"),
    ("sapling://join?relay=wss%3A%2F%2Fr.example.org%2Fws&token=a%0Ab", "control characters"),
])
def test_a_bad_invite_in_settings_is_one_sentence_and_nothing_is_saved(qtbot, make_gui: MakeGui, paths: Paths,  # type: ignore[no-untyped-def]
                                                                     invite: str, words: str) -> None:
    gui = make_gui()
    w = gui.window
    w.show()
    w.open_settings()
    dialog = w.dialog
    assert dialog is not None and dialog.isVisible()
    form = dialog.form
    form.swarm_relay.setChecked(True)
    form.invite.set_text(invite)
    assert not dialog.try_accept()
    assert dialog.isVisible() and form.error.isVisibleTo(dialog) and words in form.error.text()
    assert form.error.text().count(". ") == 0  # one sentence
    assert not paths.config_file.exists()
    form.invite.check()  # the preview says the same, without asking anyone
    qtbot.waitUntil(lambda: words in form.invite.card.status.text(), timeout=5_000)


@pytest.mark.integration
def test_settings_save_a_pasted_invite_only_after_its_preview(qtbot, make_gui: MakeGui, paths: Paths,  # type: ignore[no-untyped-def]
                                                              start_relay: StartRelay) -> None:
    relay = start_relay(name="Maple Street Lab", contact="ops@example.org", join_token="t0k")
    gui = make_gui()
    w = gui.window
    w.show()
    w.peers.switch_button.click()  # Switch swarm…: Settings, with the invite field ready
    dialog = w.dialog
    assert isinstance(dialog, SettingsDialog) and dialog.form.swarm_relay.isChecked()
    form = dialog.form
    form.invite.set_text(f"{relay.url}?token=t0k")
    form.threads.setValue(1)
    assert not dialog.try_accept()  # not before the relay has answered; asking it now
    assert "asking the relay" in form.error.text() and not paths.config_file.exists()
    qtbot.waitUntil(lambda: form.invite.preview is not None, timeout=10_000)
    card = form.invite.card
    assert card.values["swarm"].text() == "Maple Street Lab" and card.values["operator"].text() == "ops@example.org"
    assert card.values["policy"].text() == "Private: a join token is needed (your invite carries the token)"
    assert dialog.try_accept()
    saved = SettingsStore(paths).load_engine()
    assert (saved.swarm_mode, saved.join_token, saved.threads) == ("relay", "", 1)
    invite = parse_invite(saved.relay_url)  # the invite itself is stored, its name filled in from the relay
    assert invite == Invite((relay.url,), "t0k", "Maple Street Lab")
    config = build_config("default", paths.config_file)  # the engine reads what the app wrote
    assert config.swarm.relay_url == saved.relay_url
    assert "Maple Street Lab" in w.relay_label.text() and w.peers.swarm_name.text() == "Maple Street Lab"
    w.open_settings()  # the stored swarm saves again without a new check
    assert w.dialog is not None and w.dialog.try_accept()


@pytest.mark.integration
def test_first_run_dialog_saves_and_starts_training(qtbot, make_gui: MakeGui, paths: Paths) -> None:  # type: ignore[no-untyped-def]
    gui = make_gui(first_run_done=False)
    gui.window.show()
    gui.after_show()
    dialog = gui.window.dialog
    assert isinstance(dialog, FirstRunDialog) and "what it never shares" in dialog.about.text().lower()
    assert not dialog.form.only_idle.isEnabled()  # this headless machine reports no idle time
    dialog.form.swarm_solo.setChecked(True)
    assert dialog.try_accept(start_training=True)
    assert SettingsStore(paths).load_app().first_run_done
    assert SettingsStore(paths).load_engine().swarm_mode == "solo"
    qtbot.waitUntil(gui.engine.is_running, timeout=10_000)


def test_a_corrupt_file_shows_a_warning_in_the_window(qtbot, make_gui: MakeGui, paths: Paths) -> None:  # type: ignore[no-untyped-def]
    paths.config_dir.mkdir(parents=True)
    (paths.config_dir / "sapling-app.json").write_text("{oops")
    gui = make_gui()
    gui.window.show()
    gui.after_show()
    texts = [gui.window.banners.itemAt(i).widget().label.text() for i in range(gui.window.banners.count())]
    assert any("could not be read" in t and "default settings" in t for t in texts)


@pytest.mark.integration
def test_priority_defaults_to_background_and_round_trips_through_config_and_the_dialog(
        qtbot, make_gui: MakeGui, paths: Paths) -> None:  # type: ignore[no-untyped-def]
    assert EngineSettings().priority == "background" == build_config().run.priority
    gui = make_gui()
    w = gui.window
    w.show()
    w.open_settings()
    dialog = w.dialog
    assert dialog is not None and dialog.form.priority.currentData() == "background"
    assert dialog.form.threads.specialValueText().startswith("Automatic")
    dialog.form.priority.setCurrentIndex(dialog.form.priority.findData("normal"))
    assert dialog.try_accept()
    assert tomllib.loads(paths.config_file.read_text())["run"]["priority"] == "normal"
    assert build_config("default", paths.config_file).run.priority == "normal"  # the engine reads what the app wrote
    assert SettingsStore(paths).load_engine().priority == "normal"
    w.open_settings()
    assert w.dialog is not None and w.dialog.form.priority.currentData() == "normal"
    w.dialog.reject()


def test_a_priority_the_engine_does_not_know_is_refused() -> None:
    with pytest.raises(SettingsError, match="Priority must be one of background, normal"):
        validate(EngineSettings(priority="realtime"))


@pytest.mark.integration
def test_protection_settings_round_trip_through_the_dialog_and_the_engine_reads_them(
        qtbot, make_gui: MakeGui, paths: Paths) -> None:  # type: ignore[no-untyped-def]
    defaults = build_config().swarm
    settings = EngineSettings()
    assert (settings.plausibility_check, settings.ban_strikes, settings.ban_window, settings.ban_hours,
            settings.persist_bans, settings.banned_peers) == (
        defaults.plausibility_check, defaults.ban_strikes, defaults.ban_window, defaults.ban_hours,
        defaults.persist_bans, defaults.banned_peers)
    gui = make_gui()
    w = gui.window
    w.show()
    w.open_settings()
    dialog = w.dialog
    assert dialog is not None
    protection = dialog.protection
    assert protection.check.isChecked() and protection.ban_strikes.value() == defaults.ban_strikes
    # a rule the engine would refuse: the error is shown on the Protection tab, nothing is written
    protection.ban_strikes.setValue(20)
    assert not dialog.try_accept()
    assert dialog.tabs.currentIndex() == 1 and "judged answers the ban rule looks at" in protection.error.text()
    assert not paths.config_file.exists()
    protection.ban_strikes.setValue(3)
    protection.banned.setPlainText("3750d8d5a1b2c3d4e5f6\nnot-a-peer")
    assert not dialog.try_accept() and "not-a-peer" in protection.error.text()
    protection.banned.setPlainText("3750d8d5a1b2c3d4e5f6, 3750d8d5a1b2c3d4e5f6")
    protection.hours.setValue(0)
    protection.persist.setChecked(False)
    protection.check.setChecked(False)
    assert dialog.try_accept()
    swarm = build_config("default", paths.config_file).swarm  # the engine reads what the app wrote
    assert (swarm.plausibility_check, swarm.ban_strikes, swarm.ban_hours, swarm.persist_bans, swarm.banned_peers) == (
        False, 3, 0.0, False, ["3750d8d5a1b2c3d4e5f6"])
    w.open_settings()
    again = w.dialog.protection  # type: ignore[union-attr]
    assert not again.check.isChecked() and again.ban_strikes.value() == 3
    assert again.hours.specialValueText() == "until I lift it" and again.hours.value() == 0
    assert again.banned.toPlainText() == "3750d8d5a1b2c3d4e5f6"
    w.dialog.reject()  # type: ignore[union-attr]


def test_a_whole_number_of_ban_hours_in_the_file_is_read(paths: Paths) -> None:
    paths.config_dir.mkdir(parents=True)
    paths.config_file.write_text("[swarm]\nban_hours = 48\n")
    assert SettingsStore(paths).load_engine().ban_hours == 48.0

"""The first-run dialog, the Settings dialog (same choices) and the problem dialog.

`SettingsForm` holds the choices: the model, the swarm (the local embedded
relay by default, a community's swarm from a pasted invite, or alone) and
resource limits (power, CPU threads, priority, hours, idle only, AC power
only, start at login: app/limits.py). A value that cannot be used is shown in red under the form with what
to type instead, and the dialog stays open. A new invite is saved only after
its relay has answered and its preview shows under the field (app/join.py).
"""

from __future__ import annotations

import os
import re

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QDialog,
    QDoubleSpinBox,
    QFileDialog,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QRadioButton,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app import theme
from app.controller import Problem
from app.join import InviteField
from app.lan import NearbySwarms
from app.limits import ResourcesBox
from app.settings import AppSettings, EngineSettings, SettingsError, parse_invite, validate
from engine.common.claims import JOINING
from engine.common.schema import setting

WHAT_IT_DOES = (
    "<p><b>Sapling trains a small language model on this computer</b>, in the background, using spare "
    "time on your processor or graphics card. It practises puzzles it can check by itself (arithmetic, "
    "dates, logic, number bases), and learns a little from every answer that worked.</p>"
    "<p><b>What it shares with the swarm:</b> the puzzles and your model's answers to them, as plain text, "
    "signed with a random key made for this app. Other computers train on your answers, and yours on theirs. "
    f"{JOINING.text}</p>"
    "<p><b>What it never shares:</b> your files, your model's weights, or anything about you. "
    "With the local swarm, nothing leaves this computer at all, unless you let this network's computers join.</p>"
    "<p>You can pause or stop at any time; training continues where it left off.</p>"
)


def _error_label() -> QLabel:
    """The red sentence under a form that says what to fix; hidden until there is one."""
    label = QLabel()
    label.setTextFormat(Qt.TextFormat.PlainText)  # a sentence may quote what was typed or pasted
    label.setWordWrap(True)
    label.setStyleSheet(f"color: {theme.ERROR}; font-weight: 600;")
    label.hide()
    return label


class SettingsForm(QWidget):
    """Model, swarm and resource choices; `values()` validates and returns them."""

    changed = Signal()

    def __init__(self, idle_supported: bool, ac_supported: bool, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.saved_relay = self.saved_token = ""  # the swarm as stored: saving it again needs no new preview
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(8)
        layout.addWidget(self._model_box())
        layout.addWidget(self._swarm_box())
        self.resources = ResourcesBox(idle_supported, ac_supported)  # app/limits.py
        layout.addWidget(self.resources)
        r = self.resources
        self.threads, self.priority, self.only_idle, self.only_ac, self.autostart = \
            r.threads, r.priority, r.only_idle, r.only_ac, r.autostart
        self.error = _error_label()
        layout.addWidget(self.error)
        for choice in (*self.model_group.buttons(), *self.swarm_group.buttons()):
            choice.toggled.connect(self._sync)
        for edit in (self.folder_edit, self.hub_edit, self.invite.edit):
            edit.textEdited.connect(self._clear_error)

    def _model_box(self) -> QGroupBox:
        box = QGroupBox("Model to train")
        grid = QGridLayout(box)
        self.model_bundled = QRadioButton("SmolLM2-135M-Instruct, included with Sapling (works offline)")
        self.model_folder = QRadioButton("A model folder on this computer")
        self.model_hub = QRadioButton("A model from Hugging Face")
        self.folder_edit = QLineEdit()
        self.folder_edit.setPlaceholderText("A folder with config.json")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        self.hub_edit = QLineEdit()
        self.hub_edit.setPlaceholderText("org/name (downloaded once)")
        self.hub_edit.setToolTip("For example HuggingFaceTB/SmolLM2-360M-Instruct")
        self.model_group = QButtonGroup(self)
        for button in (self.model_bundled, self.model_folder, self.model_hub):
            self.model_group.addButton(button)
        grid.addWidget(self.model_bundled, 0, 0, 1, 3)
        grid.addWidget(self.model_folder, 1, 0)
        grid.addWidget(self.folder_edit, 1, 1)
        grid.addWidget(browse, 1, 2)
        grid.addWidget(self.model_hub, 2, 0)
        grid.addWidget(self.hub_edit, 2, 1, 1, 2)
        grid.setColumnStretch(1, 1)
        return box

    def _swarm_box(self) -> QGroupBox:
        box = QGroupBox("Swarm")
        swarm = QVBoxLayout(box)
        swarm.setSpacing(2)
        self.swarm_embedded = QRadioButton("Local swarm on this computer (recommended to start)")
        self.swarm_relay = QRadioButton("Join a community's swarm: paste the invite you were given")
        self.swarm_solo = QRadioButton("Train alone and share nothing")
        self.invite = InviteField()
        self.invite.setContentsMargins(24, 2, 0, 4)
        self.invite.changed.connect(self._clear_error)
        self.swarm_group = QButtonGroup(self)
        for button in (self.swarm_embedded, self.swarm_relay, self.swarm_solo):
            self.swarm_group.addButton(button)
        self.lan = QCheckBox("Let other computers on this network join (announces this swarm here)")
        self.lan.setStyleSheet("margin-left: 24px;")
        self.nearby = NearbySwarms()  # app/lan.py: the swarms announced on this network
        self.nearby.setContentsMargins(24, 0, 0, 4)
        self.nearby.chosen.connect(self._pick_nearby)
        swarm.addWidget(self.swarm_embedded)
        swarm.addWidget(theme.hint("Sapling runs a small relay here that other Sapling windows on this computer can "
                                   "join. Nothing leaves this computer unless you let this network's computers join."))
        swarm.addWidget(self.lan)
        swarm.addWidget(self.swarm_relay)
        swarm.addWidget(self.invite)
        swarm.addWidget(self.nearby)
        swarm.addWidget(self.swarm_solo)
        self.refuse_datasets = QCheckBox(f"{setting('refuse_dataset_swarms').label} of the answers shared in them")
        self.refuse_datasets.setToolTip("A relay can keep what its swarm shares and publish it as a dataset; its "
                                        "information says so and under which license (the Join dialog shows it).")
        swarm.addWidget(self.refuse_datasets)
        self.report_results = QCheckBox(setting("report_results").label)
        self.report_results.setToolTip("At each evaluation, also answer the relay's questions of the hour and send "
                                       "the answers; the relay scores them itself and lists your model's latest "
                                       "and best on its status page (Your contribution shows your place).")
        swarm.addWidget(self.report_results)
        return box

    # -- values -------------------------------------------------------------------------
    def set_values(self, engine: EngineSettings, app: AppSettings) -> None:
        source = engine.model_source
        if source == "bundled":
            self.model_bundled.setChecked(True)
        elif source.count("/") == 1 and not source.startswith(("/", ".", "~")) and not os.path.exists(source):
            self.model_hub.setChecked(True)
            self.hub_edit.setText(source)
        else:
            self.model_folder.setChecked(True)
            self.folder_edit.setText(source)
        {"embedded": self.swarm_embedded, "relay": self.swarm_relay, "solo": self.swarm_solo}.get(
            engine.swarm_mode, self.swarm_embedded).setChecked(True)
        self.saved_relay, self.saved_token = engine.relay_url, engine.join_token
        self.invite.set_text(engine.relay_url)
        self.lan.setChecked(engine.embedded_lan)
        self.refuse_datasets.setChecked(engine.refuse_dataset_swarms)
        self.report_results.setChecked(engine.report_results)
        self.resources.set_values(engine, app)
        self._sync()

    def values(self, engine: EngineSettings, app: AppSettings) -> tuple[EngineSettings, AppSettings]:
        """The chosen settings (copies of the given ones); SettingsError when one cannot be used."""
        if self.model_folder.isChecked():
            source = self.folder_edit.text().strip()
            if not source:
                self._fail("Choose the model folder, or pick the included model.", self.folder_edit)
        elif self.model_hub.isChecked():
            source = self.hub_edit.text().strip()
            if not source:
                self._fail("Type the Hugging Face id (org/name), or pick the included model.", self.hub_edit)
        else:
            source = "bundled"
        mode = "relay" if self.swarm_relay.isChecked() else "solo" if self.swarm_solo.isChecked() else "embedded"
        relay_url, token = self._swarm() if mode == "relay" else (self.saved_relay, self.saved_token)
        new_engine = self.resources.engine_values(engine).replace(
            model_source=source, swarm_mode=mode, relay_url=relay_url, join_token=token,
            embedded_lan=self.lan.isChecked(), refuse_dataset_swarms=self.refuse_datasets.isChecked(),
            report_results=self.report_results.isChecked())
        try:
            validate(new_engine)
        except SettingsError as exc:
            field = self.hub_edit if self.model_hub.isChecked() else self.folder_edit if self.model_folder.isChecked() \
                else None
            self._fail(str(exc), self.invite.edit if mode == "relay" and "model" not in str(exc).lower() else field)
        new_app = self.resources.app_values(app)
        self._clear_error()
        return new_engine, new_app

    def show_error(self, text: str) -> None:
        self.error.setText(text)
        self.error.show()

    def _fail(self, text: str, field: QLineEdit | None) -> None:
        self.show_error(text)
        if field is not None:
            field.setFocus()
            field.selectAll()
        raise SettingsError(text)

    def _clear_error(self) -> None:
        self.error.hide()

    def _swarm(self) -> tuple[str, str]:
        """(relay_url, join_token) to save for the pasted invite; the stored swarm needs no new check, a new
        invite is saved only once its relay has answered (the preview under the field)."""
        text = self.invite.text()
        if text == self.saved_relay.strip():
            return self.saved_relay, self.saved_token
        try:
            parse_invite(text)
        except SettingsError as exc:
            self._fail(str(exc), self.invite.edit)
        preview = self.invite.preview
        if preview is None or self.invite.checked_text != text:
            if self.invite.checked_text != text:
                self.invite.check()
            self._fail("Sapling is asking the relay who runs this swarm; save again once its details show below "
                       "the invite.", None)
        assert preview is not None
        if self.refuse_datasets.isChecked() and preview.info.dataset_license is not None:
            self._fail(f"{preview.name} publishes a dataset of the answers shared in it (license "
                       f"{preview.info.dataset_license}), and you chose never to join such a swarm.", self.invite.edit)
        return preview.link(), ""

    def _pick_nearby(self, url: str) -> None:
        """A swarm found on this network: its address in the invite field, and its preview asked for."""
        self.swarm_relay.setChecked(True)
        self.invite.set_text(url)
        self.invite.check()

    def _sync(self) -> None:
        self.lan.setEnabled(self.swarm_embedded.isChecked())
        self.folder_edit.setEnabled(self.model_folder.isChecked())
        self.hub_edit.setEnabled(self.model_hub.isChecked())
        relay = self.swarm_relay.isChecked()
        self.invite.setEnabled(relay)
        self.invite.card.setVisible(relay and self.invite.card.status.isVisibleTo(self.invite.card))
        self._clear_error()
        self.changed.emit()

    def _browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Choose a model folder", self.folder_edit.text())
        if folder:
            self.folder_edit.setText(folder)
            self.model_folder.setChecked(True)


def _bounds(name: str) -> tuple[int, int]:
    """A number field's range: the bounds its setting declares (engine/common/config.py)."""
    item = setting(name)
    return int(item.low or 0), int(item.high or 0)


class ProtectionForm(QWidget):
    """Protection from bad peers: the plausibility check, automatic bans and the list of banned peers."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(8)
        layout.addWidget(self._check_box())
        layout.addWidget(self._ban_box())
        self.error = _error_label()
        layout.addWidget(self.error)
        layout.addStretch(1)

    def _check_box(self) -> QGroupBox:
        box = QGroupBox("Answers from other peers")
        check = QVBoxLayout(box)
        check.setSpacing(2)
        self.check = QCheckBox(f"{setting('plausibility_check').label} (recommended)")
        check.addWidget(self.check)
        check.addWidget(theme.hint("Catches answers that are correct but carry injected text, such as an advert "
                              "after the answer, before your model learns from them. Every answer is also "
                              "re-scored here, whatever this says. Sapling follows the swarm's model policy: "
                              "where the relay says its nodes run different models, an answer from another "
                              "model is compared with its sender's usual answers instead of with your model."))
        return box

    def _ban_box(self) -> QGroupBox:
        box = QGroupBox("Banning peers")
        bans = QVBoxLayout(box)
        rule = QHBoxLayout()
        self.ban_strikes = QSpinBox()
        self.ban_strikes.setRange(*_bounds("ban_strikes"))
        self.ban_strikes.setSpecialValueText("Never")
        self.ban_window = QSpinBox()
        self.ban_window.setRange(*_bounds("ban_window"))
        for widget in (QLabel("Ban a peer after"), self.ban_strikes,
                       QLabel("forged or implausible answers among its last"),
                       self.ban_window):
            rule.addWidget(widget)
        rule.addStretch(1)
        bans.addLayout(rule)
        length = QHBoxLayout()
        self.hours = QDoubleSpinBox()
        self.hours.setRange(*_bounds("ban_hours"))
        self.hours.setDecimals(1)
        self.hours.setSuffix(" hours")
        self.hours.setSpecialValueText("until I lift it")
        length.addWidget(QLabel("for"))
        length.addWidget(self.hours)
        length.addStretch(1)
        bans.addLayout(length)
        self.persist = QCheckBox(f"{setting('persist_bans').label} when Sapling restarts")
        bans.addWidget(self.persist)
        bans.addWidget(theme.hint("A ban shows in the Swarm panel; double-click the peer there to lift it."))
        bans.addWidget(QLabel("Never train on these peers:"))
        self.banned = QPlainTextEdit()
        self.banned.setPlaceholderText("Peer ids (20 characters, as in the Swarm panel) or public keys, one per line")
        self.banned.setMaximumHeight(80)
        bans.addWidget(self.banned)
        bans.addWidget(theme.hint("Peers listed here can only be unbanned here."))
        return box

    def set_values(self, engine: EngineSettings) -> None:
        self.check.setChecked(engine.plausibility_check)
        self.ban_strikes.setValue(engine.ban_strikes)
        self.ban_window.setValue(engine.ban_window)
        self.hours.setValue(engine.ban_hours)
        self.persist.setChecked(engine.persist_bans)
        self.banned.setPlainText("\n".join(engine.banned_peers))

    def values(self, engine: EngineSettings) -> EngineSettings:
        """`engine` with these choices; SettingsError (shown here) when one cannot be used."""
        peers = [p for p in re.split(r"[\s,;]+", self.banned.toPlainText()) if p]
        chosen = engine.replace(plausibility_check=self.check.isChecked(), ban_strikes=self.ban_strikes.value(),
                         ban_window=self.ban_window.value(), ban_hours=self.hours.value(),
                         persist_bans=self.persist.isChecked(), banned_peers=list(dict.fromkeys(peers)))
        try:
            validate(chosen)
        except SettingsError as exc:
            self.error.setText(str(exc))
            self.error.show()
            raise
        self.error.hide()
        return chosen


class _SettingsDialogBase(QDialog):
    def __init__(self, engine: EngineSettings, app: AppSettings, idle_supported: bool, ac_supported: bool,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.engine_settings, self.app_settings = engine, app
        self.form = SettingsForm(idle_supported, ac_supported)
        self.form.set_values(engine, app)
        self.start_training = False

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        theme.fit_to_contents(self)  # a real window is sized before its wrapped hints are measured

    def _buttons(self, labels: list[tuple[str, bool, bool]]) -> QHBoxLayout:
        """(text, primary, starts training) for each button, right-aligned; Cancel is Esc."""
        row = QHBoxLayout()
        row.addStretch(1)
        cancel = QPushButton("Cancel")
        cancel.clicked.connect(self.reject)
        row.addWidget(cancel)
        for text, primary, start in labels:
            button = QPushButton(text)
            if primary:
                button.setObjectName("primary")
                button.setDefault(True)
            button.clicked.connect(lambda _=False, s=start: self.try_accept(s))
            row.addWidget(button)
        return row

    def collect(self) -> tuple[EngineSettings, AppSettings]:
        """The chosen settings; SettingsError, shown in the dialog, when one cannot be used."""
        return self.form.values(self.engine_settings, self.app_settings)

    def try_accept(self, start_training: bool = False) -> bool:
        try:
            self.engine_settings, self.app_settings = self.collect()
        except SettingsError:
            return False
        self.start_training = start_training
        self.accept()
        return True


class FirstRunDialog(_SettingsDialogBase):
    """Shown once: what Sapling does and shares, and the same choices as Settings."""

    def __init__(self, engine: EngineSettings, app: AppSettings, idle_supported: bool, ac_supported: bool,
                 parent: QWidget | None = None) -> None:
        super().__init__(engine, app, idle_supported, ac_supported, parent)
        self.setWindowTitle("Welcome to Sapling")
        self.setWindowIcon(theme.icon())
        body = QWidget()
        columns = QHBoxLayout(body)
        columns.setContentsMargins(0, 0, 0, 0)
        columns.setSpacing(20)
        columns.addLayout(self._welcome())
        right = QVBoxLayout()
        right.addWidget(self.form)
        right.addStretch(1)
        columns.addLayout(right, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(20, 20, 20, 16)
        layout.setSpacing(12)
        layout.addWidget(theme.FitScroll(body, leave=theme.DIALOG_LEAVE), 1)  # on a short screen it scrolls
        layout.addLayout(self._buttons([("Save, start later", False, False), ("Start training", True, True)]))

    def _welcome(self) -> QVBoxLayout:
        left = QVBoxLayout()
        logo = QLabel()
        logo.setPixmap(theme.icon().pixmap(72, 72))
        title = QLabel("Welcome to Sapling")
        title.setObjectName("title")
        self.about = QLabel(WHAT_IT_DOES)
        self.about.setWordWrap(True)
        self.about.setTextFormat(Qt.TextFormat.RichText)
        self.about.setMinimumWidth(300)
        self.about.setMaximumWidth(340)
        for widget in (logo, title, self.about):
            left.addWidget(widget)
        left.addStretch(1)
        return left


def _tab(widget: QWidget) -> QWidget:
    """`widget` with the margins a tab page needs, scrolling when the screen is too short for it."""
    page = QWidget()
    layout = QVBoxLayout(page)
    layout.setContentsMargins(8, 8, 8, 8)
    layout.addWidget(widget)
    return theme.FitScroll(page, leave=theme.DIALOG_LEAVE + 60)  # and the tabs, the title


class SettingsDialog(_SettingsDialogBase):
    def __init__(self, engine: EngineSettings, app: AppSettings, idle_supported: bool, ac_supported: bool,
                 config_file: str, parent: QWidget | None = None) -> None:
        super().__init__(engine, app, idle_supported, ac_supported, parent)
        self.setWindowTitle("Sapling settings")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(18, 16, 18, 14)
        title = QLabel("Settings")
        title.setObjectName("sectionTitle")
        layout.addWidget(title)
        self.protection = ProtectionForm()
        self.protection.set_values(engine)
        self.tabs = QTabWidget()
        self.tabs.addTab(_tab(self.form), "General")
        self.tabs.addTab(_tab(self.protection), "Protection")
        layout.addWidget(self.tabs)
        where = QLabel(f"Saved in {config_file}. Other engine settings stay as they are in that file.")
        where.setObjectName("muted")
        where.setWordWrap(True)
        where.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(where)
        layout.addLayout(self._buttons([("Save", True, False)]))
        self.setMinimumWidth(660)

    def focus_swarm(self) -> None:
        """Switch swarm…: the General tab, "join a community's swarm" chosen, the invite field focused."""
        self.tabs.setCurrentIndex(0)
        self.form.swarm_relay.setChecked(True)
        self.form.invite.edit.setFocus()
        self.form.invite.edit.selectAll()

    def collect(self) -> tuple[EngineSettings, AppSettings]:
        try:
            engine, app = self.form.values(self.engine_settings, self.app_settings)
        except SettingsError:
            self.tabs.setCurrentIndex(0)
            raise
        try:
            return self.protection.values(engine), app
        except SettingsError:
            self.tabs.setCurrentIndex(1)
            raise


class ProblemDialog(QDialog):
    """What went wrong, the last log lines, and what can be done now (non-modal)."""

    restartRequested = Signal()
    settingsRequested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Sapling")
        self.setModal(False)
        layout = QVBoxLayout(self)
        self.title = QLabel()
        self.title.setObjectName("sectionTitle")
        self.text = QLabel()
        self.text.setWordWrap(True)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details = QPlainTextEdit()
        self.details.setReadOnly(True)
        self.details.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.details.setMinimumSize(640, 220)
        layout.addWidget(self.title)
        layout.addWidget(self.text)
        layout.addWidget(QLabel("Last lines from the engine:"))
        layout.addWidget(self.details, 1)
        row = QHBoxLayout()
        row.addStretch(1)
        self.settings_button = QPushButton("Open Settings")
        self.settings_button.clicked.connect(self.settingsRequested)
        self.settings_button.clicked.connect(self.close)
        self.restart_button = QPushButton("Restart now")
        self.restart_button.clicked.connect(self.restartRequested)
        self.restart_button.clicked.connect(self.close)
        close = QPushButton("Close")
        close.clicked.connect(self.close)
        for button in (self.settings_button, self.restart_button, close):
            row.addWidget(button)
        layout.addLayout(row)

    def show_problem(self, problem: Problem) -> None:
        self.title.setText(problem.title)
        text = problem.text
        if problem.restart_in is not None:
            text += (f"\n\nSapling restarts it in {problem.restart_in:.0f} seconds; your progress up to the last "
                     "round is kept.")
        self.text.setText(text)
        self.details.setPlainText(problem.details or "(no output)")
        self.details.verticalScrollBar().setValue(self.details.verticalScrollBar().maximum())
        self.settings_button.setVisible(problem.needs_settings)
        self.restart_button.setVisible(problem.restart_in is not None)
        self.show()
        self.raise_()

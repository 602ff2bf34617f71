"""Joining a swarm from an invite: the "Join this swarm?" dialog and the "Paste an invite" field.

An invite (`sapling://join?relay=...`, the relay's `https://HOST/join?...`
page, or a bare `ws(s)://` address; `engine.common.rules.parse_invite`) arrives on
the command line, from a running Sapling's single-instance channel, from the
macOS open-URL event, or pasted into Settings ▸ Swarm or the first-run dialog.
Before anything is saved, the relay's information document is fetched
(`engine.common.joining.preview_invite`, on a worker thread: the window never waits)
and shown: the swarm's name, who runs it, open or private, peers online, the
relay's software and protocol version, and what joining shares. A relay that
cannot be reached, speaks another protocol version or sends a malformed
document is one sentence in the dialog, and nothing is saved.

    QT_QPA_PLATFORM=offscreen python -m app.join 'sapling://join?relay=...'   # the dialog alone
"""

from __future__ import annotations

import logging
import sys
import threading
from html import escape

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app import theme
from engine.common.claims import JOINING
from engine.common.errors import SaplingError
from engine.common.joining import NEVER_SHARED, SHARED, Preview, preview_invite
from engine.common.model_policy import describe_model_policy

log = logging.getLogger(__name__)


class PreviewFetcher(QObject):
    """Fetches an invite's preview on a worker thread; `done` carries a Preview or one sentence (str)."""

    done = Signal(object)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._generation = 0
        self._relay = _Relay(self)
        self._relay.result.connect(self._deliver)

    def fetch(self, text: str) -> None:
        """Ask for `text`'s preview; an earlier request still running is forgotten."""
        self._generation += 1
        generation, relay = self._generation, self._relay

        def work() -> None:
            try:
                result: object = preview_invite(text)
            except SaplingError as exc:
                result = str(exc)
            except Exception as exc:  # a bug: logged, and said in the dialog rather than lost
                log.exception("previewing an invite failed")
                result = f"Sapling could not read this invite ({type(exc).__name__}); the details are in its log."
            try:
                relay.result.emit(generation, result)
            except RuntimeError:  # the dialog was closed and deleted while the relay was being asked
                pass

        threading.Thread(target=work, name="invite-preview", daemon=True).start()

    def cancel(self) -> None:
        self._generation += 1

    def _deliver(self, generation: int, result: object) -> None:
        if generation == self._generation:
            self.done.emit(result)


class _Relay(QObject):
    """Carries a worker thread's result to the GUI thread (a queued signal)."""

    result = Signal(int, object)


def _bullets(items: tuple[str, ...]) -> str:
    return "".join(f"<li>{escape(item)}</li>" for item in items)


SHARING_HTML = (f"<b>Joining shares</b><ul style='margin-top:2px'>{_bullets(SHARED)}</ul>"
                f"<b>Never shared</b><ul style='margin-top:2px'>{_bullets(NEVER_SHARED)}</ul>")


def dataset_words(license_id: str | None) -> str:
    """What the relay's information document says of the swarm's dataset (the relay's `--dataset-dir`)."""
    if license_id is None:
        return "None: the relay says it keeps no dataset of what is shared"
    return f"Answers you share may be published in this swarm's dataset, license {license_id}"


class SwarmPreview(QFrame):
    """What a relay says about its swarm, or why it could not be asked."""

    FIELDS = (("swarm", "Swarm"), ("operator", "Run by"), ("policy", "Who may join"), ("models", "Models"),
              ("dataset", "Dataset"), ("online", "Peers online"), ("software", "Relay software"), ("relays", "Relays"))

    def __init__(self, show_sharing: bool = True, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("card")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 10, 14, 10)
        self.status = QLabel()
        self.status.setTextFormat(Qt.TextFormat.PlainText)  # sentences may quote what a relay or a link said
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.status)
        self.form = QFormLayout()
        self.form.setHorizontalSpacing(14)
        self.values: dict[str, QLabel] = {}
        for key, caption in self.FIELDS:
            label = QLabel()
            label.setWordWrap(True)
            label.setTextFormat(Qt.TextFormat.PlainText)  # everything here comes from a stranger's server
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            name = QLabel(caption)
            name.setObjectName("fieldName")
            self.values[key] = label
            self.form.addRow(name, label)
        layout.addLayout(self.form)
        self.description = QLabel()
        self.description.setWordWrap(True)
        self.description.setTextFormat(Qt.TextFormat.PlainText)
        self.description.setObjectName("muted")
        layout.addWidget(self.description)
        self.sharing = QLabel(SHARING_HTML)
        self.sharing.setWordWrap(True)
        self.sharing.setVisible(show_sharing)
        layout.addWidget(self.sharing)
        self.clear()

    def _details(self, visible: bool) -> None:
        for key, _caption in self.FIELDS:
            label = self.values[key]
            label.setVisible(visible)
            self.form.labelForField(label).setVisible(visible)
        self.description.setVisible(visible and bool(self.description.text()))

    def clear(self) -> None:
        self.status.setText("")
        self.status.hide()
        self._details(False)

    def show_loading(self, text: str) -> None:
        self.status.setStyleSheet(f"color: {theme.MUTED};")
        self.status.setText(f"Asking the relay about this swarm… ({text[:80]}{'…' if len(text) > 80 else ''})")
        self.status.show()
        self._details(False)

    def show_refusal(self, sentence: str) -> None:
        """The relay answered, and the swarm is one this node's settings refuse: the details stay, with why."""
        self.status.setStyleSheet(f"color: {theme.ERROR}; font-weight: 600;")
        self.status.setText(sentence)
        self.status.show()

    def show_error(self, sentence: str) -> None:
        self.status.setStyleSheet(f"color: {theme.ERROR}; font-weight: 600;")
        self.status.setText(sentence)
        self.status.show()
        self._details(False)

    def show_preview(self, preview: Preview) -> None:
        info = preview.info
        token = ""
        if info.private:
            token = " (your invite carries the token)" if preview.invite.token else " (your invite has no token)"
        relays = preview.invite.relays
        values = {
            "swarm": preview.name,
            "operator": " · ".join(part for part in (info.operator, info.contact) if part) or "not given",
            "policy": info.policy_words() + token,
            "models": describe_model_policy(info.models),
            "dataset": dataset_words(info.dataset_license),
            "online": f"{info.live.peers_online:,}" + (f" · {info.live.batches_last_hour:,} batches shared in the last "
                                                        "hour" if info.live.batches_last_hour else ""),
            "software": f"{info.software} {info.version}, swarm protocol {info.protocol}",
            "relays": "\n".join(relays) if len(relays) <= 3 else "\n".join(relays[:3])
            + f"\n… and {len(relays) - 3} more",
        }
        for key, text in values.items():
            self.values[key].setText(text)
        self.description.setText(info.description)
        self.status.setStyleSheet(f"color: {theme.ACCENT_DARK}; font-weight: 600;")
        self.status.setText(f"The relay at {preview.relay} answered.")
        self.status.show()
        self._details(True)


class JoinDialog(QDialog):
    """"Join this swarm?": the invite's preview, then Join (accept) or Cancel (nothing changes)."""

    def __init__(self, text: str, parent: QWidget | None = None, refuse_datasets: bool = False) -> None:
        """`refuse_datasets`: swarm.refuse_dataset_swarms, so a swarm that keeps a dataset cannot be joined here."""
        super().__init__(parent)
        self.text = text
        self.refuse_datasets = refuse_datasets
        self.preview: Preview | None = None
        self.setWindowTitle("Join this swarm?")
        self.setWindowIcon(theme.icon())
        self.setMinimumWidth(560)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(20, 18, 20, 14)
        layout.setSpacing(10)
        title = QLabel("Join this swarm?")
        title.setObjectName("title")
        layout.addWidget(title)
        body = QWidget()
        column = QVBoxLayout(body)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(10)
        intro = QLabel("Your computer would train with the computers in this swarm: it shares its practice answers "
                       f"with them and trains on theirs. {JOINING.text} You can leave at any time in Settings.")
        intro.setWordWrap(True)
        column.addWidget(intro)
        self.card = SwarmPreview()
        column.addWidget(self.card)
        # A 1366x768 laptop at 125% leaves 614 pixels: the relay's answer and the sharing list scroll there, the
        # title and the buttons stay in view (and the title's height is part of what the body leaves).
        self.body = body
        self.body_scroll = theme.FitScroll(body, leave=theme.DIALOG_LEAVE + 40)
        layout.addWidget(self.body_scroll, 1)
        layout.addLayout(self._buttons())
        self.fetcher = PreviewFetcher(self)
        self.fetcher.done.connect(self._on_preview)
        self.retry()

    def _buttons(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.retry_button = QPushButton("Try again")
        self.retry_button.clicked.connect(self.retry)
        self.retry_button.hide()
        row.addWidget(self.retry_button)
        row.addStretch(1)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.reject)
        self.join_button = QPushButton("Join")
        self.join_button.setObjectName("primary")
        self.join_button.setEnabled(False)
        self.join_button.clicked.connect(self.accept)
        row.addWidget(self.cancel_button)
        row.addWidget(self.join_button)
        return row

    def retry(self) -> None:
        self.preview = None
        self.join_button.setEnabled(False)
        self.retry_button.hide()
        self.card.show_loading(self.text)
        self._fit()
        self.fetcher.fetch(self.text)

    def _on_preview(self, result: object) -> None:
        if isinstance(result, Preview) and self.refuse_datasets and result.info.dataset_license is not None:
            self.card.show_preview(result)
            self.card.show_refusal(f"Your settings refuse swarms that publish a dataset of the answers shared in "
                                   f"them, and this one does (license {result.info.dataset_license}). To join it, "
                                   "turn that off in Settings first.")
        elif isinstance(result, Preview):
            self.preview = result
            self.card.show_preview(result)
            self.join_button.setEnabled(True)
            self.join_button.setDefault(True)
            self.join_button.setFocus()
        else:
            self.card.show_error(str(result))
            self.retry_button.show()
        self._fit()

    def _fit(self) -> None:
        """As tall as the relay's answer needs (within the screen): the body's own layout runs first, so the
        scrolling area asks for what the answer added rather than for the card before it came."""
        layout = self.body.layout()
        if layout is not None:
            layout.activate()
        self.body_scroll.updateGeometry()
        theme.fit_to_contents(self)

    def done(self, result: int) -> None:
        code = getattr(result, "value", result)
        if code == QDialog.DialogCode.Accepted.value and self.preview is None:
            return  # Join is only possible once the relay has answered
        self.fetcher.cancel()
        super().done(result)


class InviteField(QWidget):
    """The "Paste an invite" field of Settings ▸ Swarm and the first-run dialog, with the same preview.

    `preview` holds the relay's answer for exactly the text in the field (None
    while it is being asked, after an error, or when the text changed since)."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(4)
        row = QHBoxLayout()
        self.edit = QLineEdit()
        self.edit.setPlaceholderText("Paste an invite: sapling://join?…, https://…/join?… or wss://…/ws")
        self.edit.setMaxLength(16_384)
        self.check_button = QPushButton("Check")
        self.check_button.setToolTip("Ask the relay who runs this swarm before you save")
        self.check_button.clicked.connect(self.check)
        row.addWidget(self.edit, 1)
        row.addWidget(self.check_button)
        layout.addLayout(row)
        self.card = SwarmPreview(show_sharing=False)
        self.card.hide()
        layout.addWidget(self.card)
        self.preview: Preview | None = None
        self.checked_text = ""
        self.fetcher = PreviewFetcher(self)
        self.fetcher.done.connect(self._on_preview)
        self.edit.textEdited.connect(self._edited)
        self.edit.returnPressed.connect(self.check)

    def text(self) -> str:
        return self.edit.text().strip()

    def set_text(self, text: str) -> None:
        self.edit.setText(text)
        self._edited()

    def check(self) -> None:
        text = self.text()
        self.preview = None
        self.checked_text = text
        self.card.show()
        if not text:
            self.card.show_error("Paste the invite link you were given first.")
            return
        self.card.show_loading(text)
        self.fetcher.fetch(text)

    def _edited(self) -> None:
        self.preview = None
        self.checked_text = ""
        self.fetcher.cancel()
        self.card.clear()
        self.card.hide()
        self.changed.emit()

    def _on_preview(self, result: object) -> None:
        if isinstance(result, Preview):
            self.preview = result
            self.card.show_preview(result)
        else:
            self.card.show_error(str(result))
        self.changed.emit()


def main(argv: list[str]) -> int:
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    if not isinstance(app, QApplication) or len(argv) != 1:
        print("usage: python -m app.join INVITE", file=sys.stderr)
        return 2
    theme.apply(app)
    dialog = JoinDialog(argv[0])
    result = dialog.exec()
    print("joined" if getattr(result, "value", result) == QDialog.DialogCode.Accepted.value else "cancelled",
          dialog.preview.link() if dialog.preview else "")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

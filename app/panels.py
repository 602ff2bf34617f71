"""The swarm panel, the log view, and the window's small cards (banners, headline tiles).

`PeersPanel` says where this node is: the swarm's name and the relay in use
(from the `swarm` event, or the settings before training starts), with a
"Switch swarm…" button, and, when its link to the relay was lost, that it is
cut off and trying again, or since when it is back; then the computers
online (from the newer of the `swarm` and `peers` events, so the count is
there as soon as the relay answers) and the latest `peers` event: rollouts
received, accepted and rejected, why they were rejected, and a row per peer.
`LogView` shows the engine's log events and its stderr, batched so a burst of
lines costs one repaint, and capped at `LogView.MAX_LINES` lines.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import Qt, QTimer, QUrl, Signal
from PySide6.QtGui import (
    QColor,
    QDesktopServices,
    QFont,
    QFontDatabase,
    QResizeEvent,
    QTextCharFormat,
    QTextCursor,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app import theme
from app.session import Session, number

# The engine's reasons (engine/swarm/exchange.py), in words.
REASONS = {
    "malformed": "Malformed",
    "bad_signature": "Signature did not verify",
    "stale": "Too old",
    "unknown_task": "Unknown task",
    "question_mismatch": "Question did not match its task",
    "forged_reward": "Claimed reward was wrong",
    "too_long": "Over the length limit",
    "duplicate": "Seen before",
    "zero_advantage": "Same score for every answer",
    "banned": "From a banned peer",
    "implausible": "Improbable text for our model (possible injection)",
    "not_picked": "Not needed this round",
}


def reason_text(reason: str) -> str:
    return REASONS.get(reason, reason.replace("_", " ").strip().capitalize() or "Other")


def _count(value: Any) -> str:
    n = number(value)
    return "–" if n is None else f"{int(n):,}"


class Banner(QFrame):
    """A coloured strip with a message and optional buttons; closes itself on ✕."""

    def __init__(self, level: str, text: str, actions: list[tuple[str, Callable[[], None]]] | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("banner")
        self.setProperty("level", level)
        row = QHBoxLayout(self)
        row.setContentsMargins(12, 6, 6, 6)
        self.label = QLabel(text)
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        row.addWidget(self.label, 1)
        for title, callback in actions or []:
            button = QPushButton(title)
            button.clicked.connect(callback)
            row.addWidget(button)
        close = QPushButton("×")
        close.setToolTip("Dismiss")
        close.setFlat(True)
        close.setFixedSize(30, 30)
        close.setStyleSheet("QPushButton { padding: 0px; border: none; font-size: 18px; color: #5f6b76; }")
        close.clicked.connect(self.deleteLater)
        row.addWidget(close)


class Tile(QFrame):
    """A headline number with its name and a small note under it."""

    def __init__(self, name: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("card")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 8, 10, 8)
        layout.setSpacing(0)
        self.name = theme.ElidedLabel(name)  # a small screen shortens the name and the note with "…", never the value
        self.name.setObjectName("kpiName")
        self.value = QLabel("–")
        self.value.setObjectName("kpiValue")
        self.note = theme.ElidedLabel(" ")
        self.note.setObjectName("muted")
        for label in (self.name, self.value, self.note):
            layout.addWidget(label)

    def set(self, value: str, note: str = " ") -> None:
        self.value.setText(value)
        self.note.setText(note or " ")


def share_width(wants: list[int], room: int) -> list[int]:
    """Widths for items that want `wants` in a row of `room`: what each wants where the row has it all;
    otherwise the widest give way first (every item gets min(want, level), the level as high as `room`
    allows), so short texts stay whole and only the longest are shortened."""
    if sum(wants) <= room or not wants:
        return list(wants)
    level, left = 0, max(room, 0)
    for count, want in enumerate(sorted(wants)):
        others = len(wants) - count
        if want * others > left:
            level = left // others
            break
        left -= want
    return [min(want, level) for want in wants]


class TileRow(QWidget):
    """The headline tiles side by side. Each is as wide as its text where the window has room, the rest of the
    row shared in proportion; on a narrower window the widest tiles give way first (share_width), their notes
    ending in "…", so a short name such as "Speed" is never cut to make room beside it."""

    def __init__(self, tiles: list[Tile], spacing: int = 8, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.tiles = tiles
        self.row = QHBoxLayout(self)
        self.row.setContentsMargins(0, 0, 0, 0)
        self.row.setSpacing(spacing)
        for tile in tiles:
            self.row.addWidget(tile)

    def refit(self) -> None:
        """Call after a tile's text changes (the window does, after each refresh)."""
        wants = [tile.sizeHint().width() for tile in self.tiles]
        room = self.width() - self.row.spacing() * (len(self.tiles) - 1)
        for index, width in enumerate(share_width(wants, room)):
            self.row.setStretch(index, max(1, width))  # the layout shares the whole row in these proportions

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self.refit()


# How long the swarm panel says the link is back after it was lost.
BACK_NOTE_S = 600.0


def link_note(swarm: dict[str, Any], now: float) -> str:
    """The swarm panel's words about a relay link lost this run: cut off and trying again, or back (for
    BACK_NOTE_S); "" when it never was lost or that is long past."""
    lost = number(swarm.get("lost_at"))
    if not swarm.get("relay") or lost is None:
        return ""
    at = time.strftime("%H:%M", time.localtime(lost))
    if not swarm.get("connected"):
        return (f"Cut off from the relay since {at}. Sapling keeps trying to reconnect; meanwhile it trains on "
                "this computer's own rollouts.")
    back = number(swarm.get("since"))
    if back is None or now - back > BACK_NOTE_S:
        return ""
    return f"Back in touch with the relay since {time.strftime('%H:%M', time.localtime(back))} (cut off at {at})."


def swarm_place(swarm: dict[str, Any], mode: str, invite_name: str, first_relay: str) -> tuple[str, str]:
    """(the swarm's name, the relay in use) in words, from the `swarm` event or, before it, the settings."""
    local = ("Local swarm on this computer", "this computer (nothing leaves it)")
    alone = ("Training alone", "none: nothing is shared")
    if not swarm:
        if mode == "relay":
            return invite_name or "A community swarm", first_relay
        return alone if mode == "solo" else local
    relay = swarm.get("relay")
    if not relay:
        return alone
    name = str(swarm.get("swarm_name") or "")
    if relay == "embedded" or (not name and mode == "embedded"):  # hosting, or joined another node's local relay
        return local
    return name or str(swarm.get("relay_name") or "") or "A community swarm", str(relay)


def data_note(today: Any) -> tuple[str, bool]:
    """The swarm panel's line on today's traffic (the `peers` event's data_today), and whether a cap is reached."""
    if not isinstance(today, dict):
        return "", False

    def size(key: str) -> float:
        return number(today.get(key)) or 0.0

    def mb(n: float) -> str:
        return f"{n / 1e6:.1f} MB" if n < 1e8 else f"{n / 1e6:,.0f} MB"

    sent, received, up_cap, down_cap = (size(k) for k in ("sent_bytes", "received_bytes", "upload_cap_bytes",
                                                             "download_cap_bytes"))
    up = f"{mb(sent)} sent" + (f" of {mb(up_cap)}" if up_cap else "")
    down = f"{mb(received)} received" + (f" of {mb(down_cap)}" if down_cap else "")
    capped = bool(up_cap and sent >= up_cap) or bool(down_cap and received >= down_cap)
    tail = " · daily cap reached: training on this computer's own rollouts until midnight" if capped else ""
    return f"Data today: {up} · {down}{tail}", capped


class PeersPanel(QFrame):
    unbanRequested = Signal(str)  # a peer id whose earned ban the user chose to lift
    switchRequested = Signal()  # "Switch swarm…"

    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("card")
        self.session = session
        self.settings_place: Callable[[], tuple[str, str, str]] = lambda: ("embedded", "", "")  # mode, name, relay
        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 12, 14, 12)
        layout.setSpacing(8)
        layout.addLayout(self._where())

        top = QHBoxLayout()
        self.online = QLabel("–")
        self.online.setObjectName("bigNumber")
        self.online_label = QLabel("online in the swarm")
        self.online_label.setToolTip("Computers connected to the relay, this one included")
        self.online_label.setObjectName("muted")
        top.addWidget(self.online)
        top.addWidget(self.online_label, 1, Qt.AlignmentFlag.AlignBottom)
        layout.addLayout(top)

        counts = QGridLayout()
        counts.setHorizontalSpacing(14)
        self.received, self.accepted, self.rejected = QLabel("–"), QLabel("–"), QLabel("–")
        for column, (name, label) in enumerate((("Rollouts received", self.received), ("Accepted", self.accepted),
                                                  ("Rejected", self.rejected))):
            caption = QLabel(name)
            caption.setToolTip("Answers from other computers; each is checked and re-scored here before use")
            caption.setObjectName("muted")
            label.setObjectName("kpiValue")
            counts.addWidget(label, 0, column)
            counts.addWidget(caption, 1, column)
        layout.addLayout(counts)
        self.data = QLabel()  # today's traffic and the daily caps: `data_note`
        self.data.setObjectName("muted")
        self.data.setWordWrap(True)
        self.data.hide()
        layout.addWidget(self.data)

        self.reasons = self._table(["Why rejected", "Count"])
        self.peer_table = self._table(["Peer", "Accepted", "Rejected", "Status"])
        self.peer_table.cellDoubleClicked.connect(self._on_peer_clicked)
        self._peer_ids: list[str] = []
        self._earned_bans: set[str] = set()
        layout.addWidget(self.reasons, 1)
        layout.addWidget(self.peer_table, 1)
        self.note = QLabel()
        self.note.setObjectName("muted")
        self.note.setWordWrap(True)
        layout.addWidget(self.note)
        session.peersChanged.connect(self.refresh)
        session.swarmChanged.connect(self.refresh)
        self.refresh()

    def _where(self) -> QVBoxLayout:
        where = QVBoxLayout()
        where.setSpacing(0)
        top = QHBoxLayout()
        title = QLabel("Swarm")
        title.setObjectName("sectionTitle")
        self.switch_button = QPushButton("Switch swarm…")
        self.switch_button.setToolTip("Join another swarm with an invite, or go back to the local one")
        self.switch_button.clicked.connect(self.switchRequested)
        top.addWidget(title)
        top.addStretch(1)
        top.addWidget(self.switch_button)
        where.addLayout(top)
        self.swarm_name = QLabel()
        self.swarm_name.setStyleSheet("font-weight: 600;")
        self.relay = QLabel()
        self.relay.setObjectName("muted")
        for label in (self.swarm_name, self.relay):
            label.setTextFormat(Qt.TextFormat.PlainText)  # the name comes from a relay or an invite
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            label.setWordWrap(True)
            label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        where.addWidget(self.swarm_name)
        where.addWidget(self.relay)
        self.link = QLabel()  # cut off from the relay, or back: `link_note`
        self.link.setWordWrap(True)
        self.link.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.link.hide()
        where.addWidget(self.link)
        return where

    def refresh_place(self) -> None:
        mode, invite_name, first_relay = self.settings_place()
        name, relay = swarm_place(self.session.swarm, mode, invite_name, first_relay)
        self.swarm_name.setText(name)
        self.swarm_name.setToolTip(name)
        self.relay.setText(f"Relay: {relay}")
        note = link_note(self.session.swarm, time.time()) if self.session.state != "stopped" else ""
        self.link.setText(note)
        self.link.setStyleSheet(f"color: {theme.ERROR if not self.session.swarm.get('connected') else theme.ACCENT};")
        self.link.setVisible(bool(note))

    @staticmethod
    def _table(headers: list[str]) -> QTableWidget:
        table = QTableWidget(0, len(headers))
        table.setHorizontalHeaderLabels(headers)
        table.verticalHeader().setVisible(False)
        table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        table.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        table.setShowGrid(False)
        table.setAlternatingRowColors(True)
        table.setWordWrap(False)
        table.setTextElideMode(Qt.TextElideMode.ElideRight)
        table.verticalHeader().setDefaultSectionSize(24)
        header = table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for column in range(1, len(headers)):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        table.setMinimumHeight(70)
        return table

    @staticmethod
    def _fill(table: QTableWidget, rows: list[list[str]], empty: str) -> None:
        if not rows:
            rows = [[empty] + [""] * (table.columnCount() - 1)]
        table.setRowCount(len(rows))
        for r, row in enumerate(rows):
            for c, text in enumerate(row):
                item = QTableWidgetItem(text)
                item.setToolTip(text)
                if c > 0:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                table.setItem(r, c, item)

    def refresh(self) -> None:
        self.refresh_place()
        peers, swarm = self.session.peers, self.session.swarm
        solo = bool(swarm) and not swarm.get("relay")
        online = self.session.online
        self.online.setText(_count(online))
        self.online_label.setText("online in the swarm (just you)" if online == 1 else "online in the swarm")
        self.received.setText(_count(peers.get("received")))
        self.accepted.setText(_count(peers.get("accepted")))
        self.rejected.setText(_count(peers.get("rejected")))
        data, capped = data_note(peers.get("data_today"))
        self.data.setText(data)
        self.data.setStyleSheet(f"color: {theme.WARNING};" if capped else "")
        self.data.setVisible(bool(data))
        reasons = peers.get("rejected_by_reason") or {}
        ranked = sorted(reasons.items(), key=lambda kv: (-(number(kv[1]) or 0), str(kv[0])))
        self._fill(self.reasons, [[reason_text(str(k)), _count(v)] for k, v in ranked], "None rejected")
        by_peer = peers.get("by_peer") or {}
        peer_rows = []
        self._earned_bans = set()
        for peer_id, info in by_peer.items():
            info = info if isinstance(info, dict) else {}
            name = str(info.get("name") or "unnamed")
            ban = info.get("banned")
            status = "ok"
            probation = number(info.get("probation")) or 0  # another model's answers taken before its baseline existed
            if probation:
                status = f"ok · another model, {int(probation):,} taken on probation"
            if isinstance(ban, dict):
                earned = ban.get("source") != "config"
                status = f"banned: {reason_text(str(ban.get('reason', '')))}" + (" (double-click to lift)" if earned
                                                                                 else " (in Settings)")
                if earned:
                    self._earned_bans.add(str(peer_id))
            peer_rows.append((number(info.get("accepted")) or 0, str(peer_id), [f"{name} · {str(peer_id)[:8]}",
                              _count(info.get("accepted")), _count(info.get("rejected")), status]))
        peer_rows.sort(key=lambda r: -r[0])
        self._peer_ids = [r[1] for r in peer_rows]
        self._fill(self.peer_table, [r[2] for r in peer_rows], "No peers yet")
        if solo:
            self.note.setText("Training alone: nothing is shared. Choose a swarm in Settings to join one.")
        elif not peers:
            self.note.setText("Rollouts from other computers appear here once they join your swarm.")
        else:
            self.note.setText("Every rollout is re-checked on this computer; rewards are never taken on trust.")


    def _on_peer_clicked(self, row: int, _column: int) -> None:
        """Double-clicking a peer this node banned asks whether to lift the ban."""
        if not 0 <= row < len(self._peer_ids) or self._peer_ids[row] not in self._earned_bans:
            return
        peer_id = self._peer_ids[row]
        answer = QMessageBox.question(
            self, "Lift the ban?",
            f"This computer stopped using rollouts from peer {peer_id[:8]} because they failed its checks. "
            "Lift the ban and check its rollouts again?",
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.unbanRequested.emit(peer_id)


class LogView(QWidget):
    """Engine log lines and stderr, coloured by level, appended in batches."""

    MAX_LINES = 3000
    FLUSH_MS = 150

    def __init__(self, log_dir: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.log_dir = log_dir
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        bar = QHBoxLayout()
        title = QLabel("Log")
        title.setObjectName("sectionTitle")
        bar.addWidget(title)
        bar.addStretch(1)
        copy = QPushButton("Copy")
        copy.setToolTip("Copy the whole log to the clipboard")
        copy.clicked.connect(self.copy_all)
        folder = QPushButton("Open log folder")
        folder.setToolTip(log_dir)
        folder.clicked.connect(lambda: QDesktopServices.openUrl(QUrl.fromLocalFile(self.log_dir)))
        bar.addWidget(copy)
        bar.addWidget(folder)
        layout.addLayout(bar)
        self.text = QPlainTextEdit()
        self.text.setObjectName("log")
        self.text.setReadOnly(True)
        self.text.setMaximumBlockCount(self.MAX_LINES)
        self.text.setPlaceholderText("The engine's messages appear here while it runs.")
        self.text.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        font = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        font.setPointSizeF(max(8.0, QFont().pointSizeF() - 1))
        self.text.setFont(font)
        layout.addWidget(self.text)
        self.pending: list[tuple[str, str]] = []
        self.formats = {level: self._format(colour) for level, colour in (
            ("error", theme.ERROR), ("critical", theme.ERROR), ("warning", theme.WARNING),
            ("stderr", "#7b8794"), ("debug", "#7b8794"), ("info", theme.TEXT))}
        self.timer = QTimer(self)
        self.timer.setSingleShot(True)
        self.timer.setInterval(self.FLUSH_MS)
        self.timer.timeout.connect(self.flush)

    @staticmethod
    def _format(colour: str) -> QTextCharFormat:
        fmt = QTextCharFormat()
        fmt.setForeground(QColor(colour))
        return fmt

    def add(self, level: str, source: str, message: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        tag = "" if level in ("stderr", "info") else f"{level} "
        for n, line in enumerate(message.splitlines() or [""]):
            prefix = f"{stamp} {tag}{source}: " if n == 0 else " " * 9
            self.pending.append((level, prefix + line))
        if len(self.pending) > self.MAX_LINES:
            del self.pending[: -self.MAX_LINES]
        if not self.timer.isActive():
            self.timer.start()

    def flush(self) -> None:
        if not self.pending:
            return
        bar = self.text.verticalScrollBar()
        at_bottom = bar.value() >= bar.maximum() - 4
        cursor = QTextCursor(self.text.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.beginEditBlock()
        empty = self.text.document().isEmpty()
        for level, line in self.pending:
            if not empty:
                cursor.insertBlock()
            empty = False
            cursor.insertText(line, self.formats.get(level, self.formats["info"]))
        cursor.endEditBlock()
        self.pending.clear()
        if at_bottom:
            bar.setValue(bar.maximum())

    def copy_all(self) -> None:
        self.flush()
        QApplication.clipboard().setText(self.text.toPlainText())

    def lines(self) -> list[str]:
        self.flush()
        return self.text.toPlainText().splitlines()

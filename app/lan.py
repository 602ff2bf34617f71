"""Swarms on this network, in the Switch swarm dialog: the relays that announce themselves here (mDNS).

`NearbySwarms` looks for a few seconds (engine/common/lan.py's `discover`, on a
worker thread so the window stays responsive) and lists what answered, by
name and address. Picking one fills the invite field with its address, and
the field asks that relay who runs it and shows the same preview as a pasted
invite ("Join this swarm?"): nothing is joined until the user saves.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QListWidget, QListWidgetItem, QPushButton, QVBoxLayout, QWidget

from engine.common.lan import DISCOVER_SECONDS, FoundSwarm, discover

log = logging.getLogger(__name__)

Discover = Callable[[float], list[FoundSwarm]]


class NearbySwarms(QWidget):
    """A "Look on this network" button and the swarms found; `chosen(url)` when the user picks one."""

    chosen = Signal(str)
    finished = Signal()  # a look ended (the list is filled)
    _results = Signal(object)  # list[FoundSwarm] or an error sentence, from the worker thread

    def __init__(self, find: Discover = discover, seconds: float = DISCOVER_SECONDS,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.discover = find
        self.seconds = seconds
        self.found: list[FoundSwarm] = []
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        self.look_button = QPushButton("Look for swarms on this network")
        self.look_button.setToolTip("Relays that announce themselves here: a club's or a family's computers. "
                                    "Their answers are checked like any other swarm's.")
        self.look_button.clicked.connect(self.look)
        self.status = QLabel("")
        self.status.setObjectName("muted")
        self.status.setWordWrap(True)
        row.addWidget(self.look_button)
        row.addWidget(self.status, 1)
        layout.addLayout(row)
        self.list = QListWidget()
        self.list.setMaximumHeight(90)
        self.list.hide()
        self.list.itemClicked.connect(self._picked)
        layout.addWidget(self.list)
        self._results.connect(self._show)

    def look(self) -> None:
        self.look_button.setEnabled(False)
        self.status.setText(f"Looking on this network for {self.seconds:g} s…")
        threading.Thread(target=self._work, name="lan-discover", daemon=True).start()

    def _work(self) -> None:
        try:
            found: object = self.discover(self.seconds)
        except OSError as exc:
            found = f"Could not look on this network ({exc.strerror or exc})."
        self._results.emit(found)

    def _show(self, found: object) -> None:
        self.look_button.setEnabled(True)
        self.list.clear()
        self.found = list(found) if isinstance(found, list) else []
        for swarm in self.found:
            item = QListWidgetItem(f"{swarm.name}  ·  {swarm.url}")
            item.setData(Qt.ItemDataRole.UserRole, swarm.url)
            item.setToolTip(f"Its information: {swarm.info_url}")
            self.list.addItem(item)
        self.list.setVisible(bool(self.found))
        if isinstance(found, str):
            self.status.setText(found)
        elif self.found:
            self.status.setText("Pick one to see who runs it before you join.")
        else:
            self.status.setText("No swarm announced itself on this network.")
        self.finished.emit()

    def _picked(self, item: QListWidgetItem) -> None:
        self.chosen.emit(str(item.data(Qt.ItemDataRole.UserRole)))

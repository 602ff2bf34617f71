"""The "Your contribution" card: what other peers did with this node's rollouts, and a small chart over time.

    card = ContributionCard()
    engine_process.eventReceived.connect(card.handle)     # reads `contribution` events, ignores the rest

The numbers are the relay's, counted from the receipts other peers send
about this node's rollouts (docs/protocol.md, "Credit"); the engine forwards
them as `contribution` events (docs/engine-events.md) with the sentence to
show ("Your rollouts were used by 7 peers today (312 rollouts).") and, when
peers reject more than a quarter of what they judged, a warning naming the
main reason and what to do. Both sentences are the engine's
(engine/swarm/contribution.py): the app only shows them. The chart is the
event's history: rollouts used by others, all time, over the last two days.

Below the numbers, where this node's model stands on the swarm's results
table: the engine's sentence from the relay's own score of its evaluation
answers (`standing` events, engine/swarm/results.py), with the place.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPaintEvent, QPen
from PySide6.QtWidgets import QFrame, QLabel, QSizePolicy, QVBoxLayout, QWidget

from app import theme

log = logging.getLogger(__name__)

EMPTY = "Once peers use your rollouts, the relay counts it from their receipts and it shows here."


def _n(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def details(credit: Mapping[str, Any]) -> str:
    """The numbers under the sentence: today's, then all time's."""
    day, total = credit.get("day") or {}, credit.get("all") or {}
    rejected_day = sum(_n(v) for v in (day.get("rejected") or {}).values())
    return (f"Today: {_n(day.get('sampled')):,} sampled by peers, {_n(day.get('used')):,} used, "
            f"{rejected_day:,} rejected.   All time: {_n(total.get('used')):,} used by "
            f"{_n(total.get('peers')):,} peers, {_n(total.get('shared')):,} shared.")


class Sparkline(QWidget):
    """A small line of (time, value) points, with the newest value at its end."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.points: list[tuple[float, float]] = []
        self.setMinimumSize(200, 60)
        self.setMaximumHeight(320)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.setToolTip("Rollouts of yours that other peers used, all time, over the last two days")

    def set_points(self, points: Sequence[tuple[float, float]]) -> None:
        self.points = sorted(points)
        self.update()

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        area = (QRectF(self.rect()).adjusted(4, 32, -8, -18) if self.height() >= 120
                else QRectF(self.rect()).adjusted(4, 16, -8, -6))
        painter.setPen(QColor(theme.MUTED))
        painter.drawText(QRectF(self.rect()).adjusted(4, 0, 0, 0),
                         Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop,
                         "Used by others, last 2 days")
        painter.setPen(QPen(QColor(theme.GRID), 1))
        painter.drawLine(area.bottomLeft(), area.bottomRight())
        if not self.points:
            return
        t0, t1 = self.points[0][0], max(self.points[-1][0], self.points[0][0] + 1)
        low = min(v for _, v in self.points)
        high = max(max(v for _, v in self.points), low + 1)

        def at(t: float, v: float) -> QPointF:
            return QPointF(area.left() + (t - t0) / (t1 - t0) * area.width(),
                           area.bottom() - (v - low) / (high - low) * area.height())

        path = QPainterPath(at(*self.points[0]))
        for t, v in self.points[1:]:
            path.lineTo(at(t, v))
        painter.setPen(QPen(QColor(theme.ACCENT), 2))
        painter.drawPath(path)
        end = at(*self.points[-1])
        painter.setBrush(QColor(theme.ACCENT))
        painter.drawEllipse(end, 3.0, 3.0)
        if area.height() >= 80:  # big enough for its scale: the first and newest values, and when they were
            painter.setPen(QColor(theme.MUTED))
            first, last = self.points[0], self.points[-1]
            painter.drawText(at(*first) + QPointF(4, -6), f"{first[1]:,.0f}")
            painter.drawText(QRectF(area.left(), area.top() - 14, area.width() - 8, 14),
                             Qt.AlignmentFlag.AlignRight, f"{last[1]:,.0f} now")
            hours = (last[0] - first[0]) / 3600
            painter.drawText(QRectF(area.left(), area.bottom() + 2, area.width(), 14), Qt.AlignmentFlag.AlignLeft,
                             f"{hours:.0f} h ago" if hours >= 1 else f"{hours * 60:.0f} min ago")


class ContributionCard(QFrame):
    """The relay's numbers for this node, in words, with the chart below them (the "Your contribution" tab)."""

    changed = Signal()  # after a `contribution` event filled it

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("card")
        self.credit: dict[str, Any] = {}
        text = QVBoxLayout(self)
        text.setContentsMargins(14, 10, 14, 10)
        text.setSpacing(3)
        title = QLabel("Your contribution")
        title.setObjectName("sectionTitle")
        self.message = QLabel(EMPTY)
        self.message.setWordWrap(True)
        self.numbers = QLabel("")
        self.numbers.setObjectName("muted")
        self.numbers.setWordWrap(True)
        self.warning = QLabel("")
        self.warning.setWordWrap(True)
        self.warning.setStyleSheet(f"background: {theme.WARNING_SOFT}; border: 1px solid #f0d9a0; "
                                   "border-radius: 6px; padding: 4px 8px;")
        self.warning.hide()
        self.source = QLabel("")
        self.source.setObjectName("muted")
        self.standing = QLabel("")  # where this node's model stands on the relay's results table (`standing`)
        self.standing.setObjectName("standing")
        self.standing.setWordWrap(True)
        self.standing.hide()
        self.place: tuple[int, int] | None = None  # (place, of) on the table, once the relay checked the answers
        self.chart = Sparkline()
        for widget in (title, self.message, self.numbers, self.warning, self.standing):
            text.addWidget(widget)
        text.addSpacing(8)
        text.addWidget(self.chart, 1)
        text.addSpacing(16)
        text.addWidget(self.source)
        text.addStretch(1)

    def handle(self, event: Mapping[str, Any]) -> None:
        """An engine event: `contribution` fills the card, `standing` its results line; the others are not its
        business."""
        kind = event.get("type")
        if kind not in ("contribution", "standing"):
            return
        try:
            if kind == "contribution":
                self.show_credit(event)
            else:
                self.show_standing(event)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            log.warning("skipped a %s event with a bad shape: %s", kind, exc)

    def show_standing(self, event: Mapping[str, Any]) -> None:
        """The engine's sentence on where this node's model stands; the place, when the relay checked it."""
        result = event["result"]
        if not isinstance(result, dict):
            raise TypeError("result must be an object")
        checked = result.get("checked") is True
        self.place = (_n(result["place"]), _n(result["of"])) if checked else None
        self.standing.setText(f"Results table: {event['message']}")
        self.standing.show()
        self.changed.emit()

    def show_credit(self, event: Mapping[str, Any]) -> None:
        credit = event["credit"]
        if not isinstance(credit, dict):
            raise TypeError("credit must be an object")
        self.credit = credit
        self.message.setText(str(event["message"]))
        self.numbers.setText(details(credit))
        warning = event.get("warning")
        self.warning.setText(str(warning) if warning else "")
        self.warning.setVisible(bool(warning))
        at = event.get("at")
        when = time.strftime("%H:%M", time.localtime(float(at))) if isinstance(at, (int, float)) else "just now"
        self.source.setText(f"Counted by the relay from other peers' receipts; as of {when}.")
        history = event.get("history") or []
        self.chart.set_points([(float(p[0]), float(p[1])) for p in history if isinstance(p, list) and len(p) >= 2])
        self.changed.emit()

    def used_today(self) -> int | None:
        """Rollouts of this node that peers used today, or None before the relay said anything."""
        day = self.credit.get("day")
        return _n(day.get("used")) if isinstance(day, dict) else None

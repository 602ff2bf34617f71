"""Colours, fonts and the style sheet: one light, calm look on every OS (Fusion + a palette).

Every colour the app draws comes from here, so the charts, the pills and the
tray dot agree. `icon()` loads the Sapling icon from assets/ (next to the
executable in a frozen build) and draws a stand-in if the files are missing.
"""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import QEvent, QObject, QPointF, QRectF, QSize, Qt, QTimer
from PySide6.QtGui import QBrush, QColor, QIcon, QPainter, QPainterPath, QPaintEvent, QPalette, QPixmap, QResizeEvent
from PySide6.QtWidgets import QApplication, QFrame, QLabel, QScrollArea, QWidget

ACCENT = "#2f855a"  # sapling green: own reward, primary buttons
ACCENT_DARK = "#276749"
ACCENT_SOFT = "#e6f4ea"
SWARM = "#6b46c1"  # the swarm's reward
EVAL = "#2b6cb0"  # held-out accuracy
SPEED = "#c05621"  # throughput
TEXT = "#1f2933"
MUTED = "#5f6b76"
BACKGROUND = "#f3f5f2"
CARD = "#ffffff"
BORDER = "#dfe5dd"
WARNING = "#b7791f"
WARNING_SOFT = "#fff8e6"
ERROR = "#c53030"
ERROR_SOFT = "#fdecec"
GRID = "#e9ede8"

PHASE_COLOURS = {
    "training": ACCENT,
    "starting": EVAL,
    "paused": WARNING,
    "waiting": WARNING,
    "scheduled": MUTED,
    "stopping": MUTED,
    "restarting": ERROR,
    "failed": ERROR,
    "idle": MUTED,
    "finished": MUTED,
}

STYLE_SHEET = f"""
QMainWindow, QDialog {{ background: {BACKGROUND}; }}
QWidget {{ color: {TEXT}; }}
QFrame#card {{ background: {CARD}; border: 1px solid {BORDER}; border-radius: 10px; }}
QLabel#title {{ font-size: 20px; font-weight: 600; }}
QLabel#sectionTitle {{ font-size: 14px; font-weight: 600; }}
QLabel#muted, QLabel#fieldName {{ color: {MUTED}; }}
QLabel#kpiValue {{ font-size: 20px; font-weight: 600; }}
QLabel#kpiName {{ color: {MUTED}; }}
QLabel#bigNumber {{ font-size: 28px; font-weight: 600; color: {ACCENT_DARK}; }}
QLabel#pill {{ border-radius: 10px; padding: 2px 10px; color: white; font-weight: 600; }}
QPushButton {{ padding: 6px 14px; border-radius: 6px; border: 1px solid {BORDER}; background: {CARD}; }}
QPushButton:hover {{ background: #f7faf6; border-color: #c9d3c6; }}
QPushButton:disabled {{ color: #9aa5ae; background: #f5f6f5; }}
QPushButton#primary {{ background: {ACCENT}; color: white; border: 1px solid {ACCENT_DARK}; font-weight: 600; }}
QPushButton#primary:hover {{ background: {ACCENT_DARK}; }}
QPushButton#primary:disabled {{ background: #a9c9b5; border-color: #a9c9b5; color: #f4f8f5; }}
QFrame#banner {{ border-radius: 8px; }}
QFrame#banner[level="warning"] {{ background: {WARNING_SOFT}; border: 1px solid #f0d9a0; }}
QFrame#banner[level="error"] {{ background: {ERROR_SOFT}; border: 1px solid #f2b8b8; }}
QFrame#banner[level="info"] {{ background: {ACCENT_SOFT}; border: 1px solid #bfe0c9; }}
QPlainTextEdit#log {{ background: #fbfcfb; border: 1px solid {BORDER}; border-radius: 6px; }}
QTableWidget {{ border: none; gridline-color: {GRID}; background: {CARD}; }}
QHeaderView::section {{ background: {CARD}; border: none; border-bottom: 1px solid {BORDER};
                        padding: 3px 6px; color: {MUTED}; font-weight: 600; }}
QProgressBar {{ border: none; background: {GRID}; border-radius: 3px; max-height: 6px; }}
QProgressBar::chunk {{ background: {ACCENT}; border-radius: 3px; }}
QGroupBox {{ font-weight: 600; border: 1px solid {BORDER}; border-radius: 8px; margin-top: 14px;
             padding: 12px 10px 8px 10px; background: {CARD}; }}
QGroupBox::title {{ subcontrol-origin: margin; left: 10px; padding: 0 4px; }}
"""


def apply(app: QApplication) -> None:
    app.setStyle("Fusion")
    palette = QPalette()
    palette.setColor(QPalette.ColorRole.Window, QColor(BACKGROUND))
    palette.setColor(QPalette.ColorRole.WindowText, QColor(TEXT))
    palette.setColor(QPalette.ColorRole.Base, QColor(CARD))
    palette.setColor(QPalette.ColorRole.AlternateBase, QColor("#f7f9f6"))
    palette.setColor(QPalette.ColorRole.Text, QColor(TEXT))
    palette.setColor(QPalette.ColorRole.Button, QColor(CARD))
    palette.setColor(QPalette.ColorRole.ButtonText, QColor(TEXT))
    palette.setColor(QPalette.ColorRole.Highlight, QColor(ACCENT))
    palette.setColor(QPalette.ColorRole.HighlightedText, QColor("white"))
    palette.setColor(QPalette.ColorRole.ToolTipBase, QColor(CARD))
    palette.setColor(QPalette.ColorRole.ToolTipText, QColor(TEXT))
    palette.setColor(QPalette.ColorRole.PlaceholderText, QColor("#8a959e"))
    app.setPalette(palette)
    app.setStyleSheet(STYLE_SHEET)


def fit_to_contents(window: QWidget) -> None:
    """Make a window at least as tall as its word-wrapped labels need at its width, and that tall now.

    A window manager sizes a window once, from its size hint, when it is mapped; a label that
    wraps onto more lines later (a relay's answer arriving) then squeezes its neighbours and is
    clipped, which an offscreen screenshot never shows. The height for the window's width is the
    layout's heightForWidth; it is capped at the screen's available height.
    """
    layout = window.layout()
    if layout is None:
        return
    layout.activate()
    width = max(window.width(), window.minimumSizeHint().width())
    height = layout.totalHeightForWidth(width) if layout.hasHeightForWidth() else layout.totalSizeHint().height()
    screen = window.screen()
    if screen is not None:
        height = min(height, screen.availableGeometry().height() - 40)
    window.setMinimumHeight(height)
    if window.height() < height:
        window.resize(width, height)


# Height a dialog needs besides its scrolling part: title bar, margins, the row of buttons.
DIALOG_LEAVE = 130


class FitScroll(QScrollArea):
    """A frameless, vertical-only scroll area: its content gets what it would get without it, and scrolls only
    when the window is shorter than the content's minimum.

    A 1366x768 laptop at 125% scaling gives the app 614 logical pixels, less than the welcome dialog's or the
    main window's minimum height: without this the window would reach past the bottom of the screen, with the
    dialog's buttons out of reach. The content is sized here (not by `widgetResizable`, which for content with
    wrapped labels asks for its preferred height and so scrolls where nothing needs to): as tall as the view,
    and never shorter than its minimum.
    """

    SMALLEST_HEIGHT = 160

    def __init__(self, content: QWidget, leave: int, parent: QWidget | None = None) -> None:
        """`leave`: the height the rest of the window needs; while the screen has that and the content's whole
        minimum, the area asks for the content's minimum (nothing scrolls), as the content would without it."""
        super().__init__(parent)
        self.content = content
        self.leave = leave
        self.setWidget(content)
        self.setWidgetResizable(False)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        # The content's minimum grows (a banner, a longer text): fit it again once its layout has run. The timer
        # is this area's child, so a fit pending when the area is deleted (a dialog closed) dies with it; a
        # static QTimer.singleShot would call into the deleted widget.
        self.refit = QTimer(self)
        self.refit.setSingleShot(True)
        self.refit.setInterval(0)
        self.refit.timeout.connect(self._fit)
        content.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.content and event.type() == QEvent.Type.LayoutRequest:
            self.refit.start()
        return super().eventFilter(watched, event)

    def _bar(self) -> int:
        return self.verticalScrollBar().sizeHint().width()

    def _fit(self) -> None:
        view = self.viewport().size()
        layout = self.content.layout()
        least = self.content.minimumSizeHint().height()
        if layout is not None and layout.hasHeightForWidth():  # wrapped labels need more height when narrower
            least = max(least, layout.totalMinimumHeightForWidth(view.width()))
        self.content.resize(view.width(), max(view.height(), least))

    def viewportEvent(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Resize:
            self._fit()
        return super().viewportEvent(event)

    def sizeHint(self) -> QSize:
        content = self.content
        width = content.sizeHint().width()
        height = content.heightForWidth(width) if content.hasHeightForWidth() else -1
        return QSize(width + self._bar(), height if height > 0 else content.sizeHint().height())

    def minimumSizeHint(self) -> QSize:
        content = self.content.minimumSizeHint()
        screen = self.screen()
        room = screen.availableGeometry().height() - self.leave if screen is not None else content.height()
        height = content.height() if content.height() <= room else min(self.SMALLEST_HEIGHT, content.height())
        return QSize(content.width() + self._bar(), height)


class ElidedLabel(QLabel):
    """One line of text that a narrow window shortens with "…" instead of cutting it off mid-letter; while it
    is shortened, the whole text is its tooltip (otherwise it has none, so its parent's tooltip shows).

    Its minimum width is a few letters', so a row of these on a small screen (the main window's tiles at
    1366x768 scaled 125%) gives up the ends of its words, not its layout; at full width it is a plain label.
    """

    LEAST = "Abc…"

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(text, parent)
        self.setWordWrap(False)

    def setText(self, text: str) -> None:
        super().setText(text)
        self._tip()

    def minimumSizeHint(self) -> QSize:
        hint = super().minimumSizeHint()
        margins = self.contentsMargins()
        least = self.fontMetrics().horizontalAdvance(self.LEAST) + margins.left() + margins.right() + 2 * self.margin()
        return QSize(min(hint.width(), least), hint.height())

    def _room(self) -> int:
        return self.contentsRect().width() - 2 * self.margin()

    def shown(self) -> str:
        """The text as drawn: whole, or shortened to end in "…"."""
        return self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, max(self._room(), 0))

    def is_elided(self) -> bool:
        return self.shown() != self.text()

    def _tip(self) -> None:
        tip = self.text() if self.is_elided() else ""
        if self.toolTip() != tip:
            self.setToolTip(tip)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._tip()

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self._tip()

    def paintEvent(self, event: QPaintEvent) -> None:
        if not self.is_elided():
            super().paintEvent(event)
            return
        painter = QPainter(self)
        rect = self.contentsRect().adjusted(self.margin(), self.margin(), -self.margin(), -self.margin())
        self.style().drawItemText(painter, rect, int(self.alignment().value), self.palette(), self.isEnabled(),
                                  self.shown(), self.foregroundRole())


def fit_screen(window: QWidget, width: int, height: int) -> None:
    """A window's minimum size, at most its screen's available size (less room for the title bar)."""
    screen = window.screen()
    if screen is not None:
        room = screen.availableGeometry()
        width, height = min(width, room.width()), min(height, room.height() - 40)
    window.setMinimumSize(width, height)


def hint(text: str) -> QLabel:
    """A muted, wrapped line of explanation under the control it explains (indented to the control's text)."""
    label = QLabel(text)
    label.setObjectName("muted")
    label.setWordWrap(True)
    label.setContentsMargins(24, 0, 0, 4)
    return label


def assets_dir() -> Path:
    """assets/ of the checkout, or of the frozen bundle (PyInstaller's _MEIPASS)."""
    bundle = getattr(sys, "_MEIPASS", None)
    if bundle:
        return Path(bundle) / "assets"
    return Path(__file__).resolve().parent.parent / "assets"


def _drawn_icon(size: int) -> QPixmap:
    """A stand-in for assets/sapling.png: two leaves on a green tile."""
    pixmap = QPixmap(size, size)
    pixmap.fill(Qt.GlobalColor.transparent)
    p = QPainter(pixmap)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    s = size / 64.0
    p.setBrush(QColor(ACCENT))
    p.setPen(Qt.PenStyle.NoPen)
    p.drawRoundedRect(QRectF(2 * s, 2 * s, 60 * s, 60 * s), 14 * s, 14 * s)
    p.setBrush(QBrush(QColor("white")))
    for sign in (-1, 1):
        leaf = QPainterPath(QPointF(32 * s, 34 * s))
        leaf.cubicTo(QPointF((32 + sign * 4) * s, 18 * s), QPointF((32 + sign * 20) * s, 14 * s),
                     QPointF((32 + sign * 22) * s, 16 * s))
        leaf.cubicTo(QPointF((32 + sign * 22) * s, 30 * s), QPointF((32 + sign * 12) * s, 36 * s),
                     QPointF(32 * s, 34 * s))
        p.drawPath(leaf)
    p.drawRoundedRect(QRectF(30 * s, 30 * s, 4 * s, 22 * s), 2 * s, 2 * s)
    p.end()
    return pixmap


def icon() -> QIcon:
    folder = assets_dir()
    result = QIcon()
    for size in (16, 24, 32, 48, 64, 128, 256, 512):
        png = folder / "png" / f"sapling-{size}.png"
        if png.is_file():
            result.addFile(str(png))
    if result.isNull():
        for size in (16, 32, 64, 256):
            result.addPixmap(_drawn_icon(size))
    return result


def tray_icon(phase: str) -> QIcon:
    """The app icon with a small dot in the phase's colour (none while idle)."""
    base = icon()
    colour = {"training": "#38a169", "paused": WARNING, "waiting": WARNING,
              "restarting": ERROR, "failed": ERROR}.get(phase)
    if colour is None:
        return base
    result = QIcon()
    for size in (16, 22, 24, 32, 48, 64):
        pixmap = base.pixmap(size, size)
        p = QPainter(pixmap)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        r = size * 0.36
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(QColor("white"))
        p.drawEllipse(QRectF(size - r - 1, size - r - 1, r + 1, r + 1))
        p.setBrush(QColor(colour))
        p.drawEllipse(QRectF(size - r, size - r, r - 1, r - 1))
        p.end()
        result.addPixmap(pixmap)
    return result

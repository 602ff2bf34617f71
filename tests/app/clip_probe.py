"""Open the join and first-run dialogs as a user would and list every clipped label, as JSON on stdout.

    QT_QPA_PLATFORM=offscreen python -m tests.app.clip_probe INVITE [--shots DIR]
    DISPLAY=:97 QT_QPA_PLATFORM=xcb python -m tests.app.clip_probe INVITE    # a real X server, a window manager

tests/app/test_clipping.py runs it in both: a window manager sizes a real
window once, when it is mapped, and then keeps that size, so a label whose
text grows afterwards (the relay's answer) can be squeezed and cut off there
although an offscreen screenshot of the same widget looks whole.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtWidgets import QApplication, QLabel, QScrollArea, QWidget

from app import theme
from app.dialogs import FirstRunDialog
from app.join import JoinDialog
from app.settings import AppSettings, EngineSettings


def clipped(window: QWidget) -> list[str]:
    """Visible labels shorter than their text needs at their width (or narrower, where they do not wrap),
    and the window itself where it does not fit on a real screen."""
    out = []
    for label in window.findChildren(QLabel):
        if not label.isVisibleTo(window) or not (label.text() or label.pixmap()):
            continue
        need = label.heightForWidth(label.width()) if label.wordWrap() else label.sizeHint().height()
        if label.height() + 1 < need:
            out.append(f"{label.text()[:50]!r}: {label.height()} px tall, its text needs {need}")
        if not label.wordWrap() and label.width() + 1 < label.minimumSizeHint().width():
            out.append(f"{label.text()[:50]!r}: {label.width()} px wide, needs {label.minimumSizeHint().width()}")
    screen = window.screen()
    # The offscreen platform's one screen is 800x800 whatever the test asks: only a real screen is checked.
    # Sizes, not positions: a window manager may still be placing the frame when this runs.
    if QApplication.platformName() != "offscreen" and screen is not None:
        room, frame = screen.availableGeometry(), window.frameGeometry()
        if frame.width() > room.width() or frame.height() > room.height():
            out.append(f"the window ({frame.width()}x{frame.height()}) is larger than the screen "
                       f"({room.width()}x{room.height()})")
    return out


def wait(app: QApplication, done: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.02)
    for _ in range(20):  # let the window manager's resize and the layouts settle
        app.processEvents()
        time.sleep(0.02)


def main(argv: list[str]) -> int:
    invite, shots = argv[0], Path(argv[argv.index("--shots") + 1]) if "--shots" in argv else None
    app = QApplication([sys.argv[0]])
    theme.apply(app)
    report: dict[str, object] = {"screen": app.primaryScreen().availableGeometry().getRect()}
    join = JoinDialog(invite)
    join.show()
    wait(app, lambda: join.preview is not None or join.retry_button.isVisible(), 60)
    report["join_answered"] = join.preview is not None
    report["join"] = clipped(join)
    # On a screen with room for it, nothing of the join dialog scrolls (only a short screen makes it)
    report["join_scrolls"] = any(area.verticalScrollBar().maximum() > 0 for area in join.findChildren(QScrollArea))
    first = FirstRunDialog(EngineSettings(), AppSettings(), True, True)
    first.show()
    wait(app, lambda: first.isVisible(), 5)
    report["first_run"] = clipped(first)
    if shots is not None:
        shots.mkdir(parents=True, exist_ok=True)
        join.grab().save(str(shots / "join.png"))
        first.grab().save(str(shots / "first-run.png"))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

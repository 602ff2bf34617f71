"""`theme.FitScroll`: its content gets what it would get without it, and scrolls only below its minimum."""

from __future__ import annotations

from PySide6.QtWidgets import QApplication, QPushButton, QVBoxLayout, QWidget

from app.theme import FitScroll


def settle() -> None:
    for _ in range(10):
        QApplication.processEvents()


def test_fit_scroll_scrolls_only_when_the_view_is_shorter_than_the_contents_minimum(qtbot) -> None:  # type: ignore[no-untyped-def]
    content = QWidget()
    layout = QVBoxLayout(content)

    def add(count: int) -> None:
        for _ in range(count):
            button = QPushButton("a button")
            button.setMinimumHeight(40)
            layout.addWidget(button)

    add(5)
    area = FitScroll(content, leave=0)
    qtbot.addWidget(area)
    area.resize(300, 500)
    area.show()
    settle()
    assert content.height() == area.viewport().height() and not area.verticalScrollBar().isVisible()
    area.resize(300, 120)  # shorter than five buttons: they keep their height, and the view scrolls
    settle()
    assert content.height() >= content.minimumSizeHint().height() > area.viewport().height()
    assert area.verticalScrollBar().isVisible()
    assert all(b.height() >= 40 for b in content.findChildren(QPushButton))
    area.resize(300, 500)
    settle()
    add(10)  # the content's minimum grows while the view stays: it is fitted again, never squeezed
    settle()
    assert content.height() >= content.minimumSizeHint().height() > area.viewport().height()
    assert all(b.height() >= 40 for b in content.findChildren(QPushButton))

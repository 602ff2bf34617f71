"""`theme.FitScroll`: its content gets what it would get without it, and scrolls only below its minimum;
`theme.ElidedLabel` and the tiles' `share_width`: a narrow row shortens text with "…", longest first."""

from __future__ import annotations

from PySide6.QtWidgets import QApplication, QPushButton, QVBoxLayout, QWidget

from app.panels import share_width
from app.theme import ElidedLabel, FitScroll


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


def test_an_elided_label_ends_in_an_ellipsis_and_carries_its_whole_text_as_a_tooltip(qtbot) -> None:  # type: ignore[no-untyped-def]
    text = "round 40, +3.7 pts since round 10"
    label = ElidedLabel(text)
    qtbot.addWidget(label)
    label.show()
    whole = label.fontMetrics().horizontalAdvance(text)
    assert label.minimumSizeHint().width() < whole / 3  # a narrow row may squeeze it to a few letters
    label.resize(whole + 10, label.sizeHint().height())
    settle()
    assert not label.is_elided() and label.shown() == text and label.toolTip() == ""
    label.resize(whole // 2, label.sizeHint().height())
    settle()
    assert label.is_elided() and label.shown().endswith("…") and text.startswith(label.shown()[:-1])
    assert label.fontMetrics().horizontalAdvance(label.shown()) <= label.width()
    assert label.toolTip() == text  # hovering shows what was cut
    label.setText("short")  # a shorter text fits again: no tooltip, so a parent's tooltip shows through
    assert not label.is_elided() and label.toolTip() == ""


def test_share_width_keeps_short_texts_whole_and_shortens_the_longest_first() -> None:
    wants = [91, 146, 97, 160, 124, 92]
    assert share_width(wants, 800) == wants  # room for all: each gets what it wants (the layout shares the rest)
    widths = share_width(wants, 600)
    assert sum(widths) <= 600 and widths[0] == 91 and widths[5] == 92 and widths[2] == 97  # short: whole
    assert widths[1] == widths[3] == widths[4] < 124  # the three longest give way, to one level
    assert share_width(wants, 540) == [90] * 6  # less room than the shortest wants: all equal
    assert share_width([], 100) == [] and sum(share_width([50, 50], -5)) == 0


def test_a_fit_pending_when_the_area_is_deleted_is_dropped(qtbot) -> None:  # type: ignore[no-untyped-def]
    """A dialog closed right after its content changed: the fit queued by the change must not reach the deleted
    area (a static single-shot timer did, and raised in the event loop)."""
    import shiboken6

    content = QWidget()
    layout = QVBoxLayout(content)
    area = FitScroll(content, leave=0)
    area.resize(300, 200)
    area.show()
    settle()
    layout.addWidget(QPushButton("one more"))  # the content's layout asks again: a fit is queued
    QApplication.sendPostedEvents()  # the layout request reaches the filter
    shiboken6.delete(area)  # as closing a dialog does, before the queued fit runs
    settle()  # pytest-qt fails the test on any exception raised in the event loop
    assert not shiboken6.isValid(area)

"""Live charts (QtCharts): reward per round (you vs the swarm), held-out accuracy, throughput.

Each chart shows the raw per-round values as a faint line and a 10-round
average as a bold one. Series are redrawn at most four times a second, and a
series longer than about two points per pixel is decimated (min and max per
bucket, so spikes stay visible): the charts stay smooth at 10,000 rounds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from PySide6.QtCharts import QChart, QChartView, QLineSeries, QScatterSeries, QValueAxis, QXYSeries
from PySide6.QtCore import QMargins, QPointF, Qt, QTimer
from PySide6.QtGui import QColor, QFont, QPainter, QPen, QResizeEvent, QShowEvent
from PySide6.QtWidgets import QGraphicsSimpleTextItem, QGridLayout, QToolTip, QWidget

from app import theme
from app.session import History, Session

TREND_WINDOW = 10
# Each axis reaches this many pixels past the first and last values: a marker (7 px) or a line's end on
# round 0, on the newest round, at 0 or at the top of a fixed range is drawn whole, not cut by the frame.
EDGE_PIXELS = 6.0
REFRESH_MS = 250
STEP_MS = 50  # between redrawing one part and the next, so each paints in its own frame
STEPS = 4  # your reward, the swarm's, accuracy, throughput
MAX_POINTS = 2000
COMPACT_HEIGHT = 170  # a chart shorter than this (in pixels) shows no legend and no axis titles


def rolling_mean(values: Sequence[float | None], window: int = TREND_WINDOW) -> list[float | None]:
    """Mean of the last `window` known values at each position (None until there is one)."""
    prefix = [0.0, *accumulate(v for v in values if v is not None)]
    out: list[float | None] = []
    k = 0
    for value in values:
        if value is not None:
            k += 1
        if k:
            low = k - window if k > window else 0
            out.append((prefix[k] - prefix[low]) / (k - low))
        else:
            out.append(None)
    return out


def extend_rolling_mean(values: Sequence[float | None], trend: list[float | None],
                        window: int = TREND_WINDOW) -> list[float | None]:
    """`trend` (the rolling mean of a prefix of `values`) extended to all of `values`, in place."""
    for i in range(len(trend), len(values)):
        if values[i] is None:
            trend.append(trend[i - 1] if i else None)
            continue
        total, count, j = 0.0, 0, i
        while j >= 0 and count < window:
            value = values[j]
            if value is not None:
                total += value
                count += 1
            j -= 1
        trend.append(total / count)
    return trend


def decimate(xs: Sequence[float], ys: Sequence[float | None], max_points: int) -> list[QPointF]:
    """Points for a line series: None values dropped; beyond `max_points`, min and max per bucket."""
    if None in ys:
        kx = [x for x, y in zip(xs, ys, strict=False) if y is not None]
        ky: list[float] = [y for y in ys if y is not None]
    else:
        kx, ky = list(xs[: len(ys)]), list(ys)  # type: ignore[arg-type]
    n = len(ky)
    if n <= max_points:
        return [QPointF(x, y) for x, y in zip(kx, ky, strict=True)]
    buckets = max(1, max_points // 2)
    points: list[QPointF] = []
    for b in range(buckets):
        start, end = b * n // buckets, (b + 1) * n // buckets
        if start >= end:
            continue
        chunk = ky[start:end]
        lo, hi = chunk.index(min(chunk)), chunk.index(max(chunk))
        first, second = (lo, hi) if lo <= hi else (hi, lo)
        points.append(QPointF(kx[start + first], chunk[first]))
        if second != first:
            points.append(QPointF(kx[start + second], chunk[second]))
    return points


def nice_step(span: float, ticks: int = 5) -> float:
    """1, 2 or 5 times a power of ten, about span / ticks."""
    if span <= 0:
        return 1.0
    raw = span / ticks
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= factor * power:
            return factor * power
    return 10 * power


def _pad(low: float, high: float, pixels: float) -> float:
    """How far past `low` and `high` an axis of `pixels` must reach for EDGE_PIXELS of room at each end."""
    return (high - low) * EDGE_PIXELS / max(pixels - 2 * EDGE_PIXELS, 4 * EDGE_PIXELS)


@dataclass(frozen=True)
class Line:
    name: str
    colour: str
    width: float = 2.5
    tint: float = 0.0  # mixed with white: opaque pale lines paint far faster than translucent ones
    in_legend: bool = True
    markers: bool = False
    dashed: bool = False
    detail: float = 1.0  # points per pixel of plot width at most (after decimation)


def tinted(colour: str, tint: float) -> QColor:
    c = QColor(colour)
    mix = lambda v: round(v + (255 - v) * tint)  # noqa: E731
    return QColor(mix(c.red()), mix(c.green()), mix(c.blue()))


class MetricChart(QChartView):
    """One chart: a titled QChart with labelled axes (units in the titles) and a few lines."""

    def __init__(self, title: str, y_title: str, y_range: tuple[float, float] | None,
                 y_format: str, lines: Sequence[Line], empty_text: str, show_legend: bool = True,
                 parent: QWidget | None = None) -> None:
        chart = QChart()
        super().__init__(chart, parent)
        self.setRenderHint(QPainter.RenderHint.Antialiasing)
        self.setBackgroundBrush(QColor(theme.CARD))
        self.setFrameShape(QChartView.Shape.NoFrame)
        self.setMinimumHeight(120)
        self.fixed_y = y_range
        chart.setAnimationOptions(QChart.AnimationOption.NoAnimation)
        chart.setBackgroundVisible(False)
        chart.setMargins(QMargins(2, 0, 6, 0))
        chart.setTitle(title)
        title_font = QFont(self.font())
        title_font.setPointSizeF(self.font().pointSizeF() + 1)
        title_font.setBold(True)
        chart.setTitleFont(title_font)
        chart.setTitleBrush(QColor(theme.TEXT))
        legend = chart.legend()
        legend.setAlignment(Qt.AlignmentFlag.AlignTop)
        legend.setLabelColor(QColor(theme.MUTED))
        legend.setVisible(show_legend)
        self.show_legend = show_legend
        self.compact = False

        self.x_axis = self._axis("Round", "%d")
        self.y_axis = self._axis(y_title, y_format)
        chart.addAxis(self.x_axis, Qt.AlignmentFlag.AlignBottom)
        chart.addAxis(self.y_axis, Qt.AlignmentFlag.AlignLeft)
        self.series: list[QXYSeries] = []
        self.lines = list(lines)
        for line in lines:
            series: QXYSeries = QScatterSeries() if line.markers and line.width == 0 else QLineSeries()
            series.setName(line.name)
            colour = tinted(line.colour, line.tint)
            if isinstance(series, QScatterSeries):
                series.setColor(colour)
                series.setBorderColor(colour)
                series.setMarkerSize(8.0)
            else:
                pen = QPen(colour, line.width)
                if line.width <= 1.0:  # Qt's fast path for thin lines: ~7x cheaper to paint than round joins
                    pen.setCosmetic(True)
                    pen.setCapStyle(Qt.PenCapStyle.FlatCap)
                    pen.setJoinStyle(Qt.PenJoinStyle.BevelJoin)
                else:
                    pen.setCapStyle(Qt.PenCapStyle.RoundCap)
                    pen.setJoinStyle(Qt.PenJoinStyle.RoundJoin)
                if line.dashed:
                    pen.setStyle(Qt.PenStyle.DashLine)
                series.setPen(pen)
                series.setPointsVisible(line.markers)
                series.setMarkerSize(7.0)
            chart.addSeries(series)
            series.attachAxis(self.x_axis)
            series.attachAxis(self.y_axis)
            markers = legend.markers(series)
            if markers and not line.in_legend:
                markers[0].setVisible(False)
            series.hovered.connect(lambda point, state, name=line.name,
                                   fmt=y_format: self._hover(point, state, name, fmt))
            self.series.append(series)
        self.empty = QGraphicsSimpleTextItem(empty_text)
        self.empty.setBrush(QColor(theme.MUTED))
        self.scene().addItem(self.empty)
        self.ranges = (0.0, 10.0, 0.0, 1.0)
        self.set_ranges(*self.ranges)

    def _axis(self, title: str, fmt: str) -> QValueAxis:
        axis = QValueAxis()
        axis.setTitleText(title)
        axis.setLabelFormat(fmt)
        axis.setTitleBrush(QColor(theme.MUTED))
        axis.setLabelsColor(QColor(theme.MUTED))
        axis.setGridLineColor(QColor(theme.GRID))
        axis.setLinePenColor(QColor(theme.BORDER))
        axis.setMinorGridLineVisible(False)
        font = QFont(self.font())
        font.setPointSizeF(max(7.0, self.font().pointSizeF() - 0.5))
        axis.setLabelsFont(font)
        axis.setTickType(QValueAxis.TickType.TicksDynamic)
        axis.setTickAnchor(0.0)
        return axis

    def _hover(self, point: QPointF, state: bool, name: str, fmt: str) -> None:
        if state:
            value = fmt % point.y() if "%" in fmt else f"{point.y():.2f}"
            QToolTip.showText(self.cursor().pos(), f"{name}\nround {point.x():.0f}: {value}", self)

    def set_ranges(self, x_min: float, x_max: float, y_min: float, y_max: float) -> None:
        """The values' ranges; each axis shows EDGE_PIXELS more on both sides (ticks stay on round numbers)."""
        if self.fixed_y is not None:
            y_min, y_max = self.fixed_y
        self.ranges = (x_min, x_max, y_min, y_max)
        area = self.chart().plotArea()
        x_pad = _pad(x_min, x_max, area.width())
        y_pad = _pad(y_min, y_max, area.height())
        self._set_axis(self.x_axis, x_min - x_pad, x_max + x_pad, max(1.0, nice_step(x_max - x_min)))
        self._set_axis(self.y_axis, y_min - y_pad, y_max + y_pad, nice_step(y_max - y_min, 4))

    @staticmethod
    def _set_axis(axis: QValueAxis, low: float, high: float, step: float) -> None:
        """Range and tick step, never passing through a state with thousands of ticks (slow, and memory)."""
        if (axis.min(), axis.max(), axis.tickInterval()) == (low, high, step):
            return
        axis.setTickInterval(max(step, axis.tickInterval()))
        axis.setRange(low, high)
        axis.setTickInterval(step)

    def max_points(self, index: int = 0) -> int:
        """About `detail` points per pixel: min and max of each 2/detail-pixel column."""
        width = self.chart().plotArea().width() * self.lines[index].detail
        return int(min(MAX_POINTS, max(100, width)))

    def set_points(self, index: int, points: list[QPointF]) -> None:
        series = self.series[index]
        if isinstance(series, QLineSeries) and not self.lines[index].markers:
            # A line needs two points: after round 1 the chart would look empty for a whole round.
            series.setPointsVisible(len(points) == 1)
        series.replace(points)

    def set_empty(self, empty: bool) -> None:
        self.empty.setVisible(empty)
        self._place_empty()

    def _place_empty(self) -> None:
        area = self.chart().plotArea()
        rect = self.empty.boundingRect()
        self.empty.setPos(area.center().x() - rect.width() / 2, area.center().y() - rect.height() / 2)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit_chrome()
        self.set_ranges(*self.ranges)  # the margins are in pixels: the plot's size changed
        self._place_empty()

    def _fit_chrome(self) -> None:
        """Under COMPACT_HEIGHT (banners took the room) the legend and axis titles go, so the plot keeps its
        labels; the lines' names stay in their hover tooltips."""
        compact = self.height() < COMPACT_HEIGHT
        if compact == self.compact:
            return
        self.compact = compact
        self.chart().legend().setVisible(self.show_legend and not compact)
        for axis in (self.x_axis, self.y_axis):
            axis.setTitleVisible(not compact)


class ChartsPanel(QWidget):
    """Reward on top, accuracy and throughput below; redrawn when the session's history changes."""

    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.reward = MetricChart(
            "Reward per round", "Reward (0–1)", (0.0, 1.0), "%.1f",
            [Line("You, each round", theme.ACCENT, 1.0, 0.72, in_legend=False, detail=0.5),
             Line(f"You ({TREND_WINDOW}-round average)", theme.ACCENT),
             Line("Swarm, each round", theme.SWARM, 1.0, 0.72, in_legend=False, detail=0.5),
             Line(f"Swarm's answers, re-scored here ({TREND_WINDOW}-round average)", theme.SWARM)],
            "The chart fills in as rounds finish.")
        self.accuracy = MetricChart(
            "Accuracy", "Correct (%)", (0.0, 100.0), "%d",
            [Line("Held-out", theme.EVAL, 2.5, markers=True),
             Line(f"Training, {TREND_WINDOW}-round avg", theme.EVAL, 1.5, 0.55)],
            "No evaluation yet.")
        self.speed = MetricChart(
            "Throughput", "Tokens per second", None, "%.0f",
            [Line("Each round", theme.SPEED, 1.0, 0.72, in_legend=False, detail=0.5),
             Line(f"Tokens per second ({TREND_WINDOW}-round average)", theme.SPEED)],
            "No rounds yet.", show_legend=False)
        layout = QGridLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(6)
        layout.addWidget(self.reward, 0, 0, 1, 2)
        layout.addWidget(self.accuracy, 1, 0)
        layout.addWidget(self.speed, 1, 1)
        layout.setRowStretch(0, 3)
        layout.setRowStretch(1, 2)
        # Small enough minimums that the charts shrink, not scroll, when banners take their room: the window's
        # default size on a 1280x800 screen holds the three charts under two banners (tests/app/test_window.py).
        self.reward.setMinimumHeight(160)
        self.accuracy.setMinimumHeight(125)
        self.speed.setMinimumHeight(125)
        self.timer = QTimer(self)
        self.timer.setSingleShot(True)
        self.timer.setInterval(REFRESH_MS)
        self.timer.timeout.connect(lambda: self._staged(0))
        self.next_step = 0
        self.step_timer = QTimer(self)  # owned by the panel: never fires after it is gone
        self.step_timer.setSingleShot(True)
        self.step_timer.setInterval(STEP_MS)
        self.step_timer.timeout.connect(lambda: self._staged(self.next_step))
        self.redraws = 0
        self.dirty = False
        self._trends: dict[str, tuple[tuple[int, int], list[float | None]]] = {}
        session.historyChanged.connect(self.schedule)
        self.refresh()

    def schedule(self) -> None:
        """Redraw soon; while the window is hidden (in the tray) only remember to."""
        self.dirty = True
        if self.isVisible() and not self.timer.isActive():
            self.timer.start()

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if self.dirty:
            self.timer.start()

    def refresh(self) -> None:
        """Redraw every series from the session's history, now."""
        for step in range(STEPS):
            self._draw(step)

    def _staged(self, step: int) -> None:
        """A few lines per step, STEP_MS apart: no single stall pays for every chart."""
        self._draw(step)
        if step < STEPS - 1:
            self.next_step = step + 1
            self.step_timer.start()

    def _trend(self, name: str, values: list[float | None]) -> list[float | None]:
        """Rolling mean of one history series, extended on appends, recomputed after a change."""
        h = self.session.history
        key = (id(h), h.version)
        cached = self._trends.get(name)
        if cached is None or cached[0] != key or len(cached[1]) > len(values):
            trend = rolling_mean(values)
        else:
            trend = extend_rolling_mean(values, cached[1])
        self._trends[name] = (key, trend)
        return trend

    def _draw(self, step: int) -> None:
        if step == 0:
            self.redraws += 1
            self.dirty = False
        h: History = self.session.history
        xs = [float(r) for r in h.rounds]
        last = max([*h.rounds[-1:], *h.eval_rounds[-1:], 1])
        first = min([*h.rounds[:1], *h.eval_rounds[:1], 0])
        x_max = max(float(last), first + 10.0)

        def put(chart: MetricChart, index: int, ys: Sequence[float | None], x: Sequence[float] = xs) -> None:
            chart.set_points(index, decimate(x, ys, chart.max_points(index)))

        if step == 0:
            put(self.reward, 0, h.reward)
            put(self.reward, 1, self._trend("reward", h.reward))
            self.reward.set_ranges(first, x_max, 0.0, 1.0)
            self.reward.set_empty(not xs)
        elif step == 1:
            put(self.reward, 2, h.swarm_reward)
            put(self.reward, 3, self._trend("swarm", h.swarm_reward))
        elif step == 2:
            eval_pct = [None if v is None else 100.0 * v for v in h.eval_accuracy]
            put(self.accuracy, 0, eval_pct, [float(r) for r in h.eval_rounds])
            trend = self._trend("accuracy", h.accuracy)
            put(self.accuracy, 1, [None if v is None else 100.0 * v for v in trend])
            self.accuracy.set_ranges(first, x_max, 0.0, 100.0)
            self.accuracy.set_empty(not xs and not h.eval_rounds)
        else:
            put(self.speed, 0, h.tokens_per_second)
            put(self.speed, 1, self._trend("speed", h.tokens_per_second))
            top = max((v for v in h.tokens_per_second if v is not None), default=None)
            tick = nice_step((top or 10.0) * 1.1, 4)
            self.speed.set_ranges(first, x_max, 0.0, max(tick, math.ceil((top or 10.0) * 1.1 / tick) * tick))
            self.speed.set_empty(top is None)

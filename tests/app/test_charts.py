"""The live charts draw every point whole, inside their frame, offscreen.

    QT_QPA_PLATFORM=offscreen .venv/bin/python -m pytest -q tests/app/test_charts.py
"""

from __future__ import annotations

from PySide6.QtCharts import QLineSeries, QScatterSeries

from app.charts import ChartsPanel, MetricChart
from app.session import Session


def _session(rounds: int, evals: tuple[int, ...]) -> Session:
    session = Session()
    for round_index in range(rounds + 1):
        if round_index in evals:
            session.handle({"type": "eval", "round": round_index, "accuracy": 0.0 if round_index == 0 else 1.0,
                            "reward_mean": 0.1, "questions": 27, "by_specialty": {}})
        if round_index:
            session.handle({"type": "round", "round": round_index, "metrics": {
                "reward_mean": round_index % 2, "accuracy": 0.5, "swarm_reward_mean": None,
                "tokens_per_second": 40.0 + round_index, "seconds": 20.0}})
    return session


def _cut_points(chart: MetricChart) -> list[str]:
    """Points drawn closer to the plot's frame than half their marker (or pen): they show cut in two."""
    area = chart.chart().plotArea()
    cut = []
    for line, series in zip(chart.lines, chart.series, strict=True):
        radius = series.markerSize() / 2 if isinstance(series, QScatterSeries) or series.pointsVisible() else 0.0
        if isinstance(series, QLineSeries):
            radius = max(radius, series.pen().widthF() / 2)
        inner = area.adjusted(radius, radius, -radius, -radius)
        for point in series.points():
            if not inner.contains(chart.chart().mapToPosition(point, series)):
                cut.append(f"{chart.chart().title()} / {line.name}: round {point.x():g}, {point.y():g}")
    return cut


def test_round_0_the_newest_round_and_the_range_ends_are_drawn_whole(qtbot) -> None:  # type: ignore[no-untyped-def]
    """The held-out evaluation of round 0 (at 0%) and of the newest round (at 100%) sat half outside the frame,
    and so did the newest round's throughput, where the chart ends."""
    for rounds, evals in ((1, (0,)), (12, (0, 10)), (40, (0, 10, 20, 30, 40))):
        panel = ChartsPanel(_session(rounds, evals))
        qtbot.addWidget(panel)
        panel.resize(900, 480)
        panel.show()
        qtbot.waitExposed(panel)
        panel.refresh()
        assert panel.accuracy.series[0].count() == len(evals)  # the held-out markers are there to check
        assert panel.speed.series[0].count() == rounds
        for chart in (panel.reward, panel.accuracy, panel.speed):
            assert not _cut_points(chart), _cut_points(chart)

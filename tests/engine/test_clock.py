"""Training by the clock (engine/node/clock.py): run.power bundles, the duty cycle, run.schedule, on a real node."""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import psutil
import pytest

from engine.common.config_file import build_config
from engine.common.errors import ConfigError
from engine.common.events import Event
from engine.common.paths import Paths
from engine.common.presets import POWER_PRESETS
from engine.common.schedule import Schedule, waiting_message
from engine.node.clock import Clock, Control, DutyCycle, Pacing
from engine.node.loop import Node
from tests.engine.test_sapo import fast_config, parity_reward

THURSDAY = datetime(2026, 12, 3, 12, 0)  # a Thursday noon


class FakeClock:
    """Wall time and monotonic time that move only when a test says so."""

    def __init__(self, now: datetime) -> None:
        self.wall = now
        self.mono = 1000.0
        self.lock = threading.Lock()

    def now(self) -> datetime:
        with self.lock:
            return self.wall

    def monotonic(self) -> float:
        return self.mono

    def set(self, when: datetime) -> None:
        with self.lock:
            self.wall = when

    def clock(self) -> Clock:
        return Clock(now=self.now, monotonic=self.monotonic)


# -- run.power ---------------------------------------------------------------------------

def test_power_bundles_fill_the_keys_the_user_did_not_set(tmp_path: Path) -> None:
    standard = build_config().run
    assert (standard.power, standard.threads, standard.priority, standard.duty_cycle) == \
        ("standard", 0, "background", 1.0)  # today's behaviour
    low = build_config(overrides=["run.power=low"]).run
    assert (low.threads, low.priority, low.duty_cycle) == (1, "background", 0.5)
    assert build_config(overrides=["run.power=maximum"]).run.priority == "normal"
    # A key set by the user wins, from --set and from the file alike.
    assert build_config(overrides=["run.power=low", "run.threads=2"]).run.threads == 2
    toml = tmp_path / "config.toml"
    toml.write_text('[run]\npower = "low"\nduty_cycle = 0.8\n', encoding="utf-8")
    from_file = build_config("default", toml, []).run
    assert (from_file.threads, from_file.duty_cycle) == (1, 0.8)
    assert build_config("default", toml, ["run.power=maximum"]).run.duty_cycle == 0.8
    assert set(POWER_PRESETS) == {"low", "standard", "maximum"}


@pytest.mark.parametrize("override, words", [
    ("run.power=turbo", "run.power must be one of low, standard, maximum"),
    ("run.duty_cycle=0", "run.duty_cycle must be a number greater than 0.0"),
    ("run.schedule='25:00-07:00'", "is not a time of day"),
    ("run.schedule='evenings 22:00-07:00'", "must read like"),
    ("run.schedule='22:00-22:00'", "starts and ends at the same time"),
])
def test_bad_clock_settings_are_refused_with_one_sentence(override: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        build_config(overrides=[override])


# -- the duty cycle ----------------------------------------------------------------------

def test_the_duty_cycle_keeps_training_to_its_share_of_each_minute() -> None:
    fake = FakeClock(THURSDAY)
    duty = DutyCycle(0.5, fake.monotonic)
    duty.begin()
    busy = rested = 0.0
    while busy + rested < 600:  # ten minutes of 0.3 s steps
        fake.mono += 0.3
        busy += 0.3
        due = duty.rest_due()
        fake.mono += due
        rested += due
        assert due == 0.0 or due >= 1.0  # rests come in whole-second pieces, not one per step
    assert busy / (busy + rested) == pytest.approx(0.5, abs=0.01)
    full = DutyCycle(1.0, fake.monotonic)
    fake.mono += 50
    assert full.rest_due() == 0.0


def test_pauses_and_waits_are_not_counted_as_training() -> None:
    fake = FakeClock(THURSDAY)
    duty = DutyCycle(0.5, fake.monotonic)
    duty.begin()
    fake.mono += 0.4
    assert duty.rest_due() == 0.0  # 0.4 s owed, carried
    fake.mono += 3600  # an hour paused
    duty.begin()
    fake.mono += 0.7
    assert duty.rest_due() == pytest.approx(1.1)


def test_a_rest_ends_at_once_when_a_stop_is_requested() -> None:
    fake = FakeClock(THURSDAY)
    pacing = Pacing("", 0.1, fake.clock())
    pacing.duty.begin()
    fake.mono += 100  # owes 900 s of rest
    stop = threading.Event()
    stop.set()
    t0 = time.monotonic()
    pacing.between_steps(stop)
    assert time.monotonic() - t0 < 1.0 and pacing.rested == pytest.approx(900)


# -- the schedule ------------------------------------------------------------------------

def test_a_schedule_past_midnight_belongs_to_the_day_it_starts() -> None:
    nights = Schedule.parse("22:00-07:00")
    assert not nights.contains(THURSDAY)
    assert nights.contains(THURSDAY.replace(hour=23)) and nights.contains(THURSDAY.replace(hour=6, minute=59))
    assert not nights.contains(THURSDAY.replace(hour=7))
    assert nights.next_start(THURSDAY) == THURSDAY.replace(hour=22)
    weekdays = Schedule.parse("weekdays 22:00-07:00")
    friday_night, saturday_night = THURSDAY + timedelta(days=1, hours=11), THURSDAY + timedelta(days=2, hours=11)
    assert weekdays.contains(friday_night) and weekdays.contains(friday_night + timedelta(hours=7))  # Saturday 06:00
    assert not weekdays.contains(saturday_night)
    assert weekdays.next_start(saturday_night) == datetime(2026, 12, 7, 22, 0)  # Monday
    assert Schedule.parse("weekends 09:00-18:00").next_start(THURSDAY) == datetime(2026, 12, 5, 9, 0)
    assert Schedule.parse("").contains(THURSDAY) and Schedule.parse("").describe() == "at any hour"
    assert Schedule.parse("weekdays 9:30-24:00").describe() == "weekdays 09:30-00:00"


def test_the_waiting_message_names_the_hour_and_a_far_day() -> None:
    assert waiting_message(THURSDAY.replace(hour=22), THURSDAY) == "Waiting for 22:00 (schedule)."
    assert waiting_message(datetime(2026, 12, 7, 22, 0), THURSDAY) == "Waiting for Monday 22:00 (schedule)."


def test_the_wait_sleeps_on_the_event_until_the_hours_begin() -> None:
    fake = FakeClock(THURSDAY)
    pacing = Pacing("22:00-07:00", 1.0, fake.clock(), recheck=0.05)
    wake = threading.Event()
    seen: list[str] = []
    done: list[bool] = []
    waiter = threading.Thread(target=lambda: done.append(pacing.wait_for_hours(wake, lambda s, m: seen.append(m))))
    waiter.start()
    time.sleep(0.3)
    assert not done and seen == ["Waiting for 22:00 (schedule)."]
    fake.set(THURSDAY.replace(hour=22, minute=1))
    waiter.join(2)
    assert done == [True]
    fake.set(THURSDAY)
    wake.set()  # a stop or a reload ends the wait with False
    assert pacing.wait_for_hours(wake, lambda s, m: None) is False


# -- a real node -------------------------------------------------------------------------

def _cpu_seconds() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


def test_a_node_outside_its_hours_sleeps_without_cpu_and_starts_by_itself(tiny_model_dir: Path, home: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="engine.node.loop")
    fake = FakeClock(THURSDAY.replace(hour=8))
    events: list[Event] = []
    control = Control()
    config = fast_config(tiny_model_dir, "run.schedule='22:00-07:00'", "tasks.eval_every=0", "run.max_rounds=1")
    node = Node(config, Paths.under(home), events.append, control, clock=fake.clock())
    node.taskset.reward = parity_reward  # type: ignore[method-assign]
    node.pacing.recheck = 0.2  # looks at the (fake) clock five times a second, to notice the test moving it
    node.setup()
    runner = threading.Thread(target=node.run)
    runner.start()
    deadline = time.monotonic() + 10
    while not any(e.get("state") == "waiting" for e in events) and time.monotonic() < deadline:
        time.sleep(0.05)
    waiting = [e for e in events if e.get("state") == "waiting"]
    assert waiting and waiting[0]["message"] == "Waiting for 22:00 (schedule)."
    assert waiting[0]["next_start"] == "2026-12-03T22:00"
    assert "Waiting for 22:00 (schedule). The checkpoint of round 0 holds the run." in caplog.text
    time.sleep(0.3)
    before, t0 = _cpu_seconds(), time.monotonic()
    time.sleep(3.0)
    used, wall = _cpu_seconds() - before, time.monotonic() - t0
    assert node.round == 0 and used < 0.05 * wall, f"{used:.3f} CPU seconds in {wall:.1f} s of waiting"
    fake.set(THURSDAY.replace(hour=22, minute=5))
    runner.join(60)
    assert not runner.is_alive() and node.round == 1
    assert any(e.get("state") == "training" and "schedule's hours began" in e["message"] for e in events)

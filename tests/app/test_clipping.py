"""No label of the join and first-run dialogs is cut off: offscreen, and in a real X server with a window manager.

Offscreen screenshots looked whole while, under openbox at 1600x1000, the
"Join this swarm?" dialog clipped its rows: a window manager sizes a window
when it is mapped, before the relay's answer fills it. tests/app/clip_probe.py
opens both dialogs in a child process (its own QApplication and platform) and
lists every label shorter than its text needs; it listed 15 for the join
dialog before `theme.fit_to_contents`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.app.conftest import StartRelay

ROOT = Path(__file__).resolve().parents[2]
LONG = {"name": "Riverside Maths Club swarm", "contact": "ada@example.org",
        "description": "A community swarm for the maths club of Riverside Secondary School; we meet on Tuesdays "
                       "and train overnight.",
        "models": "SmolLM2-135M-Instruct@" + "0123456789abcdef" * 4}


def probe(invite: str, env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-m", "tests.app.clip_probe", invite], cwd=ROOT, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def invite_for(relay: object) -> str:
    return f"sapling://join?relay={relay.url}&name=Riverside%20Maths%20Club"  # type: ignore[attr-defined]


@pytest.mark.integration  # a real relay, a child process
def test_no_label_is_clipped_offscreen(start_relay: StartRelay) -> None:
    report = probe(invite_for(start_relay(**LONG)), {"QT_QPA_PLATFORM": "offscreen"})
    assert report["join_answered"] is True
    assert report["join"] == [] and report["first_run"] == []


# A small laptop at 125% scaling gives the app 1093x614: the welcome dialog's buttons were below the screen.
@pytest.fixture(params=["1280x800", "1600x1000", "1366x768@1.25"])
def x_display(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """A real X server (Xvfb) of that size with a window manager (openbox), and Qt's scale for it; skipped where
    they are missing."""
    from app.screenshots import virtual_display  # the one `make screenshots` takes its pictures in

    size, _, scale = request.param.partition("@")
    with virtual_display(size) as display:
        if display is None:
            pytest.skip("Xvfb and openbox are not installed (apt-get install xvfb openbox), or Xvfb did not start")
        yield {"DISPLAY": display, "QT_SCALE_FACTOR": scale or "1"}


@pytest.mark.integration  # a real X server, a window manager, a real relay
def test_no_label_is_clipped_in_a_real_window(x_display: dict[str, str], start_relay: StartRelay) -> None:
    report = probe(invite_for(start_relay(**LONG)), {"QT_QPA_PLATFORM": "xcb", **x_display})
    assert report["join_answered"] is True
    assert report["join"] == [] and report["first_run"] == [], report
    assert report["join_scrolls"] is (x_display["QT_SCALE_FACTOR"] != "1"), report  # only the small scaled screen

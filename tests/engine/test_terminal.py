"""What `sapling-node run` prints (engine/node/terminal.py): bars on a terminal, one line per step in a file."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine.common.events import make_event
from engine.experiment.plan import Mix
from engine.experiment.terminal import ExperimentTerminal
from engine.node.terminal import StepBar, TerminalView

ROOT = Path(__file__).resolve().parents[2]
METRICS = {"round": 1, "reward_mean": 0.25, "accuracy": 0.5, "tokens_per_second": 40.0, "seconds": 3.0,
           "rss_bytes": 2**30, "loss": 0.01}


def phases(view: TerminalView) -> None:
    for phase, total in (("generating", 4), ("scoring", 2)):
        for done in range(total + 1):
            view(make_event("progress", phase=phase, done=done, total=total, round=1))
    view({"type": "contribution", "v": 1, "ts": 0.0})  # no line of its own: the step goes on
    view(make_event("round", round=1, metrics=METRICS))


def test_redirected_output_gets_one_line_per_step_and_no_carriage_returns(capsys: pytest.CaptureFixture[str]) -> None:
    phases(TerminalView())  # pytest's captured stderr is not a terminal, as `run > node.log 2>&1` is not
    out, err = capsys.readouterr()
    assert "\r" not in out + err
    assert re.fullmatch(r"round 1 generating: 4/4 in \d+\.\d s\nround 1 scoring: 2/2 in \d+\.\d s\n", err), err
    assert out.startswith("round    1 | reward 0.250 | acc  50.0% |") and out.count("\n") == 1


def test_a_terminal_gets_bars_that_redraw_in_place() -> None:
    screen = io.StringIO()
    bar = StepBar("round 1 generating", 4, stream=screen, bars=True)
    for done in range(5):
        bar.update(done)
    bar.close()
    assert "\r" in screen.getvalue() and "4/4" in screen.getvalue()
    quiet = io.StringIO()
    line = StepBar("round 1 training", 2, stream=quiet, bars=False)
    line.update(1)
    assert quiet.getvalue() == ""  # nothing until the step ends
    line.update(2)
    line.close()
    assert re.fullmatch(r"round 1 training: 2/2 in \d+\.\d s\n", quiet.getvalue())


def test_the_experiment_view_prints_lines_in_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    view = ExperimentTerminal(mixes=1)
    mix = Mix(4, 4)
    view.mix_started(mix, 1, 0, 2)
    for done in range(3):
        view.progress("generating", done, 2)
    view.round_done(mix, {"round": 1, "rewards": [0.5, 0.25], "external_groups": [4, 4], "seconds": 9.0})
    view.close()
    out, err = capsys.readouterr()
    assert "\r" not in out + err
    assert err.splitlines()[0].startswith("generating: 2/2 in ")
    assert err.splitlines()[1].startswith("mix 4/4 (1 of 1): 1/2 rounds in ")
    assert out.startswith("mix 4/4 round    1 | reward by node 0.500 0.250 | mean 0.375")


@pytest.mark.integration
def test_the_cli_prints_no_bars_into_a_log_file(tmp_path: Path, tiny_model_dir: Path) -> None:
    """`sapling-node run > node.log 2>&1`: every line ends with a newline, none with a carriage return."""
    log = tmp_path / "node.log"
    with log.open("wb") as out:
        proc = subprocess.run([sys.executable, "-m", "engine.cli", "run", "--home", str(tmp_path / "home"), "--model",
                               str(tiny_model_dir), "--rounds", "1", "--solo", "--set", "tasks.eval_every=0",
                               "--set", "tasks.questions_per_round=2", "--set", "tasks.completions_per_question=2",
                               "--set", "tasks.max_new_tokens=8", "--set", "run.priority='normal'"],
                              cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                              timeout=600)
    text = log.read_text(encoding="utf-8")
    assert proc.returncode == 0, text
    assert "\r" not in text
    assert re.search(r"^round 1 generating\s+: ", text, re.MULTILINE) is None  # the bar's padding is stripped
    assert re.search(r"^round 1 generating: \d+/\d+ in \d+\.\d s$", text, re.MULTILINE), text
    assert re.search(r"^round    1 \| reward ", text, re.MULTILINE), text

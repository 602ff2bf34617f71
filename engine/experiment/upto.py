"""An experiment's records as they stood after round N: a long run read at rounds 50, 100, 150 and 200.

A 200-round comparison is reported at several horizons. Rather than teach every
reader (rewards per round, per hour, held-out at equal time, the round's cost)
to stop at a round, `records_upto(folder, rounds)` writes a copy of the
experiment's records cut after round `rounds` and returns it; the readers then
read it as they read any folder:

- each mix's rounds.jsonl and node-K/metrics.jsonl keep the lines of rounds up
  to `rounds` (lines that name no round, such as a run's header, stay);
- evals.jsonl keeps the evaluations after rounds up to `rounds`, and eval.json
  (the evaluation after the mix's last round) stays only when that round is
  within them;
- progress.json says the last round kept;
- the plan and the evaluation before training are copied as they are.

Checkpoints are not copied. The copy goes to a folder named for the source and
the round under `cache`, written under a temporary name and renamed into place,
and is made again each time (the source may be a run still going).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from engine.common.atomicio import atomic_dir
from engine.experiment.plan import EVAL_FILE, EVALS_FILE, PLAN_FILE, PROGRESS_FILE, ROUNDS_FILE, START_EVAL_FILE

LINES = (ROUNDS_FILE, EVALS_FILE, "metrics.jsonl")


def _round_of(line: str) -> int | None:
    try:
        value = json.loads(line).get("round")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) else None


def cut_lines(text: str, rounds: int) -> str:
    """The JSON lines of `text` whose round is at most `rounds` (and those that name none)."""
    kept = [line for line in text.splitlines() if line.strip() and (_round_of(line) or 0) <= rounds]
    return "".join(f"{line}\n" for line in kept)


def _copy_mix(source: Path, target: Path, rounds: int) -> None:
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source)
        if not path.is_file() or "checkpoints" in relative.parts or "best-held-out" in relative.parts:
            continue
        out = target / relative
        out.parent.mkdir(parents=True, exist_ok=True)
        if path.name in LINES:
            out.write_text(cut_lines(path.read_text(encoding="utf-8"), rounds), encoding="utf-8")
        elif path.name == EVAL_FILE:
            if (_round_of(path.read_text(encoding="utf-8")) or 0) <= rounds:
                shutil.copyfile(path, out)
        elif path.name == PROGRESS_FILE:
            done = _round_of(path.read_text(encoding="utf-8")) or 0
            out.write_text(json.dumps({"round": min(done, rounds)}) + "\n", encoding="utf-8")
        elif path.suffix in (".json", ".jsonl"):
            shutil.copyfile(path, out)


def records_upto(folder: Path, rounds: int, cache: Path) -> Path:
    """A copy of experiment `folder`'s records cut after round `rounds`, in `cache`; ValueError when `rounds` is not
    a positive whole number or `folder` holds no experiment."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"--upto takes a round number of 1 or more, got {rounds!r}.")
    folder = Path(folder)
    if not (folder / PLAN_FILE).is_file():
        raise ValueError(f"{folder} holds no experiment ({PLAN_FILE} is missing).")
    name = hashlib.sha256(str(folder.resolve()).encode("utf-8")).hexdigest()[:16]
    target = Path(cache) / f"{name}-upto-{rounds}"
    with atomic_dir(target) as tmp:
        for file in (PLAN_FILE, START_EVAL_FILE):
            if (folder / file).is_file():
                shutil.copyfile(folder / file, tmp / file)
        for mix in sorted(p for p in folder.iterdir() if p.is_dir()):
            _copy_mix(mix, tmp / mix.name, rounds)
    return target

"""What the window knows about training, built from engine events: one signal hub.

`Session.handle(event)` takes an event already parsed by `engine.common.events` and
updates plain Python state (status, device, swarm identity, peers, progress,
history); widgets listen to its signals and read that state. A well-formed
event whose fields have the wrong shape is logged and skipped, never fatal.

`History` holds the per-round series the charts draw, as parallel lists, and
is first filled from metrics.jsonl so reopening the app shows earlier rounds.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

log = logging.getLogger(__name__)


def number(value: Any) -> float | None:
    """A finite float, or None for null, NaN, strings and booleans."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


class History:
    """Per-round series (x = round) and held-out evaluations, oldest first."""

    def __init__(self) -> None:
        self.rounds: list[int] = []
        self.reward: list[float | None] = []
        self.swarm_reward: list[float | None] = []
        self.accuracy: list[float | None] = []
        self.tokens_per_second: list[float | None] = []
        self.seconds: list[float | None] = []
        self.eval_rounds: list[int] = []
        self.eval_accuracy: list[float | None] = []
        self.version = 0  # bumped whenever earlier points change (not on appends)

    def __len__(self) -> int:
        return len(self.rounds)

    def _truncate_from(self, round_index: int) -> None:
        """Drop rounds >= round_index (a new run, or a round done again after a crash)."""
        keep = len(self.rounds)
        while keep and self.rounds[keep - 1] >= round_index:
            keep -= 1
        self.version += 1
        for series in (self.rounds, self.reward, self.swarm_reward, self.accuracy, self.tokens_per_second,
                       self.seconds):
            del series[keep:]

    def add_round(self, metrics: Mapping[str, Any]) -> bool:
        round_index = metrics.get("round")
        if isinstance(round_index, bool) or not isinstance(round_index, int):
            return False
        if self.rounds and round_index <= self.rounds[-1]:
            self._truncate_from(round_index)
        self.rounds.append(round_index)
        self.reward.append(number(metrics.get("reward_mean")))
        self.swarm_reward.append(number(metrics.get("swarm_reward_mean")))
        self.accuracy.append(number(metrics.get("accuracy")))
        self.tokens_per_second.append(number(metrics.get("tokens_per_second")))
        self.seconds.append(number(metrics.get("seconds")))
        return True

    def add_eval(self, round_index: Any, accuracy: Any) -> bool:
        if isinstance(round_index, bool) or not isinstance(round_index, int):
            return False
        if self.eval_rounds and round_index <= self.eval_rounds[-1]:
            while self.eval_rounds and self.eval_rounds[-1] >= round_index:
                self.eval_rounds.pop()
                self.eval_accuracy.pop()
        self.eval_rounds.append(round_index)
        self.eval_accuracy.append(number(accuracy))
        return True

    def recent_mean(self, series: list[float | None], n: int = 10) -> float | None:
        values = [v for v in series[-n:] if v is not None]
        return sum(values) / len(values) if values else None

    @classmethod
    def from_metrics_file(cls, path: Path, run: str) -> History:
        """Rounds and evals of one run from metrics.jsonl; unreadable lines are skipped."""
        history = cls()
        try:
            handle = open(path, encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return history
        except OSError as exc:
            log.warning("cannot read history from %s: %s", path, exc)
            return history
        with handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(record, dict) or record.get("run") != run:
                    continue
                if record.get("kind") == "round":
                    history.add_round(record)
                elif record.get("kind") == "eval":
                    history.add_eval(record.get("round"), record.get("accuracy"))
        return history


def describe_device(device: Mapping[str, Any] | None) -> str:
    """'NVIDIA H200 (GPU)', 'Apple MLX', 'CPU · Intel Xeon (8 threads)'."""
    if not device:
        return "Not known yet"
    kind = str(device.get("kind", "")).lower()
    name = str(device.get("name") or "").strip()
    if kind == "cuda":
        return f"{name or 'NVIDIA GPU'} (CUDA GPU)"
    if kind == "mlx":
        return f"Apple MLX · {name}" if name else "Apple MLX"
    return f"CPU · {name}" if name else "CPU"


def describe_model(source: str | None) -> str:
    if not source or source == "bundled":
        return "SmolLM2-135M-Instruct (bundled)"
    if "/" in source and not source.startswith(("/", ".", "~")) and source.count("/") == 1:
        return f"{source} (Hugging Face)"
    return f"{Path(source).name or source} (folder)"


class Session(QObject):
    """State from the engine's events, plus signals for the widgets that show it."""

    statusChanged = Signal()
    swarmChanged = Signal()
    peersChanged = Signal()
    progressChanged = Signal()
    historyChanged = Signal()  # rounds or evals added, or the history replaced
    roundAdded = Signal(dict)  # the round's metrics
    evalAdded = Signal(dict)  # the eval event
    checkpointSaved = Signal(int)
    logMessage = Signal(str, str, str)  # level, source, text
    engineError = Signal(str, str, bool)  # kind, message, fatal

    def __init__(self, run: str = "default", parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.run = run
        self.history = History()
        self.state = "idle"  # the engine's last status.state; "idle" before any
        self.message = ""
        self.device: dict[str, Any] | None = None
        self.model: str | None = None
        self.round = 0
        self.swarm: dict[str, Any] = {}
        self.peers: dict[str, Any] = {}
        self.online: int | None = None  # computers on the relay, this one included: the newer of swarm and peers
        self.progress: dict[str, Any] = {}
        self.last_metrics: dict[str, Any] = {}
        self.last_eval: dict[str, Any] = {}
        self.ignored = 0  # events skipped for a bad shape
        self.metrics_file: Path | None = None

    def load_history(self, metrics_file: Path) -> None:
        self.metrics_file = metrics_file
        self.history = History.from_metrics_file(metrics_file, self.run)
        if self.history.rounds:
            self.round = max(self.round, self.history.rounds[-1])
        self.historyChanged.emit()

    def handle(self, event: Mapping[str, Any]) -> None:
        type_ = event.get("type")
        handler = getattr(self, f"_on_{type_}", None)
        if handler is None:
            return
        try:
            handler(event)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            self.ignored += 1
            log.warning("skipped a %s event with a bad shape: %s", type_, exc)
            self.logMessage.emit("warning", "app", f"Skipped a {type_} event with a bad shape: {exc}")

    # -- one method per event type ------------------------------------------------------
    def _on_status(self, event: Mapping[str, Any]) -> None:
        self.state = str(event["state"])
        self.message = str(event["message"] or "")
        device = event.get("device")
        if isinstance(device, dict):
            self.device = device
        if event.get("model"):
            self.model = str(event["model"])
        if isinstance(event.get("round"), int):
            self.round = int(event["round"])
        run = event.get("run")
        if isinstance(run, str) and run and run != self.run:
            self.run = run
            if self.metrics_file is not None:
                self.load_history(self.metrics_file)
            else:
                self.history = History()
                self.historyChanged.emit()
        if self.state in ("stopped", "stopping"):
            self.progress = {}
            self.progressChanged.emit()
        self.statusChanged.emit()

    def _on_progress(self, event: Mapping[str, Any]) -> None:
        done, total = event["done"], event["total"]
        if not isinstance(done, (int, float)) or not isinstance(total, (int, float)):
            raise TypeError("done and total must be numbers")
        self.progress = {"phase": str(event["phase"]), "done": done, "total": total, "round": event["round"]}
        self.progressChanged.emit()

    def _on_round(self, event: Mapping[str, Any]) -> None:
        metrics = event["metrics"]
        if not isinstance(metrics, dict):
            raise TypeError("metrics must be an object")
        metrics = {**metrics, "round": event["round"]}
        if not self.history.add_round(metrics):
            raise ValueError("round must be a whole number")
        self.round = int(event["round"])
        self.last_metrics = metrics
        self.roundAdded.emit(metrics)
        self.historyChanged.emit()

    def _on_eval(self, event: Mapping[str, Any]) -> None:
        if not self.history.add_eval(event["round"], event["accuracy"]):
            raise ValueError("round must be a whole number")
        self.last_eval = dict(event)
        self.evalAdded.emit(dict(event))
        self.historyChanged.emit()

    def _on_peers(self, event: Mapping[str, Any]) -> None:
        for key in ("online", "received", "accepted", "rejected"):
            if number(event[key]) is None:
                raise TypeError(f"{key} must be a number")
        reasons = event.get("rejected_by_reason") or {}
        by_peer = event.get("by_peer") or {}
        if not isinstance(reasons, dict) or not isinstance(by_peer, dict):
            raise TypeError("rejected_by_reason and by_peer must be objects")
        self.peers = {**event, "rejected_by_reason": reasons, "by_peer": by_peer}
        # `connected` is optional: cut off from the relay, the engine's count of computers online is stale.
        self.online = None if event.get("connected") is False else int(event["online"])
        self.peersChanged.emit()

    def _on_swarm(self, event: Mapping[str, Any]) -> None:
        self.swarm = {key: event[key] for key in ("peer_id", "name", "relay", "connected", "message")}
        # Optional: the swarm's name (from its invite), the relay's own name, and every relay of the swarm.
        for key, kind in (("swarm_name", str), ("relay_name", str), ("relays", list)):
            if isinstance(event.get(key), kind):
                self.swarm[key] = event[key]
        # Optional: when the link last changed, and when it was last lost (the swarm panel says cut off, or back).
        for key in ("since", "lost_at"):
            if (when := number(event.get(key))) is not None:
                self.swarm[key] = when
        # `online` is optional in the schema; the engine sends it on every link change, long before round 1.
        online = number(event.get("online"))
        if not event["connected"]:
            self.online = None
        elif online is not None:
            self.online = int(online)
        self.swarmChanged.emit()

    def _on_log(self, event: Mapping[str, Any]) -> None:
        self.logMessage.emit(str(event["level"]), str(event["logger"]), str(event["message"]))

    def _on_error(self, event: Mapping[str, Any]) -> None:
        fatal = bool(event["fatal"])
        self.logMessage.emit("error", str(event["kind"]), str(event["message"]))
        self.engineError.emit(str(event["kind"]), str(event["message"]), fatal)

    def _on_checkpoint(self, event: Mapping[str, Any]) -> None:
        if isinstance(event["round"], int):
            self.checkpointSaved.emit(int(event["round"]))

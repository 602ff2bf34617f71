"""Try it's GGUF cache: the files an answer loads, exported in child processes, merged, and pruned per run.

Try it (engine/gguf/chat.py) answers with llama.cpp from GGUF files, which
`ExportCache` keeps under the cache dir (`gguf_cache_path`): the base model's
(for the bundled model, the one its conversion made, engine/models/sources.py) and,
per checkpoint, its LoRA adapter, exported by `sapling-node export --format
gguf-lora` in a child process (about 5 s on two cores, where exporting the
merged model took 12 s), then merged into the base model's GGUF here
(engine/gguf/merge.py, about 3 s). Until the merge is done, llama.cpp applies
the adapter at run time (a fifth slower per token).

An answer asks `for_answer`, which waits only when nothing usable is cached;
otherwise the newer checkpoint is exported in the background, one thread at
a time, for the next question. `prepare` starts that work as soon as Try it
opens. `close` ends the export children still running.

Tests: .venv/bin/python -m pytest tests/engine/test_export.py -q
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.common.config import NodeConfig
from engine.common.errors import CheckpointError, ModelError, SaplingError
from engine.common.events import node_command
from engine.common.paths import Paths
from engine.common.rules import BUNDLED
from engine.gguf.export import find_checkpoint, gguf_cache_path
from engine.gguf.merge import merge_lora
from engine.models.sources import BASE_GGUF, bundled_model_path

log = logging.getLogger(__name__)

KEEP_EXPORTS = 2  # checkpoints' GGUF files of each kind (adapter, merged) kept per run; the base model's too
# The adapter is exported in f32, so that merging it equals what torch's merged model answers
# (tests/engine/test_export.py).
ADAPTER_QUANT = "f32"
# While training runs a checkpoint comes every round, and exporting one costs several CPU seconds that
# training would otherwise get; a cached export younger than this answers instead of a newer checkpoint's.
REFRESH_S = 300.0

Send = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class AnswerModels:
    """What llama.cpp loads for one answer, and which checkpoint's round answers on the trained side (0: none)."""

    round: int
    trained: Path  # the merged GGUF, or the base model's while `adapter` is applied at run time
    adapter: Path | None
    base: Path


class ExportCache:
    """The GGUF files of one run that Try it answers from: exported on demand or in the background, merged, pruned.

    `send` carries status messages to the panel while an answer waits; `budget`
    is read at each export for its `--threads` (the chat's `threads` command
    changes it).
    """

    def __init__(self, config: NodeConfig, paths: Paths, export_flags: Sequence[str], send: Send,
                 budget: Callable[[], int]) -> None:
        self.config = config
        self.paths = paths
        self.export_flags = list(export_flags)
        self.send = send
        self.budget = budget
        self.refresh_s = REFRESH_S
        # The exports made between answers (`prepare`, a newer checkpoint), one thread at a time, and their rounds.
        self._background: threading.Thread | None = None
        self._background_rounds: tuple[int, ...] = ()
        self._exports: set[subprocess.Popen[str]] = set()  # export children running now (`close` ends them)
        self._exports_lock = threading.Lock()

    # -- what an answer loads -------------------------------------------------------------
    def for_answer(self, ask_id: int) -> AnswerModels:
        """The models answer `ask_id` loads, exported now when nothing usable is cached."""
        round_index, export = self.trained_export(ask_id)
        base = self.ensure_export(ask_id, 0)
        trained, adapter = self.trained_model(round_index, export)
        if adapter is not None:  # its merge comes next, for the questions after this one
            self._export_in_background(round_index)
        return AnswerModels(round_index, trained, adapter, base)

    def newest_round(self) -> int:
        try:
            return find_checkpoint(self.config, self.paths, None).round
        except CheckpointError:
            return 0

    def trained_export(self, ask_id: int) -> tuple[int, Path]:
        """The round to answer with and its GGUF: the newest checkpoint's, once it is made.

        While training runs a new checkpoint comes every round, and its export takes
        longer than an answer. When an older checkpoint's export is cached, the answer
        uses it at once and the newest is exported in the background for the next
        question, unless the cached one is younger than `refresh_s` (each export takes
        CPU from training); the answer says which round answered. Only the very first
        question (nothing cached yet) waits for an export.
        """
        newest = self.newest_round()
        if newest == 0 or self.export_path(newest).is_file():
            return newest, self.ensure_export(ask_id, newest)
        cached = self._newest_cached(below=newest)
        if cached is None:
            return newest, self.ensure_export(ask_id, newest)
        try:
            age = time.time() - cached[1].stat().st_mtime
        except OSError:  # pruned meanwhile: export the newest now
            return newest, self.ensure_export(ask_id, newest)
        if age < self.refresh_s:
            self.send({"type": "status", "id": ask_id, "message": f"Answering with round {cached[0]}; a newer "
                       f"checkpoint is prepared at most every {self.refresh_s / 60:.0f} minutes while you ask…"})
            return cached
        self._export_in_background(newest)
        self.send({"type": "status", "id": ask_id,
                   "message": f"Answering with round {cached[0]}; round {newest} is being prepared for the next "
                              "question…"})
        return cached

    def trained_model(self, round_index: int, export: Path) -> tuple[Path, Path | None]:
        """What llama.cpp loads for the trained side: (model GGUF, adapter applied at run time or None)."""
        if round_index == 0:
            return export, None
        merged = self.merged_path(round_index)
        if merged.is_file():
            return merged, None
        return self.ensure_export(None, 0), export

    def _newest_cached(self, below: int) -> tuple[int, Path] | None:
        """The newest checkpoint export in the cache from before round `below` (never a stale later one)."""
        folder = self.export_path(1).parent
        suffix = self.export_path(1).name.split(".", 1)[1]
        found = []
        for path in folder.glob(f"round-*.{suffix}") if folder.is_dir() else []:
            number = path.name.split(".", 1)[0].removeprefix("round-")
            if number.isdigit() and 0 < int(number) < below:
                found.append((int(number), path))
        return max(found) if found else None

    # -- where the files are --------------------------------------------------------------
    def export_path(self, round_index: int) -> Path:
        """Where the export of one round is kept: round 0 (the base model; for the bundled model beside its
        conversion), and each checkpoint's adapter, per run (`merged_path` is the merged model made from it)."""
        if round_index == 0 and self.config.model.source == BUNDLED:
            try:  # made with the conversion (engine.models.sources.ensure_base_gguf); an export writes it there too
                return bundled_model_path(self.paths.models_cache) / BASE_GGUF
            except ModelError:  # no bundled model installed: the export says so
                pass
        return gguf_cache_path(self.paths, self.config.run.run_name, round_index, ADAPTER_QUANT, lora=round_index > 0)

    def merged_path(self, round_index: int) -> Path:
        """Where the merged GGUF of one checkpoint is kept (made from its adapter by `merge`)."""
        return gguf_cache_path(self.paths, self.config.run.run_name, round_index)

    # -- making them ----------------------------------------------------------------------
    def prepare(self) -> None:
        """As soon as Try it opens, and at each new question: export what an answer needs, in the background.

        The base model (when its GGUF was not made with the conversion) and the
        newest checkpoint, unless an export younger than `refresh_s` is cached
        (the first answer then uses it, as `trained_export` does). The answer
        to a question asked meanwhile waits for this export, not for a second.
        """
        rounds = [] if self.export_path(0).is_file() else [0]
        newest = self.newest_round()
        if newest > 0 and not self.export_path(newest).is_file():
            cached = self._newest_cached(below=newest)
            try:
                fresh = cached is not None and time.time() - cached[1].stat().st_mtime < self.refresh_s
            except OSError:  # pruned meanwhile
                fresh = False
            if not fresh:
                rounds.append(newest)
        if rounds:
            log.info("Try it: preparing rounds %s for llama.cpp before the first question", rounds)
            self._export_in_background(*rounds)

    def _export_in_background(self, *rounds: int) -> None:
        """Export these rounds one after the other in a thread, unless one is running already."""
        if self._background is not None and self._background.is_alive():
            return

        def work() -> None:
            for round_index in rounds:
                try:
                    self.ensure_export(None, round_index)
                    self.merge(round_index)
                except (SaplingError, OSError) as exc:  # the next question tries again; this one was answered
                    log.warning("Try it: background export of round %d failed: %s", round_index, exc)

        self._background_rounds = rounds
        self._background = threading.Thread(target=work, daemon=True, name="chat-export")
        self._background.start()

    def merge(self, round_index: int) -> None:
        """Make the merged GGUF of a checkpoint whose adapter is exported (in the calling thread)."""
        merged = self.merged_path(round_index)
        if round_index == 0 or merged.is_file():
            return
        started = time.monotonic()
        merge_lora(self.ensure_export(None, 0), self.export_path(round_index), merged)
        log.info("Try it: merged round %d into the base model in %.1f s", round_index, time.monotonic() - started)
        self._prune(merged.parent)

    def ensure_export(self, ask_id: int | None, round_index: int) -> Path:
        """The cached GGUF of one round, exported now (in a child process) when missing.

        When a background export (`prepare`) is already making it, the answer
        waits for that one instead of starting a second. With `ask_id` None
        (a background export) it reports nothing to the panel.
        """
        path = self.export_path(round_index)
        if path.is_file():
            return path
        what = "the base model" if round_index == 0 else f"round {round_index}"
        if self._join_background(ask_id, round_index, what):
            return path
        if ask_id is not None:
            self.send({"type": "status", "id": ask_id,
                       "message": f"Preparing {what} for llama.cpp (once per checkpoint)…"})
        path.parent.mkdir(parents=True, exist_ok=True)
        kind = ["--format", "gguf"] if round_index == 0 else ["--format", "gguf-lora", "--quant", ADAPTER_QUANT]
        code, errors = self._run_export(ask_id, [*kind, "--round", str(round_index), "--out", str(path)])
        if code != 0 or not path.is_file():
            last = next((line.strip() for line in reversed(errors) if line.strip()), f"exit code {code}")
            raise SaplingError(f"Could not export {what} for Try it: {last.removeprefix('sapling-node: error: ')}")
        self._prune(path.parent)
        return path

    def _join_background(self, ask_id: int | None, round_index: int, what: str) -> bool:
        """Wait for the background export of `round_index` when one is making it; True when its file is there."""
        running = self._background
        if (running is None or not running.is_alive() or running is threading.current_thread()
                or round_index not in self._background_rounds):
            return False
        if ask_id is not None:
            self.send({"type": "status", "id": ask_id,
                       "message": f"Preparing {what} for llama.cpp (begun when Try it opened)…"})
        path = self.export_path(round_index)
        while running.is_alive() and not path.is_file():  # written atomically; a merge may follow it
            running.join(timeout=0.05)
        return path.is_file()

    def _run_export(self, ask_id: int | None, flags: list[str]) -> tuple[int, list[str]]:
        """`sapling-node export FLAGS` as a child: its stdout lines as status messages; (exit code, stderr lines)."""
        argv = node_command("export", [*self.export_flags, "--threads", str(self.budget()), *flags])
        log.info("exporting for Try it: %s", argv)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                encoding="utf-8", errors="replace")
        with self._exports_lock:
            self._exports.add(proc)
        try:
            errors: list[str] = []
            reader = threading.Thread(target=lambda: errors.extend(proc.stderr or []), daemon=True)
            reader.start()
            for line in proc.stdout or []:
                if line.strip() and ask_id is not None:
                    self.send({"type": "status", "id": ask_id, "message": line.strip()})
            code = proc.wait()
            reader.join(timeout=5)
        finally:
            with self._exports_lock:
                self._exports.discard(proc)
        return code, errors

    def close(self) -> None:
        """End the export children still running (the app closed Try it): none outlives this process."""
        with self._exports_lock:
            running = list(self._exports)
        for proc in running:
            proc.terminate()

    def _prune(self, folder: Path) -> None:
        """Keep the newest `KEEP_EXPORTS` checkpoint exports of each kind; drop the rest, and any of another kind."""
        drop: list[Path] = []
        kept: set[Path] = set()
        for example in (self.export_path(1), self.merged_path(1)):
            suffix = example.name.split(".", 1)[1]
            current = sorted(folder.glob(f"round-*.{suffix}"), reverse=True)
            kept.update(current[:KEEP_EXPORTS])
            drop.extend(current[KEEP_EXPORTS:])
        drop.extend(p for p in folder.glob("round-*.gguf") if p not in kept and p not in drop)
        for old in drop:
            try:
                old.unlink(missing_ok=True)
            except OSError:  # still open by llama.cpp (Windows); the next export prunes it
                pass

"""Try it: a question answered token by token by the newest checkpoint and, beside it, by the base model.

    sapling-node chat [--home DIR] [--run-name NAME] [--budget N]    (the app starts it with engine.events.node_command)

The desktop app's Try it panel runs this as a child process, started when
the tab opens, and talks to it in JSON lines. It answers with llama.cpp
(llama-cpp-python) from GGUF exports: the bundled base model's is made with
its conversion (engine/models.py), and at start (`prepare`) the newest
checkpoint's LoRA adapter is exported in the background by `sapling-node
export --format gguf-lora` in a child process (about 5 s on two cores,
where exporting the merged model took 12 s), then merged into the base
model's GGUF here (engine/gguf_merge.py, about 3 s), both cached per
checkpoint (`gguf_cache_path`). A question asked before the merge is done
is answered by llama.cpp with the adapter applied at run time (a fifth
slower per token); later ones by the merged model. So the first question
seldom waits, and never long. This process never imports torch; it imports
llama_cpp and reasoning-gym (through engine.tasks) only when first needed.

Answers are greedy, like the held-out evaluation. Both models write in turn,
one token each, on one thread, so they stream side by side within one thread
budget: `--budget` (and the `threads` command) sets the threads of llama.cpp
and of the export; the app gives 1 while training runs. Within it, an answer
uses only the threads other programs leave free (`engine.priority.ThreadPolicy`).

Commands (stdin), one JSON object per line:

    {"cmd": "question", "specialty": "basic_arithmetic"}   a fresh question of one specialty
    {"cmd": "ask", "id": 3, "question": 2}                  answer question 2 (scored by its verifier)
    {"cmd": "ask", "id": 4, "text": "What is 17 + 25?"}     answer typed text (no score)
    {"cmd": "threads", "n": 1}                              thread budget from the next answer on
    {"cmd": "cancel"}                                       stop the answer being written

Messages (stdout), each with "type" (their required fields: `engine.events.CHAT_MESSAGE_FIELDS`):

    ready     llama_cpp (bool), message (one sentence when llama.cpp is unusable, else ""), specialties
    question  id, specialty, text, answer (a reference answer, or null)
    status    id, message                      (exporting or loading, before the first token)
    token     id, side ("trained" or "base"), text
    answer    id, side, text, score (null for typed text), round, tokens, first_token_s, seconds
    error     id, message                      (one sentence; the panel shows it)

Tests: .venv/bin/python -m pytest tests/app/test_tryit.py tests/engine/test_export.py -q
"""

from __future__ import annotations

import argparse
import codecs
import json
import logging
import os
import queue
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config import SAPO_SPECIALTIES, NodeConfig
from engine.errors import SaplingError
from engine.events import CHAT_COMMANDS, encode, node_command
from engine.paths import Paths
from engine.rules import BUNDLED
from engine.seeds import fixed_seed

log = logging.getLogger(__name__)

SIDES = ("trained", "base")
TYPED_MAX_TOKENS = 256
CONTEXT_TOKENS = 2048
KEEP_EXPORTS = 2  # checkpoints' GGUF files of each kind (adapter, merged) kept per run; the base model's too
# The adapter is exported in f32, so that merging it equals what torch's merged model answers (tests/engine/test_export.py).
ADAPTER_QUANT = "f32"
# While training runs a checkpoint comes every round, and exporting one costs several CPU seconds that
# training would otherwise get; a cached export younger than this answers instead of a newer checkpoint's.
REFRESH_S = 300.0
# Questions come from a seed stream of their own: never a training, held-out or worked-example item.
QUESTION_SEED_OFFSET = 3_000_000_021
INSTALL_HINT = "run `make run` once, which builds it, or `pip install llama-cpp-python==0.3.36`"

Send = Callable[[dict[str, Any]], None]


def llama_cpp_problem() -> str:
    """One sentence saying why llama.cpp cannot answer here, or "" when it imports."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError as exc:
        return f"Try it needs llama-cpp-python, which is not installed ({exc}): {INSTALL_HINT}."
    except (OSError, RuntimeError) as exc:
        return f"llama-cpp-python is installed but its library does not load here ({exc}); reinstall it: {INSTALL_HINT}."
    return ""


@dataclass
class _Model:
    path: Path
    lora: Path | None
    threads: int
    llm: Any


@dataclass
class _Stream:
    side: str
    tokens: Iterator[int]
    llm: Any
    eos: int
    limit: int
    started: float
    ids: list[int] = field(default_factory=list)
    text: str = ""
    first_token_s: float | None = None
    decoder: codecs.IncrementalDecoder = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))
    done: bool = False


class ChatServer:
    """Questions, exports on demand, and side-by-side answers; one command at a time."""

    def __init__(self, config: NodeConfig, paths: Paths, export_flags: Sequence[str], send: Send, budget: int) -> None:
        self.config = config
        self.paths = paths
        self.export_flags = list(export_flags)
        self.send = send
        self.budget = max(1, budget)
        # Within the budget, only the threads other programs leave free: on a busy 2-core machine two
        # llama.cpp threads waited on each other for 23 s before the first token, one thread took 1.1 s.
        from engine.priority import ThreadPolicy

        self.policy = ThreadPolicy(0, apply=lambda threads: None, max_threads=self.budget)
        self.cancelled = threading.Event()
        self.problem = llama_cpp_problem()
        self.questions: dict[int, Any] = {}
        self.models: dict[str, _Model] = {}
        self.rng = random.Random()
        self._taskset: Any = None
        # The exports made between answers (`prepare`, a newer checkpoint), one thread at a time, and their rounds.
        self._background: threading.Thread | None = None
        self._background_rounds: tuple[int, ...] = ()
        self._exports: set[subprocess.Popen[str]] = set()  # export children running now (`close` ends them)
        self._exports_lock = threading.Lock()
        self.refresh_s = REFRESH_S

    # -- questions ------------------------------------------------------------------------
    def taskset(self) -> Any:
        if self._taskset is None:
            from engine.tasks import TaskSet

            weights = dict.fromkeys(SAPO_SPECIALTIES, 1.0)
            self._taskset = TaskSet(weights, self.config.tasks.dataset_configs, seed=fixed_seed(self.config.run.seed))
        return self._taskset

    def new_question(self, specialty: str) -> None:
        from engine.tasks import MAX_TASK_INDEX, TaskRef

        taskset = self.taskset()
        ref = TaskRef.create(specialty, dict(taskset.config(specialty)), fixed_seed(self.config.run.seed) + QUESTION_SEED_OFFSET,
                             self.rng.randrange(MAX_TASK_INDEX))
        question = taskset.rebuild(ref)
        number = len(self.questions) + 1
        self.questions[number] = question
        self.send({"type": "question", "id": number, "specialty": specialty, "text": question.text,
                   "answer": question.reference_answer})

    # -- models ---------------------------------------------------------------------------
    def newest_round(self) -> int:
        from engine.errors import CheckpointError
        from engine.export import find_checkpoint

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
                   "message": f"Answering with round {cached[0]}; round {newest} is being prepared for the next question…"})
        return cached

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

    def prepare(self) -> None:
        """As soon as Try it opens, and at each new question: export what an answer needs, in the background.

        The base model (when its GGUF was not made with the conversion) and the
        newest checkpoint, unless an export younger than `refresh_s` is cached
        (the first answer then uses it, as `trained_export` does). The answer
        to a question asked meanwhile waits for this export, not for a second.
        """
        if self.problem:
            return
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

    def export_path(self, round_index: int) -> Path:
        """Where the export of one round is kept: round 0 (the base model; for the bundled model beside its
        conversion), and each checkpoint's adapter, per run (`merged_path` is the merged model made from it)."""
        from engine.export import gguf_cache_path

        if round_index == 0 and self.config.model.source == BUNDLED:
            from engine.errors import ModelError
            from engine.models import BASE_GGUF, bundled_model_path

            try:  # made with the conversion (engine.models.ensure_base_gguf); an export writes it there too
                return bundled_model_path(self.paths.models_cache) / BASE_GGUF
            except ModelError:  # no bundled model installed: the export says so
                pass
        return gguf_cache_path(self.paths, self.config.run.run_name, round_index, ADAPTER_QUANT, lora=round_index > 0)

    def merged_path(self, round_index: int) -> Path:
        """Where the merged GGUF of one checkpoint is kept (made from its adapter by `merge`)."""
        from engine.export import gguf_cache_path

        return gguf_cache_path(self.paths, self.config.run.run_name, round_index)

    def merge(self, round_index: int) -> None:
        """Make the merged GGUF of a checkpoint whose adapter is exported (in the calling thread)."""
        merged = self.merged_path(round_index)
        if round_index == 0 or merged.is_file():
            return
        from engine.gguf_merge import merge_lora

        started = time.monotonic()
        merge_lora(self.ensure_export(None, 0), self.export_path(round_index), merged)
        log.info("Try it: merged round %d into the base model in %.1f s", round_index, time.monotonic() - started)
        self._prune(merged.parent)

    def trained_model(self, round_index: int, export: Path) -> tuple[Path, Path | None]:
        """What llama.cpp loads for the trained side: (model GGUF, adapter applied at run time or None)."""
        if round_index == 0:
            return export, None
        merged = self.merged_path(round_index)
        if merged.is_file():
            return merged, None
        return self.ensure_export(None, 0), export

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
        running = self._background
        if (running is not None and running.is_alive() and running is not threading.current_thread()
                and round_index in self._background_rounds):
            if ask_id is not None:
                self.send({"type": "status", "id": ask_id,
                           "message": f"Preparing {what} for llama.cpp (begun when Try it opened)…"})
            while running.is_alive() and not path.is_file():  # written atomically; a merge may follow it
                running.join(timeout=0.05)
            if path.is_file():
                return path
        if ask_id is not None:
            self.send({"type": "status", "id": ask_id, "message": f"Preparing {what} for llama.cpp (once per checkpoint)…"})
        path.parent.mkdir(parents=True, exist_ok=True)
        kind = ["--format", "gguf"] if round_index == 0 else ["--format", "gguf-lora", "--quant", ADAPTER_QUANT]
        argv = node_command("export", [*self.export_flags, "--threads", str(self.budget), *kind,
                                       "--round", str(round_index), "--out", str(path)])
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
        if code != 0 or not path.is_file():
            last = next((line.strip() for line in reversed(errors) if line.strip()), f"exit code {code}")
            raise SaplingError(f"Could not export {what} for Try it: {last.removeprefix('sapling-node: error: ')}")
        self._prune(path.parent)
        return path

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

    def threads(self) -> int:
        """Threads for the next answer: the budget, less what other programs keep busy."""
        self.policy.max_threads = self.budget
        return max(1, min(self.budget, self.policy.update()))

    def load(self, side: str, path: Path, threads: int, lora: Path | None = None) -> Any:
        """A llama.cpp model of `path` (a GGUF), with the adapter `lora` applied when given; kept per side."""
        current = self.models.get(side)
        if current is not None and current.path == path and current.lora == lora:
            if current.threads != threads:
                current.llm._ctx.set_n_threads(threads, threads)  # llama_set_n_threads on the live context
                current.threads = threads
            return current.llm
        if current is not None:
            current.llm.close()
            del self.models[side]
        from llama_cpp import GGML_TYPE_F32, Llama

        try:
            # The KV cache in f32, not llama.cpp's default f16: with it the f16 export's greedy answers equal
            # torch's, which the held-out evaluation computes (docs/exporting.md); it costs ~50 MB more here.
            llm = Llama(model_path=str(path), lora_path=str(lora) if lora is not None else None, n_ctx=CONTEXT_TOKENS,
                        n_threads=threads, n_threads_batch=threads, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32,
                        verbose=False)
        except (ValueError, RuntimeError, OSError) as exc:
            damaged = lora if lora is not None else path
            damaged.unlink(missing_ok=True)  # a damaged cache file is made again on the next question
            raise SaplingError(f"llama.cpp could not load {damaged.name} ({exc}); ask again to export it anew.") from exc
        self.models[side] = _Model(path, lora, threads, llm)
        return llm

    # -- answering ------------------------------------------------------------------------
    def ask(self, ask_id: int, question_id: int | None, text: str | None) -> None:
        if self.problem:
            self.send({"type": "error", "id": ask_id, "message": self.problem})
            return
        question = self.questions.get(question_id) if question_id is not None else None
        if question_id is not None and question is None:
            raise SaplingError(f"There is no question {question_id} in this session.")
        if question is not None:
            messages = self.taskset().messages(question)
            limit = self.config.tasks.max_new_tokens
        else:
            messages = [{"role": "user", "content": str(text or "").strip()}]
            limit = TYPED_MAX_TOKENS
        started = time.monotonic()
        round_index, trained = self.trained_export(ask_id)
        base = self.ensure_export(ask_id, 0)
        models = {"trained": self.trained_model(round_index, trained), "base": (base, None)}
        if models["trained"][1] is not None:  # its merge comes next, for the questions after this one
            self._export_in_background(round_index)
        streams = []
        threads = self.threads()
        for side in SIDES:
            llm = self.load(side, models[side][0], threads, models[side][1])
            prompt = prompt_tokens(llm, messages)
            streams.append(_Stream(side, greedy_tokens(llm, prompt), llm, llm.token_eos(), limit, started))
        self.cancelled.clear()
        self._interleave(ask_id, streams)
        for stream in streams:
            score = None if question is None else self.taskset().reward(question, stream.text)
            self.send({"type": "answer", "id": ask_id, "side": stream.side, "text": stream.text, "score": score,
                       "round": round_index if stream.side == "trained" else 0, "tokens": len(stream.ids),
                       "first_token_s": stream.first_token_s, "seconds": round(time.monotonic() - started, 3)})

    def _interleave(self, ask_id: int, streams: list[_Stream]) -> None:
        """One token from each model in turn until both end (or a cancel)."""
        while not all(s.done for s in streams) and not self.cancelled.is_set():
            for stream in streams:
                if stream.done:
                    continue
                token = next(stream.tokens, None)
                if token is None or token == stream.eos:
                    stream.done = True
                    continue
                if stream.first_token_s is None:
                    stream.first_token_s = round(time.monotonic() - stream.started, 3)
                stream.ids.append(token)
                piece = stream.decoder.decode(stream.llm.detokenize([token]))
                stream.text += piece
                if piece:
                    self.send({"type": "token", "id": ask_id, "side": stream.side, "text": piece})
                if len(stream.ids) >= stream.limit:
                    stream.done = True
        for stream in streams:
            close = getattr(stream.tokens, "close", None)
            if close is not None:
                close()

    def handle(self, command: dict[str, Any]) -> None:
        cmd = command.get("cmd")
        ask_id = command.get("id", 0)
        try:
            if cmd == "question":
                self.prepare()  # a newer checkpoint is exported while the question is read
                self.new_question(str(command.get("specialty", "")))
            elif cmd == "ask":
                self.ask(int(ask_id), command.get("question"), command.get("text"))
        except SaplingError as exc:
            self.send({"type": "error", "id": ask_id, "message": str(exc)})


def prompt_tokens(llm: Any, messages: list[dict[str, str]]) -> list[int]:
    """The chat prompt as training builds it: the model's own template, no extra BOS."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = llm.metadata.get("tokenizer.chat_template")
    if not template:
        raise SaplingError("This model has no chat template, so Try it cannot build a prompt for it.")
    eos = llm.detokenize([llm.token_eos()], special=True).decode("utf-8", "replace")
    bos = llm.detokenize([llm.token_bos()], special=True).decode("utf-8", "replace") if llm.token_bos() >= 0 else ""
    formatter: Any = Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos)  # typed for OpenAI-shaped dicts
    prompt = formatter(messages=messages).prompt
    return list(llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True))


def greedy_tokens(llm: Any, prompt: list[int]) -> Iterator[int]:
    """Greedy next tokens after `prompt` (the caller stops at end-of-sequence or its limit)."""
    return llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0)


def _reader(server: ChatServer, commands: queue.Queue[dict[str, Any] | None]) -> None:
    """stdin to the command queue; cancel and threads act at once, even mid-answer."""
    for line in sys.stdin:
        try:
            command = json.loads(line)
        except ValueError:
            log.warning("ignoring a line that is not JSON: %.80s", line)
            continue
        if not isinstance(command, dict) or command.get("cmd") not in CHAT_COMMANDS:
            log.warning("ignoring an unknown command: %.80s", line)
            continue
        if command["cmd"] == "cancel":
            server.cancelled.set()
        elif command["cmd"] == "threads":
            server.budget = max(1, int(command.get("n", 1)))
        else:
            commands.put(command)
    server.cancelled.set()
    server.close()
    commands.put(None)


def build_parser() -> argparse.ArgumentParser:
    from engine.launch import add_settings_flags

    parser = argparse.ArgumentParser(prog="sapling-node chat", description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_settings_flags(parser)
    parser.add_argument("--budget", type=int, default=max(1, os.cpu_count() or 1),
                        help="threads for llama.cpp and for exports (the app gives 1 while training runs)")
    return parser


def export_flags(argv: Sequence[str]) -> list[str]:
    """The settings flags to hand on to `sapling-node export` (all but --budget)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--budget":
            skip = True
        elif not arg.startswith("--budget="):
            out.append(arg)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from engine.launch import config_from_args, setup_logging

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    paths = Paths.under(args.home) if args.home else Paths.default()
    setup_logging(paths, args.verbose, None)
    lock = threading.Lock()

    def send(message: dict[str, Any]) -> None:
        with lock:
            sys.stdout.write(encode(message) + "\n")
            sys.stdout.flush()

    try:
        config = config_from_args(args, paths)
    except SaplingError as exc:
        send({"type": "error", "id": 0, "message": str(exc)})
        return exc.exit_code
    server = ChatServer(config, paths, export_flags(argv), send, args.budget)
    send({"type": "ready", "llama_cpp": not server.problem, "message": server.problem,
          "specialties": list(SAPO_SPECIALTIES)})
    server.prepare()
    commands: queue.Queue[dict[str, Any] | None] = queue.Queue()
    threading.Thread(target=_reader, args=(server, commands), daemon=True, name="chat-stdin").start()
    while (command := commands.get()) is not None:
        server.handle(command)
    return 0


if __name__ == "__main__":
    sys.exit(main())

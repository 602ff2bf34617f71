"""Try it: a question answered token by token by the newest checkpoint and, beside it, by the base model.

    sapling-node chat [--home DIR] [--run-name NAME] [--budget N]    (the app starts it with EngineFlags)
    python -m engine.gguf.chat [same flags]

The desktop app's Try it panel runs this as a child process, started when
the tab opens, and talks to it in JSON lines. It answers with llama.cpp
(llama-cpp-python) from GGUF exports, which `ExportCache`
(engine/gguf/cache.py) finds, exports and merges, starting at once
(`prepare`): the base model's and the newest checkpoint's. A question asked
before the newest checkpoint's merge is done is answered by llama.cpp with
its adapter applied at run time (a fifth slower per token); later ones by
the merged model. So the first question seldom waits, and never long. This
process never imports torch; it imports llama_cpp and reasoning-gym (through
engine.questions.tasks) only when first needed.

Answers are greedy, like the held-out evaluation. Both models write in turn,
one token each, on one thread, so they stream side by side within one thread
budget: `--budget` (and the `threads` command) sets the threads of llama.cpp
and of the export; the app gives 1 while training runs. Within it, an answer
uses only the threads other programs leave free (`engine.node.priority.ThreadPolicy`).

Commands (stdin), one JSON object per line:

    {"cmd": "question", "specialty": "basic_arithmetic"}   a fresh question of one specialty
    {"cmd": "ask", "id": 3, "question": 2}                  answer question 2 (scored by its verifier)
    {"cmd": "ask", "id": 4, "text": "What is 17 + 25?"}     answer typed text (no score)
    {"cmd": "threads", "n": 1}                              thread budget from the next answer on
    {"cmd": "cancel"}                                       stop the answer being written

Messages (stdout), each with "type" (their required fields: `engine.common.events.CHAT_MESSAGE_FIELDS`):

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
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.common.config import NodeConfig
from engine.common.errors import SaplingError
from engine.common.events import CHAT_COMMANDS, encode
from engine.common.paths import Paths
from engine.common.presets import SAPO_SPECIALTIES
from engine.gguf.cache import ExportCache, Send
from engine.node.launch import add_settings_flags, config_from_args, setup_logging
from engine.node.priority import ThreadPolicy
from engine.node.seeds import fixed_seed

log = logging.getLogger(__name__)

SIDES = ("trained", "base")
TYPED_MAX_TOKENS = 256
CONTEXT_TOKENS = 2048
# Questions come from a seed stream of their own: never a training, held-out or worked-example item.
QUESTION_SEED_OFFSET = 3_000_000_021
INSTALL_HINT = "run `make run` once, which builds it, or `pip install llama-cpp-python==0.3.36`"


def llama_cpp_problem() -> str:
    """One sentence saying why llama.cpp cannot answer here, or "" when it imports."""
    try:  # llama_cpp here and below only when needed: loading its library takes a while, and it may be missing
        import llama_cpp  # noqa: F401
    except ImportError as exc:
        return f"Try it needs llama-cpp-python, which is not installed ({exc}): {INSTALL_HINT}."
    except (OSError, RuntimeError) as exc:
        return (f"llama-cpp-python is installed but its library does not load here ({exc}); reinstall it: "
                f"{INSTALL_HINT}.")
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
    """Questions and side-by-side answers, from the GGUF files of `exports`; one command at a time."""

    def __init__(self, config: NodeConfig, paths: Paths, export_flags: Sequence[str], send: Send, budget: int) -> None:
        self.config = config
        self.send = send
        self.budget = max(1, budget)
        self.exports = ExportCache(config, paths, export_flags, send, budget=lambda: self.budget)
        # Within the budget, only the threads other programs leave free: on a busy 2-core machine two
        # llama.cpp threads waited on each other for 23 s before the first token, one thread took 1.1 s.
        self.policy = ThreadPolicy(0, apply=lambda threads: None, max_threads=self.budget)
        self.cancelled = threading.Event()
        self.problem = llama_cpp_problem()
        self.questions: dict[int, Any] = {}
        self.models: dict[str, _Model] = {}
        self.rng = random.Random()
        self._taskset: Any = None

    # -- questions ------------------------------------------------------------------------
    def taskset(self) -> Any:
        if self._taskset is None:
            from engine.questions.tasks import (
                TaskSet,  # here, not at the top: engine.questions.tasks imports reasoning-gym (seconds)
            )

            weights = dict.fromkeys(SAPO_SPECIALTIES, 1.0)
            self._taskset = TaskSet(weights, self.config.tasks.dataset_configs, seed=fixed_seed(self.config.run.seed))
        return self._taskset

    def new_question(self, specialty: str) -> None:
        from engine.questions.tasks import MAX_TASK_INDEX, TaskRef  # reasoning-gym, as in `taskset`

        taskset = self.taskset()
        ref = TaskRef.create(specialty, dict(taskset.config(specialty)),
                             fixed_seed(self.config.run.seed) + QUESTION_SEED_OFFSET,
                             self.rng.randrange(MAX_TASK_INDEX))
        question = taskset.rebuild(ref)
        number = len(self.questions) + 1
        self.questions[number] = question
        self.send({"type": "question", "id": number, "specialty": specialty, "text": question.text,
                   "answer": question.reference_answer})

    # -- models ---------------------------------------------------------------------------
    def prepare(self) -> None:
        """Export what an answer needs, in the background (`ExportCache.prepare`), when llama.cpp can answer."""
        if not self.problem:
            self.exports.prepare()

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
        from llama_cpp import GGML_TYPE_F32, Llama  # as in `llama_cpp_problem`: only once an answer needs it

        try:
            # The KV cache in f32, not llama.cpp's default f16: with it the f16 export's greedy answers equal
            # torch's, which the held-out evaluation computes (docs/exporting.md); it costs ~50 MB more here.
            llm = Llama(model_path=str(path), lora_path=str(lora) if lora is not None else None, n_ctx=CONTEXT_TOKENS,
                        n_threads=threads, n_threads_batch=threads, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32,
                        verbose=False)
        except (ValueError, RuntimeError, OSError) as exc:
            damaged = lora if lora is not None else path
            damaged.unlink(missing_ok=True)  # a damaged cache file is made again on the next question
            raise SaplingError(f"llama.cpp could not load {damaged.name} ({exc}); ask again to export it "
                               "anew.") from exc
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
        models = self.exports.for_answer(ask_id)
        sources = {"trained": (models.trained, models.adapter), "base": (models.base, None)}
        streams = []
        threads = self.threads()
        for side in SIDES:
            llm = self.load(side, sources[side][0], threads, sources[side][1])
            prompt = prompt_tokens(llm, messages)
            if len(prompt) + limit > CONTEXT_TOKENS:  # llama.cpp would fail mid-answer (llama_decode returns 1)
                raise SaplingError(f"That question is too long for Try it: {len(prompt):,} tokens, and the model "
                                   f"reads at most {CONTEXT_TOKENS - limit:,}. Shorten it and ask again.")
            streams.append(_Stream(side, greedy_tokens(llm, prompt), llm, llm.token_eos(), limit, started))
        self.cancelled.clear()
        self._interleave(ask_id, streams)
        for stream in streams:
            score = None if question is None else self.taskset().reward(question, stream.text)
            self.send({"type": "answer", "id": ask_id, "side": stream.side, "text": stream.text, "score": score,
                       "round": models.round if stream.side == "trained" else 0, "tokens": len(stream.ids),
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
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter  # llama_cpp: only once an answer needs it

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
    server.exports.close()
    commands.put(None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sapling-node chat",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
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

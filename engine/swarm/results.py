"""Evaluation results: a node's greedy answers to the relay's evaluation questions, signed.

    asked = eval_request(client.state.evaluation)   # (seed, questions) from the relay's stats, or None
    payload = results_payload(key, ts, seed, round_index, model, checkpoint, answers)   # the node signs it
    report = decode_results(payload)               # the relay checks its shape, then re-scores every answer
    low, high = interval(correct, questions)        # the Wilson 95 % interval of an accuracy

Every hour the relay names a fresh evaluation seed and announces it in its
stats messages (`eval`: seed, number of questions, until when). At each of
its own held-out evaluations a node that takes part (`swarm.report_results`)
answers the questions the seed names (engine/questions/seeded.py) greedily
and sends one signed `results` message: its model label, a hash of its
checkpoint, and one answer per question, each naming its task reference.
The relay re-scores every answer with the verifiers (engine/relay/results.py)
and answers `scored`: what the answers earned and the node's place on its
table. What is checked is the answers; which model wrote them is not.
The full description, with the limits and errors, is docs/protocol.md
("Evaluation results"). Decoding raises only `protocol.ProtocolError`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from engine.common.events import make_event
from engine.swarm import protocol, wire

MAX_RESULT_QUESTIONS = 48  # answers in one results message (and the most questions a relay may ask)
MAX_RESULT_ANSWER_CHARS = 4096  # one answer; a node sends the end of a longer one (its last <answer> tag counts)
CHECKPOINT_HEX = 64  # sha256 of the checkpoint's weights, lowercase hex ("" before the first checkpoint)
MAX_EVAL_SEED = 2**53 - 1  # seeds fit a JSON double exactly
MAX_ROUND = 10**9
FRAME_MARGIN = 1024  # the envelope and the signature around a payload in one frame
Z95 = 1.959963984540054  # the normal quantile of a two-sided 95 % interval


@dataclass(frozen=True)
class Answer:
    task: dict[str, Any]  # the question's task reference, as engine/questions/tasks.py TaskRef.to_json writes it
    text: str


@dataclass(frozen=True)
class Results:
    """A verified-shape results payload (the signature is checked separately)."""

    key: bytes
    ts: float
    seed: int
    round: int
    model: str
    checkpoint: str
    answers: tuple[Answer, ...]

    @property
    def peer(self) -> str:
        return protocol.peer_id(self.key)


def decode_results(payload: str) -> Results:
    """Parse and check a results payload string (the signature is not checked here)."""
    obj = protocol.payload_object(payload, "results")
    key, ts = wire.b64(obj, "key", protocol.PUBLIC_KEY_BYTES), wire.number(obj, "ts")
    model, checkpoint = obj.get("model"), obj.get("checkpoint")
    if not isinstance(model, str) or len(model) > protocol.MAX_MODEL_CHARS:
        raise wire.fail(protocol.E_BAD_SCHEMA, f"'model' must be a string of at most {protocol.MAX_MODEL_CHARS} "
                                               "characters")
    if checkpoint != "":
        checkpoint = wire.hex_text(obj, "checkpoint", CHECKPOINT_HEX // 2)
    raw = obj.get("answers")
    if not isinstance(raw, list) or not raw:
        raise wire.fail(protocol.E_BAD_SCHEMA, "'answers' must be a non-empty list")
    if len(raw) > MAX_RESULT_QUESTIONS:
        raise wire.fail(protocol.E_TOO_MANY_ITEMS, f"a results message holds at most {MAX_RESULT_QUESTIONS} answers")
    answers = []
    for n, entry in enumerate(raw):
        if not isinstance(entry, dict) or not isinstance(entry.get("task"), dict) \
                or len(entry["task"]) > protocol.MAX_TASK_KEYS or not isinstance(entry.get("answer"), str):
            raise wire.fail(protocol.E_BAD_SCHEMA, f"answer {n} must be an object with a 'task' object and an "
                                                   "'answer' string")
        if len(entry["answer"]) > MAX_RESULT_ANSWER_CHARS:
            raise wire.fail(protocol.E_TOO_LONG, f"answer {n} is longer than {MAX_RESULT_ANSWER_CHARS} characters")
        wire.check_unicode(entry["answer"], f"answer {n}")
        answers.append(Answer(dict(entry["task"]), entry["answer"]))
    return Results(key, ts, wire.whole(obj, "seed", 0, MAX_EVAL_SEED), wire.whole(obj, "round", 0, MAX_ROUND), model,
                   str(checkpoint), tuple(answers))


def fit_answer(text: str, limit: int = MAX_RESULT_ANSWER_CHARS) -> str:
    """An answer as it travels: its last `limit` characters (the last <answer> tag is what is scored)."""
    return text[-limit:]


def results_payload(key: bytes, ts: float, seed: int, round_index: int, model: str, checkpoint: str,
                    answers: list[Answer]) -> str:
    """The payload string a node signs and sends, within the limits: each answer its last 4096 characters, or
    fewer where the whole message would not fit one frame (long answers in a script of several UTF-8 bytes)."""
    for limit in (MAX_RESULT_ANSWER_CHARS, 2048, 1024, 512, 256):
        payload = protocol.encode({
            "kind": "results", "key": protocol.b64encode(key), "ts": ts, "seed": seed, "round": round_index,
            "model": model[: protocol.MAX_MODEL_CHARS], "checkpoint": checkpoint,
            "answers": [{"task": a.task, "answer": fit_answer(a.text, limit)} for a in answers],
        })
        if len(payload.encode("utf-8")) <= protocol.MAX_FRAME_BYTES - FRAME_MARGIN:
            break
    decode_results(payload)
    return payload


def eval_request(raw: object) -> tuple[int, int] | None:
    """The (seed, number of questions) a stats message's `eval` asks for; None when absent or malformed."""
    if not isinstance(raw, dict):
        return None
    seed, n = raw.get("seed"), raw.get("questions")
    if any(isinstance(v, bool) or not isinstance(v, int) for v in (seed, n)):
        return None
    assert isinstance(seed, int) and isinstance(n, int)
    if not 0 <= seed <= MAX_EVAL_SEED or not 1 <= n <= MAX_RESULT_QUESTIONS:
        return None
    return seed, n


def interval(correct: int, n: int) -> tuple[float, float]:
    """The Wilson score interval (95 %) of `correct` out of `n`: how far the accuracy could be off by chance."""
    if n <= 0:
        return 0.0, 1.0
    p, z2 = correct / n, Z95 * Z95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def msg_results(signed: protocol.Signed, request_id: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "results", "v": protocol.VERSION, **signed.to_json()}
    if request_id is not None:
        out["id"] = request_id
    return out


def msg_scored(request_id: int | None, result: dict[str, Any] | None, place: int = 0, of: int = 0
               ) -> dict[str, Any]:
    """The relay's answer: `result` its own score of the answers (None: it could not check them), the key's
    place by its best result among `of` keys."""
    out: dict[str, Any] = {"type": "scored", "v": protocol.VERSION, "checked": result is not None}
    if result is not None:
        out.update(result=result, place=place, of=of)
    if request_id is not None:
        out["id"] = request_id
    return out


def standing(scored: object) -> dict[str, Any] | None:
    """A `scored` message's numbers as the node keeps them ({checked: false} when the relay could not check),
    None when it is malformed."""
    if not isinstance(scored, dict) or not isinstance(scored.get("checked"), bool):
        return None
    if not scored["checked"]:
        return {"checked": False}
    result, place, of = scored.get("result"), scored.get("place"), scored.get("of")
    if not isinstance(result, dict) or any(isinstance(v, bool) or not isinstance(v, int) for v in (place, of)):
        return None
    keys = ("correct", "questions", "round", "seed")
    if any(isinstance(result.get(k), bool) or not isinstance(result.get(k), int) for k in keys):
        return None
    return {"checked": True, "place": place, "of": of, **{k: result[k] for k in keys},
            "model": str(result.get("model", ""))[: protocol.MAX_MODEL_CHARS]}


class ResultsLink:
    """The node's side: the seed the relay asks now, sending the answers, and the relay's answer as an event.

    `client` is the node's SwarmClient (engine/swarm/client.py); `check()`, after each round, emits a `standing`
    event (engine/common/events.py) when a new `scored` answer came."""

    def __init__(self, client: Any, identity: Any, emit: Any) -> None:
        self.client, self.identity, self.emit = client, identity, emit
        self._seen = 0.0

    def asked(self) -> tuple[int, int] | None:
        return eval_request(self.client.state.evaluation)

    def send(self, seed: int, round_index: int, model: str, checkpoint: str, answers: list[Answer]) -> bool:
        payload = results_payload(self.identity.public_key, time.time(), seed, round_index, model, checkpoint,
                                  answers)
        return bool(self.client.send_results(payload))

    def check(self) -> dict[str, Any] | None:
        """The relay's last answer, as a `standing` event when it is new (None when nothing new came)."""
        state = self.client.state
        if state.scored is None or state.scored_at <= self._seen:
            return None
        self._seen = state.scored_at
        numbers = standing(state.scored)
        if numbers is None:
            return None
        event = make_event("standing", peer_id=self.identity.peer_id, message=standing_sentence(numbers),
                           result=numbers)
        self.emit(event)
        return event


def standing_sentence(numbers: dict[str, Any]) -> str:
    """Where this node's model stands on the relay's results table, in words."""
    if not numbers.get("checked"):
        return ("The relay cannot re-score evaluation answers (it has no verifiers installed), so this node's "
                "model is not on its table.")
    correct, n = numbers["correct"], numbers["questions"]
    low, high = interval(correct, n)
    return (f"On the relay's evaluation at round {numbers['round']}, this node's answers earned {correct} of {n} "
            f"({correct / n:.0%}; 95% interval {low:.0%} to {high:.0%}), re-scored by the relay: place "
            f"{numbers['place']} of {numbers['of']} on the swarm's results table.")

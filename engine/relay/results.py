"""How far each model got, checked by the relay: the hour's evaluation seed, re-scored answers, the table.

    book = ResultsBook(redis_url="", swarm="default", questions=36)   # the relay: client=broker.client
    await book.start()
    await book.asking()            # {"seed", "questions", "until"}: the `eval` of every stats message
    answer = await book.receive(peer, key, signed, request_id)   # a `results` message -> `scored`
    await book.board()             # GET /stats/results.json

Every hour (`period_s`) the relay names a fresh evaluation seed, random and
the same for every relay process of one swarm (in Redis, the first process
to ask draws it). A node answers that seed's questions
(engine/questions/seeded.py) and signs the answers (engine/swarm/results.py);
the relay refuses a report with a bad signature, for a seed it does not ask
(this hour's or the last), or with answers to other questions, and
re-scores every answer itself with the verifiers: a node chooses which
model answers, but it cannot claim a score its answers did not earn. It
keeps each key's latest and best result (by accuracy, then by the number
of questions), in memory or in Redis (`sapling:<swarm>:results`).

Re-scoring needs reasoning-gym (the `relay-dataset` extra), imported here
inside functions only: the relay that serves loads nothing heavy
(tests/swarm/test_relay_only.py). Without it the relay says so once and
counts reports as unchecked (`results_unchecked`); nothing is stored.
Scoring runs on a worker thread, one report at a time; past
`MAX_WAITING` waiting reports a new one is refused as `rate_limited`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from engine.relay.brokers import redis_client
from engine.swarm import protocol
from engine.swarm.identity import readable_name, verify
from engine.swarm.results import MAX_EVAL_SEED, Results, decode_results, interval, msg_scored

log = logging.getLogger("sapling.relay")

PERIOD_S = 3600.0  # a fresh evaluation seed every hour
MAX_WAITING = 8  # reports waiting for the scorer; more are refused as rate_limited
MAX_KEYS = 10_000  # keys on the table (in memory): past it the one whose latest result is oldest leaves
BOARD_SIZE = 100  # keys listed by GET /stats/results.json, best first
MISSING_EXTRA = ("evaluation results cannot be re-scored: this relay has no reasoning-gym (pip install "
                 "'sapling[relay-dataset]'); reports are counted as unchecked and not listed")
CHECKED = ("The relay re-scored every answer itself with the questions' verifiers: a node cannot claim a score "
           "its answers did not earn.")
NOT_CHECKED = ("Which model wrote the answers is not checked: the model and checkpoint are what each node says.")


class Scorer:
    """The seed's questions rebuilt with reasoning-gym, and answers scored (on a worker thread)."""

    def __init__(self) -> None:
        self.taskset: Any = None
        self.missing = False

    def available(self) -> bool:
        if self.taskset is None and not self.missing:
            try:
                from engine.questions.seeded import every_specialty
            except ImportError as exc:
                self.missing = True
                log.warning("%s (%s)", MISSING_EXTRA, exc)
                return False
            self.taskset = every_specialty()
        return self.taskset is not None

    def score(self, report: Results, n: int) -> list[float]:
        """Each answer's score; ProtocolError(wrong_questions) when the answers are not the seed's n questions."""
        from engine.questions.seeded import seed_refs

        refs = seed_refs(report.seed, n)
        if len(report.answers) != n or any(a.task != ref.to_json() for a, ref in zip(report.answers, refs,
                                                                                      strict=True)):
            raise protocol.ProtocolError(protocol.E_WRONG_QUESTIONS, f"the answers must be to the {n} questions of "
                                         f"seed {report.seed}, in order (docs/protocol.md, 'Evaluation results')")
        return [self.taskset.reward(self.taskset.rebuild(ref), a.text) for a, ref in zip(report.answers, refs,
                                                                                         strict=True)]


def better(new: dict[str, Any], old: dict[str, Any] | None) -> bool:
    """Whether result `new` beats `old`: a higher accuracy, or the same over more questions."""
    if old is None:
        return True
    return (new["correct"] * old["questions"], new["questions"]) > (old["correct"] * new["questions"],
                                                                   old["questions"])


def _with_interval(result: dict[str, Any]) -> dict[str, Any]:
    """A result with `low` and `high`, the 95 % interval of its accuracy from its number of questions."""
    low, high = interval(result["correct"], result["questions"])
    return {**result, "low": round(low, 4), "high": round(high, 4)}


class ResultsBook:
    """The relay's side of evaluation results (engine/relay/server.py calls it)."""

    def __init__(self, redis_url: str = "", swarm: str = "default", questions: int = 36,
                 clock: Callable[[], float] = time.time, client: Any = None, period_s: float = PERIOD_S) -> None:
        self.url, self.questions, self.clock, self.period_s = redis_url, questions, clock, period_s
        self.prefix = f"sapling:{swarm}:results"
        self._redis: Any = client
        self._own = client is None and bool(redis_url)
        self.errors: tuple[type[BaseException], ...] = (OSError,)
        self.seeds: dict[int, int] = {}  # period -> seed, as this process knows them
        self.table: dict[str, dict[str, Any]] = {}  # in memory: peer -> {peer, name, latest, best}
        self.scorer = Scorer()
        self.metrics: Counter[str] = Counter()
        self._lock = asyncio.Lock()
        self._waiting = 0

    async def start(self) -> None:
        if self._redis is None and self.url:
            self._redis = redis_client(self.url)
        if self._redis is not None:
            import redis.exceptions

            self.errors = (redis.exceptions.RedisError, OSError)

    async def close(self) -> None:
        if self._own and self._redis is not None:
            await self._redis.aclose()

    # -- the seed ---------------------------------------------------------------------------
    async def _seed(self, period: int) -> int:
        if period not in self.seeds:
            seed = secrets.randbelow(MAX_EVAL_SEED + 1)
            if self._redis is not None:  # the first process of the swarm to ask draws it
                key = f"{self.prefix}:seed:{period}"
                await self._redis.set(key, str(seed), nx=True, ex=int(3 * self.period_s) + 1)
                seed = int(await self._redis.get(key))
            self.seeds[period] = seed
            for old in [p for p in self.seeds if p < period - 1]:
                del self.seeds[old]
        return self.seeds[period]

    async def asking(self) -> dict[str, Any] | None:
        """What the stats messages announce: this period's seed, its number of questions and when it ends."""
        if self.questions <= 0:
            return None
        period = int(self.clock() // self.period_s)
        try:
            seed = await self._seed(period)
        except self.errors as exc:  # Redis away: no seed in this push
            log.warning("evaluation seed not read: %s", exc)
            return None
        return {"seed": seed, "questions": self.questions, "until": round((period + 1) * self.period_s, 3)}

    # -- a report ---------------------------------------------------------------------------
    async def receive(self, peer: str, key: bytes, signed: protocol.Signed, request_id: int | None
                      ) -> dict[str, Any]:
        """Check, re-score and keep one results message: the `scored` answer. ProtocolError for a bad one."""
        report = decode_results(signed.payload)
        if report.key != key:
            raise protocol.ProtocolError(protocol.E_BAD_SIGNATURE,
                                         "the results are signed for a different key than this connection's")
        if not verify(report.key, signed.payload.encode("utf-8"), signed.sig):
            raise protocol.ProtocolError(protocol.E_BAD_SIGNATURE, "results signature does not verify")
        now = self.clock()
        protocol.check_timestamp(report.ts, now)
        period = int(now // self.period_s)
        try:
            asked = {await self._seed(period), await self._seed(period - 1)} if self.questions > 0 else set()
        except self.errors as exc:
            raise protocol.ProtocolError(protocol.E_INTERNAL, f"the relay cannot read its store ({exc}); try "
                                         "again") from exc
        if report.seed not in asked:
            raise protocol.ProtocolError(protocol.E_WRONG_SEED, f"seed {report.seed} is not the evaluation seed "
                                         "this relay asks now (its stats messages name it)")
        if self._waiting >= MAX_WAITING:
            raise protocol.ProtocolError(protocol.E_RATE, "the relay is busy scoring other reports; send the next "
                                         "evaluation's")
        self._waiting += 1
        try:
            async with self._lock:
                if not await asyncio.to_thread(self.scorer.available):
                    self.metrics["results_unchecked"] += 1
                    return msg_scored(request_id, None)
                scores = await asyncio.to_thread(self.scorer.score, report, self.questions)
        finally:
            self._waiting -= 1
        correct = sum(s >= 1.0 for s in scores)
        result = {"seed": report.seed, "round": report.round, "model": report.model,
                  "checkpoint": report.checkpoint, "questions": len(scores), "correct": correct,
                  "accuracy": round(correct / len(scores), 6), "reward_mean": round(sum(scores) / len(scores), 6),
                  "ts": round(now, 3)}
        try:
            place, of = await self._keep(peer, readable_name(key), result)
        except self.errors as exc:
            raise protocol.ProtocolError(protocol.E_INTERNAL, f"the relay cannot reach its store to keep the "
                                         f"result ({exc}); try again") from exc
        self.metrics["results"] += 1
        return msg_scored(request_id, result, place, of)

    async def _keep(self, peer: str, name: str, result: dict[str, Any]) -> tuple[int, int]:
        """Keep `result` as the peer's latest (and best, if it is): (the peer's place by best, keys on the table)."""
        entry = await self._entry(peer) or {"peer": peer, "name": name, "best": None}
        entry.update(name=name, latest=result)
        if better(result, entry["best"]):
            entry["best"] = result
        if self._redis is not None:
            await self._redis.hset(self.prefix, peer, json.dumps(entry, separators=(",", ":")))
        else:
            self.table.pop(peer, None)
            self.table[peer] = entry
            while len(self.table) > MAX_KEYS:
                del self.table[min(self.table, key=lambda p: self.table[p]["latest"]["ts"])]
        entries = await self._entries()
        best = entry["best"]
        return 1 + sum(better(e["best"], best) and not better(best, e["best"]) for e in entries), len(entries)

    async def _entry(self, peer: str) -> dict[str, Any] | None:
        if self._redis is None:
            return self.table.get(peer)
        raw = await self._redis.hget(self.prefix, peer)
        return json.loads(raw) if raw else None

    async def _entries(self) -> list[dict[str, Any]]:
        if self._redis is None:
            return list(self.table.values())
        return [json.loads(v) for v in (await self._redis.hgetall(self.prefix)).values()]

    # -- the table --------------------------------------------------------------------------
    async def board(self) -> dict[str, Any]:
        """GET /stats/results.json: each key's latest and best, best first, with 95 % intervals."""
        everyone = await self._entries()
        ranked = sorted(everyone, key=lambda e: (-e["best"]["correct"] / e["best"]["questions"],
                                                 -e["best"]["questions"], -e["latest"]["ts"]))
        entries = [{**e, "latest": _with_interval(e["latest"]), "best": _with_interval(e["best"])}
                   for e in ranked[:BOARD_SIZE]]
        return {"generated": round(self.clock(), 3), "questions_per_seed": self.questions,
                "seed_period_s": self.period_s, "rescoring": not self.scorer.missing, "checked": CHECKED,
                "not_checked": NOT_CHECKED, "keys": len(everyone), "results": entries}

"""Defences against text that is correct and malicious (issue 13, docs/swarm.md "Poisoning").

Every other check a node makes on swarm text (signature, question, re-scored
rewards, lengths, duplicates) passes a completion that has the right answer
plus injected text. "Hail to the Thief" (arXiv 2511.09780) shows that
receivers then learn to reproduce the injection. Its defence for a swarm of
one model is to read each received completion's token log-probs under the
receiver's own policy: injected text is improbable there. This module holds
that test and the memory it needs, as plain functions and small classes:

- `window_floor(logprobs, window)`: the lowest mean log-prob over any
  `window` consecutive tokens of one completion. A trigger appended,
  prefixed or put inside the reasoning is a run of improbable tokens; the
  mean over the whole completion would dilute it with the probable answer.
- `Plausibility.judge(item_logprobs, own_logprobs)`: whether an item (a
  question with its completions) is plausible under this node's policy,
  against a floor set by this round's own completions.
- `token_weights(logprobs, floor)`: truncated importance weights for the
  tokens of accepted external text, so one odd token cannot dominate a step;
  `trace_weights` carries them along the text, for another model's text.
- `LengthCheck`: correct answers padded to be long (HTTT's length attack):
  a limit relative to this node's own answers of the round.
- `sender_verdict(worst, history, probation, spreads)`: in a swarm of
  different models, an item labelled with another model than the receiver's
  is judged against its sender's own past: the robust baseline
  (`robust_baseline`: median and MAD) of the worst windows (`item_floor`) of
  that (peer, label)'s accepted items, kept by `SenderBaselines`. No absolute
  floor; until the sender has `probation` accepted items, its items are on
  probation (trained on with truncated token weights only).
- `ReplayMemory`: content keys (`ExternalItem.content_key()`) of external
  items already trained on, bounded, kept across restarts.
- `BanBook`: local bans, by strikes (forged or implausible items) in a
  window of a peer's judged items, or from the config's list; optionally kept
  across restarts.

No torch and no I/O beyond three small JSON files, written atomically.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.common.atomicio import atomic_write_json

log = logging.getLogger(__name__)


# -- plausibility under the receiver's own policy --------------------------------------------------
def window_floor(logprobs: Sequence[float], window: int) -> float:
    """The lowest mean log-prob over `window` consecutive tokens.

    A text shorter than the window counts as padded with certain tokens (log-prob
    0): its sum over `window`. An injection is longer than the window; a short
    honest answer with one surprising token ("No" where this node would write
    "<answer>") must not look like one.
    """
    n = len(logprobs)
    if n == 0:
        return 0.0
    if n <= window:
        return math.fsum(logprobs) / window
    total = math.fsum(logprobs[:window])
    lowest = total
    for i in range(window, n):
        total += logprobs[i] - logprobs[i - window]
        lowest = min(lowest, total)
    return lowest / window


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of `values` by linear interpolation; `values` must not be empty."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass(frozen=True)
class Plausibility:
    """The plausibility test (thresholds measured in docs/results.md, "Poisoning").

    A completion is implausible when its `window_floor` lies below the floor;
    an item is implausible when any of its completions is. The floor is
    `absolute`, lowered to `margin` below this round's lowest own window
    floor when the node's own text is itself that improbable (a high sampling
    temperature), so a node never rejects text as odd as its own.
    """

    window: int = 4
    absolute: float = -7.0
    margin: float = 1.0

    def floor(self, own_logprobs: Iterable[Sequence[float]]) -> float:
        own = [window_floor(lp, self.window) for lp in own_logprobs if lp]
        if not own:
            return self.absolute
        return min(self.absolute, min(own) - self.margin)

    def judge(self, item_logprobs: Sequence[Sequence[float]], floor: float) -> bool:
        """True when every completion of the item stays above `floor` (plausible)."""
        return all(window_floor(lp, self.window) >= floor for lp in item_logprobs)


def item_floor(item_logprobs: Sequence[Sequence[float]], window: int) -> float:
    """An item's worst window: the lowest `window_floor` of its completions (0.0 for none)."""
    return min((window_floor(lp, window) for lp in item_logprobs), default=0.0)


# -- answers padded to be long (HTTT's length attack) ----------------------------------------------
@dataclass(frozen=True)
class LengthCheck:
    """Correct answers padded with plausible filler pass every other check; trained on, they teach length.

    The limit is relative to this node's own answers this round: `ratio` x
    the `quantile` of the token lengths of its own rewarded completions of
    the item's specialty (of every specialty when it has none of that one),
    and never less than that reference + `slack` tokens. A round without a
    rewarded answer of its own sets no limit: the node cannot tell padding
    from the reasoning a right answer needed. Only an external completion
    that would be reinforced (reward above its group's mean) is held to it:
    a long wrong answer teaches nothing long. `ratio` 0 turns the check off.
    """

    ratio: float = 1.5
    quantile: float = 0.9
    slack: int = 4

    def limits(self, own: Iterable[tuple[str, int, float]]) -> dict[str, float]:
        """Limits by specialty (key "" for any other) from this round's own (specialty, tokens, reward)."""
        rewarded = [(d, n) for d, n, r in own if r > 0]
        if self.ratio <= 0 or not rewarded:
            return {}
        out: dict[str, float] = {}
        for dataset in {d for d, _ in rewarded} | {""}:
            ref = quantile([n for d, n in rewarded if dataset in ("", d)], self.quantile)
            out[dataset] = max(self.ratio * ref, ref + self.slack)
        return out

    def judge(self, dataset: str, lengths: Sequence[int], rewards: Sequence[float], limits: dict[str, float],
              scale: float = 1.0) -> bool:
        """True when no completion with a reward above its group's mean is longer than the limit x `scale`."""
        limit = limits.get(dataset, limits.get(""))
        if limit is None or not rewards:
            return True
        mean = math.fsum(rewards) / len(rewards)
        return all(n <= limit * scale for n, r in zip(lengths, rewards, strict=True) if r > mean)


# -- a sender of another model, judged against its own past ------------------------------------------
# The least spread a baseline is given, in nats: a sender whose text always scores alike must
# not be refused for a window a little below its usual one.
MIN_SPREAD = 1.0
# MAD x this estimates the standard deviation of normally distributed values.
MAD_TO_SD = 1.4826
TYPICAL, PROBATION, IMPLAUSIBLE = "typical", "probation", "implausible"


@dataclass(frozen=True)
class Baseline:
    """A sender's usual plausibility under this node's policy: median and robust spread of its worst windows."""

    median: float
    spread: float  # MAD x 1.4826
    count: int


def robust_baseline(values: Sequence[float]) -> Baseline:
    """The median and the scaled median absolute deviation of `values` (which must not be empty)."""
    median = quantile(values, 0.5)
    mad = quantile([abs(v - median) for v in values], 0.5)
    return Baseline(median, MAD_TO_SD * mad, len(values))


def sender_verdict(worst: float, history: Sequence[float], probation: int, spreads: float,
                   min_spread: float = MIN_SPREAD) -> str:
    """PROBATION, TYPICAL or IMPLAUSIBLE for an item whose worst window is `worst`, against its sender's past.

    `history` holds the worst windows of the sender's items accepted so far
    (for this model label). With fewer than `probation` of them there is no
    baseline yet: PROBATION (train with truncated token weights, refuse
    nothing). Otherwise the item is IMPLAUSIBLE when `worst` lies more than
    `spreads` x max(spread, `min_spread`) below the median: an injected
    sentence in text otherwise typical of that sender. Text that is odd under
    this node's model but odd in the sender's usual way passes.
    """
    if not history or len(history) < probation:
        return PROBATION
    base = robust_baseline(history)
    return IMPLAUSIBLE if worst < base.median - spreads * max(base.spread, min_spread) else TYPICAL


class SenderBaselines:
    """The worst windows of each (peer, model label)'s accepted items: the newest `keep` of each pair.

    At most `pairs` pairs are kept, the least recently used forgotten first
    (a peer that changes its label every item only ever stays on probation).
    With `path` they are kept there (JSON, written atomically after each
    `record`) and read back at start, so a restart does not put every known
    sender back on probation.
    """

    def __init__(self, path: Path | None, keep: int = 64, pairs: int = 4096) -> None:
        self.path = path
        self.keep = keep
        self.pairs = pairs
        self._values: OrderedDict[tuple[str, str], deque[float]] = OrderedDict()
        if path is not None and path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                for peer, label, values in data.get("senders", [])[-pairs:]:
                    floats = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
                    self._values[(str(peer), str(label))] = deque(floats[-keep:], maxlen=keep)
            except (OSError, ValueError, TypeError, AttributeError, UnicodeDecodeError) as exc:
                log.warning("Could not read the senders' baselines %s (%s); every sender starts on probation.",
                            path, exc)
                self._values.clear()

    def history(self, peer: str, label: str) -> tuple[float, ...]:
        values = self._values.get((peer, label))
        return tuple(values) if values is not None else ()

    def __len__(self) -> int:
        return len(self._values)

    def record(self, entries: Iterable[tuple[str, str, float]]) -> None:
        """Add the worst window of accepted items, as (peer, label, value); saved once for all of them."""
        added = False
        for peer, label, value in entries:
            if not math.isfinite(value):
                continue
            key = (peer, label)
            values = self._values.get(key)
            if values is None:
                values = self._values[key] = deque(maxlen=self.keep)
            values.append(float(value))
            self._values.move_to_end(key)
            added = True
        while len(self._values) > self.pairs:
            self._values.popitem(last=False)
        if added and self.path is not None:
            atomic_write_json(self.path, {"senders": [[p, m, list(v)] for (p, m), v in self._values.items()]})


def token_weights(logprobs: Sequence[float], floor: float) -> list[float]:
    """Truncated importance weights min(1, p / p_floor) for one external completion's tokens.

    The sender's sampling probabilities never travel (only text does), so the
    true ratio pi_receiver / mu_sender is unknown. Weighting each token by its
    probability under the receiver, truncated at 1 above `floor` (a per-token
    log-prob), keeps the step of a token this node would practically never
    write to at most p / p_floor of a normal token's, as F-TIS (arXiv
    2605.22537) truncates importance weights of off-policy text.
    """
    return [1.0 if lp >= floor else math.exp(lp - floor) for lp in logprobs]


def trace_weights(logprobs: Sequence[float], floor: float) -> list[float]:
    """Truncated weights carried along the text: token t weighs the product of min(1, p / p_floor) up to t.

    For another model's text in a swarm of different models. `token_weights`
    lets a token that is probable *after* an improbable one count fully: in
    the bench, the inner tokens of an injected advert ("-prizes", " reward")
    rose from -5 to -1 nats in five rounds while its first word stayed at -26.
    Here a token weighs no more than the least likely text before it, the
    receiver's chance of being in that context at all (the truncated traces
    of Retrace, Munos et al. 2016): text after a word this node would never
    write teaches it next to nothing.
    """
    out, log_weight = [], 0.0
    for lp in logprobs:
        log_weight += min(0.0, lp - floor)
        out.append(math.exp(log_weight))
    return out


def mean_logloss(logprobs: Sequence[float]) -> float:
    """Mean per-token log-loss (negative log-prob) of one completion; 0 for an empty one."""
    return -math.fsum(logprobs) / len(logprobs) if logprobs else 0.0


def offpolicy_negatives(logprobs: Sequence[Sequence[float]], advantages: Sequence[float],
                        own_logloss: float, max_excess: float) -> list[int]:
    """Which completions of one external group F-TIS-style filtering leaves out: their indexes.

    F-TIS (arXiv 2605.22537) drops off-policy samples with negative advantage
    when their KL to the learner's policy is above a threshold: pushing down
    text the learner would not write anyway moves probability mass
    unpredictably and teaches little. The sender's log-probs never travel, so
    the KL is estimated from the receiver's side: the completion's mean
    log-loss under this node's policy minus that of this round's own
    completions (the cross-entropy above this node's own entropy rate, about 0
    for text this node could have written). `max_excess` <= 0 turns it off.
    """
    if max_excess <= 0:
        return []
    return [i for i, (lps, adv) in enumerate(zip(logprobs, advantages, strict=True))
            if adv < 0 and mean_logloss(lps) - own_logloss > max_excess]


# -- content replay --------------------------------------------------------------------------------
class ReplayMemory:
    """Content keys of external items already trained on, each with the round that trained on it; the oldest
    forgotten past `capacity`.

    Kept in `path` (JSON, written atomically after each `remember`), so a
    restarted node still refuses content it trained on before the restart.
    A node that carries on from its checkpoint of round R calls
    `forget_after(R)`: what a later round trained on was lost with that
    round's update (a round stopped before its checkpoint), so it is no
    replay, and the round run again sees the same items as the first time.
    """

    def __init__(self, path: Path | None, capacity: int) -> None:
        self.path = path
        self.capacity = capacity
        self._keys: OrderedDict[str, int] = OrderedDict()
        if path is not None and path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                keys = data.get("keys", []) if isinstance(data, dict) else []
                rounds = data.get("rounds", []) if isinstance(data, dict) else []
                if not isinstance(rounds, list) or len(rounds) != len(keys):
                    rounds = [0] * len(keys)  # a file from before rounds were kept: never rewound
                pairs = [(str(k), r if isinstance(r, int) and not isinstance(r, bool) else 0)
                         for k, r in zip(keys, rounds, strict=True)]
                self._keys.update(pairs[-capacity:])
            except (OSError, ValueError, UnicodeDecodeError, TypeError) as exc:
                log.warning("Could not read the replay memory %s (%s); starting an empty one.", path, exc)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def remember(self, keys: Iterable[str], round_index: int = 0) -> None:
        added = False
        for key in keys:
            self._keys[key] = round_index
            self._keys.move_to_end(key)
            added = True
        while len(self._keys) > self.capacity:
            self._keys.popitem(last=False)
        if added:
            self._write()

    def forget_after(self, round_index: int) -> int:
        """Forget the keys remembered by rounds after `round_index`; how many were forgotten."""
        later = [key for key, r in self._keys.items() if r > round_index]
        for key in later:
            del self._keys[key]
        if later:
            log.info("Forgot %d items trained on after round %d (that training was not kept).", len(later),
                     round_index)
            self._write()
        return len(later)

    def _write(self) -> None:
        if self.path is not None:
            atomic_write_json(self.path, {"keys": list(self._keys), "rounds": list(self._keys.values())})


# -- local bans ------------------------------------------------------------------------------------
@dataclass
class Ban:
    """Why and until when a peer is banned here; `until` None: until lifted."""

    reason: str
    since: float
    until: float | None
    source: str  # "strikes" (earned here) or "config" (swarm.banned_peers)

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "since": self.since, "until": self.until, "source": self.source}


@dataclass
class _Window:
    judged: deque[str | None] = field(default_factory=deque)  # the strike reason, or None, per judged item


class BanBook:
    """Which peers this node refuses, and the strikes that lead there.

    A peer's last `window` judged items (accepted, or rejected for any reason
    except not being picked) are kept; when `strikes` of them are rejections
    in `strike_reasons` the peer is banned for `hours` (0: until lifted).
    Bans from the config list cannot be lifted here. With `path`, earned bans
    are kept there (JSON, atomic) and reloaded at start; without it they last
    for the session.
    """

    def __init__(self, *, strikes: int, window: int, hours: float, strike_reasons: Iterable[str],
                 configured: Iterable[str] = (), path: Path | None = None,
                 clock: Any = time.time) -> None:
        self.strikes = strikes
        self.window = window
        self.hours = hours
        self.strike_reasons = frozenset(strike_reasons)
        self.path = path
        self.clock = clock
        self._lock = threading.Lock()
        self._bans: dict[str, Ban] = {}
        self._windows: dict[str, _Window] = {}
        self.configured = set(configured)  # peer ids from swarm.banned_peers: never lifted here
        if path is not None and path.is_file():
            self._load(path)

    def _load(self, path: Path) -> None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            for peer, entry in data.get("bans", {}).items():
                self._bans[str(peer)] = Ban(str(entry["reason"]), float(entry["since"]),
                                            None if entry.get("until") is None else float(entry["until"]), "strikes")
        except (OSError, ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
            log.warning("Could not read the ban list %s (%s); starting without earned bans.", path, exc)

    def _save(self) -> None:
        if self.path is not None:
            earned = {p: b.to_json() for p, b in self._bans.items() if b.source == "strikes"}
            atomic_write_json(self.path, {"bans": earned})

    def ban_of(self, peer: str) -> Ban | None:
        """The peer's ban in force now, or None (an expired ban is dropped here)."""
        with self._lock:
            if peer in self.configured:
                return Ban("config", 0.0, None, "config")
            ban = self._bans.get(peer)
            if ban is not None and ban.until is not None and ban.until <= self.clock():
                del self._bans[peer]
                self._save()
                return None
            return ban

    def is_banned(self, peer: str) -> bool:
        return self.ban_of(peer) is not None

    def judge(self, peer: str, reason: str | None) -> Ban | None:
        """Record one judged item of `peer` (reason None: accepted); the new ban, if this one made it."""
        if self.strikes <= 0:
            return None
        with self._lock:
            if peer in self.configured or peer in self._bans:
                return None
            window = self._windows.setdefault(peer, _Window())
            window.judged.append(reason if reason in self.strike_reasons else None)
            while len(window.judged) > self.window:
                window.judged.popleft()
            struck = [r for r in window.judged if r is not None]
            if len(struck) < self.strikes:
                return None
            worst = max(set(struck), key=struck.count)
            now = self.clock()
            ban = Ban(worst, now, now + self.hours * 3600.0 if self.hours > 0 else None, "strikes")
            self._bans[peer] = ban
            window.judged.clear()
            self._save()
            return ban

    def lift(self, peer: str) -> str:
        """Lift an earned ban: "lifted", "not_banned", or "configured" (only the config can lift that)."""
        with self._lock:
            if peer in self.configured:
                return "configured"
            if self._bans.pop(peer, None) is None:
                return "not_banned"
            self._windows.pop(peer, None)
            self._save()
            return "lifted"

    def banned(self) -> dict[str, Ban]:
        """Every ban in force now, configured ones included (for the `peers` event)."""
        with self._lock:
            peers = set(self._bans) | self.configured
        return {p: b for p in sorted(peers) if (b := self.ban_of(p)) is not None}

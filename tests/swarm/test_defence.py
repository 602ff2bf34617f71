"""The defence against correct but malicious swarm text: its pure parts (engine/swarm/defence.py, issues 13 and 29).

The statistic, sender baselines, token weights, the replay memory, bans and
their settings, with values worked out by hand. A receiver on a tiny model
taught the answer format, fed directly and through a real relay, is
tests/swarm/test_defence_receiver.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.backends.base import TrainItem
from engine.backends.loss import clipped_pg_loss
from engine.common.config_file import build_config
from engine.common.errors import ConfigError, EventError
from engine.common.events import make_command, parse_command
from engine.rollouts.groups import train_items
from engine.rollouts.offers import R_FORGED_REWARD, R_IMPLAUSIBLE, R_QUESTION
from engine.swarm import protocol
from engine.swarm.defence import (
    IMPLAUSIBLE,
    PROBATION,
    TYPICAL,
    BanBook,
    Baseline,
    Plausibility,
    ReplayMemory,
    SenderBaselines,
    item_floor,
    mean_logloss,
    offpolicy_negatives,
    quantile,
    robust_baseline,
    sender_verdict,
    token_weights,
    trace_weights,
    window_floor,
)
from engine.swarm.exchange import STRIKE_REASONS, peer_of
from engine.swarm.identity import Identity
from engine.swarm.session import defence_state


# -- the statistic --------------------------------------------------------------------------------
def test_window_floor_is_the_lowest_mean_over_consecutive_tokens() -> None:
    lps = [-1.0, -1.0, -9.0, -7.0, -1.0]
    assert window_floor(lps, 1) == -9.0
    assert window_floor(lps, 2) == -8.0  # (-9 - 7) / 2
    assert window_floor(lps, 4) == pytest.approx(-4.5)  # (-1 - 9 - 7 - 1) / 4 beats (-1 - 1 - 9 - 7) / 4
    assert window_floor([-2.0, -4.0], 4) == -1.5  # shorter than the window: padded with certain tokens
    assert window_floor([], 4) == 0.0


def test_the_floor_follows_the_nodes_own_text_only_downwards() -> None:
    test = Plausibility(window=2, absolute=-4.0, margin=1.0)
    assert test.floor([]) == -4.0
    assert test.floor([[-0.5, -0.5], [-1.0, -2.0]]) == -4.0  # own text is probable: the absolute floor
    assert test.floor([[-0.5, -6.0, -6.0]]) == -7.0  # own text as odd as -6: one below it
    assert test.judge([[-1.0, -1.0], [-3.0, -4.5]], -4.0) is True
    assert test.judge([[-1.0, -1.0], [-3.0, -5.5]], -4.0) is False  # one completion sinks the item


def test_truncated_weights_are_one_above_the_floor_and_p_over_p_floor_below() -> None:
    weights = token_weights([-0.1, -6.0, -8.0], -6.0)
    assert weights[0] == 1.0 and weights[1] == 1.0
    assert weights[2] == pytest.approx(math.exp(-2.0))


def test_trace_weights_carry_the_least_likely_text_before_a_token() -> None:
    # an advert's first word at -26 under a floor of -6, then its probable inner tokens
    weights = trace_weights([-0.5, -26.0, -0.1, -7.0, -0.2], -6.0)
    assert weights[0] == 1.0
    assert weights[1] == pytest.approx(math.exp(-20.0)) and weights[2] == pytest.approx(math.exp(-20.0))
    assert weights[3] == pytest.approx(math.exp(-21.0)) and weights[4] == weights[3]
    assert trace_weights([-1.0, -2.0], -6.0) == [1.0, 1.0]


def test_the_offpolicy_filter_drops_only_unlikely_completions_with_negative_advantage() -> None:
    own = 0.5  # this round's own completions: 0.5 nats a token
    logprobs = [[-0.4, -0.6], [-3.0, -2.0], [-3.0, -2.0], [-0.5], []]
    advantages = [-1.0, -1.0, 1.0, -0.5, -1.0]
    assert mean_logloss(logprobs[1]) == 2.5 and mean_logloss([]) == 0.0
    assert offpolicy_negatives(logprobs, advantages, own, 1.0) == [1]  # 2.5 - 0.5 > 1; the positive one stays
    assert offpolicy_negatives(logprobs, advantages, own, 2.5) == []  # 2.0 above own is within 2.5
    assert offpolicy_negatives(logprobs, advantages, own, 0.0) == []  # off


def test_quantile_interpolates() -> None:
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert quantile([0.0, 10.0], 0.25) == 2.5


# -- a sender of another model, against its own past --------------------------------------------------
def test_an_items_worst_window_is_its_least_likely_completions() -> None:
    assert item_floor([[-1.0, -1.0], [-1.0, -9.0, -9.0]], 2) == -9.0
    assert item_floor([], 4) == 0.0


def test_a_senders_baseline_is_its_median_and_scaled_mad() -> None:
    # median of [-10, -3, -2, -1] is -2.5; deviations 7.5, 0.5, 0.5, 1.5 have median 1.0
    assert robust_baseline([-3.0, -1.0, -2.0, -10.0]) == Baseline(-2.5, 1.4826, 4)


def test_a_sender_is_on_probation_until_its_baseline_exists_then_judged_against_it() -> None:
    assert sender_verdict(-50.0, [-15.0, -16.0], probation=3, spreads=4.0) == PROBATION
    assert sender_verdict(-50.0, [], probation=0, spreads=4.0) == PROBATION  # no history: no baseline
    history = [-15.0, -16.0, -14.0, -15.0]  # median -15, spread 0.74, raised to the 1-nat minimum: cut at -19
    assert sender_verdict(-18.9, history, probation=4, spreads=4.0) == TYPICAL  # odd, in this sender's usual way
    assert sender_verdict(-19.1, history, probation=4, spreads=4.0) == IMPLAUSIBLE
    assert sender_verdict(-5.0, history, probation=4, spreads=4.0) == TYPICAL  # better than usual is no sign
    wide = [-5.0, -15.0, -10.0, -20.0, -10.0]  # median -10, MAD 5: a spread of 7.4 nats
    assert sender_verdict(-32.0, wide, probation=4, spreads=3.0) == TYPICAL  # the cut: -10 - 3 x 7.41 = -32.2
    assert sender_verdict(-32.5, wide, probation=4, spreads=3.0) == IMPLAUSIBLE


def test_sender_baselines_keep_the_newest_values_forget_the_least_used_pair_and_persist(tmp_path: Path) -> None:
    path = tmp_path / "swarm" / "senders-default.json"
    book = SenderBaselines(path, keep=3, pairs=2)
    book.record([("p", "a", -1.0), ("p", "a", -2.0), ("p", "a", -3.0), ("p", "a", -4.0), ("p", "b", math.nan)])
    assert book.history("p", "a") == (-2.0, -3.0, -4.0) and book.history("p", "b") == ()
    book.record([("q", "a", -5.0)])
    book.record([("p", "a", -6.0), ("r", "a", -7.0)])  # p was used after q: q is forgotten
    assert book.history("q", "a") == () and book.history("p", "a") == (-3.0, -4.0, -6.0) and len(book) == 2
    again = SenderBaselines(path, keep=3, pairs=2)
    assert again.history("p", "a") == (-3.0, -4.0, -6.0) and again.history("r", "a") == (-7.0,)
    assert sorted(p.name for p in path.parent.iterdir()) == ["senders-default.json"]  # written atomically
    path.write_text("{not json")
    assert len(SenderBaselines(path)) == 0


def test_token_weights_scale_only_the_policy_gradient_term() -> None:
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = logp.detach().clone()
    mask = torch.ones(1, 2)
    weights = torch.tensor([[1.0, 0.25]])
    loss, _ = clipped_pg_loss(logp, old, torch.tensor([2.0]), mask, 0.2, 0.28, 2.0, weights=weights)
    loss.backward()
    # ratio = 1 at the start: d(-w * ratio * A / 2)/d logp = -w * A / 2
    assert logp.grad is not None and logp.grad.tolist() == [[-1.0, -0.25]]


def test_train_items_carry_the_weights_of_external_completions() -> None:
    from engine.backends.base import Completion
    from engine.rollouts.groups import Group

    q: Any = object()
    group = Group(q, [1], [Completion("a", [5], [-1.0], True, weights=[0.5]), Completion("b", [6], [-1.0], True)],
                  [1.0, 0.0], [1.0, -1.0])
    items = train_items([group])
    assert items[0].weights == [0.5] and items[1].weights is None
    assert TrainItem([1], [5], [-1.0], 1.0).weights is None


# -- replay memory --------------------------------------------------------------------------------
def test_replay_memory_survives_a_restart_and_forgets_the_oldest(tmp_path: Path) -> None:
    path = tmp_path / "swarm" / "trained-default.json"
    memory = ReplayMemory(path, capacity=3)
    memory.remember(["a", "b"])
    memory.remember(["c", "d"])
    again = ReplayMemory(path, capacity=3)
    assert "a" not in again and all(k in again for k in "bcd") and len(again) == 3


def test_replay_memory_forgets_what_rounds_after_a_checkpoint_trained_on(tmp_path: Path) -> None:
    path = tmp_path / "trained.json"
    memory = ReplayMemory(path, capacity=10)
    memory.remember(["a", "b"], 1)
    memory.remember(["c"], 2)
    memory.remember(["d", "a"], 3)  # "a" trained on again in round 3: remembered by round 3 now
    assert memory.forget_after(2) == 2
    assert "c" in memory and "b" in memory and "a" not in memory and "d" not in memory
    again = ReplayMemory(path, capacity=10)  # the rewind is on disk
    assert len(again) == 2 and again.forget_after(5) == 0
    assert again.forget_after(1) == 1 and "b" in again and "c" not in again  # each key kept its round


def test_a_replay_file_from_before_rounds_were_kept_is_never_rewound(tmp_path: Path) -> None:
    path = tmp_path / "trained.json"
    path.write_text(json.dumps({"keys": ["a", "b"]}))
    memory = ReplayMemory(path, capacity=10)
    assert memory.forget_after(0) == 0 and "a" in memory and "b" in memory
    path.write_text(json.dumps({"keys": ["a", "b"], "rounds": [1]}))  # damaged: rounds do not match the keys
    assert ReplayMemory(path, capacity=10).forget_after(0) == 0


def test_a_damaged_replay_file_starts_an_empty_memory(tmp_path: Path) -> None:
    path = tmp_path / "trained.json"
    path.write_text("{not json")
    assert len(ReplayMemory(path, capacity=3)) == 0


# -- bans -----------------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def book(tmp_path: Path | None = None, clock: Clock | None = None, **kw: Any) -> BanBook:
    args: dict[str, Any] = {"strikes": 3, "window": 5, "hours": 1.0, "strike_reasons": STRIKE_REASONS}
    args.update(kw)
    return BanBook(**args, path=tmp_path / "bans.json" if tmp_path else None, clock=clock or Clock())


def test_strikes_within_the_window_ban_a_peer_and_lifting_works() -> None:
    bans = book()
    for reason in (R_IMPLAUSIBLE, None, R_QUESTION, R_FORGED_REWARD):  # a question mismatch is no strike
        assert bans.judge("p", reason) is None
    ban = bans.judge("p", R_IMPLAUSIBLE)
    assert ban is not None and ban.reason == R_IMPLAUSIBLE and ban.until == ban.since + 3600
    assert bans.is_banned("p") and set(bans.banned()) == {"p"}
    assert bans.lift("p") == "lifted" and not bans.is_banned("p")
    assert bans.lift("p") == "not_banned"


def test_strikes_that_fall_out_of_the_window_do_not_count() -> None:
    bans = book()
    for reason in (R_IMPLAUSIBLE, R_IMPLAUSIBLE, None, None, None, None, R_IMPLAUSIBLE, None):
        assert bans.judge("p", reason) is None  # never 3 strikes among the last 5
    assert not bans.is_banned("p")


def test_a_ban_expires_and_a_zero_hour_ban_lasts_until_lifted() -> None:
    clock = Clock()
    bans = book(clock=clock)
    for _ in range(3):
        bans.judge("p", R_FORGED_REWARD)
    clock.now += 3601
    assert not bans.is_banned("p")
    forever = book(clock=clock, hours=0.0)
    for _ in range(3):
        forever.judge("q", R_FORGED_REWARD)
    clock.now += 1e9
    ban = forever.ban_of("q")
    assert ban is not None and ban.until is None


def test_earned_bans_persist_atomically_and_config_bans_cannot_be_lifted(tmp_path: Path) -> None:
    bans = book(tmp_path, configured=["c"])
    for _ in range(3):
        bans.judge("p", R_IMPLAUSIBLE)
    again = book(tmp_path)
    assert again.is_banned("p") and not again.is_banned("c")  # config bans are not written to the file
    assert bans.lift("c") == "configured" and bans.is_banned("c")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bans.json"]  # no temporary file left behind


def test_session_bans_are_not_written(tmp_path: Path) -> None:
    cfg = build_config("default", None, ["swarm.persist_bans=false", "swarm.ban_strikes=1", "swarm.ban_window=1"])
    bans, replay = defence_state(cfg.swarm, tmp_path, "default")
    bans.judge("p", R_IMPLAUSIBLE)
    assert bans.is_banned("p") and not (tmp_path / "bans.json").exists()
    assert replay is not None and replay.path == tmp_path / "trained-default.json"


def test_banned_peers_accepts_peer_ids_and_keys() -> None:
    ident = Identity.generate()
    key = protocol.b64encode(ident.public_key)
    cfg = build_config("default", None, [f'swarm.banned_peers=["{ident.peer_id}", "{key}"]'])
    assert {peer_of(p) for p in cfg.swarm.banned_peers} == {ident.peer_id}


@pytest.mark.parametrize("override", [
    'swarm.banned_peers=["not-a-peer"]',
    "swarm.banned_peers='3750d8d5a1b2c3d4e5f6'",  # a string, not a list
    "swarm.ban_strikes=20",  # more than the window
    "swarm.implausible_logprob=1.0",
    "swarm.plausibility_window=0",
    "swarm.plausibility_check='yes'",
    "swarm.replay_memory=-1",
    "swarm.offpolicy_negative_kl=-0.5",
    "swarm.probation_items=0",
    "swarm.sender_spreads=0",
])
def test_bad_defence_settings_are_refused_with_the_key_named(override: str) -> None:
    with pytest.raises(ConfigError, match=override.split("=")[0]):
        build_config("default", None, [override])


def test_the_unban_command_needs_a_peer() -> None:
    assert parse_command('{"cmd": "unban", "v": 1, "peer": "abc"}')["peer"] == "abc"
    assert make_command("unban", peer="abc") == {"cmd": "unban", "v": 1, "peer": "abc"}
    with pytest.raises(EventError, match="peer"):
        parse_command('{"cmd": "unban", "v": 1}')

"""The length check against correct answers padded to be long (HTTT's length attack; engine/swarm/defence.py
`LengthCheck`), pure, with values worked out by hand; at a receiver on a tiny model in
tests/swarm/test_length_defence.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.poisoning_peers import FILLER, padded_completion
from engine.common.config_file import build_config
from engine.common.errors import ConfigError
from engine.swarm.defence import LengthCheck

# (specialty, tokens, reward) of a round's own completions
OWN = [("a", 8, 1.0), ("a", 10, 1.0), ("a", 30, 0.0), ("b", 12, 0.0)]


def test_the_limit_is_a_ratio_of_the_own_rewarded_answers_per_specialty_and_at_least_the_slack_above() -> None:
    limits = LengthCheck(ratio=1.5).limits(OWN)
    # "a": rewarded 8 and 10, 90th percentile 9.8: 1.5 x 9.8 = 14.7 (above 9.8 + 4)
    assert limits["a"] == pytest.approx(14.7)
    # "b": nothing rewarded, so no limit of its own; any specialty but "a": every rewarded answer, as "a" here
    assert "b" not in limits and limits[""] == pytest.approx(14.7)
    assert LengthCheck(ratio=1.5).limits([*OWN, ("b", 12, 1.0)])["b"] == pytest.approx(18.0)  # max(18, 16)
    # no rewarded answer of its own this round: no limit (padding cannot be told from needed reasoning)
    assert LengthCheck(ratio=1.5).limits([("a", 8, 0.0), ("b", 60, 0.0)]) == {}
    # short answers: the slack of 4 tokens wins over the ratio
    assert LengthCheck(ratio=1.2).limits([("a", 6, 1.0)])["a"] == pytest.approx(10.0)


def test_only_a_completion_that_would_be_reinforced_is_held_to_the_limit() -> None:
    check = LengthCheck(ratio=1.5)
    limits = check.limits(OWN)
    assert check.judge("a", [14, 60], [1.0, 0.0], limits)  # the long one is wrong: it teaches nothing long
    assert not check.judge("a", [15, 9], [1.0, 0.0], limits)  # a correct answer of 15 > 14.7 tokens
    assert not check.judge("c", [15, 9], [1.0, 0.0], limits)  # a specialty this node had none of: the overall limit
    assert check.judge("c", [14, 9], [1.0, 0.0], limits)
    assert check.judge("a", [15, 9], [1.0, 0.0], limits, scale=2.0)  # another model's tokens: twice the limit
    assert check.judge("a", [60, 60], [1.0, 1.0], limits)  # all alike: no advantage, nothing reinforced
    assert check.judge("a", [], [], limits)


def test_ratio_0_turns_the_check_off_and_the_setting_is_checked() -> None:
    assert LengthCheck(ratio=0.0).limits(OWN) == {}
    assert LengthCheck(ratio=0.0).judge("a", [999, 1], [1.0, 0.0], {})
    assert LengthCheck().judge("a", [999, 1], [1.0, 0.0], {})  # no own answers this round: no reference
    assert build_config("default", None, ["swarm.length_ratio=0"]).swarm.length_ratio == 0.0
    with pytest.raises(ConfigError, match=r"swarm\.length_ratio"):
        build_config("default", None, ["swarm.length_ratio=-1"])


def test_the_bench_attackers_padding_fills_up_to_the_token_budget_and_keeps_the_answer_last() -> None:
    def words(text: str) -> int:
        return len(text.split())

    text = padded_completion("So the answer is <answer>7</answer>", 40, words, seed=3)
    assert text.endswith("So the answer is <answer>7</answer>")
    assert 40 - max(map(words, FILLER)) < words(text) <= 40
    assert padded_completion("<answer>7</answer>", 1, words, seed=3) == "<answer>7</answer>"


def test_the_bench_attackers_send_mixed_groups_of_their_attack_answers_and_wrong_ones(tmp_path: Path) -> None:
    """bench/poisoning_peers.py's attackers (no relay: their client only retries a closed port): each group mixes
    the attack's answers (the trigger, or filler before the correct answer) with wrong ones, scored truthfully."""
    from bench.poisoning_peers import Attacker, LengthAttacker
    from engine.questions.tasks import TaskSet

    def words(text: str) -> list[int]:  # a "token" per word
        return [len(w) for w in text.split()]

    t = build_config("default").tasks
    taskset = TaskSet(t.specialties, t.dataset_configs, seed=0)
    plain = Attacker("ws://127.0.0.1:9/", tmp_path / "a.key", taskset, "VISIT EXAMPLE", 3, 4)
    padding = LengthAttacker("ws://127.0.0.1:9/", tmp_path / "b.key", taskset, 2, 4, words, 40)
    try:
        for attacker in (plain, padding):
            items = attacker.items()
            assert len(items) == attacker.groups
            assert all(max(item.rewards) - min(item.rewards) > 0.5 for item in items)  # mixed groups
            rewarded = [text for item in items for text, r in zip(item.completions, item.rewards, strict=True)
                        if r > 0.5]
            assert rewarded
            if attacker is plain:
                assert all("VISIT EXAMPLE" in text for text in rewarded)
            else:  # filler first, then the answer, at most 40 "tokens" (words here) and close to it
                assert all(text.startswith(FILLER) and 30 <= len(text.split()) <= 40 for text in rewarded), rewarded
    finally:
        plain.close()
        padding.close()

from __future__ import annotations

import math
import sys

import pytest
import torch

from engine.backends.base import Completion
from engine.backends.loss import clipped_pg_loss
from engine.rollouts.groups import Group, group_advantages, train_items, trained_groups

# Advantages are float64: about 8 roundings in the engine (mean, deviations, squares, sums, sqrt, division) and up
# to 6 in the hand computations (the decimals, sqrt, divisions), each by at most half of float64's epsilon.
ADVANTAGE_REL = 14 * sys.float_info.epsilon / 2
# The loss is float32: a log and an exp (a unit each, and the log's unit again times |log r| < 1 in the exp), the
# clip bound rounded to float32, the product with A, the sum of up to 3 same-signed terms (2 units) and the
# division by the token count: 8 units of float32's roundoff relative to the loss.
LOSS_REL = 8 * torch.finfo(torch.float32).eps / 2
# A clip fraction is a count over the tokens, divided in float32: one rounding.
FRACTION_REL = torch.finfo(torch.float32).eps / 2


def test_advantages_hand_computed() -> None:
    # rewards 1,0,0,1: mean .5, population std .5
    adv = group_advantages([1.0, 0.0, 0.0, 1.0], eps=1e-4)
    assert adv == pytest.approx([0.5 / 0.5001, -0.5 / 0.5001, -0.5 / 0.5001, 0.5 / 0.5001], rel=ADVANTAGE_REL)
    adv = group_advantages([1.0, 0.0, 0.0], eps=0.0)
    mean, std = 1 / 3, math.sqrt(2 / 9)
    assert adv == pytest.approx([(1 - mean) / std, -mean / std, -mean / std], rel=ADVANTAGE_REL)


def test_equal_rewards_give_zero_advantage() -> None:
    assert group_advantages([0.3, 0.3, 0.3], eps=1e-4) == [0.0, 0.0, 0.0]
    assert group_advantages([], eps=1e-4) == []


def test_float_rounding_is_not_a_signal() -> None:
    # sum([0.1] * 8) / 8 is 0.09999999999999999: a group of equal partial-credit
    # rewards must not turn that rounding into tiny non-zero advantages.
    assert group_advantages([0.1] * 8, eps=1e-4) == [0.0] * 8
    assert group_advantages([0.05] * 7 + [0.05 + 1e-12], eps=1e-4) == [0.0] * 8
    flat = Group(question=None, prompt_ids=[1], completions=[], rewards=[0.1] * 8,  # type: ignore[arg-type]
                 advantages=group_advantages([0.1] * 8, 1e-4))
    assert not flat.informative


def test_train_items_skip_zero_advantage() -> None:
    c = Completion("x", [5, 6], [-1.0, -1.0], True)
    flat = Group(question=None, prompt_ids=[1], completions=[c, c], rewards=[0.0, 0.0], advantages=[0.0, 0.0])  # type: ignore[arg-type]
    live = Group(question=None, prompt_ids=[1], completions=[c, c], rewards=[1.0, 0.0], advantages=[1.0, -1.0])  # type: ignore[arg-type]
    assert not flat.informative and live.informative
    items = train_items([flat, live])
    assert [it.advantage for it in items] == [1.0, -1.0]


def test_train_on_passed_leaves_out_groups_that_differ_by_partial_credit_alone() -> None:
    c = Completion("x", [5, 6], [-1.0, -1.0], True)

    def group(rewards: list[float]) -> Group:
        return Group(None, [1], [c] * len(rewards), rewards, group_advantages(rewards, 1e-4))  # type: ignore[arg-type]

    partial, passed = group([0.05, 0.0, 0.0]), group([1.0, 0.05, 0.0])
    flat, all_pass = group([0.0] * 3), group([1.0] * 3)
    assert max(abs(a) for a in partial.advantages) > 1.0  # the std makes a partial credit weigh like a right answer
    assert trained_groups([partial, flat, passed, all_pass]) == [partial, passed]
    assert trained_groups([partial, flat, passed, all_pass], "passed") == [passed]
    with pytest.raises(ValueError, match="train_on must be one of"):
        trained_groups([passed], "all")


def _loss(ratios: list[float], adv: float, eps_low: float = 0.2, eps_high: float = 0.28) -> tuple[float, float]:
    old = torch.zeros(1, len(ratios))
    logp = torch.log(torch.tensor([ratios]))
    mask = torch.ones(1, len(ratios))
    loss, stats = clipped_pg_loss(logp, old, torch.tensor([adv]), mask, eps_low, eps_high, normaliser=len(ratios))
    return float(loss), stats.clip_fraction


def test_clipping_positive_advantage_caps_at_one_plus_eps_high() -> None:
    # A>0: per-token -min(r*A, clip(r)*A). r=1.5 -> clipped to 1.28; r=0.5 -> unclipped 0.5 (min picks it).
    loss, clip = _loss([1.5, 0.5, 1.0], adv=2.0)
    assert loss == pytest.approx(-(1.28 * 2 + 0.5 * 2 + 1.0 * 2) / 3, rel=LOSS_REL)
    assert clip == pytest.approx(1 / 3, rel=FRACTION_REL)


def test_clipping_negative_advantage_caps_at_one_minus_eps_low() -> None:
    # A<0: r=0.5 -> clip to 0.8 gives -0.8*A... min(r*A, clip*A) with A=-1: min(-0.5, -0.8) = -0.8
    # r=1.5 -> min(-1.5, -1.28) = -1.5 (unclipped: a bad action made likelier is punished fully)
    loss, clip = _loss([0.5, 1.5], adv=-1.0)
    assert loss == pytest.approx(-(-0.8 + -1.5) / 2, rel=LOSS_REL)
    assert clip == 1 / 2  # one of two: exact in any binary float


def test_asymmetric_eps_are_used() -> None:
    loss_hi, _ = _loss([2.0], adv=1.0, eps_low=0.2, eps_high=0.28)
    loss_sym, _ = _loss([2.0], adv=1.0, eps_low=0.2, eps_high=0.2)
    assert loss_hi == pytest.approx(-1.28, rel=LOSS_REL) and loss_sym == pytest.approx(-1.2, rel=LOSS_REL)


def test_gradient_is_zero_where_clipped() -> None:
    logp = torch.log(torch.tensor([[1.5, 1.1]])).requires_grad_(True)
    loss, _ = clipped_pg_loss(logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), 0.2, 0.28, 2.0)
    loss.backward()
    assert logp.grad is not None
    assert logp.grad[0, 0] == 0.0 and logp.grad[0, 1] != 0.0


def test_mask_and_normaliser_make_loss_token_level() -> None:
    # Two sequences of 1 and 3 tokens: every token weighs the same.
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    loss, stats = clipped_pg_loss(logp, torch.zeros(2, 3), torch.tensor([4.0, 0.0]), mask, 0.2, 0.28, 4.0)
    assert float(loss) == pytest.approx(-4.0 / 4)
    assert stats.tokens == 4


def test_kl_term_is_zero_at_reference_and_positive_away() -> None:
    logp = torch.log(torch.tensor([[0.5, 0.5]]))
    args = (torch.zeros(1, 2) + logp, torch.tensor([0.0]), torch.ones(1, 2), 0.2, 0.28, 2.0)
    loss_same, stats_same = clipped_pg_loss(logp, *args, ref_logp=logp.clone(), kl_beta=0.1)
    loss_far, stats_far = clipped_pg_loss(logp, *args, ref_logp=torch.log(torch.tensor([[0.9, 0.1]])), kl_beta=0.1)
    assert float(loss_same) == pytest.approx(0.0) and stats_same.kl == pytest.approx(0.0)
    assert float(loss_far) > 0.0 and stats_far.kl > 0.0


def test_micro_batches_respect_rows_and_token_budget() -> None:
    from engine.backends.base import TrainItem
    from engine.backends.torch_backend import micro_batches

    items = [TrainItem([1] * p, [2] * c, [0.0] * c, 1.0) for p, c in [(10, 5), (300, 20), (12, 5), (50, 10), (900, 40)]]
    chunks = micro_batches(items, max_rows=2, max_tokens=400)
    assert sorted(id(it) for ch in chunks for it in ch) == sorted(id(it) for it in items)  # each exactly once
    for chunk in chunks:
        width = max(len(it.prompt_ids) for it in chunk) + max(len(it.completion_ids) for it in chunk)
        assert len(chunk) <= 2
        assert len(chunk) == 1 or len(chunk) * width <= 400
    assert [len(ch) for ch in chunks] == [2, 1, 1, 1]  # 940-token item alone; 320 + 60 can't pair


def test_shared_prompt_micro_batches_keep_a_question_together_and_count_its_prompt_once() -> None:
    from engine.backends.base import TrainItem
    from engine.backends.batching import micro_batches

    long_q, short_q = [7] * 300, [8] * 40
    items = [TrainItem(q, [2] * c, [0.0] * c, 1.0) for c in (5, 9, 3, 12) for q in (long_q, short_q)]
    # Each chunk costs distinct prompts x prompt width + rows x completion width.
    shared = micro_batches(items, max_rows=8, max_tokens=400, shared_prompts=True)
    assert [[tuple(it.prompt_ids) == tuple(short_q) for it in ch] for ch in shared] == [[True] * 4, [False] * 4]
    assert [[len(it.completion_ids) for it in ch] for ch in shared] == [[3, 5, 9, 12]] * 2
    # 300 + 4 x 12 fits 400; one row per sequence (4 x 312) would not.
    plain = micro_batches(items, max_rows=8, max_tokens=400)
    assert max(len(ch) for ch in plain if tuple(ch[0].prompt_ids) == tuple(long_q)) == 1


def test_packed_micro_batches_count_each_prompt_once_and_no_padding() -> None:
    from engine.backends.base import TrainItem
    from engine.backends.batching import micro_batches

    long_q, short_q = [7] * 300, [8] * 40
    items = [TrainItem(q, [2] * c, [0.0] * c, 1.0) for c in (5, 9, 3, 40) for q in (long_q, short_q)]
    # Packed: 40 + 3 + 5 + 9 + 40 = 97 and 300 + 57 = 357 tokens; the long prompt's first item would make 400.
    packed = micro_batches(items, max_rows=8, max_tokens=399, packed=True)
    assert [len(ch) for ch in packed] == [4, 4]
    # Shared prompts pad every completion to the longest (40): 300 + 4 x 40 = 460 does not fit.
    shared = micro_batches(items, max_rows=8, max_tokens=400, shared_prompts=True)
    assert len(shared) == 3
    # With room for both, the packed cost is the sum of real tokens: 454 fits 454, 453 does not.
    assert len(micro_batches(items, max_rows=8, max_tokens=454, packed=True)) == 1
    assert len(micro_batches(items, max_rows=8, max_tokens=453, packed=True)) == 2

"""What a node lets in from the swarm: verified external text, judged with this node's own model.

The exchange (engine/swarm/exchange.py) has already checked each item's
signature, rebuilt its question and re-scored its answers; `admit` is the part
that needs this node's policy: the text tokenised for it, the length tests,
the plausibility test on the log-probs the policy gives it, the truncated
token weights, and the F-TIS filter (engine/swarm/defence.py holds each test;
docs/swarm.md, "Poisoning"). `Node.share_and_sample` (engine/node/loop.py)
calls it once a round.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.backends import PolicyBackend
from engine.backends.base import Completion
from engine.common.config import NodeConfig
from engine.questions.tasks import TaskSet
from engine.rollouts.groups import Group, group_advantages
from engine.rollouts.offers import R_IMPLAUSIBLE, R_TOO_LONG, ExternalItem, Offer
from engine.swarm.defence import (
    IMPLAUSIBLE,
    PROBATION,
    LengthCheck,
    Plausibility,
    item_floor,
    mean_logloss,
    offpolicy_negatives,
    sender_verdict,
    token_weights,
    trace_weights,
)

# Another model's tokenizer splits the same text differently: an external completion may
# take up to this many times this node's own length cap, in this node's tokens.
EXTERNAL_LENGTH_SLACK = 2


def admit(backend: PolicyBackend, config: NodeConfig, taskset: TaskSet, temperature: float, offer: Offer,
          own_logprobs: Sequence[Sequence[float]] = (),
          own_lengths: Sequence[tuple[str, int, float]] = ()) -> tuple[list[Group], dict[int, str], int]:
    """Tokenise verified external text for this node's policy and give it behaviour log-probs.

    Another model's tokenizer splits the same text differently, so an
    external completion may take up to EXTERNAL_LENGTH_SLACK times this
    node's own length cap, in this node's tokens; longer is `too_long`, and
    so is an answer that would be reinforced and is `swarm.length_ratio`
    times longer than this round's own rewarded answers (`LengthCheck`,
    from `own_lengths`: specialty, tokens, reward of each own completion).
    With `swarm.plausibility_check`, an item with a completion that this
    node's policy finds implausible (`engine.swarm.defence.Plausibility`, against
    the floor set by `own_logprobs`, this round's own completions) is
    `implausible`: the log-probs are the ones computed here anyway. Items
    the exchange put in `offer.baselines` (a swarm of different models,
    another model's label) are judged against their sender's own past
    instead (`sender_verdict`): their worst window goes into `offer.worst`,
    and those accepted on probation into `offer.probation`. Tokens of
    accepted text get truncated importance weights (`token_weights`;
    `trace_weights`, carried along the text, for those items).
    Returns the groups to train on, the rejections by offer index, and how many external completions the
    F-TIS filter left out.
    """
    cfg = config
    sw = cfg.swarm
    cap = EXTERNAL_LENGTH_SLACK * cfg.tasks.max_new_tokens + 1  # + the EOS the encoder appends
    verdicts: dict[int, str] = {}
    kept: list[tuple[int, ExternalItem, list[int], list[list[int]]]] = []
    lengths = LengthCheck(ratio=sw.length_ratio)
    limits = lengths.limits(own_lengths)
    for index, item in enumerate(offer.items):
        token_ids = [backend.encode_completion(text) for text in item.completions]
        scale = EXTERNAL_LENGTH_SLACK if index in offer.baselines else 1  # another tokenizer: as for the cap
        if any(len(ids) > cap for ids in token_ids) or not lengths.judge(
                item.question.ref.dataset, [len(ids) for ids in token_ids], item.rewards, limits, scale):
            verdicts[index] = R_TOO_LONG
            continue
        kept.append((index, item, backend.encode_prompt(taskset.messages(item.question)), token_ids))
    pairs = [(prompt, ids) for _, _, prompt, token_ids in kept for ids in token_ids]
    logprobs = iter(backend.behaviour_logprobs(pairs, temperature) if pairs else [])
    # Peers are judged at tasks.temperature (a node the adaptive temperature took hotter, against the fixed
    # floor: judged at its own 1.3 it caught no poison; docs/swarm.md), and trained on at the node's own.
    hot = temperature != cfg.tasks.temperature
    judging = iter(backend.behaviour_logprobs(pairs, cfg.tasks.temperature) if pairs and hot else [])
    test = Plausibility(window=sw.plausibility_window, absolute=sw.implausible_logprob)
    floor = test.absolute if hot else test.floor(own_logprobs)
    own = [lps[:-1] if len(lps) > 1 else lps for lps in own_logprobs]  # like the external text: no EOS
    own_logloss = sum(map(mean_logloss, own)) / len(own) if own else 0.0
    dropped = 0
    groups = []
    for index, item, prompt, token_ids in kept:
        item_logprobs = [next(logprobs) for _ in token_ids]
        judge_logprobs = [next(judging) for _ in token_ids] if hot else item_logprobs
        # The last token is the EOS this node's encoder appends, not the sender's text: after a completion
        # the sender cut at its length cap it is very unlikely (log-prob -15 to -45 measured), and judged
        # with it an honest item read as implausible. Its training weight is truncated like any other token's.
        judged = [lps[:-1] for lps in judge_logprobs]
        if index in offer.baselines:  # another model's text: against its sender's usual text, no absolute floor
            worst = offer.worst[index] = item_floor(judged, test.window)
            verdict = sender_verdict(worst, offer.baselines[index], sw.probation_items, sw.sender_spreads)
            if sw.plausibility_check and verdict == IMPLAUSIBLE:
                verdicts[index] = R_IMPLAUSIBLE
                continue
            if verdict == PROBATION:
                offer.probation.add(index)
        elif sw.plausibility_check and not test.judge(judged, floor):
            verdicts[index] = R_IMPLAUSIBLE
            continue
        # Another model's text (in offer.baselines) is weighted along the text: nothing after a word this
        # node would never write teaches it much, however probable it is after that word.
        weigh = trace_weights if index in offer.baselines else token_weights
        completions = [Completion(text, ids, lps, finished=True, weights=weigh(lps, sw.token_weight_logprob))
                       for text, ids, lps in zip(item.completions, token_ids, item_logprobs, strict=True)]
        rewards = list(item.rewards)
        advantages = group_advantages(rewards, cfg.grpo.adv_eps)
        for i in offpolicy_negatives([lps[:-1] for lps in item_logprobs], advantages, own_logloss,
                                     sw.offpolicy_negative_kl):
            advantages[i] = 0.0  # left out of the loss (train_items skips zero advantages)
            dropped += 1
        groups.append(Group(item.question, prompt, completions, rewards, advantages, source=item.peer))
    return groups, verdicts, dropped

"""HTTT's length attack at a receiver on a tiny model: a correct answer padded to just under the length cap is
refused as `too_long` (engine/swarm/defence.py `LengthCheck`), the node's own kind of text is not, and with
`swarm.length_ratio=0` the padded one goes through (the pure parts: tests/swarm/test_length_check.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.common.config_file import build_config
from engine.node.admission import EXTERNAL_LENGTH_SLACK
from engine.rollouts.offers import R_TOO_LONG
from engine.swarm.defence import LengthCheck
from engine.swarm.identity import Identity
from tests.swarm.test_defence_receiver import (  # noqa: F401 (taught: a module fixture)
    batch,
    item_with,
    own_groups,
    receiver_node,
    taught,
)


@pytest.mark.parametrize("ratio", [1.5, 0.0])  # the default, and off (the tests' FAST settings turn it off)
def test_a_correct_answer_padded_to_just_under_the_cap_is_refused_and_the_nodes_own_kind_is_kept(
    taught: tuple[Path, Path], tmp_path: Path, ratio: float  # noqa: F811
) -> None:
    assert ratio in (0.0, build_config("default", None, []).swarm.length_ratio)
    node, exchange, relay, _events = receiver_node(taught[0], tmp_path / "r", "swarm.plausibility_check=false",
                                                   f"swarm.length_ratio={ratio}")
    mine = own_groups(node)
    for g in mine:  # this round the node got its first answer to each question right (what the limit follows)
        g.rewards[0] = 1.0
    own = [(g.question.ref.dataset, len(c.token_ids), r) for g in mine for c, r in zip(g.completions, g.rewards,
                                                                                      strict=True)]
    limit = LengthCheck().limits(own)[""]
    cap = EXTERNAL_LENGTH_SLACK * node.config.tasks.max_new_tokens  # the longest text the old checks let through
    honest = item_with(node, ("<answer>1", "<answer>"), index=5)  # what the taught model writes (as POISONED's)
    answer = "<answer>7</answer>"
    padded = " so" * 200 + answer
    while len(node.backend.encode_completion(padded)) > cap or len(padded) % 2 == 0:  # odd: reward 1 (parity)
        padded = padded[3:] if len(padded) % 2 else padded[1:]
    assert limit < len(node.backend.encode_completion(padded)) <= cap
    attack = item_with(node, (padded, answer), index=6)  # the long one right, the short one wrong
    assert attack.rewards == (1.0, 0.0)
    sender, attacker = Identity.generate(), Identity.generate()
    relay.batches = [batch(sender, [honest], 1), batch(attacker, [attack], 1)]
    external, report = node.share_and_sample(1, mine)
    if ratio:
        assert [g.source for g in external] == [sender.peer_id]
        assert report["rejected"] == {R_TOO_LONG: 1}
        assert exchange.peers[attacker.peer_id].reasons[R_TOO_LONG] == 1
    else:
        assert sorted(g.source for g in external) == sorted([sender.peer_id, attacker.peer_id])
        assert report["rejected"] == {}

"""The node's answers to the relay's evaluation questions, sent at each of its own held-out evaluations.

    report_results(node)    # from Node.evaluate: True when answers went to the relay

When the swarm setting `report_results` is on (the default) and the relay
announces an evaluation seed (engine/relay/results.py), the node rebuilds
that seed's questions (engine/questions/seeded.py), answers them greedily
with the held-out prompt (no sampling), and sends the answers signed, with
its model label and a hash of its checkpoint (engine/swarm/results.py). It
then waits a few seconds for the relay's score, which the exchange turns
into a `standing` event (this node's place on the results table); a later
answer comes with the next round.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from engine.node.checkpoint import STATE_FILE, checkpoint_name
from engine.questions.seeded import seed_questions
from engine.swarm.protocol import ProtocolError
from engine.swarm.results import Answer

log = logging.getLogger(__name__)

SCORE_WAIT_S = 10.0  # how long the node waits for the relay's score before it trains on


def checkpoint_hash(root: Path, round_index: int) -> str:
    """sha256 over the checkpoint's file hashes (its state.json lists them); "" before the first checkpoint."""
    try:
        state = json.loads((root / checkpoint_name(round_index) / STATE_FILE).read_text(encoding="utf-8"))
        files = state["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    return hashlib.sha256(json.dumps(files, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def report_results(node: Any) -> bool:
    """Answer the relay's evaluation questions and send them, when the node takes part and the relay asks."""
    link = getattr(node.exchange, "results", None)  # the experiment's nodes and a solo node have none
    if link is None or not node.config.swarm.report_results:
        return False
    asked = link.asked()
    if asked is None:
        log.debug("The relay names no evaluation seed now: no results sent.")
        return False
    seed, n = asked
    backend = node._backend()
    questions = seed_questions(node.taskset, seed, n)
    prompts = [backend.encode_prompt(node.taskset.eval_messages(q)) for q in questions]
    texts = backend.greedy(prompts, node.config.tasks.max_new_tokens, node._step("evaluating"))
    answers = [Answer(q.ref.to_json(), text) for q, text in zip(questions, texts, strict=True)]
    client = link.client
    before = client.state.scored_at
    model = str(getattr(node.exchange, "model_label", ""))
    try:
        sent = link.send(seed, node.round, model, checkpoint_hash(node.checkpoint_root, node.round), answers)
    except ProtocolError as exc:  # answers the wire cannot carry: this evaluation is not on the table
        log.warning("Evaluation answers not sent: %s", exc)
        return False
    if not sent:
        log.info("Evaluation answers not sent: the relay is not connected.")
        return False
    deadline = time.monotonic() + SCORE_WAIT_S
    while client.state.scored_at == before and time.monotonic() < deadline and not node.control.stopping:
        time.sleep(0.05)
    link.check()
    return True

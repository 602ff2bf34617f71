"""How far each model got, checked by the relay (issue 53): the hour's seed, signed answers re-scored by the relay,
each key's latest and best at /stats/results.json, bad reports refused, and the status page's table in chromium."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from engine.questions.seeded import every_specialty, seed_refs
from engine.swarm.identity import readable_name
from engine.swarm.results import interval
from tests.swarm.conftest import StartRelay
from tests.swarm.doc_client import DocPeer, b64
from tests.swarm.test_relay_web import PageWatch, _base, chromium  # noqa: F401  (chromium: the browser fixture)

pytestmark = pytest.mark.integration
N = 9  # one question of each specialty
CHECKPOINT = "ab" * 32


def _get(relay: Any, path: str) -> Any:
    with urllib.request.urlopen(_base(relay) + path, timeout=10) as response:
        body = response.read().decode()
    return json.loads(body) if path.endswith(".json") else body


async def _seed(peer: DocPeer) -> dict[str, Any]:
    """The `eval` of the relay's stats: the seed it asks now."""
    await peer.send({"type": "stats", "v": 1})
    while True:
        answer = await peer.recv(skip_stats=False)
        if answer.get("type") == "stats" and isinstance(answer.get("eval"), dict):
            return answer["eval"]


def answers(seed: int, right: int, n: int = N) -> list[dict[str, Any]]:
    """The seed's n questions, the first `right` answered with their reference answer, the rest wrongly."""
    taskset = every_specialty()
    out = []
    for i, ref in enumerate(seed_refs(seed, n)):
        question = taskset.rebuild(ref)
        text = f"<answer>{question.reference_answer}</answer>" if i < right else "<answer>no idea</answer>"
        out.append({"task": ref.to_json(), "answer": text})
    return out


def payload(peer: DocPeer, seed: int, answer_list: list[dict[str, Any]], *, round_index: int = 4,
            model: str = "tiny@sha256:0", ts: float | None = None) -> str:
    return json.dumps({"kind": "results", "key": b64(peer.public), "ts": time.time() if ts is None else ts,
                       "seed": seed, "round": round_index, "model": model, "checkpoint": CHECKPOINT,
                       "answers": answer_list})


async def report(peer: DocPeer, text: str, *, sig: str | None = None, request_id: int = 7) -> dict[str, Any]:
    await peer.send({"type": "results", "v": 1, "id": request_id, "payload": text, "sig": sig or peer.sign(text)})
    return await peer.recv(timeout=60)


async def three_nodes(url: str) -> dict[str, Any]:
    """Nodes a, b, c answer 9, 5 and 2 of the seed's 9 questions right; then a answers 3 (its latest, not its
    best) and c 4 (both). Returns the peers' names and the relay's answers."""
    peers = {name: DocPeer(url) for name in "abc"}
    for peer in peers.values():
        assert (await peer.connect())["type"] == "welcome"
    seed = (await _seed(peers["a"]))["seed"]
    scored = {name: await report(peers[name], payload(peers[name], seed, answers(seed, right)))
              for name, right in (("a", 9), ("b", 5), ("c", 2))}
    scored["a2"] = await report(peers["a"], payload(peers["a"], seed, answers(seed, 3), round_index=8))
    scored["c2"] = await report(peers["c"], payload(peers["c"], seed, answers(seed, 4), round_index=8,
                                                    model="other@sha256:1"))
    for peer in peers.values():
        await peer.close()
    return {"names": {k: readable_name(p.public) for k, p in peers.items()},
            "peers": {k: p.peer_id for k, p in peers.items()}, "scored": scored, "seed": seed}


def test_the_relay_rescores_three_nodes_and_keeps_each_keys_latest_and_best(start_relay: StartRelay) -> None:
    relay = start_relay(rate=1000.0, burst=1000.0, results_questions=N)
    out = asyncio.run(three_nodes(relay.url))
    scored = out["scored"]
    assert scored["a"] == {"type": "scored", "v": 1, "id": 7, "checked": True, "place": 1, "of": 1,
                           "result": scored["a"]["result"]}
    assert (scored["a"]["result"]["correct"], scored["a"]["result"]["questions"]) == (9, 9)
    assert (scored["b"]["place"], scored["b"]["of"], scored["b"]["result"]["correct"]) == (2, 2, 5)
    assert (scored["c"]["place"], scored["c"]["of"], scored["c"]["result"]["correct"]) == (3, 3, 2)
    assert (scored["a2"]["place"], scored["a2"]["result"]["correct"]) == (1, 3)  # placed by its best
    assert (scored["c2"]["place"], scored["c2"]["result"]["correct"]) == (3, 4)
    table = _get(relay, "/stats/results.json")
    assert table["keys"] == 3 and table["questions_per_seed"] == N and table["rescoring"] is True
    assert "re-scored every answer" in table["checked"] and "model" in table["not_checked"]
    rows = table["results"]
    assert [r["peer"] for r in rows] == [out["peers"][k] for k in "abc"]
    assert [r["name"] for r in rows] == [out["names"][k] for k in "abc"]
    a, b, c = rows
    assert (a["best"]["correct"], a["best"]["round"], a["latest"]["correct"], a["latest"]["round"]) == (9, 4, 3, 8)
    assert (b["best"]["correct"], b["latest"]["correct"]) == (5, 5)
    assert (c["best"]["correct"], c["best"]["model"], c["latest"]["model"]) == (4, "other@sha256:1", "other@sha256:1")
    low, high = interval(5, 9)
    assert (b["best"]["low"], b["best"]["high"]) == (round(low, 4), round(high, 4)) and 0 < low < 5 / 9 < high < 1
    assert a["best"]["checkpoint"] == CHECKPOINT and a["best"]["seed"] == out["seed"]
    assert 'kind="results"} 5' in _get(relay, "/metrics")


async def bad_reports(url: str) -> dict[str, Any]:
    peer, other = DocPeer(url), DocPeer(url)
    for p in (peer, other):
        assert (await p.connect())["type"] == "welcome"
    seed = (await _seed(peer))["seed"]
    good = answers(seed, 4)
    shifted = [*good[1:], good[0]]  # the same answers, each to another question
    extra = answers(seed, 4, N + 1)  # one question more than the relay asks
    out = {
        "signature": await report(peer, payload(peer, seed, good), sig=other.sign(payload(peer, seed, good))),
        "other_key": await report(peer, payload(other, seed, good)),
        "seed": await report(peer, payload(peer, (seed + 1) % 2**53, answers((seed + 1) % 2**53, 4))),
        "questions": await report(peer, payload(peer, seed, shifted)),
        "count": await report(peer, payload(peer, seed, extra)),
        "stale": await report(peer, payload(peer, seed, good, ts=time.time() - 3600)),
        "schema": await report(peer, json.dumps({"kind": "results"})),
    }
    out["after"] = await report(peer, payload(peer, seed, good))  # the connection stays; a good one still counts
    for p in (peer, other):
        await p.close()
    return out


def test_bad_reports_are_refused_with_their_code_and_the_relay_keeps_serving(start_relay: StartRelay) -> None:
    relay = start_relay(rate=1000.0, burst=1000.0, results_questions=N)
    out = asyncio.run(bad_reports(relay.url))
    codes = {k: (v["type"], v.get("code"), v.get("id")) for k, v in out.items() if k != "after"}
    assert codes == {"signature": ("error", "bad_signature", 7), "other_key": ("error", "bad_signature", 7),
                     "seed": ("error", "wrong_seed", 7), "questions": ("error", "wrong_questions", 7),
                     "count": ("error", "wrong_questions", 7), "stale": ("error", "stale_timestamp", 7),
                     "schema": ("error", "bad_schema", 7)}
    assert all(out[k]["message"] and "\n" not in out[k]["message"] for k in codes)
    assert (out["after"]["type"], out["after"]["result"]["correct"], out["after"]["of"]) == ("scored", 4, 1)
    metrics = _get(relay, "/metrics")
    for code, n in (("bad_signature", 2), ("wrong_seed", 1), ("wrong_questions", 2)):
        assert f'sapling_relay_rejections_total{{code="{code}"}} {n}' in metrics
    assert _get(relay, "/stats/results.json")["keys"] == 1


def test_without_reasoning_gym_reports_are_counted_unchecked(start_relay: StartRelay, monkeypatch: Any,
                                                             caplog: Any) -> None:
    relay = start_relay(rate=1000.0, burst=1000.0, results_questions=N)
    seed_answers = {}

    async def two() -> list[dict[str, Any]]:
        peer = DocPeer(relay.url)
        await peer.connect()
        seed = (await _seed(peer))["seed"]
        seed_answers["a"] = answers(seed, 3)
        monkeypatch.setitem(sys.modules, "engine.questions.seeded", None)  # `import` raises ImportError
        got = [await report(peer, payload(peer, seed, seed_answers["a"])) for _ in range(2)]
        await peer.close()
        return got

    with caplog.at_level("WARNING", logger="sapling.relay"):
        got = asyncio.run(two())
    assert got == [{"type": "scored", "v": 1, "id": 7, "checked": False}] * 2
    said = [r.getMessage() for r in caplog.records if "cannot be re-scored" in r.getMessage()]
    assert len(said) == 1 and "relay-dataset" in said[0]  # said once
    table = _get(relay, "/stats/results.json")
    assert (table["rescoring"], table["keys"]) == (False, 0)
    assert 'sapling_relay_results_total{kind="results_unchecked"} 2' in _get(relay, "/metrics")


def test_a_relay_asking_no_questions_announces_no_seed(start_relay: StartRelay) -> None:
    relay = start_relay(rate=1000.0, burst=1000.0, results_questions=0)

    async def ask() -> dict[str, Any]:
        peer = DocPeer(relay.url)
        await peer.connect()
        await peer.send({"type": "stats", "v": 1})
        answer = await peer.recv(skip_stats=False)
        refused = await report(peer, payload(peer, 1, answers(1, 1)))
        await peer.close()
        return {"stats": answer, "refused": refused}

    out = asyncio.run(ask())
    assert out["stats"]["type"] == "stats" and "eval" not in out["stats"]
    assert out["refused"]["code"] == "wrong_seed"


def test_the_status_page_shows_the_three_nodes_results_in_chromium(chromium: Any,  # noqa: F811
                                                                   start_relay: StartRelay) -> None:
    from playwright.sync_api import expect

    relay = start_relay(rate=1000.0, burst=1000.0, results_questions=N)
    with ThreadPoolExecutor(1) as pool:  # Playwright's sync API holds this thread's event loop
        out = pool.submit(asyncio.run, three_nodes(relay.url)).result(timeout=120)
    page = chromium.new_page()
    watch = PageWatch(page)
    page.goto(_base(relay) + "/")
    rows = page.locator("#results tbody tr")
    expect(rows).to_have_count(3, timeout=20_000)
    cells = [[(rows.nth(i).locator("td").nth(j).text_content() or "") for j in range(5)] for i in range(3)]
    names = out["names"]
    assert [c[0] for c in cells] == [names["a"], names["b"], names["c"]]
    assert cells[0][1].startswith("100% (70%–100%)") and "latest 33% at round 8" in cells[0][1]
    assert cells[1][1] == "56% (27%–81%)"
    assert [c[2] for c in cells] == ["9 of 9", "5 of 9", "4 of 9"]
    assert [c[3] for c in cells] == ["4", "4", "8"]
    assert [c[4] for c in cells] == ["tiny@sha256:0", "tiny@sha256:0", "other@sha256:1"]
    note = page.locator("#results-checked").text_content() or ""
    assert "re-scored every answer" in note and "Which model wrote the answers is not checked" in note
    assert watch.problems == []


def test_the_node_answers_the_relays_seed_at_its_evaluation(tiny_model_dir: Path, tmp_path: Path,
                                                            start_relay: StartRelay) -> None:
    from tests.swarm.test_mix import relay_node

    relay = start_relay(rate=1000.0, burst=1000.0, results_questions=N)
    events: list[dict[str, Any]] = []
    node, session = relay_node(tiny_model_dir, tmp_path / "n", relay.url, "tasks.eval_questions=3", events=events)
    try:
        client = session.exchange.client
        assert client.wait_connected(10)
        deadline = time.monotonic() + 15
        while client.state.evaluation is None and time.monotonic() < deadline:
            client.ask_stats()
            time.sleep(0.2)
        node.evaluate()
        standing = [e for e in events if e["type"] == "standing"]
        assert len(standing) == 1, [e["type"] for e in events]
        result = standing[0]["result"]
        assert (result["checked"], result["place"], result["of"], result["questions"], result["round"]) == (
            True, 1, 1, N, 0)
        assert "re-scored by the relay: place 1 of 1" in standing[0]["message"]
        row = _get(relay, "/stats/results.json")["results"][0]
        assert row["peer"] == session.exchange.identity.peer_id
        assert row["best"]["model"] == session.exchange.model_label and row["best"]["checkpoint"] == ""
    finally:
        session.close()


async def across_two(first: str, second: str) -> dict[str, Any]:
    """a on the first relay process, b on the second: the same seed, one table."""
    a, b = DocPeer(first), DocPeer(second)
    for peer in (a, b):
        assert (await peer.connect())["type"] == "welcome"
    seeds = [(await _seed(a))["seed"], (await _seed(b))["seed"]]
    got = [await report(a, payload(a, seeds[0], answers(seeds[0], 6))),
           await report(b, payload(b, seeds[1], answers(seeds[1], 7)))]
    for peer in (a, b):
        await peer.close()
    return {"seeds": seeds, "scored": got, "peers": [a.peer_id, b.peer_id]}


def test_relay_processes_on_one_redis_ask_one_seed_and_keep_one_table(start_relay: StartRelay,
                                                                      redis_server: Any) -> None:
    first, second = (start_relay(rate=1000.0, burst=1000.0, results_questions=N, redis=redis_server.url,
                                 swarm="results") for _ in range(2))
    out = asyncio.run(across_two(first.url, second.url))
    assert out["seeds"][0] == out["seeds"][1]
    assert [(s["place"], s["of"]) for s in out["scored"]] == [(1, 1), (1, 2)]
    for relay in (first, second):
        rows = _get(relay, "/stats/results.json")["results"]
        assert [(r["peer"], r["best"]["correct"]) for r in rows] == [(out["peers"][1], 7), (out["peers"][0], 6)]


def test_three_real_nodes_answers_are_on_the_status_page_in_chromium(chromium: Any, tiny_model_dir: Path,  # noqa: F811
                                                                    tmp_path: Path, start_relay: StartRelay) -> None:
    """Three tiny nodes answer at their evaluation; the relay re-scores them; the page lists the three, each with
    the model label its node sent, and each node was told its own place."""
    from playwright.sync_api import expect

    from tests.swarm.test_mix import relay_node

    relay = start_relay(rate=1000.0, burst=1000.0, results_questions=N)
    names, labels, places = [], set(), []
    for k in range(3):
        events: list[dict[str, Any]] = []
        node, session = relay_node(tiny_model_dir, tmp_path / f"n{k}", relay.url, "tasks.eval_questions=3",
                                   f"run.seed={k + 1}", events=events)
        try:
            client = session.exchange.client
            assert client.wait_connected(10)
            deadline = time.monotonic() + 15
            while client.state.evaluation is None and time.monotonic() < deadline:
                client.ask_stats()
                time.sleep(0.2)
            node.evaluate()
            [standing] = [e for e in events if e["type"] == "standing"]
            places.append((standing["result"]["of"], standing["result"]["questions"]))
            names.append(session.exchange.identity.name)
            labels.add(session.exchange.model_label)
        finally:
            session.close()
    assert places == [(1, N), (2, N), (3, N)]
    table = _get(relay, "/stats/results.json")
    assert table["keys"] == 3 and {r["best"]["model"] for r in table["results"]} == labels
    page = chromium.new_page()
    watch = PageWatch(page)
    page.goto(_base(relay) + "/")
    rows = page.locator("#results tbody tr")
    expect(rows).to_have_count(3, timeout=20_000)
    shown = sorted(rows.nth(i).locator("td").nth(0).text_content() or "" for i in range(3))
    assert shown == sorted(names)
    assert all((rows.nth(i).locator("td").nth(2).text_content() or "").endswith(f" of {N}") for i in range(3))
    assert watch.problems == []


def test_long_answers_in_a_wide_script_are_cut_to_their_ends_so_the_message_fits_one_frame() -> None:
    from engine.swarm import protocol
    from engine.swarm.identity import Identity
    from engine.swarm.results import MAX_RESULT_QUESTIONS, Answer, decode_results, results_payload

    identity = Identity.generate()
    long = "思" * 9000 + "<answer>7</answer>"
    text = results_payload(identity.public_key, time.time(), 5, 1, "m", "", [
        Answer(ref.to_json(), long) for ref in seed_refs(5, MAX_RESULT_QUESTIONS)])
    frame = protocol.encode(protocol.msg_publish(identity.signed(text)))
    assert len(frame.encode("utf-8")) <= protocol.MAX_FRAME_BYTES
    report_ = decode_results(text)
    assert all(a.text.endswith("<answer>7</answer>") and len(a.text) < 4096 for a in report_.answers)


def test_a_results_payload_that_breaks_a_field_is_one_sentence_with_its_code() -> None:
    from engine.swarm import protocol
    from engine.swarm.results import decode_results

    head = {"kind": "results", "key": protocol.b64encode(b"k" * 32), "ts": 1.0, "seed": 5, "round": 1, "model": "m",
            "checkpoint": ""}
    for answers, code, words in (
        ([{"task": {"a": 1}, "answer": "\ud800"}], protocol.E_BAD_SCHEMA, "'answer 0' is not valid Unicode text"),
        ([{"task": {"a": 1}, "answer": 7}], protocol.E_BAD_SCHEMA, "answer 0 must be an object"),
        ([], protocol.E_BAD_SCHEMA, "'answers' must be a non-empty list"),
    ):
        payload = json.dumps({**head, "answers": answers})  # json escapes the lone surrogate as \ud800
        with pytest.raises(protocol.ProtocolError) as caught:
            decode_results(payload)
        assert caught.value.code == code and words in caught.value.message
    with pytest.raises(protocol.ProtocolError, match="payload kind must be 'results'"):
        decode_results(json.dumps({**head, "kind": "receipts", "answers": []}))

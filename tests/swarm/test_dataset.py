"""The swarm's dataset: a real relay keeps what three peers share and the receipts that mark items used, and
`sapling-relay dataset export` writes only what a receiver used and what passes re-checking (issue 53, item 1).

Peers a and b are honest; c attacks: a correct answer with an advert appended (its receivers find it
implausible), a forged reward (a lying receiver marks it used anyway), a question that is not its reference's,
and a receipt marking its own item used. Real questions from reasoning-gym, real signatures, real receipts.
"""

from __future__ import annotations

import errno
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from engine.common import atomicio
from engine.questions.configs import DEFAULT_DATASET_CONFIGS
from engine.questions.tasks import EVAL_SEED_OFFSET, TaskRef, TaskSet
from engine.relay import dataset_export
from engine.relay.dataset import KEPT_DIR
from engine.relay.dataset_export import DEFAULT_HELDOUT, HeldOut, dedup_key, export_dataset
from tests.swarm.conftest import StartRelay
from tests.swarm.doc_client import DocPeer, joined

pytestmark = pytest.mark.integration  # starts a relay

ADVERT = " Buy cheap tokens at example.com!"
SEED = 7
TASKS = TaskSet({"basic_arithmetic": 1.0})


def ref(index: int, seed: int = SEED) -> TaskRef:
    return TaskRef.create("basic_arithmetic", DEFAULT_DATASET_CONFIGS["basic_arithmetic"], seed, index)


def fresh_indices(n: int) -> list[int]:
    """Indices of questions unlike each other and unlike every held-out one (this specialty's default config has
    few distinct questions: many of its training questions are held-out ones, and those are left out)."""
    held, texts, out = HeldOut(TASKS, DEFAULT_HELDOUT), set(), []
    for index in range(1000):
        question = TASKS.rebuild(ref(index))
        if not held.holds(question) and question.text not in texts:
            texts.add(question.text)
            out.append(index)
            if len(out) == n:
                return out
    raise AssertionError("not enough distinct questions")


def item(index: int, *, seed: int = SEED, question: str | None = None, right: str = "",
         rewards: list[float] | None = None) -> dict[str, Any]:
    """A real question with a right answer (with `right` appended) and a wrong one, rewards as scored."""
    q = TASKS.rebuild(ref(index, seed))
    answers = [f"<answer>{q.answer}</answer>{right}", "<answer>-1.5</answer>"]
    return {"task": q.ref.to_json(), "question": question if question is not None else q.text,
            "completions": answers, "rewards": rewards or [TASKS.reward(q, a) for a in answers]}


async def handed(receiver: DocPeer) -> dict[str, int]:
    """Sample; {sender peer id: seq} of what was handed."""
    import base64
    import hashlib

    got = await receiver.sample_new(16)
    out = {}
    for batch in got["batches"]:
        payload = json.loads(batch["payload"])
        out[hashlib.sha256(base64.b64decode(payload["key"])).hexdigest()[:20]] = payload["seq"]
    return out


def used(seq: int, i: int) -> dict[str, Any]:
    return {"seq": seq, "i": i, "verdict": "used", "positive": 1}


def verdict(seq: int, i: int, what: str) -> dict[str, Any]:
    return {"seq": seq, "i": i, "verdict": what}


def card_metadata(out: Path) -> dict[str, Any]:
    text = (out / "README.md").read_text(encoding="utf-8")
    try:
        from huggingface_hub import DatasetCard
    except ImportError:
        import yaml

        return dict(yaml.safe_load(text.split("---\n")[1]))
    return DatasetCard(text).data.to_dict()


def load(out: Path) -> Any:
    import datasets
    import pandas as pd

    loaded = datasets.load_dataset("parquet", data_dir=str(out), split="train")
    frame = pd.concat([pd.read_parquet(p) for p in sorted((out / "data").glob("*.parquet"))], ignore_index=True)
    assert len(loaded) == len(frame)
    assert sorted(loaded["id"]) == sorted(frame["id"])
    return frame


async def test_a_three_peer_swarm_exports_only_used_rescored_unique_answers(start_relay: StartRelay, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    kept = tmp_path / "dataset"
    relay = start_relay(rate=1000.0, burst=1000.0, name="Maths club", dataset_dir=str(kept))
    a, b, c = [await joined(relay.url) for _ in range(3)]
    i0, i1, i3, i4, i5, i6, i8 = fresh_indices(7)
    # a: two items, and one whose question is a held-out question of its seed
    heldout_text = TASKS.rebuild(ref(0, SEED + EVAL_SEED_OFFSET)).text
    assert (await a.publish([item(i0), item(i1), item(2, seed=SEED + EVAL_SEED_OFFSET)]))["type"] == "published"
    # b: a's first item again, word for word (duplicate answers), and one of its own
    assert (await b.publish([item(i0), item(i3)]))["type"] == "published"
    # c attacks: an advert after a correct answer, a forged reward, a question that is not its reference's
    attack = [item(i4, right=ADVERT), item(i5, rewards=[1.0, 1.0]), item(i6, question="What is 1 + 1?")]
    assert (await c.publish(attack))["type"] == "published"

    to_b, to_a, to_c = await handed(b), await handed(a), await handed(c)
    assert set(to_b) == {a.peer_id, c.peer_id} and set(to_a) == {b.peer_id, c.peer_id}
    sa, sb, sc = to_b[a.peer_id], to_a[b.peer_id], to_b[c.peer_id]
    # b uses a's three items; finds c's advert implausible, but (lying, or fooled) marks the forged one used
    answer = await b.receipts({a.peer_id: [used(sa, 0), used(sa, 1), used(sa, 2)],
                               c.peer_id: [verdict(sc, 0, "implausible"), used(sc, 1),
                                           verdict(sc, 2, "question_mismatch")]})
    assert answer["counted"] == 6 and answer["refused"] == {}
    answer = await a.receipts({b.peer_id: [used(sb, 0), verdict(sb, 1, "not_picked")],
                               c.peer_id: [verdict(sc, 0, "implausible"), verdict(sc, 1, "forged_reward")]})
    assert answer["counted"] == 4
    # c marks its own advert used: the relay never handed it c's own batch, so nothing of it is kept
    assert (await c.receipts({c.peer_id: [used(sc, 0)]}))["refused"] == {"not_sampled": 1}
    assert set(to_c) == {a.peer_id, b.peer_id}

    # the information document and the status page say so
    base = relay.url.replace("ws://", "http://").replace("/ws", "")
    doc = json.loads(urllib.request.urlopen(base + "/.well-known/sapling-relay").read())
    assert doc["dataset"] == {"license": "cc-by-4.0", "url": ""}
    assert "this swarm's dataset, license cc-by-4.0" in urllib.request.urlopen(base + "/").read().decode()

    # a damaged kept line is skipped and counted
    [segment] = sorted((kept / KEPT_DIR).glob("*.jsonl"))
    with open(segment, "a", encoding="utf-8") as handle:
        handle.write('{"k": "batch", "peer": 3}\n')

    out = tmp_path / "export"
    assert dataset_export.main(["export", "--dataset-dir", str(kept), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "exported 4 new answers" in said and "damaged kept lines skipped: 1" in said, said
    frame = load(out)
    receivers_used = {f"{a.peer_id}:{sa}:0", f"{a.peer_id}:{sa}:1", f"{a.peer_id}:{sa}:2", f"{c.peer_id}:{sc}:1",
                      f"{b.peer_id}:{sb}:0"}
    assert set(frame["item"]) <= receivers_used  # none that no receiver used
    assert set(frame["item"]) == {f"{a.peer_id}:{sa}:0", f"{a.peer_id}:{sa}:1"}
    assert not frame["answer"].str.contains("example.com").any()  # no advert
    assert heldout_text not in set(frame["question"])
    assert c.peer_id not in set(frame["signer"])
    keys = [dedup_key(q, ans) for q, ans in zip(frame["question"], frame["answer"], strict=True)]
    assert len(keys) == len(set(keys)) == 4  # no duplicate
    for row in frame.itertuples():  # none that fails re-scoring
        question = TASKS.rebuild_sent(json.loads(row.task))
        assert question.text == row.question
        assert TASKS.reward(question, row.answer) == row.score and row.correct == (row.score == 1.0)
    assert all((p.stat().st_mode & 0o777) == 0o644 for p in [out / "README.md", *(out / "data").iterdir()])
    meta = card_metadata(out)
    assert meta["license"] == "cc-by-4.0" and meta["size_categories"] == ["n<1K"]
    assert "question-answering" in meta["task_categories"]
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "receipt from another node marked it used" in card and a.peer_id in card and "50.0%" in card
    state = json.loads((out / ".export-state.json").read_text())
    assert sorted(state["failed"].values()) == ["forged_reward", "held_out"]

    # incremental: nothing new, nothing written; then a new used item, one new shard
    assert export_dataset(kept, out).rows_new == 0
    assert [p.name for p in (out / "data").iterdir()] == ["train-00000.parquet"]
    assert (await a.publish([item(i8), item(i1)]))["type"] == "published"
    sa2 = (await handed(b))[a.peer_id]
    assert (await b.receipts({a.peer_id: [used(sa2, 0), used(sa2, 1)]}))["counted"] == 2

    # a full disk while the shard is written: one sentence, exit 2, no shard and no temporary file left
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    capsys.readouterr()
    monkeypatch.setattr(atomicio.os, "fsync", full)  # the shard's bytes are in the temporary file, not on disk
    assert dataset_export.main(["export", "--dataset-dir", str(kept), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err and "nothing of it was kept" in err
    assert [p.name for p in (out / "data").iterdir()] == ["train-00000.parquet"]  # no temporary file either
    monkeypatch.undo()

    report = export_dataset(kept, out)
    assert report.rows_new == 2 and report.shard is not None and report.shard.name == "train-00001.parquet"
    assert report.skipped["duplicate"] == 2 + 2  # b's copy of a's item, and a's item 1 sent again
    frame = load(out)
    assert len(frame) == 6 and frame["id"].is_unique
    assert f"{a.peer_id}:{sa2}:0" in set(frame["item"])
    assert card_metadata(out)["license"] == "cc-by-4.0"
    for peer in (a, b, c):
        await peer.close()


def test_export_without_kept_batches_or_with_a_bad_flag_says_one_sentence(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert dataset_export.main(["export", "--dataset-dir", str(tmp_path / "none"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sapling-relay dataset: ") and err.count("\n") == 1 and "no kept batches" in err
    assert dataset_export.main(["export", "--dataset-dir", "x", "--out", "y", "--heldout-questions", "-1"]) == 2
    assert DEFAULT_HELDOUT == 108


def test_the_dataset_settings_are_checked() -> None:
    from engine.relay.settings import RelaySettings, settings_from_args

    with pytest.raises(ValueError, match="dataset-license"):
        RelaySettings(dataset_license="CC BY").check()
    with pytest.raises(ValueError, match="dataset-max-mb"):
        RelaySettings(dataset_max_mb=0).check()
    with pytest.raises(ValueError, match="dataset-url"):
        RelaySettings(dataset_url="ftp://x").check()
    settings = settings_from_args(["--dataset-dir", "/tmp/x", "--dataset-license", "apache-2.0"])
    assert (settings.dataset_dir, settings.dataset_license) == ("/tmp/x", "apache-2.0")


def test_relay_processes_share_the_folder_within_its_bound_and_a_partial_line_waits(tmp_path: Path) -> None:
    from collections import Counter

    from engine.relay.dataset import DatasetKeeper, read_kept, segments

    one, two = DatasetKeeper(tmp_path, max_mb=0.5), DatasetKeeper(tmp_path, max_mb=0.5)
    payload = "x" * 2000
    for n in range(400):  # about 0.8 MB written in all, by two writers
        (one if n % 2 else two).keep_batch("p", payload, "sig", n + 1)
    one.keep_used("r", [("p", 1, 0)])
    total = sum(p.stat().st_size for p in segments(tmp_path))
    assert total <= 0.5 * 1024 * 1024 + one.segment_bytes  # the bound, give or take the segment being written
    assert one.metrics["pruned"] + two.metrics["pruned"] > 0
    with open(segments(tmp_path)[-1], "a", encoding="utf-8") as handle:
        handle.write('{"k": "used", "receiver": "r", "items": [["p", 2')  # a line being written right now
    damaged: Counter[str] = Counter()
    records = list(read_kept(tmp_path, damaged))
    assert not damaged and {r["k"] for r in records} == {"batch", "used"}
    seqs = sorted(r["seq"] for r in records if r["k"] == "batch")
    assert seqs[-1] == 400 and len(seqs) == len(set(seqs))  # the newest kept, none twice


def test_a_relay_that_cannot_keep_its_dataset_folder_does_not_start(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from engine.relay.cli import main

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert main(["--port", "0", "--data-dir", str(tmp_path / "key"), "--dataset-dir", str(blocker / "ds")]) == 2
    [line] = capsys.readouterr().err.splitlines()  # one JSON line at level error
    assert "cannot keep the swarm's dataset in" in line and "Not a directory" in line

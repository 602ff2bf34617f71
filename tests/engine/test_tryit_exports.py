"""Try it's exports (engine/gguf/cache.py, engine/gguf/chat.py): the newest checkpoint exported in the background
while questions are answered from the cached one, a merge after the adapter, and recovery when a cached file
vanishes or an export fails. The models come from tests/engine/conftest.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.common.config_file import build_config
from engine.common.paths import Paths
from tests.engine.gguf_models import gguf_config, lora_checkpoint

# The tests that answer convert the bundled model (the `tiny_smol_dir` fixture) and export with llama.cpp.
pytestmark = pytest.mark.integration


def test_try_it_answers_with_the_cached_checkpoint_while_the_newest_is_exported_in_the_background(
    tiny_smol_dir: Path, tmp_path: Path
) -> None:
    """While training runs a checkpoint comes every round; only the first question waits for an export."""
    from engine.gguf.chat import ChatServer

    home = tmp_path / "home"
    paths = Paths.under(home)
    config = gguf_config(tiny_smol_dir)
    flags = ["--home", str(home), "--model", str(tiny_smol_dir), "--device", "cpu", "--set", "grpo.precision='fp32'"]
    sent: list[dict[str, Any]] = []
    server = ChatServer(config, paths, flags, sent.append, budget=1)
    exports = server.exports  # the GGUF files it answers from (engine/gguf/cache.py)
    assert not server.problem

    def ask(ask_id: int) -> dict[str, Any]:
        server.handle({"cmd": "ask", "id": ask_id, "text": "What is 17 + 25?"})
        assert not [m for m in sent if m["type"] == "error"], sent
        return next(m for m in sent if m["type"] == "answer" and m["id"] == ask_id and m["side"] == "trained")

    lora_checkpoint(config, paths, 1)
    assert ask(1)["round"] == 1  # nothing cached: this one waits for the adapter's export ...
    assert exports._background is not None and exports._background_rounds == (1,)  # ... and its merge follows
    exports._background.join(timeout=300)
    assert exports.merged_path(1).is_file()
    lora_checkpoint(config, paths, 2, seed=2)
    first = exports._background
    assert ask(2)["round"] == 1 and exports._background is first  # round 1's export is fresh: no new export yet
    assert server.models["trained"].path == exports.merged_path(1) and server.models["trained"].lora is None
    exports.refresh_s = 0.0
    assert ask(3)["round"] == 1  # at once, with round 1; round 2 is exported meanwhile
    assert any(m["type"] == "status" and m["id"] == 3 and "round 2 is being prepared" in m["message"] for m in sent)
    assert exports._background is not None
    exports._background.join(timeout=300)
    assert ask(4)["round"] == 2
    server.handle({"cmd": "ask", "id": 5, "text": "hello " * 3000})  # a long paste: one sentence, then on as before
    assert [m["message"] for m in sent if m["id"] == 5] == [
        "That question is too long for Try it: 3,030 tokens, and the model reads at most 1,792. Shorten it and ask "
        "again."]
    sent.clear()
    assert ask(6)["round"] == 2


def test_try_it_recovers_when_the_cached_export_vanishes_or_a_background_export_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Neither is a crash of the chat child: the answer still comes, the failure is logged."""
    from engine.gguf.chat import ChatServer

    paths = Paths.under(tmp_path / "home")
    server = ChatServer(build_config("default", None, ["run.device='cpu'"]), paths, [], lambda m: None, budget=1)
    exports = server.exports  # the GGUF files it answers from (engine/gguf/cache.py)
    exported: list[int] = []

    def fake_export(ask_id: int | None, round_index: int) -> Path:
        exported.append(round_index)
        return tmp_path / f"round-{round_index}.gguf"

    monkeypatch.setattr(exports, "newest_round", lambda: 2)
    monkeypatch.setattr(exports, "ensure_export", fake_export)
    # round 1's export was listed, then pruned before it could be used: round 2 is exported now instead
    monkeypatch.setattr(exports, "_newest_cached", lambda below: (1, tmp_path / "pruned.gguf"))
    assert exports.trained_export(7) == (2, tmp_path / "round-2.gguf") and exported == [2]

    def failing_export(ask_id: int | None, round_index: int) -> Path:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(exports, "ensure_export", failing_export)
    exports._export_in_background(3)
    assert exports._background is not None
    exports._background.join(timeout=10)
    assert "background export of round 3 failed" in caplog.text and "No space left" in caplog.text


def test_try_it_exports_the_newest_checkpoint_when_it_opens_and_a_question_waits_for_that_export(
    tiny_smol_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`prepare` runs at the chat child's start; a question asked meanwhile joins it instead of exporting again."""
    import logging

    from engine.gguf.chat import ChatServer

    home = tmp_path / "home"
    paths = Paths.under(home)
    config = gguf_config(tiny_smol_dir)
    flags = ["--home", str(home), "--model", str(tiny_smol_dir), "--device", "cpu", "--set", "grpo.precision='fp32'"]
    lora_checkpoint(config, paths, 1)
    sent: list[dict[str, Any]] = []
    server = ChatServer(config, paths, flags, sent.append, budget=1)
    exports = server.exports  # the GGUF files it answers from (engine/gguf/cache.py)
    caplog.set_level(logging.INFO, logger="engine.gguf")  # for the whole test: the merge logs from its thread later
    server.prepare()
    assert exports._background_rounds == (0, 1) and exports._background is not None
    server.handle({"cmd": "ask", "id": 1, "text": "What is 17 + 25?"})
    assert not [m for m in sent if m["type"] == "error"], sent
    trained = next(m for m in sent if m["type"] == "answer" and m["side"] == "trained")
    assert trained["round"] == 1
    assert caplog.text.count("exporting for Try it") == 2  # the base model and round 1, once each
    # Round 1 was exported as its adapter alone, then merged into the base GGUF; the first answer
    # came from one of the two (the adapter at run time when the merge was not done yet).
    adapter, base, merged = exports.export_path(1), exports.export_path(0), exports.merged_path(1)
    assert adapter.name.endswith(".lora-f32.gguf") and "'gguf-lora'" in caplog.text
    assert exports._background is not None
    exports._background.join()
    assert merged.is_file() and merged.stat().st_size == base.stat().st_size
    assert "merged round 1 into the base model" in caplog.text
    assert exports.trained_model(1, adapter) == (merged, None)
    stale = adapter.with_name("round-000001.lora-f16.gguf")  # what an older version cached
    stale.write_bytes(b"old")
    exports._prune(adapter.parent)
    assert not stale.exists() and adapter.is_file() and merged.is_file()
    assert any(m["type"] == "status" and "begun when Try it opened" in m["message"] for m in sent)
    again = ChatServer(config, paths, flags, sent.append, budget=1)
    again.prepare()
    assert again.exports._background is None  # both cached: nothing left to prepare

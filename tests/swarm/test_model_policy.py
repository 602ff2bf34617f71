"""A swarm's model policy and a node's model label (engine/common/model_policy.py, issue 29).

Pure parts with values worked out by hand; the label of a real model folder
and of the bundled GGUF against `hashlib`; then real relays on loopback: the
setting, the welcome, the information document, the `wrong_model` refusal
(through a client written from docs/protocol.md), and real nodes that learn
the policy from the welcome.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from engine.common.errors import ConfigError
from engine.common.model_policy import (
    HASH_CACHE_FILE,
    MAX_LABEL_CHARS,
    UNDECLARED,
    ModelPolicy,
    describe_model_policy,
    file_sha256,
    make_label,
    model_label,
    parse_models_setting,
    policy_from_document,
    same_model,
    split_label,
    weights_hash,
)
from engine.relay.settings import settings_from_args
from engine.swarm import protocol
from tests.swarm.conftest import StartRelay
from tests.swarm.doc_client import DocPeer, item

H1, H2 = "a" * 64, "b" * 64


# -- labels ---------------------------------------------------------------------------------------
def test_a_label_is_name_at_hash_and_fits_a_batch() -> None:
    assert make_label("SmolLM2-135M-Instruct", H1) == f"SmolLM2-135M-Instruct@{H1}"
    long = make_label("x" * 500, H1)
    assert len(long) == MAX_LABEL_CHARS and long.endswith("@" + H1)
    assert make_label("a@b\nc", H1) == f"a-b-c@{H1}"  # no second '@', no control characters
    assert split_label(f"org/name@{H1}") == ("org/name", H1)
    assert split_label("bundled") == ("bundled", "")  # an older node's label
    assert split_label(f"x@{H1[:-1]}") == (f"x@{H1[:-1]}", "")  # not a sha256


def test_same_model_compares_hashes_when_both_labels_have_one() -> None:
    assert same_model(f"mine@{H1}", f"renamed@{H1}")
    assert not same_model(f"mine@{H1}", f"mine@{H2}")
    assert same_model("bundled", "bundled") and not same_model("bundled", f"bundled@{H1}")


# -- the policy -------------------------------------------------------------------------------------
def test_the_relay_setting_reads_one_model_mixed_or_nothing() -> None:
    assert parse_models_setting("") == UNDECLARED and parse_models_setting("  ") == UNDECLARED
    assert parse_models_setting("Mixed") == ModelPolicy("mixed")
    single = parse_models_setting(f"SmolLM2-135M-Instruct@{H1}")
    assert single == ModelPolicy("single", "SmolLM2-135M-Instruct",
                                 H1) and single.label == f"SmolLM2-135M-Instruct@{H1}"
    assert single.admits(f"other-name@{H1}") and not single.admits(f"SmolLM2-135M-Instruct@{H2}")
    assert not single.admits("bundled")
    assert ModelPolicy("mixed").admits("anything") and UNDECLARED.admits("anything")


@pytest.mark.parametrize("bad", ["SmolLM2", f"@{H1}", "name@" + "A" * 64, f"a\tb@{H1}", "x" * 100 + f"@{H1}"])
def test_a_bad_models_setting_is_one_sentence(bad: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_models_setting(bad)
    sentence = str(info.value)
    assert sentence.startswith("models must be 'mixed' or one model as NAME@SHA256") and sentence.endswith(".")
    assert "\n" not in sentence


def test_the_document_field_round_trips_and_anything_unreadable_is_undeclared() -> None:
    for policy in (UNDECLARED, ModelPolicy("mixed"), ModelPolicy("single", "m", H1)):
        assert policy_from_document(policy.to_document()) == policy
    assert UNDECLARED.to_document() is None
    for junk in ("mixed", ["mixed"], {"policy": "many"}, {"policy": "single", "name": "m", "hash": "abc"},
                 {"policy": "single", "name": 3, "hash": H1}, {"policy": "single", "name": "a@b", "hash": H1}):
        assert policy_from_document(junk) == UNDECLARED, junk


def test_the_policy_in_words_for_the_join_dialog() -> None:
    single = describe_model_policy({"policy": "single", "name": "SmolLM2-135M-Instruct", "hash": H1})
    assert single.startswith("Every node here trains SmolLM2-135M-Instruct") and H1[:12] in single
    assert describe_model_policy(ModelPolicy("mixed")).startswith("Nodes here run different models.")
    assert describe_model_policy(None).startswith("The relay does not say which models its nodes run")
    assert describe_model_policy({"policy": "nonsense"}) == describe_model_policy(None)


# -- this node's label ------------------------------------------------------------------------------
def test_file_hashes_are_sha256_and_cached_by_path_size_and_time(tmp_path: Path) -> None:
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"weights" * 1000)
    cache = tmp_path / "cache"
    assert file_sha256(weights, cache) == hashlib.sha256(weights.read_bytes()).hexdigest()
    # The cache answers while the file is unchanged (a planted value proves it is read) ...
    entries = json.loads((cache / HASH_CACHE_FILE).read_text())
    (cache / HASH_CACHE_FILE).write_text(json.dumps(dict.fromkeys(entries, H2)))
    assert file_sha256(weights, cache) == H2
    # ... and a changed file is hashed again.
    weights.write_bytes(b"other")
    os.utime(weights, ns=(1, 1))
    assert file_sha256(weights, cache) == hashlib.sha256(b"other").hexdigest()


def test_several_weights_files_hash_as_their_sha256sum_list(tmp_path: Path) -> None:
    a, b = tmp_path / "b.safetensors", tmp_path / "a.safetensors"
    a.write_bytes(b"one")
    b.write_bytes(b"two")
    listing = (f"{hashlib.sha256(b'two').hexdigest()}  a.safetensors\n"
               f"{hashlib.sha256(b'one').hexdigest()}  b.safetensors\n")
    assert weights_hash([a, b]) == hashlib.sha256(listing.encode()).hexdigest()
    assert weights_hash([a]) == hashlib.sha256(b"one").hexdigest()
    with pytest.raises(ConfigError, match="no weights file"):
        weights_hash([])


def test_a_model_folder_is_labelled_by_its_name_and_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    label = model_label(str(tiny_model_dir), tiny_model_dir, tmp_path)
    digest = hashlib.sha256((tiny_model_dir / "model.safetensors").read_bytes()).hexdigest()
    assert label == f"{tiny_model_dir.name}@{digest}"


def test_the_bundled_model_is_labelled_by_the_sha256_of_its_gguf(tmp_path: Path) -> None:
    from engine.common.model_policy import BUNDLED_NAME, bundled_gguf_path

    gguf = bundled_gguf_path()
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert model_label("bundled", tmp_path / "not-used", tmp_path) == f"{BUNDLED_NAME}@{digest}"


# -- the relay: its setting, welcome, information document and refusal ------------------------------
def test_the_relays_models_setting_is_checked_like_every_other() -> None:
    assert settings_from_args(["--models", "mixed"]).model_policy() == ModelPolicy("mixed")
    assert settings_from_args([]).model_policy() == UNDECLARED
    assert settings_from_args(["--models", f"m@{H1}"]).model_policy() == ModelPolicy("single", "m", H1)
    with pytest.raises(ValueError, match=r"^models must be 'mixed' or one model"):
        settings_from_args(["--models", "SmolLM2-135M-Instruct"])


def info_document(relay_url: str) -> dict[str, Any]:
    url = relay_url.replace("ws://", "http://").replace("/ws", "/.well-known/sapling-relay")
    with urllib.request.urlopen(url, timeout=10) as answer:
        return dict(json.loads(answer.read()))


async def publish_labelled(peer: DocPeer, label: str) -> dict[str, Any]:
    payload = json.loads(peer.batch_payload([item()]))
    payload["model"] = label
    text = json.dumps(payload)
    await peer.send({"type": "publish", "v": 1, "payload": text, "sig": peer.sign(text)})
    return await peer.recv()


@pytest.mark.integration
async def test_a_relay_of_one_model_refuses_batches_labelled_with_another(start_relay: StartRelay) -> None:
    relay = start_relay(models=f"SmolLM2-135M-Instruct@{H1}")
    declared = {"policy": "single", "name": "SmolLM2-135M-Instruct", "hash": H1}
    sender, reader = DocPeer(relay.url), DocPeer(relay.url)
    try:
        welcome = await sender.connect()
        assert welcome["type"] == "welcome" and welcome["models"] == declared
        assert (await asyncio.to_thread(info_document, relay.url))["models"] == declared
        for label in (f"SmolLM2-135M-Instruct@{H2}", "doc-client", "bundled"):
            refused = await publish_labelled(sender, label)
            assert refused["type"] == "error" and refused["code"] == protocol.E_WRONG_MODEL, refused
            assert H1 in refused["message"]
        # the connection stays open, and the same weights under another name are the same model
        assert (await publish_labelled(sender, f"my-copy@{H1}"))["type"] == "published"
        await reader.connect()
        assert len((await reader.sample(16))["batches"]) == 1  # only that batch was kept
    finally:
        await sender.close()
        await reader.close()


@pytest.mark.integration
@pytest.mark.parametrize("setting", ["mixed", ""])
async def test_a_mixed_or_silent_relay_takes_every_label_and_says_so(start_relay: StartRelay, setting: str) -> None:
    relay = start_relay(models=setting)
    declared = {"policy": "mixed"} if setting else None
    peer = DocPeer(relay.url)
    try:
        assert (await peer.connect())["models"] == declared
        assert (await asyncio.to_thread(info_document, relay.url))["models"] == declared
        for label in (f"a@{H1}", f"b@{H2}", "doc-client"):
            assert (await publish_labelled(peer, label))["type"] == "published"
    finally:
        await peer.close()


@pytest.mark.integration
@pytest.mark.parametrize("setting", ["mixed", "other"])
def test_a_node_learns_the_policy_from_the_welcome_and_labels_its_batches(
    tiny_model_dir: Path, tmp_path: Path, start_relay: StartRelay, setting: str
) -> None:
    from engine.common.paths import Paths
    from engine.node.loop import Node
    from engine.swarm.session import open_swarm
    from tests.swarm.test_mix import config, parity_reward

    relay = start_relay(models="mixed" if setting == "mixed" else f"someone-elses@{H2}")
    cfg = config(tiny_model_dir, "swarm.mode='relay'", f"swarm.relay_url='{relay.url}'")
    events: list[Any] = []
    paths = Paths.under(tmp_path / "node")
    session = open_swarm(cfg, paths.identity_file, events.append)
    try:
        exchange = session.exchange
        assert exchange is not None and exchange.client.wait_connected(10)
        node = Node(cfg, paths, events.append, exchange=exchange)
        node.taskset.reward = parity_reward  # type: ignore[method-assign]
        node.setup()
        digest = hashlib.sha256((tiny_model_dir / "model.safetensors").read_bytes()).hexdigest()
        assert exchange.model_label == f"{tiny_model_dir.name}@{digest}"
        if setting == "mixed":
            assert exchange.models == ModelPolicy("mixed")
            return
        assert exchange.models == ModelPolicy("single", "someone-elses", H2)
        node.run_round()  # its batch is refused by the relay, and it still trains
        deadline = time.monotonic() + 10
        while not exchange.client.state.publish_errors and time.monotonic() < deadline:
            time.sleep(0.05)
        assert exchange.client.state.publish_errors == {protocol.E_WRONG_MODEL: 1}
        assert relay.relay.metrics["publishes"] == 0
    finally:
        session.close()

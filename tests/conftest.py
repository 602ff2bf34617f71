"""Shared fixtures: tiny random models (built once per session), isolated Sapling homes, relays, redis-server."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from bench.harness.servers import RedisServer

if TYPE_CHECKING:
    from engine.relay.embedded import EmbeddedRelay

# Never reach for the network from tests; never print HF progress bars.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session", autouse=True)
def _one_thread() -> None:
    """Deterministic and polite on a 2-core machine: in-process torch uses one thread."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _install_seeds_follow_the_test(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """An install draws its seed at random (engine/node/seeds.py). In this process a test's installs draw
    from a generator seeded by the test's id instead: a test sees the same seeds on every run (no
    test passes or fails by the draw), and two installs in one test still get different seeds."""
    import random
    from types import SimpleNamespace

    import engine.node.seeds

    draw = random.Random(request.node.nodeid)
    monkeypatch.setattr(engine.node.seeds, "secrets", SimpleNamespace(randbelow=draw.randrange))


@pytest.fixture(autouse=True)
def _no_handler_left_on_a_closed_stream() -> Iterator[None]:
    """A test that runs a CLI's main() in this process (sapling-relay's sets up JSON logging with
    logging.basicConfig(force=True)) leaves the root logger writing to that test's captured stderr,
    closed once the test ends; later tests' log lines would fail there ("Logging error")."""
    import logging

    root = logging.getLogger()
    before = list(root.handlers)
    level = root.level
    yield
    for handler in list(root.handlers):
        if type(handler) is logging.StreamHandler and handler not in before:
            root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from bench.harness.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"), arch="llama")


@pytest.fixture(scope="session")
def tiny_qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from bench.harness.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-qwen"), arch="qwen2", seed=1)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A private SAPLING_HOME for one test."""
    return tmp_path / "home"


StartRelay = Callable[..., "EmbeddedRelay"]


@pytest.fixture
def start_relay() -> Iterator[StartRelay]:
    """Real relays in this process, each on a free loopback port, stopped after the test."""
    from engine.relay.embedded import EmbeddedRelay
    from engine.relay.settings import RelaySettings

    started: list[EmbeddedRelay] = []

    def start(**settings: Any) -> EmbeddedRelay:
        relay = EmbeddedRelay(RelaySettings(host="127.0.0.1", port=0, **settings))
        relay.start()
        started.append(relay)
        return relay

    yield start
    for relay in started:
        relay.stop()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A redis-server of this test's own on a free loopback port, without persistence, stopped after the test;
    the test may stop it and start it again on the same port."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make test installs it)")
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()

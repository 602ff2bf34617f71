"""Model sources and the rules the app shares with the engine (engine/common/rules.py, engine/models/sources.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.common.errors import ConfigError, ModelError
from engine.common.rules import check_model_source, check_relay_url, model_source_kind, split_invite, stable_seed
from engine.models.sources import resolve_model_dir

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_a_hub_id_offline_and_not_cached_says_what_to_do(tmp_path: Path) -> None:
    # conftest sets HF_HUB_OFFLINE=1; a fresh HF cache holds nothing.
    code = (
        "import os, sys\n"
        f"os.environ['HF_HOME'] = {str(tmp_path / 'hf')!r}\n"
        "os.environ['HF_HUB_OFFLINE'] = '1'\n"
        "from pathlib import Path\n"
        "from engine.common.errors import ModelError\n"
        "from engine.models.sources import resolve_model_dir\n"
        "try:\n"
        f"    resolve_model_dir('nobody-here/no-such-model', Path({str(tmp_path / 'cache')!r}))\n"
        "except ModelError as exc:\n"
        "    print(exc)\n"
        "    sys.exit(3)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 3, out.stderr[-2000:]
    assert "not in the Hugging Face cache" in out.stdout and "hf download nobody-here/no-such-model" in out.stdout


def test_a_missing_model_folder_is_a_model_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model_dir(str(tmp_path / "nothing"), tmp_path)


@pytest.mark.parametrize(
    ("source", "kind"),
    [
        ("bundled", "bundled"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "hub"),
        ("./models/mine", "folder"),
        ("/abs/path", "folder"),
        ("~/models/x", "folder"),
        ("C:\\Users\\me\\model", "folder"),
        ("C:/Users/me/model", "folder"),  # the drive colon: the app and the engine used to disagree here
        ("a/b/c", "folder"),
    ],
)
def test_app_and_engine_read_a_model_source_the_same_way(source: str, kind: str) -> None:
    assert model_source_kind(source) == kind


def test_check_model_source_names_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        check_model_source(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"no config\.json"):
        check_model_source(str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="not a Hugging Face id"):
        check_model_source("not a hub id")
    assert check_model_source("org/name") == "hub"


def test_invites_carry_the_join_token() -> None:
    assert split_invite("wss://relay.example/ws?token=abc") == ("wss://relay.example/ws", "abc")
    assert split_invite("ws://10.0.0.2:8765/ws") == ("ws://10.0.0.2:8765/ws", "")
    assert split_invite("wss://relay.example.org/ws?token=abc&x=1") == ("wss://relay.example.org/ws?x=1", "abc")
    assert split_invite(" ws://h:1 ") == ("ws://h:1/ws", "")


@pytest.mark.parametrize("bad", ["", "http://relay/ws", "ws://", "ws://host:99999/ws", "ws://ho st/ws"])
def test_bad_relay_addresses_are_refused(bad: str) -> None:
    with pytest.raises(ConfigError):
        check_relay_url(bad)


@pytest.mark.integration
def test_stable_seeds_do_not_depend_on_the_process() -> None:
    code = "from engine.common.rules import stable_seed; print(stable_seed('draw', 3, 7))"
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
            for _ in range(2)}
    assert runs == {f"{stable_seed('draw', 3, 7)}\n"}
    assert 0 <= stable_seed(1) < 2**64 and stable_seed(1) != stable_seed(2)

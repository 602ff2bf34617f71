"""`sapling-node identity show|export|import` (engine/swarm/identity_backup.py): a key you can keep."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from engine.cli import main
from engine.common.paths import Paths
from engine.swarm.identity import Identity

ROOT = Path(__file__).resolve().parents[2]


def node(home: Path) -> Identity:
    return Identity.load_or_create(Paths.under(home).identity_file)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.integration
def test_export_then_import_into_a_fresh_home_gives_the_same_peer_id(tmp_path: Path) -> None:
    original = node(tmp_path / "a")
    backup = tmp_path / "backup" / "sapling-identity.txt"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "engine.cli", "identity", *args], capture_output=True, text=True,
                              cwd=ROOT, timeout=60)

    out = cli("export", str(backup), "--home", str(tmp_path / "a"))
    assert out.returncode == 0, out.stderr
    assert original.name in out.stdout and "private" in out.stdout
    assert mode(backup) == 0o600
    text = backup.read_text()
    assert f"peer id {original.peer_id}" in text and "do not send it to anyone" in text
    out = cli("import", str(backup), "--home", str(tmp_path / "b"), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"name": original.name, "peer_id": original.peer_id, "replaced": None,
                                      "changed": True}
    shown = json.loads(cli("show", "--home", str(tmp_path / "b"), "--json").stdout)
    assert shown["peer_id"] == original.peer_id
    assert node(tmp_path / "b").peer_id == original.peer_id
    assert mode(Paths.under(tmp_path / "b").identity_file) == 0o600


@pytest.mark.integration
def test_a_damaged_backup_is_one_sentence_exit_2_and_changes_nothing(tmp_path: Path) -> None:
    before = node(tmp_path / "a")
    key_file = Paths.under(tmp_path / "a").identity_file
    kept = key_file.read_bytes()
    damaged = tmp_path / "damaged.txt"
    good = tmp_path / "good.txt"
    assert main(["identity", "export", str(good), "--home", str(tmp_path / "other")]) == 0
    damaged.write_bytes(good.read_bytes()[:-40])
    out = subprocess.run([sys.executable, "-m", "engine.cli", "identity", "import", str(damaged), "--home",
                          str(tmp_path / "a")], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("sapling-node: error: The backup ") and "damaged" in out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert key_file.read_bytes() == kept and node(tmp_path / "a").peer_id == before.peer_id
    assert sorted(p.name for p in key_file.parent.iterdir()) == ["identity.key"]


def _pem_of(key: object, password: bytes | None = None) -> bytes:
    encryption = (serialization.BestAvailableEncryption(password) if password
                  else serialization.NoEncryption())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,  # type: ignore[attr-defined]
                             encryption)


@pytest.mark.parametrize(("content", "words"), [
    (b"", "damaged"),
    (b"hello, this is not a key\n", "damaged"),
    (b"\xff\xfe\x00garbage" * 3, "damaged"),
    (_pem_of(X25519PrivateKey.generate()), "another kind of key"),
    (_pem_of(Ed25519PrivateKey.generate(), b"secret"), "password"),
    (b"x" * (65 * 1024), "too large"),
])
def test_a_wrong_file_is_refused_and_the_identity_stays(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        content: bytes, words: str) -> None:
    home = tmp_path / "home"
    before = node(home)
    wrong = tmp_path / "wrong.pem"
    wrong.write_bytes(content)
    code, out, err = run(capsys, "identity", "import", str(wrong), "--home", str(home))
    assert code == 2 and out == "" and words in err and err.count("\n") == 1
    assert node(home).peer_id == before.peer_id
    assert [p.name for p in Paths.under(home).data_dir.iterdir()] == ["identity.key"]


def test_importing_another_key_keeps_the_current_one_beside_it(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    mine, theirs = node(tmp_path / "mine"), node(tmp_path / "theirs")
    backup = tmp_path / "theirs.key"
    assert main(["identity", "export", str(backup), "--home", str(tmp_path / "theirs")]) == 0
    capsys.readouterr()
    old = Paths.under(tmp_path / "mine").identity_file.read_bytes()
    code, out, _err = run(capsys, "identity", "import", str(backup), "--home", str(tmp_path / "mine"))
    assert code == 0 and f"now {theirs.name}" in out
    data = Paths.under(tmp_path / "mine").data_dir
    [replaced] = [p for p in data.iterdir() if p.name.startswith("identity.key.replaced-")]
    assert replaced.read_bytes() == old and mode(replaced) == 0o600
    assert Identity.load_or_create(replaced).peer_id == mine.peer_id
    assert node(tmp_path / "mine").peer_id == theirs.peer_id
    # the same file again: nothing to change, nothing more kept
    code, out, _err = run(capsys, "identity", "import", str(backup), "--home", str(tmp_path / "mine"))
    assert code == 0 and "nothing changed" in out
    assert len([p for p in data.iterdir() if p.name.startswith("identity.key.replaced-")]) == 1


def test_show_and_export_both_make_the_identity_when_there_is_none_and_agree(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    code, out, _err = run(capsys, "identity", "show", "--home", str(home), "--json")
    shown = json.loads(out)
    assert code == 0 and shown["made_now"] is True and shown["peer_id"] == node(home).peer_id
    code, out, _err = run(capsys, "identity", "show", "--home", str(home))
    assert code == 0 and shown["peer_id"] in out and "made now" not in out
    for before in (["identity", "--home", str(home), "--json", "show"],  # the flags before the action work too
                   ["identity", "--home", str(tmp_path / "other"), "show", "--home", str(home), "--json"]):
        code, out, _err = run(capsys, *before)
        assert code == 0 and json.loads(out)["peer_id"] == shown["peer_id"]
    assert not (tmp_path / "other").exists()  # the one after the action wins, and the other is never touched
    code, out, _err = run(capsys, "identity", "export", str(tmp_path / "b.key"), "--home", str(home), "--json")
    assert code == 0 and json.loads(out)["peer_id"] == shown["peer_id"]
    fresh = tmp_path / "fresh"
    code, out, _err = run(capsys, "identity", "export", str(tmp_path / "c.key"), "--home", str(fresh), "--json")
    assert code == 0 and json.loads(out)["peer_id"] == node(fresh).peer_id
    code, _out, err = run(capsys, "identity", "export", str(tmp_path), "--home", str(home))
    assert code == 2 and "is a folder" in err
    key_file = Paths.under(home).identity_file
    code, _out, err = run(capsys, "identity", "export", str(key_file), "--home", str(home))
    assert code == 2 and "the identity file itself" in err
    if os.name == "posix":
        assert mode(tmp_path / "b.key") == 0o600


def test_a_backup_replaces_only_an_earlier_backup_of_the_same_identity(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    home, other_home = tmp_path / "home", tmp_path / "other"
    backup, theirs, notes = tmp_path / "mine.key", tmp_path / "theirs.key", tmp_path / "notes.txt"
    assert run(capsys, "identity", "export", str(backup), "--home", str(home))[0] == 0
    assert run(capsys, "identity", "export", str(backup), "--home", str(home))[0] == 0  # the same key again
    assert run(capsys, "identity", "export", str(theirs), "--home", str(other_home))[0] == 0
    kept = theirs.read_bytes()
    notes.write_text("mine")
    code, _out, err = run(capsys, "identity", "export", str(theirs), "--home", str(home))
    assert code == 2 and f"another identity, {node(other_home).name}" in err and theirs.read_bytes() == kept
    code, _out, err = run(capsys, "identity", "export", str(notes), "--home", str(home))
    assert code == 2 and "not a Sapling identity backup; nothing was changed" in err and notes.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "mine.key", "notes.txt", "other", "theirs.key"]

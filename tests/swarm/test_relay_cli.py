"""The relay's command line: the public-face settings and `sapling-relay invite`.

    .venv/bin/python -m pytest -q tests/swarm/test_relay_cli.py
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
import segno

from engine.common.rules import Invite, parse_invite
from engine.relay import invite as relay_invite
from engine.relay.settings import settings_from_args

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine.relay", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def _invite(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = relay_invite.main(args)
    out, err = capsys.readouterr()
    return code, out, err


# -- settings -----------------------------------------------------------------------------------
def test_public_face_settings_from_flags_and_config(tmp_path: Path) -> None:
    settings = settings_from_args(["--description", "Maths club swarm.", "--contact", "ops@example.org",
                                   "--public-url", "wss://a.example.org/ws, wss://b.example.org/ws",
                                   "--public-url", "wss://c.example.org/ws", "--name", "Maths"])
    assert settings.public_url == ["wss://a.example.org/ws", "wss://b.example.org/ws", "wss://c.example.org/ws"]
    assert (settings.description, settings.contact, settings.name) == ("Maths club swarm.", "ops@example.org", "Maths")
    config = tmp_path / "relay.toml"
    config.write_text('description = "line one\\nline two"\ncontact = "https://example.org/ops"\n'
                      'public_url = ["wss://a.example.org/ws"]\n')
    settings = settings_from_args(["--config", str(config)])
    assert settings.public_url == ["wss://a.example.org/ws"] and settings.description == "line one\nline two"
    config.write_text('public_url = "wss://a.example.org/ws,wss://b.example.org/ws"\n')
    assert settings_from_args(["--config", str(config)]).public_url == ["wss://a.example.org/ws",
                                                                        "wss://b.example.org/ws"]


@pytest.mark.parametrize("args", [
    ["--public-url", "https://relay.example.org/ws"],
    ["--public-url", "wss://"],
    ["--public-url", "wss://[/ws"],
    ["--name", "x" * 81],
    ["--contact", "a\x07b"],
    ["--name", "two\nlines"],
    ["--description", "y" * 1001],
    ["--public-url", ",".join(f"wss://r{i}.example.org/ws" for i in range(9))],
])
def test_bad_public_face_settings_are_one_sentence(args: list[str]) -> None:
    with pytest.raises(ValueError) as caught:
        settings_from_args(args)
    assert "\n" not in str(caught.value) and str(caught.value)


@pytest.mark.integration
def test_a_bad_public_url_exits_2_without_a_traceback() -> None:
    out = _cli("--public-url", "http://relay.example.org/ws")
    assert out.returncode == 2 and out.stderr.startswith("sapling-relay: ") and "Traceback" not in out.stderr


# -- invite -------------------------------------------------------------------------------------
def test_invite_prints_the_link_the_page_and_a_qr_code_of_the_page(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _invite(["--url", "wss://a.example.org/ws", "--url", "wss://b.example.org:8443/ws",
                              "--token", "s3cret", "--name", "Maths <club>"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    link = lines[lines.index("Invite link (opens Sapling):") + 1].strip()
    page = lines[lines.index("Web page for people without Sapling yet (the relay serves it):") + 1].strip()
    want = Invite(("wss://a.example.org/ws", "wss://b.example.org:8443/ws"), "s3cret", "Maths <club>")
    assert parse_invite(link) == want and link.startswith("sapling://join?")
    assert parse_invite(page) == want and page.startswith("https://a.example.org/join?")
    assert "join token" in out
    qr = io.StringIO()
    segno.make(page, error=relay_invite.QR_ERROR_LEVEL, micro=False).terminal(out=qr, compact=True)
    assert qr.getvalue() in out  # the QR code printed is the page's


def test_invite_reads_the_relays_settings_and_flags_win(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "relay.toml"
    config.write_text('public_url = ["wss://relay.example.org/ws"]\njoin_token = "tok"\nname = "Lab swarm"\n'
                      'port = 9000\n')
    code, out, _ = _invite(["--config", str(config), "--no-qr"], capsys)
    assert code == 0
    assert parse_invite(out.splitlines()[1].strip()) == Invite(("wss://relay.example.org/ws",), "tok", "Lab swarm")
    code, out, _ = _invite(["--config", str(config), "--no-qr", "--name", "Other", "--token", "",
                            "--url", "ws://127.0.0.1:8765/ws", "--page", "http://127.0.0.1:8765"], capsys)
    assert code == 0
    assert parse_invite(out.splitlines()[1].strip()) == Invite(("ws://127.0.0.1:8765/ws",), "", "Other")
    assert out.splitlines()[3].strip().startswith("http://127.0.0.1:8765/join?relay=ws%3A%2F%2F127.0.0.1")


@pytest.mark.parametrize(("args", "words"), [
    ([], "--url"),
    (["--url", "http://relay.example.org/ws"], "ws:// or wss://"),
    (["--url", "wss://relay.example.org/ws?token=abc"], "token"),
    (["--url", "wss://relay.example.org/ws", "--name", "n" * 81], "--name"),
    (["--url", "wss://relay.example.org/ws", "--token", "a\x01b"], "control characters"),
    (["--url", "wss://" + "h" * 10_000 + "/ws"], "characters"),
    (["--url", ",".join(f"wss://r{i}.example.org/ws" for i in range(9))], "relays"),
    (["--url", "wss://relay.example.org/ws", "--page", "javascript:alert(1)"], "--page"),
    (["--url", "wss://relay.example.org/ws", "--page", "http://["], "--page"),
    (["--url", "wss://[/ws"], "not a valid URL"),
])
def test_a_bad_invite_is_one_sentence_and_exit_2(args: list[str], words: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _invite(args, capsys)
    assert code == 2 and out == ""
    assert err.startswith("sapling-relay invite: ") and err.count("\n") == 1 and words in err, err


def test_an_invite_too_long_for_a_qr_code_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    urls = [f"wss://relay-number-{i}-of-a-long-list.{'x' * 180}.example.org/ws" for i in range(8)]
    code, out, _ = _invite(["--url", ",".join(urls), "--name", "n" * 80], capsys)
    assert code == 0 and "too long for a QR code" in out


@pytest.mark.integration
def test_the_invite_command_through_sapling_relay(tmp_path: Path) -> None:
    out = _cli("invite", "--url", "wss://relay.example.org/ws", "--name", "Club")
    assert out.returncode == 0 and "sapling://join?relay=wss%3A%2F%2Frelay.example.org%2Fws&name=Club" in out.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text("public_url = 7\n")
    for args in (("invite", "--url", "ftp://x"), ("invite", "--config", str(bad)),
                 ("invite", "--config", str(tmp_path / "missing.toml"))):
        out = _cli(*args)
        assert out.returncode == 2, (args, out.stderr)
        assert out.stderr.startswith("sapling-relay invite: ") and "Traceback" not in out.stderr, out.stderr

"""The invite format (engine/common/rules.py): one parser for the relay, the node and the app."""

from __future__ import annotations

import pytest

from engine.common.errors import ConfigError
from engine.common.rules import INVITE_MAX_CHARS, INVITE_MAX_RELAYS, Invite, parse_invite


def test_a_link_with_two_relays_a_token_and_a_name_round_trips_through_all_three_spellings() -> None:
    invite = Invite(("wss://relay.example.org/ws", "ws://10.0.0.2:8765/ws"), "s3cret", "Maths club")
    link = invite.link()
    assert link.startswith("sapling://join?relay=wss%3A%2F%2Frelay.example.org%2Fws&relay=ws%3A%2F%2F10.0.0.2")
    assert parse_invite(link) == invite
    assert invite.page_url() == "https://relay.example.org/join?" + link.split("?", 1)[1]
    assert parse_invite(invite.page_url()) == invite
    assert parse_invite(invite.page_url("http://lab.local:8080/")) == invite
    assert parse_invite("  " + link + "\n") == invite


def test_a_bare_relay_address_is_an_invite_to_that_relay_with_its_token() -> None:
    assert parse_invite("wss://relay.example.org/ws?token=abc") == Invite(("wss://relay.example.org/ws",), "abc")
    assert parse_invite("ws://127.0.0.1:9000") == Invite(("ws://127.0.0.1:9000/ws",))


def test_a_relay_listed_twice_is_tried_once_in_its_first_place() -> None:
    invite = parse_invite("sapling://join?relay=wss://b/ws&relay=wss://a/ws&relay=wss://b/ws")
    assert invite.relays == ("wss://b/ws", "wss://a/ws")


def test_a_page_for_plain_ws_relays_is_served_over_http() -> None:
    assert Invite(("ws://lab.local:8765/ws",)).page_url().startswith("http://lab.local:8765/join?")


@pytest.mark.parametrize(("text", "message"), [
    ("", "Paste the invite link"),
    ("javascript:alert(1)", "not javascript:"),
    ("file:///etc/passwd", "not file:"),
    ("ftp://relay.example.org/ws", "not ftp:"),
    ("hello there", "not an invite link or a relay address"),
    ("sapling://other?relay=wss://x/ws", "must start with sapling://join?"),
    ("https://relay.example.org/evil?relay=wss://x/ws", "not an invite page"),
    ("sapling://join?name=Lab", "names no relay"),
    ("sapling://join?relay=http://x/ws", "must start with ws:// or wss://"),
    ("sapling://join?relay=wss://x/ws&token=a%01b", "control characters"),
    ("sapling://join?relay=wss://x/ws&name=" + "n" * 81, "longer than 80"),
    ("sapling://join?relay=wss://x/ws&token=" + "t" * 257, "longer than 256"),
    ("sapling://join?relay=wss%3A%2F%2Fx%2Fws%3Ftoken%3Dinner", "must not carry its own token"),
    ("sapling://join?" + "&".join(f"relay=wss://h{k}/ws" for k in range(INVITE_MAX_RELAYS + 1)), "relays, more than"),
    ("wss://relay.example.org/" + "x" * 10_000, f"more than the {INVITE_MAX_CHARS}"),
    ("wss://[/ws", "not a valid"),
    ("sapling://join?relay=wss%3A%2F%2F%5B", "not a valid URL"),
    ("sapling://join?relay=wss://h:99999/ws", "invalid port"),
    ("wss://relay.example.org/ws\x00", "control characters"),
])
def test_a_malformed_invite_gets_one_sentence_naming_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        parse_invite(text)
    assert "\n" not in str(caught.value)

"""`sapling-relay invite`: the links and QR code that bring people into a swarm.

    sapling-relay invite --url wss://relay.example.org/ws --name "Maths club"
    sapling-relay invite --url wss://a.example.org/ws --url wss://b.example.org/ws --token T
    sapling-relay invite --config relay.toml        # public_url, join_token and name from the relay's settings

It prints the `sapling://join?...` link (opens Sapling), the
`https://HOST/join?...` page that the relay serves for people who do not
have Sapling yet, and a QR code of that page for phones. The invite format
and its parser are engine/common/rules.py's (`Invite`, `parse_invite`); what this
prints parses back to the same invite, or the command says in one sentence
what is wrong and exits 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit

from engine.common.errors import ConfigError
from engine.common.rules import INVITE_MAX_NAME, INVITE_MAX_TOKEN, Invite, parse_invite
from engine.relay.settings import RelaySettings, settings_from_namespace, split_urls

QR_ERROR_LEVEL = "m"  # recovers from about 15% damage: a screen photographed at an angle
# Longer page addresses make a code too dense for a terminal and a phone's camera: link only.
QR_MAX_CHARS = 1000


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sapling-relay invite",
        description="Print an invite link for this relay's swarm, the web page version of it and a QR code. "
        "Flags override the relay's --config file (public_url, join_token, name).",
    )
    parser.add_argument("--url", action="append", default=None, metavar="URL",
                        help="a relay address nodes should use, wss://HOST/ws (repeat, or separate with commas, "
                        "for several relays of one swarm: nodes fail over between them)")
    parser.add_argument("--token", default=None, help="the swarm's join token, for a private swarm")
    parser.add_argument("--name", default=None, help="the swarm's name, as people will see it")
    parser.add_argument("--page", default="", metavar="URL",
                        help="the site that serves the /join page (default: the first relay's host over https)")
    parser.add_argument("--config", type=Path, default=None, help="the relay's TOML settings file")
    parser.add_argument("--no-qr", action="store_true", help="leave out the QR code")
    return parser


def invite_from_args(args: argparse.Namespace) -> Invite:
    """The invite the flags and the --config file describe; ConfigError (one sentence) when it is not valid."""
    settings = RelaySettings()
    if args.config is not None:
        empty = {name: None for name in RelaySettings.__dataclass_fields__}
        try:
            settings = settings_from_namespace(argparse.Namespace(config=args.config, **empty))
        except ValueError as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"{exc}.") from None
    urls = split_urls(args.url) if args.url else list(settings.public_url)
    if not urls:
        raise ConfigError("Give the relay's public address with --url wss://HOST/ws (or public_url in --config).")
    token = settings.join_token if args.token is None else args.token
    name = (settings.name if settings.name != RelaySettings().name else "") if args.name is None else args.name
    for flag, value, limit in (("--name", name, INVITE_MAX_NAME), ("--token", token, INVITE_MAX_TOKEN)):
        if len(value.strip()) > limit:
            raise ConfigError(f"{flag} may have at most {limit} characters; it has {len(value.strip())}.")
    # Through the one parser, so what is printed is what Sapling will read (a bare host gets /ws).
    return parse_invite(Invite(tuple(urls), token.strip(), name.strip()).link())


def print_invite(invite: Invite, page: str, qr: bool, out: TextIO) -> None:
    page_url = invite.page_url(page)
    print("Invite link (opens Sapling):", file=out)
    print(f"  {invite.link()}", file=out)
    print("Web page for people without Sapling yet (the relay serves it):", file=out)
    print(f"  {page_url}", file=out)
    if invite.token:
        print("This invite carries the swarm's join token: share it only with people you want in.", file=out)
    if not qr:
        return
    if len(page_url) > QR_MAX_CHARS:
        print(f"(The invite is too long for a QR code a phone can read, over {QR_MAX_CHARS} characters; "
              "send the link instead.)", file=out)
        return
    import segno

    code = segno.make(page_url, error=QR_ERROR_LEVEL, micro=False)  # 1000 characters fit: level M holds 2331 bytes
    print("QR code of the web page (scan it with a phone):", file=out)
    code.terminal(out=out, compact=True)


def _is_site(text: str) -> bool:
    try:
        parts = urlsplit(text)
        return parts.scheme in ("https", "http") and bool(parts.hostname) and not parts.path.strip("/")
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.page and not _is_site(args.page):
            raise ConfigError(f"--page must be a site address such as https://relay.example.org, not {args.page!r}.")
        invite = invite_from_args(args)
    except ConfigError as exc:
        print(f"sapling-relay invite: {exc}", file=sys.stderr)
        return 2
    try:
        print_invite(invite, args.page, not args.no_qr, sys.stdout)
        sys.stdout.flush()
    except BrokenPipeError:  # `sapling-relay invite | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0

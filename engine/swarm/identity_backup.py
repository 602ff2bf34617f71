"""Keep a node's swarm identity: show it, back it up to a file, restore it from one.

    sapling-node identity show [--home DIR] [--json]
    sapling-node identity export FILE [--home DIR]     # a copy of identity.key, with a note on what it is
    sapling-node identity import FILE [--home DIR]     # the old key is kept as identity.key.replaced-<time>

A node's peer id, its readable name and every credit other peers' receipts
earned it belong to its Ed25519 key (`identity.key` in the data dir). A
backup is that key as PEM (PKCS#8, unencrypted) after a few lines saying
what it is; whoever holds it can act as this node in the swarm. `import`
checks the file before touching anything: a damaged file, or one that holds
no Ed25519 private key, gets one sentence, exit 2, and the identity stays as
it was. Every write is atomic and the key files are mode 0600. A node that
is running keeps the key it started with until it restarts (the app
restarts its engine after a restore).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from engine.common.atomicio import atomic_write_bytes
from engine.common.errors import IdentityError
from engine.common.paths import Paths
from engine.swarm.identity import KEY_FILE_MODE, Identity

MAX_KEY_FILE_BYTES = 64 * 1024  # a backup is a few hundred bytes; anything this big is not one
NOTE = """Sapling swarm identity: {name} (peer id {peer_id})
This file is the private key of a Sapling node. Whoever has it can act as
that node in the swarm and use its name and credit: keep it somewhere
private, and do not send it to anyone, not even to a swarm's operator.
Restore it with Settings > Identity > Restore identity, or with
`sapling-node identity import FILE`.

"""


def _pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def read_key(path: Path, what: str = "The identity file") -> Ed25519PrivateKey:
    """The Ed25519 private key in `path`; IdentityError with one sentence when there is none to read."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_KEY_FILE_BYTES:
            raise IdentityError(f"{what} {path} is too large to be a Sapling identity ({MAX_KEY_FILE_BYTES // 1024} kB "
                                "at most).")
        data = path.read_bytes()
    except FileNotFoundError:
        raise IdentityError(f"{what} {path} does not exist.") from None
    except OSError as exc:
        raise IdentityError(f"{what} {path} cannot be read ({exc.strerror or exc}).") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise IdentityError(f"{what} {path} is protected by a password; Sapling keys have none.") from None
    except ValueError:
        raise IdentityError(f"{what} {path} is damaged or is not a Sapling identity (no readable private key in "
                            "it).") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise IdentityError(f"{what} {path} holds another kind of key than a Sapling identity (Ed25519).")
    return key


def current(paths: Paths, create: bool = False) -> Identity:
    """This node's identity, read strictly (a damaged key is an IdentityError, never replaced here);
    made now when there is none yet and `create` is set."""
    path = paths.identity_file
    if not path.exists():
        if not create:
            raise IdentityError(f"This computer has no swarm identity yet ({path} is made when a node first "
                                "starts); start one, or import a backup with `sapling-node identity import FILE`.")
        return Identity.load_or_create(path)
    return Identity(read_key(path, "The key file"), path)


def export_identity(paths: Paths, dest: Path) -> Identity:
    """Write this node's key, with a note on what it is, to `dest` (atomically, mode 0600)."""
    identity = current(paths, create=True)
    dest = Path(dest).expanduser()
    if dest.exists() and dest.resolve() == paths.identity_file.resolve():
        raise IdentityError(f"{dest} is the identity file itself; choose a file somewhere else for the backup.")
    if dest.is_dir():
        raise IdentityError(f"{dest} is a folder; give the name of the backup file to write.")
    if dest.exists():
        _may_replace(dest, identity)
    pem = _pem(read_key(paths.identity_file, "The key file"))
    note = NOTE.format(name=identity.name, peer_id=identity.peer_id).encode("utf-8")
    try:
        atomic_write_bytes(dest, note + pem, mode=KEY_FILE_MODE)
    except OSError as exc:
        raise IdentityError(f"The backup cannot be written to {dest} ({exc.strerror or exc}).") from None
    return identity


def _may_replace(dest: Path, identity: Identity) -> None:
    """A backup replaces only an earlier backup of the same identity: not a user's file, nor another node's key."""
    try:
        there = Identity(read_key(dest, "The file"))
    except IdentityError:
        raise IdentityError(f"{dest} exists and is not a Sapling identity backup; nothing was changed. Give another "
                            "name, or delete it first.") from None
    if there.peer_id != identity.peer_id:
        raise IdentityError(f"{dest} holds the backup of another identity, {there.name} (peer id {there.peer_id}); "
                            "nothing was changed. Give another name, so that both are kept.")


def import_identity(paths: Paths, source: Path, now: float | None = None) -> tuple[Identity, Path | None, bool]:
    """Make the key in `source` this node's identity. Returns it, where the replaced key was kept (None
    when there was none) and whether anything changed (False: it already was this node's key)."""
    key = read_key(Path(source).expanduser(), "The backup")
    new = Identity(key)
    path = paths.identity_file
    kept: Path | None = None
    if path.exists():
        try:
            if Identity(read_key(path, "The key file")).peer_id == new.peer_id:
                return Identity(key, path), None, False
        except IdentityError:
            pass  # a damaged current key is kept aside like any other
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
        kept = path.with_name(f"{path.name}.replaced-{stamp}")
        n = 1
        while kept.exists():
            n += 1
            kept = path.with_name(f"{path.name}.replaced-{stamp}-{n}")
    try:
        if kept is not None:
            os.link(path, kept)  # a second name for the old key: identity.key itself is never missing
        atomic_write_bytes(path, _pem(key), mode=KEY_FILE_MODE)
    except OSError as exc:
        raise IdentityError(f"The identity cannot be written to {path} ({exc.strerror or exc}); nothing was "
                            "changed.") from None
    return Identity(key, path), kept, True


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`sapling-node identity ...` (engine/cli.py adds it)."""
    ident = sub.add_parser("identity", help="show this node's swarm identity, back it up to a file, or restore it")
    home_help, json_help = "keep config, data, cache and logs under this one folder", "one JSON object, not sentences"
    # Before the action (`identity --home DIR show`) or after it (`identity show --home DIR`): the action's own
    # flags default to nothing at all, so they never overwrite what was given before the action.
    ident.add_argument("--home", type=Path, help=home_help)
    ident.add_argument("--json", action="store_true", help=json_help)
    actions = ident.add_subparsers(dest="identity_action", required=True, metavar="ACTION")
    for name, text in (("show", "print the name and peer id"),
                       ("export", "write the key to FILE (keep it private: whoever has it can act as this node)"),
                       ("import", "make the key in FILE this node's identity (the current one is kept beside it)")):
        action = actions.add_parser(name, help=text)
        if name != "show":
            action.add_argument("file", type=Path, metavar="FILE")
        action.add_argument("--home", type=Path, default=argparse.SUPPRESS, help=home_help)
        action.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=json_help)


def run(args: argparse.Namespace, paths: Paths) -> int:
    try:
        if args.identity_action == "show":  # like export, makes the identity a first run would make
            made = not paths.identity_file.exists()
            identity = current(paths, create=True)
            out: dict[str, Any] = {"name": identity.name, "peer_id": identity.peer_id, "file": str(identity.path),
                                   "made_now": made}
            print(json.dumps(out) if args.json else f"{identity.name} (peer id {identity.peer_id}), key in "
                  f"{identity.path}" + (" (made now: this computer had none yet)" if made else ""))
        elif args.identity_action == "export":
            identity = export_identity(paths, args.file)
            out = {"name": identity.name, "peer_id": identity.peer_id, "file": str(args.file)}
            print(json.dumps(out) if args.json else
                  f"Backed up {identity.name} (peer id {identity.peer_id}) to {args.file}. Keep that file private: "
                  "whoever has it can act as this node.")
        else:
            identity, kept, changed = import_identity(paths, args.file)
            out = {"name": identity.name, "peer_id": identity.peer_id, "replaced": str(kept) if kept else None,
                   "changed": changed}
            if args.json:
                print(json.dumps(out))
            elif not changed:
                print(f"This node already is {identity.name} (peer id {identity.peer_id}); nothing changed.")
            else:
                before = f"; the previous key is kept as {kept}" if kept else ""
                print(f"This node is now {identity.name} (peer id {identity.peer_id}){before}. A node that is "
                      "running uses it from its next start.")
    except IdentityError as exc:
        print(f"sapling-node: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0

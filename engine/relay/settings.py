"""The relay's settings and its command line, apart from the server (engine/relay/server.py).

    sapling-relay --help                             # every setting, with its default
    sapling-relay --config relay.toml --port 8765    # defaults < TOML file < flags

`RelaySettings` is one dataclass: each field is a flag (`--join-token` for
`join_token`) and a key of the `--config` TOML file. Nothing here imports
aiohttp, so the settings can be read, checked and printed without the
server; `settings_from_args` raises ValueError with one sentence for a bad
value, which `main` (in relay.py) prints before exiting 2.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import logging
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from engine.common.model_policy import ModelPolicy, parse_models_setting
from engine.common.rules import check_relay_url
from engine.relay.proxy import TrustedProxies
from engine.swarm import protocol
from engine.swarm.results import MAX_RESULT_QUESTIONS

MAX_NAME_CHARS = 80  # the relay's name, as nodes and the status page show it
MAX_DESCRIPTION_CHARS = 1000
MAX_CONTACT_CHARS = 200
MAX_PUBLIC_URLS = 8  # the most relay addresses one invite may carry (engine.common.rules.INVITE_MAX_RELAYS)
RELAY_DIR_NAME = "sapling-relay"  # the relay's own data folder under the user's data folder
KEY_FILE_NAME = "relay.key"
DEFAULT_DATASET_MAX_MB = 1024.0  # the kept batches' bound on disk (engine/relay/dataset.py)
DEFAULT_DATASET_LICENSE = "cc-by-4.0"
DEFAULT_RESULTS_QUESTIONS = 36  # the hourly evaluation's questions: 4 of each of the nine specialties
LICENSE_PATTERN = re.compile(r"^[a-z0-9][a-z0-9.+-]{0,63}$")  # a Hugging Face license id: cc-by-4.0, apache-2.0
# Settings that are lists; the key lists are read from files named on the command line.
KEY_LISTS = ("allow_keys", "ban_keys")
URL_LISTS = ("public_url",)
ADDRESS_LISTS = ("trusted_proxy",)  # IP addresses and CIDR networks, repeated or comma-separated like URL_LISTS


@dataclass
class RelaySettings:
    host: str = field(default="127.0.0.1", metadata={"help": "address to listen on (0.0.0.0 for every interface)"})
    port: int = field(default=8765, metadata={"help": "TCP port (0 picks a free one)"})
    redis: str = field(default="", metadata={"help": "redis://host:port/db to share one swarm between relay processes"})
    swarm: str = field(default="default",
                       metadata={"help": "swarm name: the Redis key prefix, so one Redis can hold several swarms"})
    join_token: str = field(default="",
                            metadata={"help": "private swarm: nodes must present this token (with allow-keys, both "
                                              "must pass)"})
    allow_keys: list[str] = field(default_factory=list,
                                  metadata={"help": "private swarm: only these public keys (base64) or peer ids may "
                                                    "join"})
    ban_keys: list[str] = field(default_factory=list,
                                metadata={"help": "public keys (base64) or peer ids that may not join"})
    max_conn_per_ip: int = field(default=protocol.DEFAULT_MAX_CONN_PER_IP,
                                 metadata={"help": "open connections allowed from one IP address"})
    trusted_proxy: list[str] = field(default_factory=list,
                                     metadata={"help": "IP address or CIDR network of a reverse proxy in front of the "
                                                       "relay, such as Caddy (repeat the flag or separate with "
                                                       "commas): for a connection from it, the client's address is the "
                                                       "rightmost one in X-Forwarded-For that is not a trusted proxy, "
                                                       "and the per-address cap and the logs use it; empty: the header "
                                                       "is never read"})
    rate: float = field(default=protocol.DEFAULT_RATE_PER_S,
                        metadata={"help": "requests per second per peer (token-bucket refill)"})
    burst: float = field(default=protocol.DEFAULT_BURST, metadata={"help": "token-bucket capacity per peer"})
    window: int = field(default=protocol.DEFAULT_WINDOW_BATCHES, metadata={"help": "recent batches kept for sampling"})
    send_queue: int = field(default=protocol.DEFAULT_SEND_QUEUE,
                            metadata={"help": "messages queued to one connection before it is dropped as a slow "
                                              "consumer"})
    credit_per_round: int = field(default=protocol.DEFAULT_CREDIT_PER_ROUND,
                                  metadata={"help": "receipts credit at most this many items of one sender as used per "
                                                    "sample answer of one receiver (docs/protocol.md, Credit)"})
    receipt_window: float = field(default=protocol.DEFAULT_RECEIPT_WINDOW_S,
                                  metadata={"help": "seconds after a sample during which the relay takes receipts for "
                                                    "what it handed out"})
    heartbeat: float = field(default=protocol.HEARTBEAT_S,
                             metadata={"help": "websocket ping interval in seconds; a peer answering neither of two "
                                               "pings is dropped"})
    reject_log_every: float = field(default=60.0,
                                    metadata={"help": "seconds between info-level summaries of refused messages per "
                                                      "peer"})
    name: str = field(default="sapling-relay",
                      metadata={"help": "the swarm's name, shown to nodes, on the status page and in invites (at most "
                                        f"{MAX_NAME_CHARS} characters)"})
    description: str = field(default="",
                             metadata={"help": "a sentence or two about this swarm for the status page and the join "
                                               f"dialog (at most {MAX_DESCRIPTION_CHARS} characters)"})
    operator: str = field(default="",
                          metadata={"help": "who runs this relay, as people should see it on the status page and "
                                            f"the /join page: a person, a club, a school (at most {MAX_NAME_CHARS} "
                                            "characters)"})
    contact: str = field(default="", metadata={"help": "how to reach the operator: an email address or a URL"})
    public_url: list[str] = field(default_factory=list,
                                  metadata={"help": "the wss:// address nodes should use, as the internet sees it "
                                                    "(repeat the flag or separate with commas for several); goes into "
                                                    "invites and the information document"})
    models: str = field(default="",
                        metadata={"help": "which models this swarm trains: NAME@SHA256 for one model (batches labelled "
                                          "with another are refused as wrong_model; `python -m "
                                          "engine.models.label` prints a node's label), 'mixed' (nodes may run "
                                          "different models: each judges another model's text against its sender's own "
                                          "past), or empty: not declared (nodes treat the swarm as one of their own "
                                          "model)"})
    data_dir: str = field(default="",
                          metadata={"help": f"folder for the relay's Ed25519 key ({KEY_FILE_NAME}); processes of one "
                                            f"swarm should share it (empty: the user's data folder, {RELAY_DIR_NAME})"})
    dataset_dir: str = field(default="",
                             metadata={"help": "folder where the relay keeps every stored batch and the receipts "
                                               "that mark items used, for `sapling-relay dataset export` (shared by "
                                               "the processes of one swarm; empty: no dataset is kept)"})
    dataset_max_mb: float = field(default=DEFAULT_DATASET_MAX_MB,
                                  metadata={"help": "the most megabytes the kept batches may take in dataset-dir; "
                                                    "past it the oldest files are deleted"})
    dataset_license: str = field(default=DEFAULT_DATASET_LICENSE,
                                 metadata={"help": "the license the swarm's dataset is published under (a Hugging "
                                                   "Face license id such as cc-by-4.0); the information document and "
                                                   "the join dialog show it"})
    dataset_url: str = field(default="",
                             metadata={"help": "where the latest export of the dataset is published (an https:// "
                                               "address); the status page links to it (empty: no link)"})
    results_questions: int = field(default=DEFAULT_RESULTS_QUESTIONS,
                                   metadata={"help": "questions of the hourly evaluation seed that nodes answer and "
                                                     "the relay re-scores for its results table (GET "
                                                     f"/stats/results.json; 0 to {MAX_RESULT_QUESTIONS}, 0: no "
                                                     "table); re-scoring needs the relay-dataset extra"})
    log_level: str = field(default="info", metadata={"help": "debug, info, warning or error"})
    advertise: bool = field(default=False,
                            metadata={"help": "announce this relay on the local network (mDNS/DNS-SD, _sapling._tcp) "
                                              "so that nodes there find it (`sapling-node discover`); listens on "
                                              "every interface unless --host names one"})

    def check(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0-65535, got {self.port}")
        for key in ("max_conn_per_ip", "window", "send_queue", "credit_per_round"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key.replace('_', '-')} must be at least 1")
        if (self.rate <= 0 or self.burst < 1 or self.heartbeat <= 0 or self.reject_log_every <= 0
            or self.receipt_window <= 0):
            raise ValueError("rate, heartbeat, reject-log-every and receipt-window must be positive and burst at "
                             "least 1")
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise ValueError("log-level must be debug, info, warning or error")
        if self.redis and not self.redis.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("redis must be a redis://, rediss:// or unix:// URL")
        for key, limit in (("name", MAX_NAME_CHARS), ("description", MAX_DESCRIPTION_CHARS),
                           ("operator", MAX_NAME_CHARS), ("contact", MAX_CONTACT_CHARS)):
            value: str = getattr(self, key)
            if len(value) > limit:
                raise ValueError(f"{key} must be at most {limit} characters, got {len(value)}")
            allowed = "\n" if key == "description" else ""
            if any((ord(c) < 32 or ord(c) == 127) and c not in allowed for c in value):
                raise ValueError(f"{key} must not contain control characters")
        if not 0 <= self.results_questions <= MAX_RESULT_QUESTIONS:
            raise ValueError(f"results-questions must be 0 to {MAX_RESULT_QUESTIONS}, got {self.results_questions}")
        if not self.dataset_max_mb > 0:
            raise ValueError(f"dataset-max-mb must be above 0, got {self.dataset_max_mb:g}")
        if not LICENSE_PATTERN.match(self.dataset_license):
            raise ValueError("dataset-license must be a license id such as cc-by-4.0 (a-z, 0-9, '.', '+' and '-')")
        url = self.dataset_url
        if url and (not url.startswith(("https://", "http://")) or len(url) > 2048
                    or any(ord(c) <= 32 or ord(c) == 127 for c in url)):
            raise ValueError("dataset-url must be an https:// address without spaces")
        if len(self.public_url) > MAX_PUBLIC_URLS:
            raise ValueError(f"public-url: at most {MAX_PUBLIC_URLS} addresses, got {len(self.public_url)}")
        for url in self.public_url:
            check_relay_url(url)  # ConfigError: a ValueError with one sentence
        parse_models_setting(self.models)  # ConfigError: a ValueError with one sentence
        self.trusted_proxies()  # ValueError with one sentence for an entry that is not an address or a network

    def limits(self) -> dict[str, Any]:
        """The `limits` object of the welcome: the protocol's constants and this relay's flags."""
        return protocol.limits(rate_per_s=self.rate, burst=self.burst, max_conn_per_ip=self.max_conn_per_ip,
                               send_queue=self.send_queue, window_batches=self.window, heartbeat_s=self.heartbeat,
                               credit_per_round=self.credit_per_round, receipt_window_s=self.receipt_window)

    def model_policy(self) -> ModelPolicy:
        """The swarm's model policy from `models` (engine/common/model_policy.py): welcome, information document,
        publish."""
        return parse_models_setting(self.models)

    def trusted_proxies(self) -> TrustedProxies:
        """The proxies whose X-Forwarded-For the relay believes (engine/relay/proxy.py): the per-address cap, logs."""
        return TrustedProxies(self.trusted_proxy)

    def key_path(self) -> Path:
        """Where the relay's Ed25519 key lives: `data_dir`, or the user's data folder for the relay."""
        if self.data_dir:
            return Path(self.data_dir).expanduser() / KEY_FILE_NAME
        import platformdirs

        return Path(platformdirs.user_data_dir(RELAY_DIR_NAME, appauthor=False)) / KEY_FILE_NAME


class JsonLogFormatter(logging.Formatter):
    """One JSON object per log line: ts, level, msg, and any `extra=` fields."""

    _skip = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in self._skip})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def _read_keys(path: str) -> list[str]:
    text = Path(path).read_text(encoding="utf-8")
    keys = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    return [k for k in keys if k]


def _valid_key(text: str) -> bool:
    if len(text) == protocol.PEER_ID_HEX and all(c in "0123456789abcdef" for c in text):
        return True
    try:
        return len(base64.b64decode(text, validate=True)) == protocol.PUBLIC_KEY_BYTES
    except (binascii.Error, ValueError):
        return False


def split_urls(values: list[str]) -> list[str]:
    """Flag values that may each hold several comma-separated URLs -> one list, blanks dropped."""
    return [url.strip() for value in values for url in value.split(",") if url.strip()]


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per RelaySettings field (and --config), none with a default: unset flags stay None."""
    parser.add_argument("--config", type=Path, help="TOML file with any of the settings below (keys with underscores)")
    defaults = RelaySettings()
    for f in fields(RelaySettings):
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata.get("help", "")
        if f.name in KEY_LISTS:
            parser.add_argument(flag + "-file", dest=f.name, metavar="FILE", default=None,
                                help=f"{help_text}; one per line, '#' comments")
        elif f.name in URL_LISTS or f.name in ADDRESS_LISTS:
            parser.add_argument(flag, dest=f.name, metavar="URL" if f.name in URL_LISTS else "ADDR", action="append",
                                default=None, help=help_text)
        elif isinstance(getattr(defaults, f.name), bool):
            parser.add_argument(flag, action="store_true", default=None, help=help_text)
        else:
            parser.add_argument(flag, type=type(getattr(defaults, f.name)), default=None,
                                help=f"{help_text} (default: {getattr(defaults, f.name)!r})")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sapling-relay",
        description="Relay for a Sapling swarm: nodes publish signed rollout batches and pull uniform samples of "
        "other nodes' batches. Settings come from defaults < --config TOML (keys as below, with underscores) < flags. "
        "`sapling-relay invite --help` prints invite links and a QR code for this relay.",
    )
    add_setting_flags(parser)
    return parser


def settings_from_namespace(args: argparse.Namespace) -> RelaySettings:
    """RelaySettings from parsed flags (see add_setting_flags) over the --config file; ValueError if bad."""
    values: dict[str, Any] = {}
    if args.config is not None:
        try:
            data = tomllib.loads(args.config.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read {args.config}: {exc}") from exc
        known = {f.name for f in fields(RelaySettings)}
        for key, value in data.items():
            if key not in known:
                raise ValueError(f"{args.config}: unknown setting {key!r}; allowed: {', '.join(sorted(known))}")
            values[key] = value
    for f in fields(RelaySettings):
        value = getattr(args, f.name, None)
        if value is None:
            continue
        if f.name in KEY_LISTS:
            try:
                value = _read_keys(value)
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"cannot read {f.name.replace('_', '-')} file: {exc}") from exc
        values[f.name] = value
    defaults = RelaySettings()
    for name, value in values.items():
        want = type(getattr(defaults, name))
        flag = name.replace("_", "-")
        if name in URL_LISTS:
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(isinstance(u, str) for u in value):
                raise ValueError(f"{flag} must be a list of wss:// addresses")
            values[name] = split_urls(value)
        elif name in ADDRESS_LISTS:
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
                raise ValueError(f"{flag} must be a list of IP addresses or CIDR networks")
            values[name] = split_urls(value)
        elif want is list:
            if not isinstance(value, list) or not all(isinstance(k, str) and _valid_key(k.strip()) for k in value):
                raise ValueError(f"{flag}: every entry must be a base64 Ed25519 public key or a peer id")
        elif want is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{flag} must be a number, got {value!r}")
            values[name] = float(value)
        elif want is bool:
            if not isinstance(value, bool):
                raise ValueError(f"{flag} must be true or false, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, want):
            kind = {int: "a whole number", str: "text in quotes"}.get(want, f"a {want.__name__}")
            raise ValueError(f"{flag} must be {kind}, got {value!r}")
    settings = RelaySettings(**values)
    settings.check()
    return settings


def settings_from_args(argv: list[str] | None) -> RelaySettings:
    """Parse the relay's command line (argparse exits 2 itself on an unknown flag)."""
    return settings_from_namespace(build_parser().parse_args(argv))

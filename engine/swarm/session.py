"""A node run's swarm session: solo, this computer's relay, or a community's; bans and data caps.

`open_swarm(config, identity_file, emit, host_relay=...)` starts what `swarm.mode` asks for
and returns a `SwarmSession`: the node's `SwarmExchange` (engine/swarm/exchange.py)
on a `SwarmClient` to the relay, with the defence state kept in the data dir
(`defence_state`: bans, the replay memory) and today's traffic counted against
the daily caps (`swarm.daily_upload_mb`, `swarm.daily_download_mb`;
engine/swarm/datacap.py). `SwarmSession.close()` closes the link (and stops
this computer's relay), and saves today's traffic.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.common.config import NodeConfig, SwarmConfig
from engine.common.errors import ConfigError, RelayError
from engine.common.events import Event, make_event
from engine.common.joining import preview_invite
from engine.common.rules import parse_invite
from engine.swarm.client import LinkState, RelayMemory, SwarmClient
from engine.swarm.contribution import CREDIT_FILE, Contribution, swarm_key
from engine.swarm.datacap import DATA_FILE, MB, DataMeter
from engine.swarm.defence import BanBook, ReplayMemory, SenderBaselines
from engine.swarm.exchange import (
    BANS_FILE,
    RELAYS_FILE,
    STRIKE_REASONS,
    SwarmExchange,
    peer_of,
    replay_file,
    senders_file,
)
from engine.swarm.identity import Identity
from engine.swarm.local import HostRelay, LocalSwarm


class SwarmSession:
    """The exchange of one node run, and this computer's relay link when the mode is embedded."""

    def __init__(self, exchange: SwarmExchange | None, relay: Any = None) -> None:
        self.exchange = exchange
        self.relay = relay  # a LocalSwarm (hosting or joined), or None

    def close(self) -> None:
        if self.exchange is not None:
            self.exchange.close()
        if self.relay is not None:
            self.relay.stop()


def defence_state(sw: SwarmConfig, state_dir: Path | None, run_name: str) -> tuple[BanBook, ReplayMemory | None]:
    """The node's ban book and replay memory from its settings; their files live in `state_dir`
    (None: nothing is kept across restarts)."""
    persist = state_dir is not None and sw.persist_bans
    bans = BanBook(strikes=sw.ban_strikes, window=sw.ban_window, hours=sw.ban_hours, strike_reasons=STRIKE_REASONS,
                   configured=[peer_of(p) for p in sw.banned_peers],
                   path=state_dir / BANS_FILE if persist and state_dir is not None else None)
    replay = None
    if sw.replay_memory > 0:
        replay = ReplayMemory(replay_file(state_dir, run_name) if state_dir is not None else None, sw.replay_memory)
    return bans, replay


def refuse_a_dataset_swarm(relay_url: str) -> None:
    """swarm.refuse_dataset_swarms: ConfigError when the swarm's relay says it keeps a dataset of what is shared,
    or when no relay of the invite answers (the node cannot tell, so it does not join)."""
    try:
        preview = preview_invite(relay_url)
    except (RelayError, ConfigError) as exc:
        raise ConfigError(f"Sapling could not ask the swarm's relay whether it keeps a dataset ({exc}), and "
                          "swarm.refuse_dataset_swarms is on: the node does not join until it can tell.") from None
    license_id = preview.info.dataset_license
    if license_id is not None:
        raise ConfigError(f"{preview.name or 'This swarm'} keeps a dataset of the answers shared in it (license "
                          f"{license_id}), and swarm.refuse_dataset_swarms is on: the node does not join it. Turn "
                          "it off in Settings, or choose another swarm.")


def open_swarm(config: NodeConfig, identity_file: Any, emit: Callable[[Event], None],
               state_dir: Path | None = None, *, host_relay: HostRelay | None = None) -> SwarmSession:
    """Start what `swarm.mode` asks for. Solo (or J = 0) gives a session without exchange.

    `host_relay` starts this computer's relay when the node hosts it (`swarm.mode = "embedded"`): the caller
    hands engine/relay/embedded.py's `start_embedded_relay`, since this package never imports the relay.

    Bans, the replay memory and which relay last let this node in (`relays.json`)
    are kept in `state_dir`, by default the `swarm` folder beside the identity
    file (the data dir). In relay mode `swarm.relay_url` is an invite or a bare
    relay address (`engine.common.rules.parse_invite`); its token comes before
    `swarm.join_token`.
    """
    sw = config.swarm
    identity = Identity.load_or_create(identity_file)
    if sw.mode == "solo" or sw.external_groups == 0:
        emit(make_event("swarm", peer_id=identity.peer_id, name=identity.name, relay=None, connected=False,
                        message="Solo: not sharing rollouts (swarm.mode = solo or external_groups = 0)."))
        return SwarmSession(None)
    token = sw.join_token
    swarm_name = ""
    exchange_ref: list[SwarmExchange] = []

    def on_change(state: LinkState) -> None:
        if exchange_ref:
            exchange_ref[0].announce(state)

    def on_message(text: str) -> None:  # the local relay changed hands: say so, in the swarm line
        if exchange_ref and local is not None:
            exchange_ref[0].relay_label = local.label
            exchange_ref[0].announce(message=text)

    if state_dir is None:
        state_dir = Path(identity_file).parent / "swarm"
    local: LocalSwarm | None = None
    if sw.mode == "relay":
        # An invite (sapling://join?relay=...&relay=...) or a bare relay address: the relays are tried in
        # order of last success, and the node moves to the next one when its relay fails.
        invite = parse_invite(sw.relay_url)
        if sw.refuse_dataset_swarms:
            refuse_a_dataset_swarm(sw.relay_url)
        token = invite.token or token
        swarm_name = invite.name
        memory = RelayMemory(state_dir / RELAYS_FILE)
        client = SwarmClient(invite.relays, identity, token=token, on_change=on_change, memory=memory)
        label = client.url
    else:
        # Host this computer's relay, or join the node that does; take it over if that node stops.
        if host_relay is None:
            raise ValueError("swarm.mode = embedded: open_swarm needs host_relay (start_embedded_relay)")
        local = LocalSwarm(sw.embedded_host, sw.embedded_port, identity, host_relay=host_relay, token=token,
                           on_change=on_change, on_message=on_message, lan=sw.embedded_lan)
        client = local.start()
        label = local.label
    bans, replay = defence_state(sw, state_dir, config.run.run_name)
    exchange = SwarmExchange(client, identity, config.model.source, emit, label, bans=bans, replay=replay,
                             swarm_name=swarm_name,
                             senders=SenderBaselines(senders_file(state_dir, config.run.run_name)))
    exchange.meter = client.meter = DataMeter(state_dir / DATA_FILE, int(sw.daily_upload_mb * MB),
                                              int(sw.daily_download_mb * MB))
    exchange.contribution = Contribution(state_dir / CREDIT_FILE, identity.peer_id,
                                         swarm_key(client.urls if sw.mode == "relay" else ()), emit)
    exchange_ref.append(exchange)
    exchange.announce()
    if local is None:
        client.start()
    client.wait_connected(3.0)
    return SwarmSession(exchange, local)

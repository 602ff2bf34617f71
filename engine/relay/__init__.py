"""`sapling-relay`: the websocket relay nodes share rollouts through, deployable on its own.

- `server`: the relay (`Relay`); `cli`: `sapling-relay`'s command line;
- `embedded`: a relay on a background thread inside another process (`start_embedded_relay`, the one door a
  node hosts this computer's relay through; `EmbeddedRelay`);
- `settings`: its settings and command line; `proxy`: which address a connection behind Caddy comes from;
- `brokers`: where the swarm's recent batches are kept (memory, or Redis Streams shared by processes);
- `limits`: per-peer rate limits and the refusals' summary log; `credit`: usefulness counted from receipts,
  kept by `credit_store` (in memory, or in Redis shared by processes);
- `info`: the information document and the relay's own key; `stats`: live numbers per minute over a day;
- `web`: the status page, invite pages, health and metrics, built from the files in `static/`;
- `invite`: `sapling-relay invite`, the links and QR code that bring people in.

The relay installs without the ML stack (the `relay` extra, `make relay-venv`, installers/relay/):
its modules import only each other, the node's wire format and identity (engine.swarm.protocol,
identity, rate, receipts) and engine.common's errors, atomicio, rules and model_policy; never torch,
transformers, Qt, reasoning-gym or numpy (tests/swarm/test_relay_only.py imports every module here).
The arrow runs one way: engine/swarm/ never imports the relay; a node hosts this computer's relay
through `start_embedded_relay`, which its caller (engine/node/launch.py) hands to the swarm.

    python -m engine.relay --help       # the same as sapling-relay --help
"""

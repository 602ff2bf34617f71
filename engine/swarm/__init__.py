"""The node's side of the swarm: what it shares and takes back, its link to a relay, and the wire they speak.

- `protocol`: the wire protocol (message shapes, limits, validation), shared with the relay;
- `identity`: the node's Ed25519 key; `identity_backup`: `sapling-node identity show|export|import`;
- `client`: the link to the relay, on a background thread; `link`: what the link shows and keeps;
  `heartbeat`: when a silent link is dead, with a deadline on every wait;
- `local`: this computer's relay, hosted or joined, and taken over when its host stops;
- `rate`: a request budget, the same on both sides of the websocket; `datacap`: the daily traffic caps;
- `exchange`: the SAPO mix: this node's groups out as signed text, peers' text in, verified and re-scored;
- `defence`: against text that is correct and malicious: bans, replay memory, plausibility, length;
- `session`: a node run's swarm, opened as `swarm.mode` asks (solo, this computer's relay, or a community's);
- `receipts`: what a receiving node tells the relay about the items it was handed;
- `contribution`: receipts for what the node took, and the credit others' receipts earned it;
- `node_stats`: `sapling-node stats`; `doctor`: `sapling-node doctor`, each step of joining a relay, timed.

engine/swarm knows nothing of training: it imports engine.common, engine.rollouts (plain data) and
itself, never the round loop, a backend, a model or torch. The questions it re-scores a peer's text
with are the caller's (`TaskSet` is named in annotations only), and so is the function that hosts
this computer's relay (`host_relay`: engine/relay/embedded.py's `start_embedded_relay`), so the
relay, which is built on `protocol`, `identity`, `rate` and `receipts`, is never imported here.
tests/test_boundaries.py keeps both walls.
"""

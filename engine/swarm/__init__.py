"""The node's side of the swarm: the wire format, its identity, its link to a relay, what it gave and got.

- `protocol`: the wire protocol (message shapes, limits, validation), shared with the relay;
- `identity`: the node's Ed25519 key; `identity_backup`: `sapling-node identity show|export|import`;
- `client`: the link to the relay, on a background thread; `local`: this computer's relay, hosted or joined;
- `rate`: a request budget, the same on both sides of the websocket;
- `receipts`: what a receiving node tells the relay about the items it was handed;
- `contribution`: receipts for what the node took, and the credit others' receipts earned it;
- `node_stats`: `sapling-node stats`, what this node's rollouts did for the others.

engine/swarm knows nothing of training: it imports engine.common, engine.rollouts (plain data) and the
relay package (a node hosts this computer's relay, `local`), never the round loop, a backend or torch.
The relay itself is engine/relay/.
"""

"""A round's rollouts as plain data, shared by the round loop (engine/node/) and the swarm (engine/swarm/).

- `groups`: a question with its answers, rewards and advantages (`Group`), and what a round trains on;
- `offers`: what peers offer a round (`ExternalItem`, `Offer`) and why an item is refused (`R_*`).

No torch and no reasoning-gym: the swarm imports this package (tests/test_boundaries.py), and a
question appears here only as a type. What a backend takes and returns (`Completion`, `TrainItem`)
is the backends' own (engine/backends/base.py).
"""

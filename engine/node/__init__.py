"""The node: the SAPO round loop and what runs it, on one computer.

- `round`: one round read top to bottom (`run_round`): draw, generate, score, share, train, checkpoint, report;
- `loop`: the `Node` that runs rounds: their state and steps, pause/stop/reload, the held-out evaluation;
- `clock`: when it works: pause/stop/reload requests from other threads (`Control`), run.schedule's hours
  and run.duty_cycle;
- `checkpoint`: atomic checkpoints and resume; `metrics`: metrics.jsonl; `seeds`: which seed a run uses;
- `priority`: the OS priority and the thread budget it trains with;
- `launch`: what `sapling-node run`, `serve`, `export`, `config` and `chat` share (flags, logging, signals,
  a run with its swarm); `serve`: the loop driven by JSON lines (the app); `terminal`: what a terminal shows.

Above the questions (engine/questions/), the round's data (engine/rollouts/), the backends, the models and
the swarm, all of which it imports; none of them imports it (tests/test_boundaries.py). Try it and export
(engine/gguf/) and the experiment build on its pieces.
"""

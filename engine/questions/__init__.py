"""What a node is asked, and how it chooses: reasoning-gym questions, their scores and difficulty.

- `tasks`: questions named by a `TaskRef` and rebuilt anywhere, rewards from their verifiers (`TaskSet`);
- `configs`: what a task's config may hold: defaults, and the limits a peer's reference must pass;
- `scores`: what scores say: an answer passed, answers differ, a group teaches (grpo.train_on);
- `curriculum`: difficulty that follows the model (`tasks.difficulty = "adaptive"`);
- `frontier`: re-asking the questions that taught (`tasks.reask_share`);
- `peers`: asking the questions that taught a peer (`swarm.peer_questions`);
- `probe`: a few answers of each question first, the rest only for those kept (`tasks.probe_answers`);
- `heat`: a sampling temperature that follows the model (`tasks.adaptive_temperature`).

Imports engine.common and nothing else of the engine; a round's groups (engine/rollouts/) are built on
these questions, and the choosers read only what they need of them. Only `tasks` imports reasoning-gym.
"""

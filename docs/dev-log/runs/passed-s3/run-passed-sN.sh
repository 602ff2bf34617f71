#!/bin/bash
# Issue 37: a further seed (SEED, default 3), fixed and grpo.train_on=passed side by side (one thread each, so the pair shares the
# machine alike), 40 rounds, from the frozen worktree at 48ff280; re-running resumes both.
SEED=${1:-3}
cd /work/frozen-48ff280
X=~/sapling-experiments
for ARM in fixed passed; do
  R=""; [ -f $X/$ARM-s$SEED/experiment.json ] && R="--resume"
  SET=""; [ $ARM = passed ] && SET="--set grpo.train_on=passed"
  /work/main/.venv/bin/python -m engine.cli experiment --out $X/$ARM-s$SEED $R --seed $SEED --nodes 4 --mixes 8/0 \
    --rounds 40 --threads 1 --set run.priority=normal $SET >> $X/$ARM-s$SEED.log 2>&1 &
done
wait

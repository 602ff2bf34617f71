#!/bin/bash
# Issue 37: a third seed, fixed and grpo.train_on=passed side by side (one thread each, so the pair shares the
# machine alike), 40 rounds, from the frozen worktree at 48ff280; re-running resumes both.
cd /work/frozen-48ff280
X=~/sapling-experiments
for ARM in fixed passed; do
  R=""; [ -f $X/$ARM-s2/experiment.json ] && R="--resume"
  SET=""; [ $ARM = passed ] && SET="--set grpo.train_on=passed"
  /work/main/.venv/bin/python -m engine.cli experiment --out $X/$ARM-s2 $R --seed 2 --nodes 4 --mixes 8/0 \
    --rounds 40 --threads 1 --set run.priority=normal $SET >> $X/$ARM-s2.log 2>&1 &
done
wait

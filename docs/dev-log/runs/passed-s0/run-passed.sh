#!/bin/bash
# Issue 37: grpo.train_on='passed' (train only on groups with a fully correct answer), 2 seeds x 40 rounds, the two
# runs side by side with one thread each, from the frozen worktree at 48ff280; re-running resumes both.
cd /work/frozen-48ff280
X=~/sapling-experiments
for S in 0 1; do
  R=""; [ -f $X/passed-s$S/experiment.json ] && R="--resume"
  /work/main/.venv/bin/python -m engine.cli experiment --out $X/passed-s$S $R --seed $S --nodes 4 --mixes 8/0 \
    --rounds 40 --threads 1 --set run.priority=normal --set grpo.train_on=passed \
    >> $X/passed-s$S.log 2>&1 &
done
wait

#!/bin/bash
# Issue 37: adaptive levels (which follow grpo.train_on since a43168b) on top of the default train_on=passed, seeds 0
# and 1 side by side (one thread each, as passed-s0/s1 ran), 40 rounds, from the frozen worktree at 392caa9; waits for
# the seed-3 pair to end first; re-running resumes both. Compare with passed-s0/s1.
X=~/sapling-experiments
while pgrep -f "engine.cli experiment --out $X/(fixed|passed)-s3" > /dev/null; do sleep 30; done
cd /work/frozen-392caa9
for SEED in 0 1; do
  OUT=$X/adaptive-passed-s$SEED
  R=""; [ -f $OUT/experiment.json ] && R="--resume"
  /work/main/.venv/bin/python -m engine.cli experiment --out $OUT $R --seed $SEED --nodes 4 --mixes 8/0 \
    --rounds 40 --threads 1 --set run.priority=normal --set "tasks.difficulty='adaptive'" >> $OUT.log 2>&1 &
done
wait

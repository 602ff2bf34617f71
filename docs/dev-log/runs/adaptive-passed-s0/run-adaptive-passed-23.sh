#!/bin/bash
# Issue 37: adaptive levels on top of train_on=passed, seeds 2 and 3 side by side (one thread each), 40 rounds, from the
# frozen worktree at 392caa9, after seeds 0 and 1 end; re-running resumes both. Compare with passed-s2/s3.
X=~/sapling-experiments
while pgrep -f "engine.cli experiment --out $X/adaptive-passed-s[01]" > /dev/null; do sleep 20; done
cd /work/frozen-392caa9
for SEED in 2 3; do
  OUT=$X/adaptive-passed-s$SEED
  R=""; [ -f $OUT/experiment.json ] && R="--resume"
  /work/main/.venv/bin/python -m engine.cli experiment --out $OUT $R --seed $SEED --nodes 4 --mixes 8/0 \
    --rounds 40 --threads 1 --set run.priority=normal --set "tasks.difficulty='adaptive'" >> $OUT.log 2>&1 &
done
wait

#!/bin/bash
# Issue 37: seeds 4-7 of grpo.train_on=passed against informative (the "fixed" arm, today's fixed weights), side by
# side (one thread each), 40 rounds, from the frozen worktree at 75e066e; re-running resumes where it stopped.
cd /work/frozen-75e066e
X=~/sapling-experiments
for SEED in ${@:-4 5 6 7}; do
  for ARM in fixed passed; do
    [ -f $X/$ARM-s$SEED/report.json ] && continue
    R=""; [ -f $X/$ARM-s$SEED/experiment.json ] && R="--resume"
    /work/main/.venv/bin/python -m engine.cli experiment --out $X/$ARM-s$SEED $R --seed $SEED --nodes 4 --mixes 8/0 \
      --rounds 40 --threads 1 --set run.priority=normal --set grpo.train_on=$([ $ARM = passed ] && echo passed || echo informative) \
      >> $X/$ARM-s$SEED.log 2>&1 &
  done
  wait
done

#!/bin/bash
# Issue 37: the fixed arms fixed-s0/s1 (30 rounds, from 7828836) run on to 40 rounds, beside the probing runs,
# from the frozen worktree at fd28f73 (the fixed path is unchanged); re-running carries on.
cd /work/frozen-fd28f73
X=~/sapling-experiments
for S in 0 1; do
  /work/main/.venv/bin/python -m engine.cli experiment --out $X/fixed-s$S --resume --rounds 40 >> $X/fixed-s$S.log 2>&1 &
done
wait

#!/bin/bash
# Adaptive sampling temperature against the default (issue 37), seeds 0 and 1, 30 rounds, the four runs side by
# side with one thread each, from the frozen worktree; RESUME=--resume carries each on where it stopped.
cd /work/frozen-7828836
X=~/sapling-experiments
R=${RESUME:-}
C="--nodes 4 --mixes 8/0 --rounds 30 --threads 1 --set run.priority=normal"
H="--set tasks.adaptive_temperature=true"
for S in 0 1; do
  /work/main/.venv/bin/python -m engine.cli experiment --out $X/heat-s$S --seed $S $C $H $R >> $X/heat-s$S.log 2>&1 &
  /work/main/.venv/bin/python -m engine.cli experiment --out $X/fixed-s$S --seed $S $C $R >> $X/fixed-s$S.log 2>&1 &
done
wait

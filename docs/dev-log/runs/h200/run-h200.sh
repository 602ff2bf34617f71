#!/bin/bash
# The paper's horizon: the default joined node (8/4, swarm.train_groups=4) against the same 4 nodes alone (8/0),
# 200 rounds, held-out every 25 rounds (each node's best checkpoint kept), fp32 (the bf16 step was in question on
# AMX CPUs when this began), every arm of every seed named at once, one thread each, at nice 10 (on 2 cores, seed 0 to
# round 200 and seed 1 to round 100 take about 150 minutes with nothing else running; docs/swarm.md).
# From a frozen worktree (FROZEN: `git worktree add /work/frozen-h200 5e28b79`); re-running resumes where each
# arm stopped (the folders under X must still be there; on a fresh machine it starts again).
#   bash run-h200.sh 0 1
FROZEN=${FROZEN:-/work/frozen-h200}
X=${X:-$HOME/sapling-experiments}
cd "$FROZEN" || exit 1
for SEED in ${@:-0 1}; do
  for ARM in alone joined; do
    OUT=$X/h200-$ARM-s$SEED
    [ -f $OUT/report.json ] && grep -q '"complete": true' $OUT/report.json && continue
    MIX=8/0; [ $ARM = joined ] && MIX=8/4
    R=""; [ -f $OUT/experiment.json ] && R="--resume"
    nice -n 10 /work/main/.venv/bin/python -m engine.cli experiment --out $OUT $R --seed $SEED --nodes 4 \
      --mixes $MIX --rounds 200 --threads 1 --set run.priority=normal --set grpo.precision=fp32 \
      --set tasks.eval_every=25 >> $OUT.log 2>&1 &
  done
done
wait

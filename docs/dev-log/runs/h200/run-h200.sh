#!/bin/bash
# The paper's horizon: the default joined node (8/4, swarm.train_groups=4) against the same 4 nodes alone (8/0),
# 200 rounds, held-out every 25 rounds (each node's best checkpoint kept), fp32 (the bf16 step was in question on
# AMX CPUs when this began), one thread each.
# From a frozen worktree (FROZEN: `git worktree add /work/frozen-h200 5e28b79`); re-running resumes where each
# arm stopped (the folders under X must still be there; on a fresh machine it starts again).
#   bash run-h200.sh 0 1:100     seed 0 to round 200, seed 1 to round 100 (run again with `1` to take it to 200:
#                                --resume --rounds 200 lengthens a run; the learning rate is constant, so nothing
#                                a round does depends on how many rounds were planned)
# The arms run in the order named (each seed's joined arm, then its alone arm), LANES at once (default 2, one a
# core): four single-thread runs time-sliced on two cores cost about 1.5x the CPU-seconds a node-round (cache and
# memory traffic), so two lanes finish sooner. With nothing else running, `0 1:100` takes about 150 minutes on
# 2 cores (docs/swarm.md). The order and the lanes change only the wall time, never a number.
FROZEN=${FROZEN:-/work/frozen-h200}
X=${X:-$HOME/sapling-experiments}
LANES=${LANES:-2}
cd "$FROZEN" || exit 1
for SPEC in ${@:-0 1}; do
  SEED=${SPEC%%:*}; ROUNDS=200; [ "$SPEC" != "$SEED" ] && ROUNDS=${SPEC#*:}
  for ARM in joined alone; do
    OUT=$X/h200-$ARM-s$SEED
    MIX=8/0; [ $ARM = joined ] && MIX=8/4
    R=""; [ -f $OUT/experiment.json ] && R="--resume"
    if [ -f $OUT/report.json ] && grep -q '"complete": true' $OUT/report.json; then
      python3 -c "import json,sys; sys.exit(json.load(open('$OUT/experiment.json'))['rounds'] < $ROUNDS)" && continue
    fi
    while [ "$(jobs -rp | wc -l)" -ge "$LANES" ]; do wait -n; done
    echo "$(date -u +%FT%TZ) start $ARM s$SEED to round $ROUNDS"
    nice -n 10 /work/main/.venv/bin/python -m engine.cli experiment --out $OUT $R --seed $SEED --nodes 4 \
      --mixes $MIX --rounds $ROUNDS --threads 1 --set run.priority=normal --set grpo.precision=fp32 \
      --set tasks.eval_every=25 >> $OUT.log 2>&1 &
  done
done
wait
echo "$(date -u +%FT%TZ) every arm done"

#!/bin/bash
# The paper's horizon: the default joined node (8/4, swarm.train_groups=4) against the same 4 nodes alone (8/0),
# 200 rounds, held-out every 25 rounds (each node's best checkpoint kept), fp32 (the bf16 step was in question on
# AMX CPUs when this began), every arm of every seed named at once, one thread each.
# From a frozen worktree (FROZEN: `git worktree add /work/frozen-h200 5e28b79`); re-running resumes where each
# arm stopped (the folders under X must still be there; on a fresh machine it starts again).
#   bash run-h200.sh 0 1:100     seed 0 to round 200, seed 1 to round 100 (run again with `1` to take it to 200:
#                                --resume --rounds 200 lengthens a run; the learning rate is constant, so nothing
#                                a round does depends on how many rounds were planned)
# The first seed's joined arm runs at nice 10, every other arm at nice 12: it is the longest (a joined round costs
# about 1.6x a round alone), and the others finish beside it. Niceness changes only the wall time, not a number.
# On 2 cores, with nothing else running, `0 1:100` takes about 140 minutes (docs/swarm.md).
FROZEN=${FROZEN:-/work/frozen-h200}
X=${X:-$HOME/sapling-experiments}
cd "$FROZEN" || exit 1
FIRST=1
for SPEC in ${@:-0 1}; do
  SEED=${SPEC%%:*}; ROUNDS=200; [ "$SPEC" != "$SEED" ] && ROUNDS=${SPEC#*:}
  for ARM in joined alone; do
    OUT=$X/h200-$ARM-s$SEED
    NICE=12; [ $FIRST = 1 ] && [ $ARM = joined ] && NICE=10
    MIX=8/0; [ $ARM = joined ] && MIX=8/4
    R=""; [ -f $OUT/experiment.json ] && R="--resume"
    if [ -f $OUT/report.json ] && grep -q '"complete": true' $OUT/report.json; then
      python3 -c "import json,sys; sys.exit(json.load(open('$OUT/experiment.json'))['rounds'] < $ROUNDS)" && continue
    fi
    nice -n $NICE /work/main/.venv/bin/python -m engine.cli experiment --out $OUT $R --seed $SEED --nodes 4 \
      --mixes $MIX --rounds $ROUNDS --threads 1 --set run.priority=normal --set grpo.precision=fp32 \
      --set tasks.eval_every=25 >> $OUT.log 2>&1 &
  done
  FIRST=0
done
wait

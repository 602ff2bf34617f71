#!/bin/bash
# The paper's horizon: a joined node, 8/4 with no cap (the experiment preset's swarm.train_groups=0: all own groups
# and exactly 4 swarm groups a round; meant as the app's default, which caps at 4, but the cap was not set and seed 1
# runs as seed 0 did so that they pool) against the same 4 nodes alone (8/0),
# 200 rounds, held-out every 25 rounds (each node's best checkpoint kept), fp32 (the bf16 step was in question on
# AMX CPUs when this began), one thread each.
# From a frozen worktree (FROZEN: `git worktree add /work/frozen-h200 5e28b79 && git -C /work/frozen-h200 apply
# $PWD/docs/dev-log/runs/h200/rewind.patch`: the replay memory rewinds on resume, main's 6e15677; without it a
# joined arm resumed after a round cut short refuses, in that round, the peers' items its lost attempt trained on);
# re-running resumes where each arm stopped (the folders under X must still be there; on a fresh machine it starts
# again).
#   bash run-h200.sh 0 1:100     seed 0 to round 200, seed 1 to round 100 (run again with `1` to take it to 200:
#                                --resume --rounds 200 lengthens a run; the learning rate is constant, so nothing
#                                a round does depends on how many rounds were planned)
# The arms run in the order named (each seed's joined arm, then its alone arm), LANES at once (default 2, one a
# core: more runs than cores cost more CPU-seconds a node-round; on 2026-12-06 a joined node-round took 15 CPU-s
# with six runs on two cores, 9.2 with two). On the Xeon (AMX), later that day, two lanes, rounds 35-65 of seed 0:
# 7.8 CPU-s a node-round alone, 11.7 joined; `0 1:100` is then about 190 minutes of both cores (docs/swarm.md).
# The order and the lanes change only the wall time, never a number.
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

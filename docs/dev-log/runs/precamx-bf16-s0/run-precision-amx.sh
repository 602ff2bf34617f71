#!/bin/bash
# Learning in bf16 against fp32 on an Intel Xeon with AMX: 4 nodes alone (8/0), 30 rounds, held-out every 10
# rounds, the four runs (2 precisions x 2 seeds) side by side with one thread each at nice 5; from a frozen
# worktree (FROZEN); re-running resumes. As docs/dev-log/2026-12-05.md did on the EPYC (runs/precl-*).
FROZEN=${FROZEN:-/work/frozen-mixes}
X=${X:-$HOME/sapling-experiments}
cd "$FROZEN" || exit 1
for SEED in 0 1; do
  for P in fp32 bf16; do
    OUT=$X/precamx-$P-s$SEED
    [ -f $OUT/report.json ] && grep -q '"complete": true' $OUT/report.json && continue
    R=""; [ -f $OUT/experiment.json ] && R="--resume"
    nice -n 5 /work/main/.venv/bin/python -m engine.cli experiment --out $OUT $R --seed $SEED --nodes 4 \
      --mixes 8/0 --rounds 30 --threads 1 --set run.priority=normal --set grpo.precision=$P \
      --set tasks.eval_every=10 >> $OUT.log 2>&1 &
  done
done
wait

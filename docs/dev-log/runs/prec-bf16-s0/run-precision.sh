#!/bin/bash
# Whole rounds in fp32 against bf16 autocast on a CPU with AVX512-BF16, side by side (one thread each), same seed,
# 2 nodes alone (8/0), 10 rounds, no held-out evaluation; from a frozen worktree; re-running resumes.
cd /work/frozen-prec
X=~/sapling-experiments
SEED=${1:-0}
for P in fp32 bf16; do
  [ -f $X/prec-$P-s$SEED/report.json ] && continue
  R=""; [ -f $X/prec-$P-s$SEED/experiment.json ] && R="--resume"
  /work/main/.venv/bin/python -m engine.cli experiment --out $X/prec-$P-s$SEED $R --seed $SEED --nodes 2 --mixes 8/0 \
    --rounds 10 --threads 1 --set run.priority=normal --set grpo.precision=$P --set tasks.eval_every=0 \
    >> $X/prec-$P-s$SEED.log 2>&1 &
done
wait

#!/bin/bash
# Learning in bf16 against fp32 on a CPU with AVX512-BF16: 4 nodes alone (8/0), 30 rounds, held-out every 10
# rounds, the two arms side by side (one thread each), seeds in turn; from a frozen worktree; re-running resumes.
cd /work/frozen-prec2
X=~/sapling-experiments
for SEED in ${@:-0 1}; do
  for P in fp32 bf16; do
    [ -f $X/precl-$P-s$SEED/report.json ] && continue
    R=""; [ -f $X/precl-$P-s$SEED/experiment.json ] && R="--resume"
    /work/main/.venv/bin/python -m engine.cli experiment --out $X/precl-$P-s$SEED $R --seed $SEED --nodes 4 \
      --mixes 8/0 --rounds 30 --threads 1 --set run.priority=normal --set grpo.precision=$P \
      --set tasks.eval_every=10 >> $X/precl-$P-s$SEED.log 2>&1 &
  done
  wait
done

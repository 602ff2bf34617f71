#!/bin/bash
# Issue 37: probing k=3 of 24 with the prompt cache, 2 seeds x 40 rounds, the two runs side by side with one thread
# each, from the frozen worktree at ffc507b; re-running resumes both (--resume when the folder exists).
cd /work/frozen-ffc507b
X=~/sapling-experiments
for S in 0 1; do
  R=""; [ -f $X/probe24c-s$S/experiment.json ] && R="--resume"
  /work/main/.venv/bin/python -m engine.cli experiment --out $X/probe24c-s$S $R --seed $S --nodes 4 --mixes 8/0 \
    --rounds 40 --threads 1 --set run.priority=normal --set tasks.probe_answers=3 --set tasks.probe_questions=24 \
    >> $X/probe24c-s$S.log 2>&1 &
done
wait

#!/bin/bash
# Issue 51's swarm-only lever (a), swarm.peer_questions: a joined node, 8/4 with no cap (the experiment preset's
# swarm.train_groups=0; meant as the app's default, whose cap this script did not set: run-lever-cap.sh sets it) with
# a quarter of its questions (2 of 8) taken from the swarm's teaching questions, against the same default without
# it; 25 rounds, held-out every 10 rounds, fp32, one thread each, nice 5, two seeds. Alone (8/0) is mixes-sK's 8/0
# (run-mixes.sh): the same seeds and settings, and the code of 1c15393 reproduces it bit for bit (eval-start and
# rounds 1-2 of seed 0 compared), so it is not run again. From a frozen worktree (FROZEN: `git worktree add
# /work/frozen-lever 1c15393`); re-running resumes.
#   bash run-lever.sh 0 1
FROZEN=${FROZEN:-/work/frozen-lever}
X=${X:-$HOME/sapling-experiments}
cd "$FROZEN" || exit 1
C="--nodes 4 --rounds 25 --threads 1 --set run.priority=normal --set grpo.precision=fp32 --set tasks.eval_every=10"
for SEED in ${@:-0 1}; do
  for ARM in default peer; do
    OUT=$X/lever-$ARM-s$SEED
    R=""; [ -f $OUT/experiment.json ] && R="--resume"
    EXTRA=""; [ $ARM = peer ] && EXTRA="--set swarm.peer_questions=0.25"
    nice -n 5 /work/main/.venv/bin/python -m engine.cli experiment --out $OUT $R --seed $SEED --mixes 8/4 $C \
      $EXTRA >> $OUT.log 2>&1 &
  done
done
wait

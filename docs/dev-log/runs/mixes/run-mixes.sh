#!/bin/bash
# The paper's four mixes (8/0, 6/2, 4/4, 2/6) with today's code: 4 nodes, 25 rounds, held-out every 10 rounds,
# no cap on the batch (swarm.train_groups=0: I own and J swarm groups, as the paper), fp32, one thread each,
# the seeds named side by side at nice 5. From a frozen worktree (FROZEN: `git worktree add /work/frozen-mixes
# 6e0e22d`, and from 4/4 on `git -C /work/frozen-mixes apply $PWD/docs/dev-log/runs/h200/rewind.patch`: a resume
# after a round cut short runs it as if it never ran); re-running resumes (a mix already finished is not run again).
#   bash run-mixes.sh          # seeds 0 and 1
#   bash run-mixes.sh 1        # seed 1 only
FROZEN=${FROZEN:-/work/frozen-mixes}
X=${X:-$HOME/sapling-experiments}
cd "$FROZEN" || exit 1
for SEED in ${@:-0 1}; do
  OUT=$X/mixes-s$SEED
  R=""; [ -f $OUT/experiment.json ] && R="--resume"
  nice -n 5 /work/main/.venv/bin/python -m engine.cli experiment --out $OUT $R --seed $SEED --nodes 4 \
    --mixes 8/0,6/2,4/4,2/6 --rounds 25 --threads 1 --set run.priority=normal --set grpo.precision=fp32 \
    --set swarm.train_groups=0 --set tasks.eval_every=10 >> $OUT.log 2>&1 &
done
wait

#!/bin/bash
# Issue 51's lever (a), swarm.peer_questions=0.25, against alone AND the app's default joined node
# (swarm.train_groups=4: swarm groups only to fill the batch up to 4 groups trained on), per hour under one load:
# every arm one experiment a core at nice 10, as the 200-round pair's arms ran on 2026-12-07, 25 rounds, fp32,
# one thread, held-out at rounds 0 and 25. (The experiment's preset sets swarm.train_groups=0 so that a mix I/J
# means exactly J swarm groups: the default has to be named, as here. run-lever.sh's 'default' did not name it.)
# Seed 1's alone arm is the first 25 rounds of h200-alone-s1 (same settings, one a core from round 0); seed 0's
# pair began under another load, so its alone arm runs again. From a frozen worktree (FROZEN: `git worktree add
# /work/frozen-lever 1c15393 && git -C /work/frozen-lever apply $PWD/docs/dev-log/runs/lever/rewind-1c15393.patch`,
# the lever's code with main's replay-memory rewind); re-running resumes; LANES at once (default 2).
#   bash run-lever-cap.sh 1:default 1:peer 0:alone 0:default 0:peer
# A third field lengthens an arm (--resume --rounds N; the learning rate is constant, so nothing a round does depends
# on how many rounds were planned): the app's real default against alone at the paper's horizon, seed 0:
#   bash run-lever-cap.sh 0:default:200 0:alone:200
FROZEN=${FROZEN:-/work/frozen-lever}
X=${X:-$HOME/sapling-experiments}
LANES=${LANES:-2}
cd "$FROZEN" || exit 1
for SPEC in "$@"; do
  SEED=${SPEC%%:*}; ARM=${SPEC#*:}; ROUNDS=25
  case $ARM in *:*) ROUNDS=${ARM#*:}; ARM=${ARM%%:*} ;; esac
  OUT=$X/cap-$ARM-s$SEED
  case $ARM in
    alone) A="--mixes 8/0" ;;
    default) A="--mixes 8/4 --set swarm.train_groups=4" ;;
    peer) A="--mixes 8/4 --set swarm.train_groups=4 --set swarm.peer_questions=0.25" ;;
    *) echo "unknown arm $ARM"; exit 2 ;;
  esac
  R=""; [ -f $OUT/experiment.json ] && R="--resume"
  while [ "$(jobs -rp | wc -l)" -ge "$LANES" ]; do wait -n; done
  echo "$(date -u +%FT%TZ) start $ARM s$SEED to round $ROUNDS"
  nice -n 10 /work/main/.venv/bin/python -m engine.cli experiment --out $OUT $R --seed $SEED --nodes 4 $A \
    --rounds $ROUNDS --threads 1 --set run.priority=normal --set grpo.precision=fp32 --set tasks.eval_every=25 \
    >> $OUT.log 2>&1 &
done
wait
echo "$(date -u +%FT%TZ) lever arms done"

#!/bin/bash
# Run the given commands one after another on whichever of LANES lanes is free, counting as busy every
# `engine.cli experiment` already running (one a core: time-sliced runs cost more CPU-seconds a node-round).
# Each command is one experiment (or a driver of one); all of them resume where they stopped.
#   bash queue.sh "bash run-mixes.sh 0" "bash run-mixes.sh 1" "LANES=1 bash run-h200.sh 1:100"
LANES=${LANES:-2}
busy() { pgrep -fc "engine.cli experiment" || true; }
for CMD in "$@"; do
  sleep 5
  while [ "$(busy)" -ge "$LANES" ]; do sleep 30; done
  echo "$(date -u +%FT%TZ) start: $CMD"
  bash -c "$CMD" &
done
wait
echo "$(date -u +%FT%TZ) queue done"

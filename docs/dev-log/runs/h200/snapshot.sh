#!/bin/bash
# A long run's records as they stand, packed into the tree (docs/dev-log/runs/NAME/records.tar.xz): every
# *.json and *.jsonl and the log, never the checkpoints (node-K/checkpoints, best-held-out: hundreds of MB).
# The run goes on; a later snapshot replaces this one.
#   bash snapshot.sh h200-alone-s0 h200-joined-s0
X=${X:-$HOME/sapling-experiments}
RUNS=$(cd "$(dirname "$0")/.." && pwd)
for NAME in "$@"; do
  SRC=$X/$NAME; DST=$RUNS/$NAME
  [ -d "$SRC" ] || { echo "no run $SRC" >&2; exit 1; }
  rm -rf "$DST" && mkdir -p "$DST"
  (cd "$SRC" && find . \( -name checkpoints -o -name best-held-out -o -name config -o -name cache \) -prune -o \
      -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.log' \) -print0 | xargs -0 cp --parents -t "$DST")
  (cd "$RUNS/../../.." && .venv/bin/python -m bench.records pack "docs/dev-log/runs/$NAME") || exit 1
done

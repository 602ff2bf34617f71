#!/usr/bin/env bash
# Smoke-test the .dmg as a user gets it: mount it, check it holds Sapling.app and the Applications
# link, copy the app out (what dragging it onto Applications does), run the copy's self-test with
# its output captured and a time limit, and, when the build is signed, ask Gatekeeper about it.
#
#   installers/macos/smoke-dmg.sh dist/Sapling-0.1.0-arm64.dmg [unsigned|signed|notarized]
#
# SAPLING_SELF_TEST_TIMEOUT: seconds before the self-test is killed (default 1500; the app's own
# limit is 900). notarized: `spctl -a` must accept the app and the image and the ticket must be
# stapled; signed (not notarized): codesign must verify, and spctl's verdict, which is "rejected"
# for a Developer ID app Apple has not notarized, is printed as a warning. Run by build-macos.yml.
set -euo pipefail
DMG="${1:?path to the .dmg}"
SIGNING="${2:-unsigned}"
TIMEOUT="${SAPLING_SELF_TEST_TIMEOUT:-1500}"

die() { echo "smoke-dmg: $*" >&2; exit 1; }
[ -f "$DMG" ] || die "no such file: $DMG"

WORK="$(mktemp -d)"
MOUNT="$WORK/volume"
APP="$WORK/Applications/Sapling.app"
mkdir -p "$MOUNT" "$WORK/Applications"
cleanup() {
    hdiutil detach -quiet "$MOUNT" 2>/dev/null || hdiutil detach -force -quiet "$MOUNT" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

hdiutil verify "$DMG"
hdiutil attach -nobrowse -readonly -noautoopen -mountpoint "$MOUNT" "$DMG"
[ -d "$MOUNT/Sapling.app" ] || die "the image holds no Sapling.app"
[ "$(readlink "$MOUNT/Applications")" = /Applications ] || die "the image has no Applications link"
ditto "$MOUNT/Sapling.app" "$APP"
hdiutil detach "$MOUNT"

scheme="$(/usr/libexec/PlistBuddy -c 'Print :CFBundleURLTypes:0:CFBundleURLSchemes:0' "$APP/Contents/Info.plist")"
[ "$scheme" = sapling ] || die "Info.plist does not register the sapling:// scheme (got '$scheme')"

# macOS has no timeout(1): perl's alarm() survives exec, so the app gets SIGALRM at the limit.
LOG="$WORK/self-test.log"
status=0
QT_QPA_PLATFORM=offscreen perl -e 'alarm shift @ARGV; exec @ARGV or die "exec: $!\n"' "$TIMEOUT" \
    "$APP/Contents/MacOS/sapling" --self-test > "$LOG" 2>&1 || status=$?
cat "$LOG"
[ "$status" -ne 142 ] || die "the self-test ran past $TIMEOUT s and was stopped"
[ "$status" -eq 0 ] || die "the self-test exited with $status"
grep -q "PASSED" "$LOG" || die "the self-test exited 0 without printing PASSED"

case "$SIGNING" in
    notarized)
        spctl -a -vv -t exec "$APP"
        spctl -a -vv -t open --context context:primary-signature "$DMG"
        xcrun stapler validate "$DMG"
        ;;
    signed)
        codesign --verify --deep --strict --verbose=2 "$APP"
        verdict="$(spctl -a -vv -t exec "$APP" 2>&1 || true)"
        echo "::warning::signed but not notarized; Gatekeeper says: $verdict"
        ;;
    unsigned)
        echo "smoke-dmg: unsigned build: no Gatekeeper check (on a user's Mac, Gatekeeper blocks it until they allow it in System Settings > Privacy & Security)"
        ;;
    *) die "the second argument is unsigned, signed or notarized, not '$SIGNING'" ;;
esac
echo "smoke-dmg: $DMG passed"

#!/usr/bin/env bash
# Wrap Sapling.app in a compressed disk image with an Applications link (drag to install).
#
#   installers/macos/make-dmg.sh dist/Sapling.app dist/Sapling-0.1.0-arm64.dmg
#
# With SAPLING_CODESIGN_IDENTITY set, the image itself is signed too (notarize.sh needs that).
set -euo pipefail
APP="${1:?path to Sapling.app}"
DMG="${2:?output .dmg}"
STAGE="$(mktemp -d)/Sapling"
mkdir -p "$STAGE"
cp -R "$APP" "$STAGE/"
ln -s /Applications "$STAGE/Applications"
rm -f "$DMG"
# hdiutil create fails now and then with "Resource busy" (hdiutil: create failed - Resource busy) when
# something (Spotlight, XProtect) still holds the staged files; a later attempt goes through.
ATTEMPTS=5
for attempt in $(seq 1 "$ATTEMPTS"); do
    if hdiutil create -volname "Sapling" -srcfolder "$STAGE" -fs HFS+ -format UDZO -imagekey zlib-level=9 -ov "$DMG"; then
        break
    fi
    if [ "$attempt" -eq "$ATTEMPTS" ]; then
        echo "make-dmg: hdiutil create failed $ATTEMPTS times" >&2
        exit 1
    fi
    echo "make-dmg: hdiutil create failed (attempt $attempt of $ATTEMPTS); trying again in $((attempt * 15)) s" >&2
    rm -f "$DMG"
    sleep $((attempt * 15))
done
if [ -n "${SAPLING_CODESIGN_IDENTITY:-}" ]; then
    codesign --force --timestamp --sign "$SAPLING_CODESIGN_IDENTITY" "$DMG"
fi
rm -rf "$(dirname "$STAGE")"
echo "make-dmg: $DMG $(du -h "$DMG" | cut -f1)"

#!/usr/bin/env bash
# Send a signed .dmg to Apple's notary service, wait for the verdict, staple the ticket.
#
#   APPLE_ID=... APPLE_TEAM_ID=... APPLE_APP_PASSWORD=... installers/macos/notarize.sh dist/Sapling.dmg
#
# APPLE_APP_PASSWORD is an app-specific password for APPLE_ID (appleid.apple.com).
set -euo pipefail
DMG="${1:?signed .dmg}"
: "${APPLE_ID:?}" "${APPLE_TEAM_ID:?}" "${APPLE_APP_PASSWORD:?}"
xcrun notarytool submit "$DMG" --apple-id "$APPLE_ID" --team-id "$APPLE_TEAM_ID" \
    --password "$APPLE_APP_PASSWORD" --wait --timeout 1h --output-format json | tee notarization.json
grep -q '"status" *: *"Accepted"' notarization.json || {
    id="$(sed -n 's/.*"id" *: *"\([^"]*\)".*/\1/p' notarization.json | head -1)"
    [ -n "$id" ] && xcrun notarytool log "$id" --apple-id "$APPLE_ID" --team-id "$APPLE_TEAM_ID" --password "$APPLE_APP_PASSWORD"
    echo "notarize: Apple did not accept $DMG" >&2
    exit 1
}
xcrun stapler staple "$DMG"
xcrun stapler validate "$DMG"

#!/usr/bin/env bash
# CI only: put the Developer ID certificate into a throw-away keychain and print its identity.
#
#   MACOS_CERTIFICATE_P12_BASE64=... MACOS_CERTIFICATE_PASSWORD=... installers/macos/import-certificate.sh
#
# Writes the identity ("Developer ID Application: Name (TEAMID)") to stdout; the
# workflow passes it to PyInstaller as SAPLING_CODESIGN_IDENTITY.
set -euo pipefail
: "${MACOS_CERTIFICATE_P12_BASE64:?}" "${MACOS_CERTIFICATE_PASSWORD:?}"
KEYCHAIN="${RUNNER_TEMP:-/tmp}/sapling-signing.keychain-db"
KEYCHAIN_PASSWORD="$(uuidgen)"
P12="${RUNNER_TEMP:-/tmp}/sapling-signing.p12"
echo "$MACOS_CERTIFICATE_P12_BASE64" | base64 --decode > "$P12"
security create-keychain -p "$KEYCHAIN_PASSWORD" "$KEYCHAIN" >&2
security set-keychain-settings -lut 21600 "$KEYCHAIN" >&2
security unlock-keychain -p "$KEYCHAIN_PASSWORD" "$KEYCHAIN" >&2
security import "$P12" -k "$KEYCHAIN" -P "$MACOS_CERTIFICATE_PASSWORD" -T /usr/bin/codesign >&2
security set-key-partition-list -S apple-tool:,apple: -s -k "$KEYCHAIN_PASSWORD" "$KEYCHAIN" >&2
security list-keychains -d user -s "$KEYCHAIN" $(security list-keychains -d user | tr -d '"') >&2
rm -f "$P12"
security find-identity -v -p codesigning "$KEYCHAIN" | sed -n 's/.*"\(Developer ID Application:[^"]*\)".*/\1/p' | head -1

#!/usr/bin/env bash
# Package a PyInstaller one-folder build of Sapling as a .deb.
#
#   installers/linux/build-deb.sh [ONE_FOLDER] [OUT_DIR]
#
# ONE_FOLDER defaults to build/pyinstaller/dist/sapling (what `make installer-linux`
# builds first), OUT_DIR to dist/. The result is OUT_DIR/sapling_<version>_<arch>.deb,
# or sapling-cuda_... when SAPLING_TORCH_VARIANT=cuda (the two conflict: same files).
#
# Layout: /opt/sapling (the one-folder build), /usr/bin/sapling -> /opt/sapling/sapling,
# a desktop entry and hicolor icons. dpkg owns every file, so `apt-get remove sapling`
# leaves nothing behind (user data under ~/.local/share/sapling etc. is the user's).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
HERE="$ROOT/installers/linux"
ONE_FOLDER="${1:-$ROOT/build/pyinstaller/dist/sapling}"
OUT_DIR="${2:-$ROOT/dist}"
VARIANT="${SAPLING_TORCH_VARIANT:-cpu}"
# xz level: 1 by default (a 1 GB tree in about 2 minutes on 2 cores, 5% bigger than
# dpkg's default 6, which takes 4 times as long); release builds in CI use 6.
XZ_LEVEL="${SAPLING_DEB_XZ_LEVEL:-1}"

die() { echo "build-deb: $*" >&2; exit 1; }

[ -x "$ONE_FOLDER/sapling" ] || die "no one-folder build at $ONE_FOLDER (run: make installer-linux)"
command -v dpkg-deb >/dev/null || die "dpkg-deb not found (Debian/Ubuntu only)"

VERSION="$(sed -n 's/^__version__ *= *"\([^"]*\)".*/\1/p' "$ROOT/engine/__init__.py" | head -1)"
[ -n "$VERSION" ] || die "no __version__ in engine/__init__.py"
ARCH="$(dpkg --print-architecture)"
case "$VARIANT" in
    cpu) PACKAGE=sapling; CONFLICTS=sapling-cuda; FLAVOUR="CPU build of PyTorch" ;;
    cuda) PACKAGE=sapling-cuda; CONFLICTS=sapling; FLAVOUR="CUDA build of PyTorch (NVIDIA GPUs)" ;;
    *) die "SAPLING_TORCH_VARIANT must be cpu or cuda, got $VARIANT" ;;
esac

if [ "$VARIANT" = cpu ] && find "$ONE_FOLDER" -name 'libcudart*' -o -name 'libcublas*' -o -name 'libcudnn*' | grep -q .; then
    die "CUDA libraries found in a CPU build: $ONE_FOLDER (see installers/pyinstaller/sapling.spec)"
fi

STAGE="$ROOT/build/deb/${PACKAGE}_${VERSION}_${ARCH}"
rm -rf "$STAGE"
mkdir -p "$STAGE/DEBIAN" "$STAGE/opt" "$STAGE/usr/bin" "$STAGE/usr/share/applications" \
    "$STAGE/usr/share/doc/$PACKAGE"

echo "build-deb: staging $ONE_FOLDER"
cp -a "$ONE_FOLDER" "$STAGE/opt/sapling"
# Nothing from a build machine's Python run may ride along.
find "$STAGE/opt/sapling" -depth -type d -name __pycache__ -exec rm -rf {} +
ln -s /opt/sapling/sapling "$STAGE/usr/bin/sapling"
install -m 0644 "$HERE/sapling.desktop" "$STAGE/usr/share/applications/sapling.desktop"
install -m 0644 "$HERE/copyright" "$STAGE/usr/share/doc/$PACKAGE/copyright"

# Icons: the SVG as scalable, each PNG at the size it really has.
ICONS=0
if [ -f "$ROOT/assets/sapling.svg" ]; then
    install -D -m 0644 "$ROOT/assets/sapling.svg" "$STAGE/usr/share/icons/hicolor/scalable/apps/sapling.svg"
    ICONS=$((ICONS + 1))
fi
for png in "$ROOT"/assets/png/sapling-*.png; do
    [ -f "$png" ] || continue
    size="$(python3 -c 'import struct,sys; d=open(sys.argv[1],"rb").read(24); print("%dx%d" % struct.unpack(">II", d[16:24]))' "$png")"
    # hicolor's index.theme stops at 512x512; bigger ones would never be looked up.
    [ "${size%%x*}" -le 512 ] || continue
    install -D -m 0644 "$png" "$STAGE/usr/share/icons/hicolor/$size/apps/sapling.png"
    ICONS=$((ICONS + 1))
done
[ "$ICONS" -gt 0 ] || die "no icons in assets/ (sapling.svg, png/sapling-<size>.png): the menu entry would have none"

# Root-owned, world-readable, nothing group/world-writable.
chmod -R u+rwX,go+rX,go-w "$STAGE"

install -m 0755 "$HERE/prerm" "$STAGE/DEBIAN/prerm"

INSTALLED_KB="$(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)"
# What the bundle loads from the system (glibc, GL/EGL, a few X11/Wayland libraries), read
# from the ELF files themselves; see installers/linux/debdeps.py.
DEPENDS="$(python3 "$HERE/debdeps.py" "$STAGE/opt/sapling")"

cat > "$STAGE/DEBIAN/control" <<EOF
Package: $PACKAGE
Version: $VERSION
Architecture: $ARCH
Maintainer: Sapling contributors <sapling@invalid>
Installed-Size: $INSTALLED_KB
Depends: $DEPENDS
Conflicts: $CONFLICTS
Replaces: $CONFLICTS
Section: science
Priority: optional
Description: help train small language models from your own computer
 Sapling trains its own copy of a small language model with GRPO on
 reasoning puzzles it can check by itself, and shares its attempts with a
 swarm of other computers (SAPO). It runs offline with the bundled
 SmolLM2-135M-Instruct model. This package ships the $FLAVOUR.
EOF

(cd "$STAGE" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) > "$STAGE/DEBIAN/md5sums"
chmod 0644 "$STAGE/DEBIAN/control" "$STAGE/DEBIAN/md5sums"

mkdir -p "$OUT_DIR"
DEB="$OUT_DIR/${PACKAGE}_${VERSION}_${ARCH}.deb"
echo "build-deb: compressing (xz -$XZ_LEVEL) into $DEB"
dpkg-deb --root-owner-group -Zxz -z"$XZ_LEVEL" --build "$STAGE" "$DEB" >/dev/null
echo "build-deb: $DEB $(du -h "$DEB" | cut -f1) (installed $((INSTALLED_KB / 1024)) MiB)"

"""Render assets/sapling.svg into every icon format the app and the installers use.

    .venv/bin/python assets/make_icons.py

Writes png/sapling-{16..1024}.png (Qt's SVG renderer, offscreen), sapling.ico
(Windows: 16-256 px) and sapling.icns (macOS: 16-1024 px) with Pillow, and
sapling.png (256 px, for Linux desktop entries). Run it again after editing the SVG.
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PIL import Image
from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

HERE = Path(__file__).resolve().parent
SIZES = (16, 24, 32, 48, 64, 128, 256, 512, 1024)
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)


def render(renderer: QSvgRenderer, size: int) -> Image.Image:
    image = QImage(size, size, QImage.Format.Format_ARGB32)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
    renderer.render(painter)
    painter.end()
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")
    buffer.close()
    return Image.open(io.BytesIO(bytes(data.data()))).convert("RGBA")


def main() -> int:
    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])
    renderer = QSvgRenderer(str(HERE / "sapling.svg"))
    if not renderer.isValid():
        print("make_icons: assets/sapling.svg is not a valid SVG", file=sys.stderr)
        return 1
    (HERE / "png").mkdir(exist_ok=True)
    images = {size: render(renderer, size) for size in SIZES}
    for size, image in images.items():
        image.save(HERE / "png" / f"sapling-{size}.png", optimize=True)
    images[256].save(HERE / "sapling.png", optimize=True)
    images[256].save(HERE / "sapling.ico", sizes=[(s, s) for s in ICO_SIZES],
                     append_images=[images[s] for s in ICO_SIZES if s != 256])
    images[1024].save(HERE / "sapling.icns", append_images=[images[s] for s in (16, 32, 64, 128, 256, 512)])
    del app
    for path in sorted(HERE.glob("sapling.*")) + sorted((HERE / "png").glob("*.png")):
        print(f"{path.relative_to(HERE.parent)}  {path.stat().st_size:>8,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`sapling`: the desktop entry point.

Until the PySide6 window lands, `sapling` runs the headless node in this
terminal as a child process (the same boundary the window will use), passing
its arguments through: `sapling --rounds 5` is `sapling-node run --rounds 5`.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = [sys.executable, "-m", "engine.cli", "run", *args]
    try:
        return subprocess.call(command)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""Start at login, written the OS's own way.

- Linux: ``$XDG_CONFIG_HOME/autostart/sapling.desktop`` (freedesktop autostart).
- macOS: ``~/Library/LaunchAgents/org.sapling.Sapling.plist`` (a LaunchAgent with RunAtLoad).
- Windows: the ``Sapling`` value under ``HKCU\\Software\\Microsoft\\Windows\\CurrentVersion\\Run``.

The entry runs ``sapling --background``: the app starts in the tray and trains.
Files are written atomically; turning the option off removes the entry.
"""

from __future__ import annotations

import os
import plistlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.common.atomicio import atomic_write_bytes, atomic_write_text

LABEL = "org.sapling.Sapling"
RUN_KEY = r"Software\Microsoft\Windows\CurrentVersion\Run"
VALUE_NAME = "Sapling"


def launch_command(extra: Sequence[str] = ()) -> list[str]:
    """How to start this app in the background: the frozen executable, or python -m app.main."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "--background", *extra]
    return [sys.executable, "-m", "app.main", "--background", *extra]


def desktop_exec(argv: Sequence[str]) -> str:
    """An Exec= line: arguments quoted as the Desktop Entry spec asks."""
    def quote(arg: str) -> str:
        if arg and not any(c in arg for c in ' \t\n"\'\\><~|&;$*?#()`='):
            return arg
        escaped = "".join("\\" + c if c in '"`$\\' else c for c in arg)
        return f'"{escaped}"'
    return " ".join(quote(a) for a in argv).replace("%", "%%")


def windows_command(argv: Sequence[str]) -> str:
    import subprocess

    return subprocess.list2cmdline(list(argv))


class Autostart:
    """Enable, disable or inspect the login entry for one platform (injectable for tests)."""

    def __init__(self, platform: str = sys.platform, home: Path | None = None, registry: Any = None) -> None:
        self.platform = platform
        self.home = Path(home) if home is not None else Path.home()
        self._registry = registry

    @property
    def location(self) -> str:
        if self.platform == "win32":
            return f"HKEY_CURRENT_USER\\{RUN_KEY}\\{VALUE_NAME}"
        return str(self.entry_path())

    def entry_path(self) -> Path:
        if self.platform == "darwin":
            return self.home / "Library" / "LaunchAgents" / f"{LABEL}.plist"
        config = os.environ.get("XDG_CONFIG_HOME") if self.home == Path.home() else None
        return Path(config or self.home / ".config") / "autostart" / "sapling.desktop"

    def registry(self) -> Any:
        if self._registry is None:
            import winreg

            self._registry = winreg
        return self._registry

    def enable(self, argv: Sequence[str]) -> None:
        if self.platform == "win32":
            reg = self.registry()
            with reg.CreateKey(reg.HKEY_CURRENT_USER, RUN_KEY) as key:
                reg.SetValueEx(key, VALUE_NAME, 0, reg.REG_SZ, windows_command(argv))
        elif self.platform == "darwin":
            plist = {"Label": LABEL, "ProgramArguments": list(argv), "RunAtLoad": True,
                     "ProcessType": "Interactive", "LimitLoadToSessionType": "Aqua"}
            atomic_write_bytes(self.entry_path(), plistlib.dumps(plist))
        else:
            text = "\n".join([
                "[Desktop Entry]", "Type=Application", "Name=Sapling",
                "Comment=Train a small language model with a swarm, in the background",
                f"Exec={desktop_exec(argv)}", "Icon=sapling", "Terminal=false",
                "X-GNOME-Autostart-enabled=true", "",
            ])
            atomic_write_text(self.entry_path(), text)

    def disable(self) -> None:
        if self.platform == "win32":
            reg = self.registry()
            try:
                with reg.OpenKey(reg.HKEY_CURRENT_USER, RUN_KEY, 0, reg.KEY_SET_VALUE) as key:
                    reg.DeleteValue(key, VALUE_NAME)
            except FileNotFoundError:
                pass
        else:
            self.entry_path().unlink(missing_ok=True)

    def is_enabled(self) -> bool:
        if self.platform == "win32":
            reg = self.registry()
            try:
                with reg.OpenKey(reg.HKEY_CURRENT_USER, RUN_KEY) as key:
                    reg.QueryValueEx(key, VALUE_NAME)
                return True
            except FileNotFoundError:
                return False
        return self.entry_path().is_file()

    def apply(self, enabled: bool, argv: Sequence[str]) -> None:
        if enabled:
            self.enable(argv)
        else:
            self.disable()

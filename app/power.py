"""Train only when the computer is idle, or only on AC power, where the OS reports those.

`idle_seconds()` asks the OS how long since the last keyboard or mouse input:
Windows `GetLastInputInfo`, macOS `HIDIdleTime` from ioreg, and on Linux the
X11 screen-saver extension or the desktop's D-Bus idle monitor. It returns
None where nothing answers (a headless machine, an unknown desktop), and the
Settings dialog then greys the option out. `on_ac_power()` uses psutil's
battery report; a computer without a battery is always on AC power.

`PowerPolicy` polls both and says whether training may run now.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

log = logging.getLogger(__name__)

IDLE_AFTER_SECONDS = 300.0
POLL_MS = 20_000


def _windows_idle() -> float | None:
    class LastInputInfo(ctypes.Structure):
        _fields_ = [("cbSize", ctypes.c_uint), ("dwTime", ctypes.c_uint)]

    info = LastInputInfo()
    info.cbSize = ctypes.sizeof(info)
    windll: Any = getattr(ctypes, "windll", None)
    if windll is None or not windll.user32.GetLastInputInfo(ctypes.byref(info)):
        return None
    return float((windll.kernel32.GetTickCount() - info.dwTime) & 0xFFFFFFFF) / 1000.0


def _macos_idle() -> float | None:
    try:
        out = subprocess.run(["ioreg", "-c", "IOHIDSystem", "-d", "4"], capture_output=True, text=True,
                             timeout=2).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r'"HIDIdleTime"\s*=\s*(\d+)', out)
    return int(match.group(1)) / 1e9 if match else None


class _X11Idle:
    """XScreenSaverQueryInfo through ctypes; unavailable without libXss or a display."""

    class Info(ctypes.Structure):
        _fields_ = [("window", ctypes.c_ulong), ("state", ctypes.c_int), ("kind", ctypes.c_int),
                    ("til_or_since", ctypes.c_ulong), ("idle", ctypes.c_ulong), ("eventMask", ctypes.c_ulong)]

    def __init__(self) -> None:
        self.display: Any = None
        xlib_name, xss_name = ctypes.util.find_library("X11"), ctypes.util.find_library("Xss")
        if not xlib_name or not xss_name:
            return
        try:
            self.xlib = ctypes.cdll.LoadLibrary(xlib_name)
            self.xss = ctypes.cdll.LoadLibrary(xss_name)
        except OSError:
            return
        self.xlib.XOpenDisplay.restype = ctypes.c_void_p
        self.xlib.XDefaultRootWindow.argtypes = [ctypes.c_void_p]
        self.xlib.XDefaultRootWindow.restype = ctypes.c_ulong
        self.xss.XScreenSaverAllocInfo.restype = ctypes.POINTER(self.Info)
        self.xss.XScreenSaverQueryInfo.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.POINTER(self.Info)]
        self.display = self.xlib.XOpenDisplay(None)
        self.info = self.xss.XScreenSaverAllocInfo() if self.display else None

    def __call__(self) -> float | None:
        if not self.display or not self.info:
            return None
        root = self.xlib.XDefaultRootWindow(self.display)
        if not self.xss.XScreenSaverQueryInfo(self.display, root, self.info):
            return None
        return float(self.info.contents.idle) / 1000.0


def _dbus_idle() -> float | None:
    """GNOME's Mutter idle monitor, then the freedesktop screen saver (KDE and others)."""
    from PySide6.QtDBus import QDBusConnection, QDBusInterface, QDBusMessage

    bus = QDBusConnection.sessionBus()
    if not bus.isConnected():
        return None
    for service, path, interface, method, scale in (
        ("org.gnome.Mutter.IdleMonitor", "/org/gnome/Mutter/IdleMonitor/Core", "org.gnome.Mutter.IdleMonitor",
         "GetIdletime", 1e-3),
        ("org.freedesktop.ScreenSaver", "/org/freedesktop/ScreenSaver", "org.freedesktop.ScreenSaver",
         "GetSessionIdleTime", 1.0),
    ):
        iface = QDBusInterface(service, path, interface, bus)
        if not iface.isValid():
            continue
        iface.setTimeout(500)
        reply = iface.call(method)
        if reply.type() == QDBusMessage.MessageType.ReplyMessage and reply.arguments():
            value = reply.arguments()[0]
            if isinstance(value, (int, float)):
                return float(value) * scale
    return None


class IdleProbe:
    """Seconds since the last input, or None where the OS does not say."""

    def __init__(self) -> None:
        self._x11: _X11Idle | None = None

    def __call__(self) -> float | None:
        try:
            if sys.platform == "win32":
                return _windows_idle()
            if sys.platform == "darwin":
                return _macos_idle()
            if self._x11 is None:
                self._x11 = _X11Idle()
            return self._x11() if self._x11.display else _dbus_idle()
        except (OSError, AttributeError, ValueError) as exc:
            log.debug("idle time unavailable: %s", exc)
            return None


def on_ac_power() -> bool | None:
    """True on AC power (or with no battery), False on battery, None when unknown."""
    try:
        import psutil

        battery = psutil.sensors_battery()
    except (ImportError, OSError, RuntimeError, AttributeError):
        return None
    if battery is None:
        return True
    return None if battery.power_plugged is None else bool(battery.power_plugged)


def has_battery() -> bool:
    try:
        import psutil

        return psutil.sensors_battery() is not None
    except (ImportError, OSError, RuntimeError, AttributeError):
        return False


class PowerPolicy(QObject):
    """Polls idle time and power; `allowedChanged(allowed, reason)` when the answer flips."""

    allowedChanged = Signal(bool, str)

    def __init__(
        self,
        idle_probe: Callable[[], float | None] | None = None,
        ac_probe: Callable[[], bool | None] = on_ac_power,
        poll_ms: int = POLL_MS,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.idle_probe = idle_probe if idle_probe is not None else IdleProbe()
        self.ac_probe = ac_probe
        self.only_when_idle = False
        self.only_on_ac_power = False
        self.allowed = True
        self.reason = ""
        self.timer = QTimer(self)
        self.timer.setInterval(poll_ms)
        self.timer.timeout.connect(self.check)

    def idle_supported(self) -> bool:
        return self.idle_probe() is not None

    def set_rules(self, only_when_idle: bool, only_on_ac_power: bool) -> None:
        self.only_when_idle = only_when_idle
        self.only_on_ac_power = only_on_ac_power
        if only_when_idle or only_on_ac_power:
            self.timer.start()
        else:
            self.timer.stop()
        self.check()

    def evaluate(self) -> tuple[bool, str]:
        if self.only_on_ac_power and self.ac_probe() is False:
            return False, "Waiting for AC power (you chose to train only when plugged in)."
        if self.only_when_idle:
            idle = self.idle_probe()
            if idle is not None and idle < IDLE_AFTER_SECONDS:
                return False, "Waiting until the computer is idle (you chose to train only then)."
        return True, ""

    def check(self) -> None:
        allowed, reason = self.evaluate()
        if allowed != self.allowed or reason != self.reason:
            self.allowed, self.reason = allowed, reason
            self.allowedChanged.emit(allowed, reason)

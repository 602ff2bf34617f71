"""`sapling`: the desktop app, and in a frozen build also the headless node.

    sapling                       open the window (a second launch raises the first)
    sapling 'sapling://join?...'  open an invite: "Join this swarm?" (in the running window, if there is one)
    sapling --background          start training in the tray (what start-at-login runs)
    sapling --home DIR            keep settings, data and logs under DIR
    sapling --self-test [-- FLAGS]
                                  offscreen: run the real engine for one round, exit 0 when it worked
    sapling node COMMAND ...      the headless node, same as `sapling-node COMMAND ...`

`node` is handled before Qt is imported, so one executable serves both the
window and the engine it starts as a child (`sapling node serve`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """The app's options, and any engine flags after `--` (for --self-test)."""
    argv = list(argv)
    engine_flags: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, engine_flags = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(prog="sapling", description="Sapling: train a small language model with a swarm.",
                                     epilog="`sapling node --help` shows the headless node's commands.")
    parser.add_argument("invite", nargs="?", default="", metavar="INVITE",
                        help="an invite to open: sapling://join?..., https://HOST/join?... or wss://HOST/ws")
    parser.add_argument("--home", type=Path, help="keep config, data, cache and logs under this one folder")
    parser.add_argument("--background", action="store_true", help="start training at once, in the tray")
    parser.add_argument("--self-test", action="store_true",
                        help="offscreen: run one real round on the bundled model in a temporary folder, exit 0 if it "
                             "worked")
    parser.add_argument("--self-test-timeout", type=float, default=900.0, help=argparse.SUPPRESS)
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    return parser.parse_args(argv), engine_flags


def run_gui(args: argparse.Namespace) -> int:
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from app import theme
    from app.engine_flags import EngineFlags
    from app.guards import (
        InviteEvents,
        QuitSignals,
        SingleInstance,
        error_dialog,
        install_excepthook,
        instance_name,
        route_qt_messages,
        setup_app_logging,
    )
    from app.gui import build_gui

    flags = EngineFlags(home=args.home)
    paths = flags.paths()
    app = QApplication.instance() or QApplication(sys.argv[:1])
    if not isinstance(app, QApplication):
        raise RuntimeError("a QCoreApplication already exists")
    app.setApplicationName("Sapling")
    app.setApplicationDisplayName("Sapling")
    app.setDesktopFileName("sapling")
    app.setQuitOnLastWindowClosed(False)
    theme.apply(app)
    app.setWindowIcon(theme.icon())
    problem = paths.problem()  # --home (or SAPLING_HOME) names a file, or a folder nobody may write in
    if problem:
        from PySide6.QtWidgets import QMessageBox

        print(f"sapling: error: {problem}", file=sys.stderr)
        if app.platformName() not in ("offscreen", "minimal"):
            QMessageBox.critical(None, "Sapling cannot start", problem)
        return 2

    guard = SingleInstance(instance_name(paths.config_dir))
    if guard.notify_running(invite=args.invite):
        what = "the invite was sent to its window" if args.invite else "its window was brought to the front"
        print(f"Sapling is already running: {what}.")
        return 0
    guard.listen()
    invites = InviteEvents(app)  # macOS: a clicked sapling:// link arrives as an event, even at launch
    app.installEventFilter(invites)
    log_file = setup_app_logging(paths.log_dir)
    install_excepthook(error_dialog, log_file)
    route_qt_messages()

    gui = build_gui(flags)
    quit_signals = QuitSignals(app)  # Ctrl+C in the terminal, or a logout's SIGTERM: quit as the tray's Quit does
    quit_signals.received.connect(gui.quit_on_signal)
    quit_signals.install()
    from engine import __version__

    logging.getLogger("app").info("Sapling %s started (pid %d)", __version__, os.getpid())
    guard.raiseRequested.connect(gui.window.bring_to_front)
    guard.inviteReceived.connect(gui.window.open_invite)
    invites.inviteOpened.connect(gui.window.open_invite)
    if args.background:
        if gui.tray.available:
            QTimer.singleShot(0, lambda: gui.session.load_history(paths.metrics_file))
        else:
            gui.window.showMinimized()
            QTimer.singleShot(0, gui.after_show)
        gui.controller.start()
    else:
        gui.window.show()
        QTimer.singleShot(0, lambda: gui.after_show(args.invite))
    code = app.exec()
    quit_signals.uninstall()
    guard.close()
    return int(code)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["node"]:
        from engine.cli import main as node_main

        return node_main(args[1:])
    options, engine_flags = parse_args(args)
    if options.version:
        from engine import __version__

        print(f"sapling {__version__}")
        return 0
    if options.self_test:
        from app.selftest import run_self_test

        try:
            return run_self_test(engine_flags, timeout_s=options.self_test_timeout)
        except Exception:  # noqa: BLE001 - printed with its traceback and exit 1: a frozen windowed build would show PyInstaller's dialog and hang CI
            traceback.print_exc()
            print("sapling self-test: FAILED with the error above.", file=sys.stderr)
            return 1
    if engine_flags:
        print("sapling: flags after -- are only used with --self-test", file=sys.stderr)
        return 2
    return run_gui(options)


if __name__ == "__main__":
    sys.exit(main())

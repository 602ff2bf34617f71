"""`sapling-node serve`: the training loop driven by JSON lines (docs/engine-events.md).

Events go out on the real stdout, one per line. Everything else that would
print (libraries, progress bars, C extensions) is sent to stderr by
re-pointing file descriptor 1 before anything heavy is imported, so stdout
carries nothing but events. Commands come in on stdin; a reader thread turns
them into `Control` calls. End of stdin (the app went away) means stop.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import sys
import threading
import traceback
from typing import TextIO

from engine.common.errors import EventError, SaplingError
from engine.common.events import Event, encode, make_event, parse_command
from engine.common.paths import Paths

log = logging.getLogger(__name__)


class EventWriter:
    """Thread-safe, line-buffered writer of events."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        line = encode(event) + "\n"
        with self.lock:
            try:
                self.stream.write(line)
                self.stream.flush()
            except (BrokenPipeError, ValueError):
                pass  # the app is gone; the stdin reader will stop the node


class EventLogHandler(logging.Handler):
    """Forwards log records (INFO and up) as `log` events."""

    def __init__(self, emit: EventWriter) -> None:
        super().__init__(logging.INFO)
        self.emit_event = emit

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            message = str(record.msg)
        self.emit_event(make_event("log", level=record.levelname.lower(), logger=record.name, message=message))


def claim_stdout() -> TextIO:
    """Keep the real stdout for events; point fd 1 and sys.stdout at stderr."""
    sys.stdout.flush()
    events_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return io.TextIOWrapper(os.fdopen(events_fd, "wb", buffering=0), encoding="utf-8", line_buffering=True)


def read_commands(stream: TextIO, control: object, emit: EventWriter) -> None:
    from engine.node.clock import Control

    if not isinstance(control, Control):
        raise TypeError("control must be a Control")
    for line in stream:
        if not line.strip():
            continue
        try:
            command = parse_command(line)
        except EventError as exc:
            emit(make_event("log", level="warning", logger=__name__, message=f"ignored a bad command line: {exc}"))
            continue
        name = command["cmd"]
        log.info("command: %s", name)
        if name == "pause":
            control.pause()
        elif name == "resume":
            control.resume()
        elif name == "stop":
            control.stop()
        elif name == "reload":
            control.request_reload()
        elif name == "unban":
            control.request_unban(command["peer"])
    log.info("stdin closed: stopping at the next safe point")
    control.stop()


def serve(args: argparse.Namespace, paths: Paths) -> int:
    from engine.node.clock import Control
    from engine.node.launch import config_from_args, run_node, setup_logging, stop_on_signals

    emit = EventWriter(claim_stdout())
    setup_logging(paths, args.verbose, EventLogHandler(emit))
    control = Control()
    stop_on_signals(control.stop, lambda text: log.info("%s", text))
    try:
        config = config_from_args(args, paths)
        reader = threading.Thread(target=read_commands, args=(sys.stdin, control, emit), daemon=True, name="commands")
        run_node(config, paths, emit, control, reload_config=lambda: config_from_args(args, paths),
                 before_run=reader.start)
        return 0
    except SaplingError as exc:
        emit(make_event("error", kind=type(exc).__name__, message=str(exc), fatal=True))
        return exc.exit_code
    except Exception as exc:  # noqa: BLE001 - a bug: tell the app, log the traceback, exit 1
        log.error("engine crashed:\n%s", traceback.format_exc())
        emit(make_event("error", kind=type(exc).__name__, message=f"Internal error: {exc}", fatal=True))
        return 1

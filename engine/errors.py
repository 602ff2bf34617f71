"""One hierarchy for every error that crosses the engine's boundary.

A `SaplingError` is a *user's* problem (bad config value, unknown task, no
network for a hub id, corrupt checkpoint): its message is one sentence a
person can act on, and the CLI turns it into that sentence plus a non-zero
exit code. Anything else that escapes is a bug and is allowed to raise loudly.
"""

from __future__ import annotations


class SaplingError(Exception):
    """Base class: the message is meant for a person, not a developer."""

    exit_code = 1


class ConfigError(SaplingError, ValueError):
    """A configuration value is missing, malformed or out of range."""

    exit_code = 2


class DeviceError(SaplingError):
    """The requested compute device is not available on this machine."""

    exit_code = 2


class ModelError(SaplingError):
    """A model could not be found, converted or loaded."""

    exit_code = 3


class TaskError(SaplingError, ValueError):
    """A task reference names an unknown dataset or cannot be rebuilt."""

    exit_code = 2


class CheckpointError(SaplingError):
    """A checkpoint is missing, partial or does not match this run."""

    exit_code = 4


class EventError(SaplingError, ValueError):
    """A line on the engine<->app channel is not a valid event or command."""

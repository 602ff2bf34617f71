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
    # True: restarting will not help, the person has to change something (a setting, a file).
    needs_the_user = True


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


class RelayError(SaplingError):
    """A relay could not be reached, or did not answer as a Sapling relay (network, not settings)."""

    exit_code = 1


class RelayStartError(SaplingError):
    """A relay process cannot start: its port is taken, its Redis does not answer, its key folder is not writable."""

    exit_code = 2


class IdentityError(SaplingError, ValueError):
    """A swarm identity file is missing, damaged or not a Sapling key, or cannot be written."""

    exit_code = 2


class NodeBusyError(SaplingError):
    """Another node trains with the same data folder, and so with the same identity and checkpoints."""

    exit_code = 2


class EventError(SaplingError, ValueError):
    """A line on the engine<->app channel is not a valid event or command."""

    needs_the_user = False  # a bug on one side of the channel, not something a person can fix


def _user_errors() -> list[type[SaplingError]]:
    found: list[type[SaplingError]] = []
    pending: list[type[SaplingError]] = [SaplingError]
    while pending:
        cls = pending.pop()
        if cls.needs_the_user:
            found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


def user_error_kinds() -> frozenset[str]:
    """The `kind` names, as `error` events carry them, of the errors a person must fix.

    The app decides "restarting will not help" from these, so they come from
    the hierarchy itself rather than from a copied list of strings.
    """
    return frozenset(cls.__name__ for cls in _user_errors())


def user_exit_codes() -> frozenset[int]:
    """The exit codes of those errors, beyond the generic 1 (bad settings 2, model 3, checkpoint 4)."""
    return frozenset(cls.exit_code for cls in _user_errors()) - {SaplingError.exit_code}

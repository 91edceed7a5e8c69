"""Exceptions raised by the castmesh Python API."""

from __future__ import annotations

from typing import Optional

__all__ = ["CastmeshError", "ActorError", "SupervisionError", "ProcError", "CommunicatorError", "RdmaError"]


class CastmeshError(Exception):
    """Base class of every error castmesh raises on behalf of the runtime.

    Attributes:
        code: the runtime's status code name (e.g. ``"UNAVAILABLE"``), set by
            the extension from the C++ status itself (python/src/status_binding.h);
            ``"UNKNOWN"`` for errors that do not come from a status. The
            builtin exceptions the extension raises for a status
            (``ValueError``, ``TimeoutError``, ...) carry it too.
    """

    def __init__(self, message: str = "", code: str = "UNKNOWN") -> None:
        super().__init__(message)
        self.code = code


class ActorError(CastmeshError):
    """An endpoint raised an exception in its actor.

    Attributes:
        remote_type: qualified name of the exception type raised remotely
            (e.g. ``"builtins.ValueError"``).
        remote_message: ``str()`` of the remote exception.
        remote_traceback: the formatted remote traceback.
        actor: the address of the actor that raised it.
        exception: the remote exception object itself when it could be
            unpickled here, else ``None``.
    """

    def __init__(
        self,
        remote_type: str,
        remote_message: str,
        remote_traceback: str,
        actor: str = "",
        exception: Optional[BaseException] = None,
    ) -> None:
        self.remote_type = remote_type
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback
        self.actor = actor
        self.exception = exception
        where = f" in actor {actor}" if actor else ""
        super().__init__(
            f"{remote_type}: {remote_message}{where}\n"
            f"--- remote traceback ---\n{remote_traceback.rstrip()}"
        )

    def __reduce__(self):  # keep all fields when an ActorError itself is pickled
        return (
            ActorError,
            (self.remote_type, self.remote_message, self.remote_traceback, self.actor, None),
        )


class SupervisionError(CastmeshError, RuntimeError):
    """A call reached a mesh member that has failed or is gone (as Monarch's
    SupervisionError): the member stopped with an error, its constructor
    raised, or its proc died. :class:`ProcError` is the kind castmesh raises.

    Attributes:
        endpoint: the endpoint that was called, when known ("" otherwise).
    """

    endpoint: str = ""


class ProcError(SupervisionError):
    """A message could not be delivered or answered: its proc died, stopped
    or became unreachable, or the actor is gone (it failed or was stopped).
    The message names the proc and the reason given by the runtime;
    ``code`` the status code (e.g. ``"UNAVAILABLE"``).
    """


class CommunicatorError(CastmeshError, RuntimeError):
    """A communicator operation failed (a dead rank, a mismatched collective, ...); ``code`` names the status.
    Also ``castmesh.collectives.CommunicatorError``."""


class RdmaError(CastmeshError, RuntimeError):
    """An RDMA operation failed (owner lost, buffer released, ...); ``code`` names the status.
    Also ``castmesh.rdma.RdmaError``."""


def with_context(error: CastmeshError, context: str) -> ProcError:
    """A ProcError saying what failed (`context`) and why (`error`, with its code)."""
    return ProcError(f"{context}: {error.code}: {error}", error.code)

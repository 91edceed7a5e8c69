"""Exceptions raised by the castmesh Python API."""

from __future__ import annotations

from typing import List, Optional, Sequence

__all__ = ["CastmeshError", "ActorError", "ActorFailedError", "SupervisionError", "ProcError", "CommunicatorError",
           "CommunicatorTimeoutError", "RdmaError"]


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


class ActorFailedError(ActorError, SupervisionError):
    """An endpoint raised a ``BaseException`` that is not an ``Exception``
    (``SystemExit``, ``KeyboardInterrupt``, ...): the actor failed with it
    (its owner's ``__supervise__`` gets a MeshFailure, later calls to it raise
    SupervisionError). Its caller gets this: a SupervisionError, as in
    Monarch, that is also an :class:`ActorError` with the remote traceback.
    """

    def __reduce__(self):
        return (
            ActorFailedError,
            (self.remote_type, self.remote_message, self.remote_traceback, self.actor, None),
        )


class CommunicatorError(CastmeshError, RuntimeError):
    """A communicator operation failed (a dead rank, a mismatched collective, ...); ``code`` names the status.
    Also ``castmesh.collectives.CommunicatorError``."""


class CommunicatorTimeoutError(CommunicatorError, TimeoutError):
    """A blocking collective or receive did not complete within its ``timeout``
    (``except TimeoutError`` catches it too).

    Attributes:
        missing_ranks: the ranks that did not arrive (a collective) or did not
            send (a receive from one source); empty when every rank arrived or
            the receive was from any source.
    """

    def __init__(self, message: str = "", code: str = "DEADLINE_EXCEEDED",
                 missing_ranks: Sequence[int] = ()) -> None:
        super().__init__(message, code)
        self.missing_ranks: List[int] = list(missing_ranks)

    def __reduce__(self):  # keeps missing_ranks when sent back from an actor
        return (CommunicatorTimeoutError, (str(self), self.code, self.missing_ranks))


class RdmaError(CastmeshError, RuntimeError):
    """An RDMA operation failed (owner lost, buffer released, ...); ``code`` names the status.
    Also ``castmesh.rdma.RdmaError``."""


def with_context(error: CastmeshError, context: str) -> ProcError:
    """A ProcError saying what failed (`context`) and why (`error`, with its code)."""
    return ProcError(f"{context}: {error.code}: {error}", error.code)

"""Ports and channels (Monarch's low-level messaging).

``port, receiver = Channel.open()`` makes a channel whose receiving end
lives in the calling process (an actor or the controller). The
:class:`Port` pickles into any message (an endpoint's argument, a value
another port carries, ...), so any actor can ``port.send(value)`` (or
``port.exception(error)``) to it; messages from one sender arrive in the
order sent. ``await receiver.recv()`` or ``receiver.recv().get()`` takes the
next message (each ``recv()`` is given its own message, in order).

Endpoints marked ``@endpoint(explicit_response_port=True)`` receive the
caller's response port as their first argument (after ``self``) and answer
through it, at once or later (from another endpoint); their return value is
ignored. ``send(endpoint, args, kwargs, port=port)`` calls an endpoint on
every actor of its mesh without waiting: each actor's result (or error) goes
to ``port``.

A channel's receiving actor stops when its receiver is garbage collected
(or ``receiver.close()``); messages sent after that are dropped.
"""

from __future__ import annotations

from typing import Any, Dict, Generic, Optional, Tuple, TypeVar

from . import _castmesh, _context, _runtime, _serial
from ._replies import decode_reply, error_reply
from .future import Future

__all__ = ["Channel", "Port", "PortReceiver", "RankedPortReceiver", "send"]

R = TypeVar("R")

# Where an endpoint call carries its response port (the port's address and
# the answering member's rank are added by its actor server): a keyword no Python
# function can declare.
PORT_KWARG = "castmesh.port"


def _ensure_runtime() -> None:
    if not _context.in_worker():
        _runtime.runtime()


class Port(Generic[R]):
    """The sending end of a channel: ``send(value)`` / ``exception(error)``,
    fire and forget, from any actor or the controller. Pickles to its
    address (and rank), so it travels inside messages."""

    __slots__ = ("_address", "_rank")

    def __init__(self, address: str, rank: Optional[int] = None) -> None:
        self._address = address
        self._rank = rank

    @property
    def address(self) -> str:
        """The receiving actor's address."""
        return self._address

    def send(self, value: R) -> None:
        """Sends ``value`` (pickled) to the receiver."""
        _castmesh.port_send(self._address, _serial.dumps((self._rank, _serial.dumps(("ok", value)))))

    def exception(self, error: BaseException) -> None:
        """Sends an error: the receiver's ``recv()`` raises it."""
        _castmesh.port_send(self._address, _serial.dumps((self._rank, error_reply(error))))

    def __reduce__(self) -> Any:
        return (Port, (self._address, self._rank))

    def __repr__(self) -> str:
        return f"<castmesh.Port {self._address}>"


class DroppingPort(Port[Any]):
    """The port an explicit-response endpoint gets when nobody waits for an
    answer (``broadcast``, or ``send`` without a port): sends go nowhere."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__("", None)

    def send(self, value: Any) -> None:
        """Drops ``value``: nobody asked for a reply."""
        del value

    def exception(self, error: BaseException) -> None:
        """Drops ``error``: nobody asked for a reply."""
        del error


class PortReceiver(Generic[R]):
    """The receiving end of a channel opened in this process."""

    __slots__ = ("_channel", "__weakref__")

    def __init__(self, channel: "_castmesh.Channel") -> None:
        self._channel = channel

    def recv(self) -> "Future[R]":
        """The next message: ``await`` it or ``.get(timeout)``. An error sent
        with ``port.exception(e)`` is raised (``e`` itself when it unpickles
        here, else a :class:`castmesh.ActorError`)."""
        slot = self._channel.recv()
        address = self._channel.address

        def wait(timeout: Optional[float]) -> R:
            _rank, value = self._ranked(slot, timeout, address)
            return value

        return Future(wait, slot.add_callback)

    def recv_ranked(self) -> "Future[Tuple[Optional[int], R]]":
        """The next message with the rank of the mesh member that sent it
        (``None`` for a port that was not handed out by a mesh call)."""
        slot = self._channel.recv()
        address = self._channel.address
        return Future(lambda timeout: self._ranked(slot, timeout, address), slot.add_callback)

    @staticmethod
    def _ranked(slot: Any, timeout: Optional[float], address: str, raw: bool = False) -> Tuple[Optional[int], Any]:
        data = slot.wait(-1.0 if timeout is None else timeout)  # the queue itself never fails it
        if data is None:
            raise TimeoutError(f"no message at port {address} within {timeout} s")
        rank, reply = _serial.loads(data)
        if raw:
            return rank, reply
        ok, value = decode_reply(reply, "a port sender")
        if ok:
            return rank, value
        raise value.exception if value.exception is not None else value

    def close(self) -> None:
        """Stops receiving (the channel's actor stops)."""
        self._channel.close()

    def __del__(self) -> None:
        try:
            self._channel.close()
        except Exception:  # noqa: BLE001 - interpreter exit
            pass


class RankedPortReceiver(PortReceiver[R]):
    """A receiver whose ``recv()`` gives ``(rank, value)``: the rank of the
    mesh member that sent it (``None`` for a port no mesh call handed out),
    as Monarch's ``Channel.open_ranked()`` receiver does."""

    __slots__ = ()

    def recv(self) -> "Future[Tuple[Optional[int], R]]":  # type: ignore[override]
        """The next value with the rank of the mesh member that sent it: a Future of ``(rank, value)``."""
        return self.recv_ranked()


class Channel(Generic[R]):
    """Opens channels: ``port, receiver = Channel.open()``."""

    @staticmethod
    def open(once: bool = False) -> Tuple[Port[R], PortReceiver[R]]:
        """A new channel whose receiver lives in this process. ``once`` is
        accepted for Monarch compatibility (a port may be used any number of
        times here)."""
        del once
        _ensure_runtime()
        channel = _castmesh.open_channel()
        return Port(channel.address), PortReceiver(channel)

    @staticmethod
    def open_ranked(once: bool = False) -> Tuple[Port[R], RankedPortReceiver[R]]:
        """As :meth:`open`, whose receiver's ``recv()`` gives ``(rank, value)`` (Monarch's)."""
        del once
        _ensure_runtime()
        channel = _castmesh.open_channel()
        return Port(channel.address), RankedPortReceiver(channel)


def send(endpoint: Any, args: Tuple[Any, ...], kwargs: Optional[Dict[str, Any]] = None,
         port: Optional[Port[Any]] = None, selection: str = "all") -> None:
    """Calls ``endpoint`` (e.g. ``mesh.compute``) on every actor of its mesh
    without waiting. With ``port``, each actor's result (or error) is sent
    there (an explicit-response endpoint gets ``port`` as its first
    argument); without, results are dropped (as ``broadcast``).
    ``selection="choose"`` (Monarch's) sends to one actor instead, chosen as
    ``choose()`` chooses (the member with the fewest ``choose()`` requests in
    flight; this send is not counted among them, having no reply to wait
    for); slice the mesh to pick others."""
    if selection == "choose":
        endpoint = endpoint._chosen()
    elif selection != "all":
        raise ValueError(f"send(..., selection={selection!r}): 'all' or 'choose'; slice the mesh to pick actors")
    endpoint._send(tuple(args), dict(kwargs or {}), port)

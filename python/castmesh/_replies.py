"""The reply of a Python actor's call, as the actor server builds it and
callers and ports decode it (one format for both ends).

A reply is ``dumps(("ok", value))`` or ``dumps(("err", (type name, message,
formatted traceback, pickled exception or None)))``, ``"failed"`` instead of
``"err"`` when the error failed the actor. An Accumulator's call is
answered with a *piece* the C++ reducers fold (python/src/py_reducers.h).
"""

from __future__ import annotations

import os
import struct
import traceback
from typing import Any, List, Optional, Tuple

from . import _serial, supervision
from .errors import ActorError, ActorFailedError

_INT64 = range(-(2**63), 2**63)


def reply_piece(result: Any, reply: bytes) -> bytes:
    """A reply as a piece for the C++ reducers (python/src/py_reducers.h): an
    exact int (not bool) within int64 or an exact float as a number the
    relays can fold; anything else (another type, an error) as the reply."""
    if type(result) is int and result in _INT64:
        return b"I" + struct.pack("<q", result)
    if type(result) is float:
        return b"F" + struct.pack("<d", result)
    return b"R" + reply


def piece_values(piece: bytes, actor: str) -> List[Tuple[bool, Any]]:
    """The (ok, value | ActorError) outcomes a piece holds, in row-major
    order of the members (a folded number counts as one value)."""
    tag, body = piece[:1], piece[1:]
    if tag == b"I":
        return [(True, struct.unpack("<q", body)[0])]
    if tag == b"F":
        return [(True, struct.unpack("<d", body)[0])]
    if tag == b"R":
        return [decode_reply(body, actor)]
    if tag == b"L":
        out: List[Tuple[bool, Any]] = []
        offset = 0
        while offset < len(body):
            (size,) = struct.unpack_from("<I", body, offset)
            out.extend(piece_values(body[offset + 4:offset + 4 + size], actor))
            offset += 4 + size
        return out
    raise ValueError(f"not a reply piece (tag {tag!r})")


def user_traceback(error: BaseException) -> str:
    """`error`'s formatted traceback without castmesh's own frames above the user's code."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None and \
            os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(package):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(error), error, tb))


def error_reply(error: BaseException, fails_actor: bool = False) -> bytes:
    """The reply of a call that raised `error`; `fails_actor`: it failed the
    actor too (the caller raises ActorFailedError, a SupervisionError)."""
    kind = type(error)
    type_name = f"{kind.__module__}.{kind.__qualname__}"
    text = user_traceback(error)
    try:
        exc_bytes: Optional[bytes] = _serial.dumps(error)
    except Exception:  # noqa: BLE001 - the exception itself may not pickle
        exc_bytes = None
    return _serial.dumps(("failed" if fails_actor else "err", (type_name, str(error), text, exc_bytes)))


def decode_reply(data: bytes, actor: str) -> Tuple[bool, Any]:
    """(True, value) or (False, ActorError) from a reply built by error_reply or an ok reply."""
    kind, body = _serial.loads(data)
    if kind == "ok":
        return True, body
    type_name, message, text, exc_bytes = body
    exception = None
    if exc_bytes is not None:
        try:
            exception = _serial.loads(exc_bytes)
        except Exception:  # noqa: BLE001 - its class may not exist here
            exception = None
    if kind == "failed":
        supervision.expect_failure(actor)
        return False, ActorFailedError(type_name, message, text, actor, exception)
    return False, ActorError(type_name, message, text, actor, exception)

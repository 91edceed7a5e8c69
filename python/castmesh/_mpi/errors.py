"""MPI error classes and ``MPI.Exception``, and the translation of castmesh's errors into them.

mpi4py raises ``MPI.Exception`` (a RuntimeError carrying the MPI error
class) for errors the MPI library reports, e.g. a truncated receive; bad
Python arguments stay TypeError/ValueError. The numbers are Open MPI's, so
programs that compare ``Get_error_class()`` with literals keep working.
"""

from __future__ import annotations

from typing import Dict

SUCCESS = 0
ERR_BUFFER = 1
ERR_COUNT = 2
ERR_TYPE = 3
ERR_TAG = 4
ERR_COMM = 5
ERR_RANK = 6
ERR_REQUEST = 7
ERR_ROOT = 8
ERR_GROUP = 9
ERR_OP = 10
ERR_TOPOLOGY = 11
ERR_DIMS = 12
ERR_ARG = 13
ERR_UNKNOWN = 14
ERR_TRUNCATE = 15
ERR_OTHER = 16
ERR_INTERN = 17
ERR_IN_STATUS = 18
ERR_PENDING = 19
ERR_LASTCODE = 92

_STRINGS: Dict[int, str] = {
    SUCCESS: "MPI_SUCCESS: no errors",
    ERR_BUFFER: "MPI_ERR_BUFFER: invalid buffer pointer",
    ERR_COUNT: "MPI_ERR_COUNT: invalid count argument",
    ERR_TYPE: "MPI_ERR_TYPE: invalid datatype",
    ERR_TAG: "MPI_ERR_TAG: invalid tag",
    ERR_COMM: "MPI_ERR_COMM: invalid communicator",
    ERR_RANK: "MPI_ERR_RANK: invalid rank",
    ERR_REQUEST: "MPI_ERR_REQUEST: invalid request",
    ERR_ROOT: "MPI_ERR_ROOT: invalid root",
    ERR_GROUP: "MPI_ERR_GROUP: invalid group",
    ERR_OP: "MPI_ERR_OP: invalid reduce operation",
    ERR_ARG: "MPI_ERR_ARG: invalid argument of some other kind",
    ERR_UNKNOWN: "MPI_ERR_UNKNOWN: unknown error",
    ERR_TRUNCATE: "MPI_ERR_TRUNCATE: message truncated",
    ERR_OTHER: "MPI_ERR_OTHER: known error not in list",
    ERR_INTERN: "MPI_ERR_INTERN: internal error",
    ERR_IN_STATUS: "MPI_ERR_IN_STATUS: error code is in status",
    ERR_PENDING: "MPI_ERR_PENDING: pending request",
}


def Get_error_string(errorcode: int) -> str:  # noqa: N802 - mpi4py's name
    """The text of an MPI error class."""
    return _STRINGS.get(errorcode, f"MPI error {errorcode}")


def Get_error_class(errorcode: int) -> int:  # noqa: N802 - mpi4py's name
    """Error codes are error classes here."""
    return errorcode


class Exception(RuntimeError):  # noqa: A001 - mpi4py's name for it
    """An error reported by the MPI layer (``MPI.Exception``), with its error class."""

    def __init__(self, ierr: int = SUCCESS, detail: str = "") -> None:
        self.error_code = int(ierr)
        text = Get_error_string(self.error_code)
        super().__init__(f"{text}: {detail}" if detail else text)

    @property
    def error_class(self) -> int:
        return self.error_code

    @property
    def error_string(self) -> str:
        return Get_error_string(self.error_code)

    def Get_error_code(self) -> int:  # noqa: N802
        return self.error_code

    def Get_error_class(self) -> int:  # noqa: N802
        return self.error_code

    def Get_error_string(self) -> str:  # noqa: N802
        return Get_error_string(self.error_code)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, int):
            return self.error_code == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.error_code)

    def __int__(self) -> int:
        return self.error_code


def translate(error: BaseException) -> BaseException:
    """The mpi4py-style exception for an error castmesh raised.

    A message larger than the receive buffer becomes ``MPI.Exception``
    with ``ERR_TRUNCATE`` (what MPI reports); everything else keeps its type.
    """
    if isinstance(error, ValueError) and "does not fit the receive buffer" in str(error):
        return Exception(ERR_TRUNCATE, str(error))
    return error

"""MPI-style collectives among actor-mesh members or SPMD processes.

Inside an endpoint of an actor of a mesh::

    comm = castmesh.collectives.current()        # ranks in row-major order of the mesh
    comm.allreduce(grads)                         # in place, op="sum"
    row = castmesh.collectives.mesh_comm(dims=["gpus"])   # peers differing only in "gpus"

In a program started by a launcher (``mpirun -n 4 python prog.py``,
``srun python prog.py``)::

    comm = castmesh.collectives.world()

Buffers are any object with ``__dlpack__`` or the buffer protocol (NumPy
arrays, ``castmesh.Tensor``, PyTorch CPU tensors, ``bytearray``); data is
never copied on the way in, and the GIL is released while it moves.
Methods follow mpi4py's lower-case buffer methods and torch.distributed:
reductions write into ``out`` when given, else into the input in place;
``async_op=True`` returns a :class:`Request` (``.wait(timeout=None)``,
``.test()``) instead of blocking. CUDA/ROCm tensors (any DLPack device
array, or ``castmesh.tensor_engine.empty``) go to NCCL/RCCL through the
tensor_engine backend, enqueued on ``stream=`` (a
``castmesh.tensor_engine.Stream``; default: the communicator's own);
``Request.wait_stream(s)`` orders stream ``s`` after such a request. See
docs/collectives.md.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence

from . import _castmesh
from .errors import CommunicatorError
from .tensor import Tensor, empty, from_dlpack

ANY_SOURCE: int = _castmesh.ANY_SOURCE
ANY_TAG: int = _castmesh.ANY_TAG
UNDEFINED: int = _castmesh.UNDEFINED
Request = _castmesh.Request

__all__ = ["ANY_SOURCE", "ANY_TAG", "UNDEFINED", "Communicator", "CommunicatorError", "Op", "Request", "Status",
           "current", "data_path_bytes", "mesh_comm", "world"]


class Status(NamedTuple):
    """What a receive or probe matched (MPI_Status)."""

    source: int
    tag: int
    bytes: int


class Op:
    """A user-defined reduction: ``fn(a, b)`` over NumPy arrays, ``a`` holding the lower ranks' data.

    ``fn`` returns the result or writes it into ``b``. With ``commutative=False``
    ranks are combined in rank order.
    """

    def __init__(self, fn: Callable[[Any, Any], Any], commutative: bool = True, name: Optional[str] = None) -> None:
        self.fn = fn
        self.commutative = commutative
        self.name = name or getattr(fn, "__name__", "user_op")


_DLPACK_CUDA = 2
_DLPACK_ROCM = 10


def _tensor(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else from_dlpack(x)


def _like(x: Any, leading: Optional[int] = None, divide: Optional[int] = None) -> Tensor:
    t = _tensor(x)
    shape = list(t.shape)
    if leading is not None:
        shape = [leading] + shape
    if divide is not None:
        numel = 1
        for s in shape:
            numel *= s
        if numel % divide:
            raise ValueError(f"{numel} elements do not split into {divide} equal blocks")
        shape = [numel // divide]
    kind, index = t.__dlpack_device__()
    if kind in (_DLPACK_CUDA, _DLPACK_ROCM):  # device input: the output on the same device
        from . import tensor_engine
        return tensor_engine.empty(shape, t.dtype, f"{'cuda' if kind == _DLPACK_CUDA else 'rocm'}:{index}")
    return empty(shape, t.dtype)


class Communicator:
    """A group of ranks and this rank's place in it (wraps the C++ ``castmesh::Communicator``)."""

    def __init__(self, impl: Any) -> None:
        self._impl = impl

    @property
    def rank(self) -> int:
        return self._impl.rank

    @property
    def size(self) -> int:
        return self._impl.size

    @property
    def dims(self) -> dict:
        """The named dimensions of the ranks, e.g. ``{"hosts": 2, "gpus": 4}``."""
        return self._impl.dims

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, size={self.size}, dims={self.dims})"

    # mpi4py spellings
    def Get_rank(self) -> int:  # noqa: N802
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return self.size

    # ---- groups ----
    def along(self, dims: Sequence[str]) -> "Communicator":
        """The ranks that differ from this one only in ``dims``."""
        return Communicator(self._impl.along(list(dims)))

    def split(self, color: int, key: int = 0) -> Optional["Communicator"]:
        """MPI_Comm_split; ``UNDEFINED`` gives None. Collective."""
        sub = self._impl.split(color, key)
        return None if sub is None else Communicator(sub)

    def dup(self) -> "Communicator":
        return Communicator(self._impl.dup())

    # ---- point to point ----
    def send(self, buf: Any, dest: int, tag: int = 0) -> None:
        self._impl.send(buf, dest, tag)

    def isend(self, buf: Any, dest: int, tag: int = 0) -> Request:
        return self._impl.isend(buf, dest, tag)

    def recv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG,
             timeout: Optional[float] = None) -> Status:
        return self._impl.recv(buf, source, tag, timeout)

    def irecv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        return self._impl.irecv(buf, source, tag)

    def probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, timeout: Optional[float] = None) -> Status:
        return self._impl.probe(source, tag, timeout)

    def iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Optional[Status]:
        return self._impl.iprobe(source, tag)

    # ---- collectives ----
    def barrier(self, async_op: bool = False) -> Optional[Request]:
        return self._impl.barrier(async_op)

    def _done(self, result: Any, out: Any) -> Any:
        return result if result is not None else out

    def allreduce(self, x: Any, op: Any = "sum", out: Any = None, async_op: bool = False,
                  stream: Any = None) -> Any:
        """Reduces ``x`` over every rank into ``out`` (default: ``x``, in place); returns the output."""
        if out is None:
            out = x
        # Inlined _done: this is the call a training loop makes most.
        request = self._impl.allreduce(x, out, op, async_op, stream)
        return out if request is None else request

    def reduce(self, x: Any, root: int = 0, op: Any = "sum", out: Any = None, async_op: bool = False,
               stream: Any = None) -> Any:
        """Like allreduce; only ``root``'s output is written (default: ``x`` there)."""
        if out is None and self.rank == root:
            out = x
        return self._done(self._impl.reduce(x, out, op, root, async_op, stream), out)

    def broadcast(self, x: Any, root: int = 0, async_op: bool = False,
                  stream: Any = None) -> Any:
        """Copies root's ``x`` into every rank's ``x``; returns ``x``."""
        return self._done(self._impl.broadcast(x, root, async_op, stream), x)

    bcast = broadcast

    def allgather(self, x: Any, out: Any = None, async_op: bool = False,
                  stream: Any = None) -> Any:
        """Every rank's ``x``, stacked by rank (a new ``castmesh.Tensor`` of shape ``(size, *x.shape)`` unless ``out``)."""
        out = _like(x, leading=self.size) if out is None else out
        return self._done(self._impl.allgather(x, out, async_op, stream), out)

    def gather(self, x: Any, root: int = 0, out: Any = None, async_op: bool = False,
               stream: Any = None) -> Any:
        """Like allgather, at ``root`` only (others get None)."""
        if out is None and self.rank == root:
            out = _like(x, leading=self.size)
        return self._done(self._impl.gather(x, out, root, async_op, stream), out)

    def scatter(self, x: Any, out: Any, root: int = 0, async_op: bool = False,
                stream: Any = None) -> Any:
        """Block r of root's ``x`` (``size`` blocks the size of ``out``) goes to rank r's ``out``."""
        return self._done(self._impl.scatter(x if self.rank == root else None, out, root, async_op, stream), out)

    def reduce_scatter(self, x: Any, op: Any = "sum", out: Any = None, async_op: bool = False,
                       stream: Any = None) -> Any:
        """Block ``rank`` of the reduction of every rank's ``x`` (``size`` equal blocks, flattened)."""
        out = _like(x, divide=self.size) if out is None else out
        return self._done(self._impl.reduce_scatter(x, out, op, async_op, stream), out)

    def alltoall(self, x: Any, out: Any = None, async_op: bool = False,
                 stream: Any = None) -> Any:
        """Block j of this rank's ``x`` goes to block ``rank`` of rank j's output."""
        out = _like(x) if out is None else out
        return self._done(self._impl.alltoall(x, out, async_op, stream), out)


def data_path_bytes() -> Dict[str, int]:
    """Body bytes this process's collectives moved by each data path since it
    started: ``shared_memory`` (same-host rings), ``single_copy`` (read from a
    same-host sender's memory) and ``socket`` (the proc connection). Peers on
    different hosts only ever use ``socket`` (docs/hosts.md)."""
    return dict(_castmesh.data_path_bytes())


def current() -> Communicator:
    """The communicator of the actor mesh whose endpoint is running (ranks in row-major order)."""
    return Communicator(_castmesh.current_communicator())


def mesh_comm(dims: Optional[Sequence[str]] = None) -> Communicator:
    """``current()``, or the peers that differ from this rank only in ``dims``."""
    comm = current()
    return comm if dims is None else comm.along(dims)


def world(rendezvous: str = "", secret: str = "", timeout: float = 60.0) -> Communicator:
    """The communicator of every process of an SPMD job (``mpirun``/``srun``/indexed Job).

    Rank and size come from the launcher's variables; rank 0 listens on
    ``rendezvous`` (default ``CASTMESH_RENDEZVOUS``, else a single-host address
    derived from the job id) and the others join it.
    """
    return Communicator(_castmesh.world_communicator(rendezvous, secret, timeout))

"""MPI datatypes: the predefined ones and derived ones (vector, indexed, struct, resized ...).

A datatype is its type map reduced to what moving data needs: the byte
offsets, in type-map order, of every byte of one item (``index``), its
lower and upper bounds, and (for reductions) the NumPy dtype of its
elements when it has one. Sending a non-contiguous type packs the bytes
(``buffer[index + i * extent]`` for item i) and receiving one unpacks them,
as MPI does; contiguous types move straight from the caller's buffer.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import errors
from .views import byte_view


class _Unavailable(type):
    """A class whose unknown public attributes raise NotImplementedError naming them (never AttributeError)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise NotImplementedError(f"castmesh.MPI: {cls.__name__}.{name} is not provided (see docs/mpi4py.md)")


class Unavailable(metaclass=_Unavailable):
    """Base of the MPI classes: unknown public attributes of instances raise NotImplementedError too."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise NotImplementedError(f"castmesh.MPI: {type(self).__name__}.{name} is not provided (see docs/mpi4py.md)")


class Datatype(Unavailable):
    """``MPI.Datatype``: a predefined or derived datatype."""

    __slots__ = ("_name", "_index", "_size", "_lb", "_ub", "_align", "_np", "_elem", "_contig", "_predefined",
                 "_freed", "_committed", "_explicit_bounds")

    def __init__(self, name: str = "", index: Optional[np.ndarray] = None, lb: int = 0, ub: int = 0, align: int = 1,
                 np_dtype: Optional[np.dtype] = None, elem: Optional[np.dtype] = None, predefined: bool = False) -> None:
        self._name = name
        self._index = np.zeros(0, dtype=np.int64) if index is None else index
        self._size = int(self._index.size)
        self._lb = int(lb)
        self._ub = int(ub)
        self._align = int(align)
        self._np = np_dtype
        self._elem = elem
        self._predefined = predefined
        self._freed = index is None and not predefined and name == ""
        self._committed = predefined
        self._explicit_bounds = False
        self._contig = (self._lb == 0 and self._ub == self._size
                        and bool(np.array_equal(self._index, np.arange(self._size))))

    # ---- properties ----
    @property
    def size(self) -> int:
        return self._size

    @property
    def extent(self) -> int:
        return self._ub - self._lb

    @property
    def lb(self) -> int:
        return self._lb

    @property
    def ub(self) -> int:
        return self._ub

    @property
    def true_lb(self) -> int:
        return int(self._index.min()) if self._size else 0

    @property
    def true_ub(self) -> int:
        return int(self._index.max()) + 1 if self._size else 0

    @property
    def true_extent(self) -> int:
        return self.true_ub - self.true_lb

    @property
    def name(self) -> str:
        return self._name

    @property
    def is_predefined(self) -> bool:
        return self._predefined

    @property
    def is_named(self) -> bool:
        return self._predefined

    @property
    def typechar(self) -> str:
        return self._np.char if self._np is not None and not self._np.fields else ""

    def Get_size(self) -> int:  # noqa: N802
        return self._size

    def Get_extent(self) -> Tuple[int, int]:  # noqa: N802
        return self._lb, self.extent

    def Get_true_extent(self) -> Tuple[int, int]:  # noqa: N802
        return self.true_lb, self.true_extent

    def Get_name(self) -> str:  # noqa: N802
        return self._name

    def Set_name(self, name: str) -> None:  # noqa: N802
        self._name = str(name)

    def __repr__(self) -> str:
        return f"<castmesh.MPI.Datatype {self._name or 'derived'} size={self._size} extent={self.extent}>"

    def __bool__(self) -> bool:
        return not self._freed

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Datatype) and other._freed and self._freed:
            return True
        return self is other

    def __hash__(self) -> int:
        return id(self)

    # ---- life cycle ----
    def Commit(self) -> "Datatype":  # noqa: N802
        self._check()
        self._committed = True
        return self

    def Free(self) -> None:  # noqa: N802
        if self._predefined:
            raise errors.Exception(errors.ERR_TYPE, f"cannot free the predefined datatype {self._name}")
        self._check()
        self._freed = True

    def Dup(self) -> "Datatype":  # noqa: N802
        self._check()
        return self._derived(self._index, self._lb, self._ub, self._elem, self._np, explicit=self._explicit_bounds)

    def _check(self) -> None:
        if self._freed:
            raise errors.Exception(errors.ERR_TYPE, "the datatype was freed (MPI.DATATYPE_NULL)")

    # ---- constructors ----
    def _derived(self, index: np.ndarray, lb: int, ub: int, elem: Optional[np.dtype], np_dtype: Optional[np.dtype] = None,
                 explicit: bool = False, align: Optional[int] = None) -> "Datatype":
        t = Datatype("", index.astype(np.int64, copy=False), lb, ub, self._align if align is None else align,
                     np_dtype, elem)
        t._explicit_bounds = explicit
        return t

    @staticmethod
    def _compose(parts: Sequence[Tuple[int, int, "Datatype"]], struct: bool = False) -> "Datatype":
        """``parts``: (byte displacement, count, type) placed in order, count copies each ``extent`` apart."""
        pieces: List[np.ndarray] = []
        lbs: List[int] = []
        ubs: List[int] = []
        elems = set()
        align = 1
        explicit = False
        for disp, count, t in parts:
            t._check()
            count = int(count)
            if count < 0:
                raise ValueError(f"negative block length {count}")
            if count == 0:
                continue
            starts = int(disp) + np.arange(count, dtype=np.int64) * t.extent
            pieces.append((starts[:, None] + t._index[None, :]).ravel())
            lbs.append(int(starts.min()) + t._lb)
            ubs.append(int(starts.max()) + t._ub)
            elems.add(t._elem)
            align = max(align, t._align)
            explicit = explicit or t._explicit_bounds
        index = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
        lb = min(lbs) if lbs else 0
        ub = max(ubs) if ubs else 0
        if struct and not explicit and align > 1:  # MPI pads a struct's extent to its strictest alignment
            ub = lb + -(-(ub - lb) // align) * align
        elem = next(iter(elems)) if len(elems) == 1 else None
        single = parts[0][2] if len(parts) == 1 else None
        out = (single or Datatype("", np.zeros(0, np.int64), predefined=False))._derived(index, lb, ub, elem, align=align,
                                                                                       explicit=explicit)
        return out

    def Create_contiguous(self, count: int) -> "Datatype":  # noqa: N802
        return Datatype._compose([(0, count, self)])

    def Create_vector(self, count: int, blocklength: int, stride: int) -> "Datatype":  # noqa: N802
        return Datatype._compose([(i * int(stride) * self.extent, blocklength, self) for i in range(int(count))])

    def Create_hvector(self, count: int, blocklength: int, stride: int) -> "Datatype":  # noqa: N802
        return Datatype._compose([(i * int(stride), blocklength, self) for i in range(int(count))])

    def Create_indexed(self, blocklengths: Sequence[int], displacements: Sequence[int]) -> "Datatype":  # noqa: N802
        _same_length(blocklengths, displacements)
        return Datatype._compose([(int(d) * self.extent, b, self) for b, d in zip(blocklengths, displacements)])

    def Create_hindexed(self, blocklengths: Sequence[int], displacements: Sequence[int]) -> "Datatype":  # noqa: N802
        _same_length(blocklengths, displacements)
        return Datatype._compose([(int(d), b, self) for b, d in zip(blocklengths, displacements)])

    def Create_indexed_block(self, blocklength: int, displacements: Sequence[int]) -> "Datatype":  # noqa: N802
        return Datatype._compose([(int(d) * self.extent, blocklength, self) for d in displacements])

    def Create_hindexed_block(self, blocklength: int, displacements: Sequence[int]) -> "Datatype":  # noqa: N802
        return Datatype._compose([(int(d), blocklength, self) for d in displacements])

    @classmethod
    def Create_struct(cls, blocklengths: Sequence[int], displacements: Sequence[int],  # noqa: N802
                      datatypes: Sequence["Datatype"]) -> "Datatype":
        _same_length(blocklengths, displacements)
        _same_length(blocklengths, datatypes)
        return Datatype._compose([(int(d), b, t) for b, d, t in zip(blocklengths, displacements, datatypes)],
                                 struct=True)

    def Create_resized(self, lb: int, extent: int) -> "Datatype":  # noqa: N802
        self._check()
        return self._derived(self._index, int(lb), int(lb) + int(extent), self._elem, self._np, explicit=True)

    # ---- pack / unpack ----
    def Pack_size(self, count: int, comm: Any = None) -> int:  # noqa: N802
        del comm
        return int(count) * self._size

    def Pack(self, inbuf: Any, outbuf: Any, position: int, comm: Any = None) -> int:  # noqa: N802
        src = byte_view(inbuf, writable=False)
        dst = byte_view(outbuf, writable=True)
        count = src.size // self.extent if self.extent else 0
        data = self.pack(src, count)
        if position + data.size > dst.size:
            raise errors.Exception(errors.ERR_TRUNCATE, f"Pack needs {position + data.size} bytes, outbuf has {dst.size}")
        dst[position:position + data.size] = data
        return position + data.size

    def Unpack(self, inbuf: Any, position: int, outbuf: Any, comm: Any = None) -> int:  # noqa: N802
        src = byte_view(inbuf, writable=False)
        dst = byte_view(outbuf, writable=True)
        count = dst.size // self.extent if self.extent else 0
        n = count * self._size
        self.unpack(src[position:position + n], dst, count)
        return position + n

    def item_indices(self, count: int) -> np.ndarray:
        """Byte offsets, in type-map order, of ``count`` items from the buffer's start."""
        if count == 1:
            return self._index
        return (np.arange(count, dtype=np.int64)[:, None] * self.extent + self._index[None, :]).ravel()

    def check_fits(self, nbytes: int, count: int, offset: int = 0) -> None:
        """ValueError unless ``count`` items starting ``offset`` bytes in fit a buffer of ``nbytes``."""
        if count <= 0 or self._size == 0:
            return
        first = offset + (0 if self._contig else min(int(self._index.min()), 0) + min(0, (count - 1) * self.extent))
        last = offset + (count - 1) * max(self.extent, 0) + (self._size if self._contig else int(self._index.max()) + 1)
        if first < 0 or last > nbytes:
            raise ValueError(f"message: buffer too small: {count} x {self._name or 'derived datatype'} "
                             f"(size {self._size}, extent {self.extent}) from byte {offset} needs bytes "
                             f"{first}..{last}, the buffer has {nbytes}")

    def pack(self, u8: np.ndarray, count: int) -> np.ndarray:
        """The packed bytes of ``count`` items of this type laid out in ``u8`` (a copy)."""
        return u8[self.item_indices(count)]

    def unpack(self, packed: np.ndarray, u8: np.ndarray, count: int) -> None:
        """Writes packed bytes (possibly fewer than ``count`` items) into their places in ``u8``."""
        idx = self.item_indices(count)
        u8[idx[:packed.size]] = packed


def _same_length(a: Sequence[Any], b: Sequence[Any]) -> None:
    if len(a) != len(b):
        raise ValueError(f"sequences of different lengths ({len(a)} and {len(b)})")


def _basic(name: str, code: str, char: str = "") -> Datatype:
    dt = np.dtype(code)
    t = Datatype(f"MPI_{name}", np.arange(dt.itemsize, dtype=np.int64), 0, dt.itemsize, dt.alignment, dt, dt,
                 predefined=True)
    return t


def _pair(name: str, value: str, offset: int, extent: int) -> Datatype:
    """A value/index pair type for MAXLOC/MINLOC (``{value, int}`` as C lays out the struct)."""
    v = np.dtype(value)
    dt = np.dtype({"names": ["v", "i"], "formats": [v, np.int32], "offsets": [0, offset], "itemsize": extent})
    index = np.concatenate([np.arange(v.itemsize), np.arange(offset, offset + 4)]).astype(np.int64)
    return Datatype(f"MPI_{name}", index, 0, extent, max(v.alignment, 4), dt, None, predefined=True)


_NULL = Datatype("MPI_DATATYPE_NULL")
_NULL._freed = True
DATATYPE_NULL = _NULL

BYTE = _basic("BYTE", "u1")
PACKED = _basic("PACKED", "u1")
CHAR = _basic("CHAR", "S1")
WCHAR = _basic("WCHAR", "i4")
SIGNED_CHAR = _basic("SIGNED_CHAR", "i1")
SHORT = _basic("SHORT", "i2")
INT = _basic("INT", "i4")
LONG = _basic("LONG", "i8")
LONG_LONG = _basic("LONG_LONG", "i8")
LONG_LONG_INT = LONG_LONG
UNSIGNED_CHAR = _basic("UNSIGNED_CHAR", "u1")
UNSIGNED_SHORT = _basic("UNSIGNED_SHORT", "u2")
UNSIGNED = _basic("UNSIGNED", "u4")
UNSIGNED_INT = UNSIGNED
UNSIGNED_LONG = _basic("UNSIGNED_LONG", "u8")
UNSIGNED_LONG_LONG = _basic("UNSIGNED_LONG_LONG", "u8")
FLOAT = _basic("FLOAT", "f4")
DOUBLE = _basic("DOUBLE", "f8")
LONG_DOUBLE = _basic("LONG_DOUBLE", "g")
C_BOOL = _basic("C_BOOL", "?")
BOOL = _basic("CXX_BOOL", "?")
INT8_T = _basic("INT8_T", "i1")
INT16_T = _basic("INT16_T", "i2")
INT32_T = _basic("INT32_T", "i4")
INT64_T = _basic("INT64_T", "i8")
UINT8_T = _basic("UINT8_T", "u1")
UINT16_T = _basic("UINT16_T", "u2")
UINT32_T = _basic("UINT32_T", "u4")
UINT64_T = _basic("UINT64_T", "u8")
AINT = _basic("AINT", "i8")
OFFSET = _basic("OFFSET", "i8")
COUNT = _basic("COUNT", "i8")
C_COMPLEX = _basic("C_COMPLEX", "c8")
C_FLOAT_COMPLEX = C_COMPLEX
C_DOUBLE_COMPLEX = _basic("C_DOUBLE_COMPLEX", "c16")
C_LONG_DOUBLE_COMPLEX = _basic("C_LONG_DOUBLE_COMPLEX", "G")
CXX_FLOAT_COMPLEX = C_COMPLEX
CXX_DOUBLE_COMPLEX = C_DOUBLE_COMPLEX
CHARACTER = _basic("CHARACTER", "S1")
LOGICAL = _basic("LOGICAL", "i4")
INTEGER = _basic("INTEGER", "i4")
REAL = _basic("REAL", "f4")
DOUBLE_PRECISION = _basic("DOUBLE_PRECISION", "f8")
COMPLEX = _basic("COMPLEX", "c8")
DOUBLE_COMPLEX = _basic("DOUBLE_COMPLEX", "c16")
FLOAT_INT = _pair("FLOAT_INT", "f4", 4, 8)
DOUBLE_INT = _pair("DOUBLE_INT", "f8", 8, 16)
LONG_INT = _pair("LONG_INT", "i8", 8, 16)
TWOINT = _pair("2INT", "i4", 4, 8)
INT_INT = TWOINT
SHORT_INT = _pair("SHORT_INT", "i2", 4, 8)
LONG_DOUBLE_INT = _pair("LONG_DOUBLE_INT", "g", np.dtype("g").itemsize, 2 * np.dtype("g").itemsize)

# A buffer's format character (struct module / NumPy ``dtype.char``) -> its datatype, as mpi4py infers it.
_BY_CHAR: Dict[str, Datatype] = {
    "c": CHAR, "b": SIGNED_CHAR, "B": UNSIGNED_CHAR, "h": SHORT, "H": UNSIGNED_SHORT, "i": INT, "I": UNSIGNED,
    "l": LONG, "L": UNSIGNED_LONG, "q": LONG_LONG, "Q": UNSIGNED_LONG_LONG, "f": FLOAT, "d": DOUBLE, "g": LONG_DOUBLE,
    "?": C_BOOL, "F": C_FLOAT_COMPLEX, "D": C_DOUBLE_COMPLEX, "G": C_LONG_DOUBLE_COMPLEX, "Zf": C_FLOAT_COMPLEX,
    "Zd": C_DOUBLE_COMPLEX, "Zg": C_LONG_DOUBLE_COMPLEX, "S": CHAR, "p": LONG, "P": UNSIGNED_LONG,
}


def from_format(fmt: str, itemsize: int) -> Datatype:
    """The predefined datatype of a buffer format; BYTE for unknown formats of one byte."""
    code = fmt.lstrip("@=<>!")
    t = _BY_CHAR.get(code)
    if t is not None and (t.size == itemsize or code == "S"):
        return t if code != "S" else BYTE
    if itemsize == 1:
        return BYTE
    raise TypeError(f"message: cannot infer an MPI datatype from the buffer format {fmt!r}; give one, e.g. [buf, MPI.BYTE]")

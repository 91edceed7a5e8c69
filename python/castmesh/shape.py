"""Shapes (named dimensions over ranks), points and value meshes.

The shape algebra is castmesh's C++ ``Shape``/``Slice`` (bound in
``castmesh._castmesh``); this module gives it a Pythonic face.
"""

from __future__ import annotations

import operator
from typing import Any, Dict, Generic, Iterator, List, Mapping, Sequence, Tuple, TypeVar, Union

from . import _castmesh

T = TypeVar("T")

__all__ = ["Shape", "Point", "ValueMesh"]


class Shape:
    """Named dimensions over a strided set of ranks, e.g. ``{gpus: 4}``.

    Immutable. ``select(gpus=1)`` drops the dimension, ``select(gpus=slice(0, 2))``
    keeps it; ranks of a selection are still the ranks of the base mesh.
    """

    __slots__ = ("_impl",)

    def __init__(self, dims: Union[Mapping[str, int], "_castmesh.Shape"]) -> None:
        if isinstance(dims, _castmesh.Shape):
            self._impl = dims
        else:
            self._impl = _castmesh.Shape(list(dims.items()))

    @property
    def labels(self) -> List[str]:
        """Dimension names, outermost first."""
        return list(self._impl.labels)

    @property
    def sizes(self) -> Dict[str, int]:
        """Size of each dimension by name."""
        return dict(zip(self._impl.labels, self._impl.sizes))

    def __len__(self) -> int:
        return self._impl.size

    @property
    def ranks(self) -> List[int]:
        """Base-mesh ranks of the points, in row-major order."""
        return list(self._impl.ranks())

    def select(self, **selectors: Union[int, slice, range]) -> "Shape":
        """Selects by dimension name with Python's indexing rules: an ``int``
        (negative counts from the end) drops the dimension, a ``slice`` or
        ``range`` keeps the indices ``range(size)[s]``. Raises KeyError for an
        unknown dimension, IndexError for an index out of range, ValueError
        for a selection that is empty or would reverse the order (a negative
        step selecting two or more indices), TypeError for anything else."""
        return self.apply(self.resolve(selectors))

    def apply(self, resolved: Sequence[Tuple[str, Union[int, Tuple[int, int, int]]]]) -> "Shape":
        """Applies selectors already normalised by :meth:`resolve`."""
        impl = self._impl
        for name, sel in resolved:
            if isinstance(sel, int):
                impl = impl.select_index(name, sel)
            else:
                impl = impl.select_range(name, *sel)
        return Shape(impl)

    def resolve(self, selectors: Mapping[str, Any]) -> List[Tuple[str, Union[int, Tuple[int, int, int]]]]:
        """Each selector normalised against its dimension's size: a
        non-negative index, or ``(start, stop, step)`` with ``0 <= start <
        stop <= size`` and ``step >= 1``, selecting exactly ``range(size)[s]``
        (what the C++ Shape/Slice take). Raises as :meth:`select`."""
        sizes = self.sizes
        resolved: List[Tuple[str, Union[int, Tuple[int, int, int]]]] = []
        for name, sel in selectors.items():
            if name not in sizes:
                raise KeyError(f"unknown dimension {name!r} (dimensions: {', '.join(sizes) or 'none'})")
            resolved.append((name, normalize_selector(name, sel, sizes[name])))
        return resolved

    def point(self, position: int) -> "Point":
        """The point at a row-major position (0 .. len-1)."""
        coords, rank = self._impl.point_at(position)
        return Point(position, dict(zip(self._impl.labels, coords)), rank)

    def points(self) -> Iterator["Point"]:
        """Every point, in row-major order."""
        for position in range(len(self)):
            yield self.point(position)

    def position_of(self, coords: Mapping[str, int]) -> int:
        """Row-major position of the point with these named coordinates
        (negative ones count from the end, as Python indices do)."""
        labels = self._impl.labels
        missing = [label for label in labels if label not in coords]
        extra = [name for name in coords if name not in labels]
        if missing or extra:
            raise KeyError(f"coordinates {dict(coords)} do not match the dimensions {labels}")
        position = 0
        for label, size in zip(labels, self._impl.sizes):
            index = coords[label]
            if isinstance(index, (slice, range)):
                raise TypeError(f"coordinate {label!r} must be an int, not {type(index).__name__}")
            position = position * size + normalize_selector(label, index, size)
        return position

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Shape) and self._impl == other._impl

    def __hash__(self) -> int:
        return hash(str(self._impl))

    def __repr__(self) -> str:
        return f"Shape({self._impl})"

    def __reduce__(self):
        return (_shape_from_state, (self._impl.labels, self._impl.offset, self._impl.sizes, self._impl.strides))


class IndexOutOfRange(IndexError, ValueError):
    """An index past either end of a dimension: an IndexError as in Python
    (and Monarch), and a ValueError as castmesh raised before."""


def normalize_selector(name: str, sel: Any, size: int) -> Union[int, Tuple[int, int, int]]:
    """One selector for a dimension `name` of `size` indices, with Python's
    rules (see :meth:`Shape.resolve`)."""
    if isinstance(sel, bool):
        raise TypeError(f"selector for {name!r} must be an int, slice or range, not bool")
    if isinstance(sel, (slice, range)):
        start, stop, step = (sel if isinstance(sel, slice) else slice(sel.start, sel.stop, sel.step)).indices(size)
        picked = range(start, stop, step)
        if len(picked) == 0:
            raise ValueError(f"{_show(sel)} selects nothing from dimension {name!r} of size {size}")
        if step < 0:
            if len(picked) > 1:
                raise ValueError(
                    f"{_show(sel)} on dimension {name!r} would reverse the mesh's order (a negative step); "
                    f"a mesh view keeps its members in ascending order: use a positive step")
            return (picked[0], picked[0] + 1, 1)
        # A step past the end selects one index; keep it small for the C++ side.
        return (picked[0], picked[-1] + 1, min(step, size))
    try:
        index = operator.index(sel)
    except TypeError:
        raise TypeError(f"selector for {name!r} must be an int, slice or range, not {type(sel).__name__}") from None
    if not -size <= index < size:
        raise IndexOutOfRange(f"index {index} is out of range for dimension {name!r} of size {size}")
    return index + size if index < 0 else index


def _show(sel: Any) -> str:
    if isinstance(sel, slice):
        parts = ["" if v is None else str(v) for v in (sel.start, sel.stop, sel.step)]
        return "[" + ":".join(parts if sel.step is not None else parts[:2]) + "]"
    return repr(sel)


def _shape_from_state(labels: Sequence[str], offset: int, sizes: Sequence[int], strides: Sequence[int]) -> Shape:
    return Shape(_castmesh.Shape.from_slice(list(labels), offset, list(sizes), list(strides)))


class Point(Mapping[str, int]):
    """One point of a shape: a mapping from dimension name to coordinate,
    plus ``rank`` (its row-major position in the shape) and ``base_rank``
    (the rank of the proc in its base mesh)."""

    __slots__ = ("rank", "coords", "base_rank")

    def __init__(self, rank: int, coords: Dict[str, int], base_rank: int = -1) -> None:
        self.rank = rank
        self.coords = coords
        self.base_rank = rank if base_rank < 0 else base_rank

    def __getitem__(self, name: str) -> int:
        return self.coords[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.coords)

    def __len__(self) -> int:
        return len(self.coords)

    def __int__(self) -> int:
        return self.rank

    def __index__(self) -> int:
        return self.rank

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Point):
            return self.rank == other.rank and self.coords == other.coords
        if isinstance(other, int):
            return self.rank == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.rank, tuple(self.coords.items())))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in self.coords.items())
        return f"Point({inner}; rank={self.rank})"


class ValueMesh(Generic[T]):
    """One value per point of a shape: the replies of :meth:`call`.

    Index with a :class:`Point`, a mapping of coordinates (``vm[{"gpus": 1}]``),
    or a position; ``vm.item(gpus=1)``; iterate with :meth:`items` and
    :meth:`values` (row-major order).
    """

    __slots__ = ("_shape", "_values")

    def __init__(self, shape: Shape, values: Sequence[T]) -> None:
        if len(values) != len(shape):
            raise ValueError(f"{len(values)} values for a shape of {len(shape)} points")
        self._shape = shape
        self._values = list(values)

    @property
    def shape(self) -> Shape:
        return self._shape

    def __len__(self) -> int:
        return len(self._values)

    def __getitem__(self, key: Union[Point, Mapping[str, int], int]) -> T:
        if isinstance(key, Point):
            return self._values[self._shape.position_of(key.coords)]
        if isinstance(key, Mapping):
            return self._values[self._shape.position_of(key)]
        if isinstance(key, int) and not isinstance(key, bool):
            n = len(self._values)
            if not -n <= key < n:
                raise IndexError(f"position {key} is out of range for a mesh of {n} values")
            return self._values[key]
        raise TypeError(f"index a ValueMesh with a Point, a coordinate mapping or a position, not {type(key).__name__}")

    def item(self, **coords: int) -> T:
        """The value at the named coordinates; no arguments for a one-point mesh."""
        if not coords:
            if len(self._values) != 1:
                raise ValueError(f"item() without coordinates needs a one-point mesh, this one has {len(self)}")
            return self._values[0]
        return self._values[self._shape.position_of(coords)]

    def slice(self, **selectors: Union[int, slice, range]) -> "ValueMesh[T]":
        """The values of a sub-mesh, selected as :meth:`Shape.select` (an int
        drops the dimension, a slice keeps ``range(size)[s]``)."""
        shape = self._shape.select(**selectors)
        position = {rank: i for i, rank in enumerate(self._shape.ranks)}
        return ValueMesh(shape, [self._values[position[rank]] for rank in shape.ranks])

    def items(self) -> Iterator[Tuple[Point, T]]:
        """(point, value) pairs in row-major order."""
        return zip(self._shape.points(), self._values)

    def values(self) -> Iterator[T]:
        """The values in row-major order."""
        return iter(self._values)

    def __iter__(self) -> Iterator[Tuple[Point, T]]:
        return self.items()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ValueMesh) and self._shape == other._shape and self._values == other._values

    def __repr__(self) -> str:
        inner = ", ".join(
            "(" + ", ".join(f"{k}={v}" for k, v in point.coords.items()) + f"): {value!r}"
            for point, value in self.items()
        )
        return f"ValueMesh({{{inner}}})"

    def __reduce__(self) -> Any:
        return (ValueMesh, (self._shape, self._values))

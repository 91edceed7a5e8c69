"""Shapes (named dimensions over ranks), points and value meshes.

The shape algebra is castmesh's C++ ``Shape``/``Slice`` (bound in
``castmesh._castmesh``); this module gives it a Pythonic face.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any, Dict, Generic, Iterator, List, Mapping, Sequence, Tuple, TypeVar, Union

from . import _castmesh

T = TypeVar("T")

__all__ = ["Shape", "Point", "ValueMesh", "Extent"]


class Shape:
    """Named dimensions over a strided set of ranks, e.g. ``{gpus: 4}``.

    Immutable. ``select(gpus=1)`` drops the dimension, ``select(gpus=slice(0, 2))``
    keeps it; ranks of a selection are still the ranks of the base mesh.

    A selection with a negative step (``gpus=slice(None, None, -1)``)
    reverses that dimension, as Python does. The C++ ``Shape``/``Slice``
    behind this one has non-negative strides only (it cannot hold a reversed
    order), so a reversed dimension is recorded here, over the C++ shape of
    the same ranks in ascending order: :attr:`ranks` and :meth:`point` give
    the reversed order, :attr:`ascending_ranks` the C++ one.
    """

    __slots__ = ("_impl", "_flips")

    def __init__(self, dims: Union[Mapping[str, int], "_castmesh.Shape"]) -> None:
        if isinstance(dims, _castmesh.Shape):
            self._impl = dims
        else:
            self._impl = _castmesh.Shape(list(dims.items()))
        # Per dimension: True when its order is reversed (only on sizes > 1).
        self._flips: Tuple[bool, ...] = (False,) * len(self._impl.labels)

    @classmethod
    def _of(cls, impl: "_castmesh.Shape", flips: Sequence[bool]) -> "Shape":
        """A shape over `impl` (ascending) with these dimensions reversed."""
        shape = cls(impl)
        shape._flips = tuple(bool(f) and size > 1 for f, size in zip(flips, impl.sizes))
        return shape

    @property
    def reversed_dims(self) -> List[str]:
        """The dimensions whose order is reversed (by a negative step)."""
        return [label for label, flip in zip(self._impl.labels, self._flips) if flip]

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
        if not any(self._flips):
            return list(self._impl.ranks())
        return [self._rank_at(coords) for coords in itertools.product(*(range(n) for n in self._impl.sizes))]

    @property
    def ascending_ranks(self) -> List[int]:
        """The ranks in the order of the C++ Shape behind this one (which
        :attr:`ranks` reverses along reversed dimensions)."""
        return list(self._impl.ranks())

    def _rank_at(self, coords: Sequence[int]) -> int:
        """The base rank at these coordinates of this (possibly reversed) view."""
        impl = self._impl
        rank = impl.offset
        for c, n, stride, flip in zip(coords, impl.sizes, impl.strides, self._flips):
            rank += (n - 1 - c if flip else c) * stride
        return rank

    def select(self, **selectors: Union[int, slice, range]) -> "Shape":
        """Selects by dimension name with Python's indexing rules: an ``int``
        (negative counts from the end) drops the dimension, a ``slice`` or
        ``range`` keeps the indices ``range(size)[s]``, in that order (a
        negative step reverses the dimension). Raises KeyError for an
        unknown dimension, IndexError for an index out of range, ValueError
        for a selection that is empty, TypeError for anything else."""
        return self.apply(self.resolve(selectors))

    def apply(self, resolved: Sequence[Tuple[str, Union[int, Tuple[int, int, int]], bool]]) -> "Shape":
        """Applies selectors already normalised by :meth:`resolve`."""
        impl = self._impl
        flips = dict(zip(impl.labels, self._flips))
        for name, sel, flip in resolved:
            if isinstance(sel, int):
                impl = impl.select_index(name, sel)
                flips.pop(name)
            else:
                impl = impl.select_range(name, *sel)
                flips[name] = flip
        return Shape._of(impl, [flips[label] for label in impl.labels])

    def resolve(self, selectors: Mapping[str, Any]) -> List[Tuple[str, Union[int, Tuple[int, int, int]], bool]]:
        """Each selector as what the C++ Shape/Slice take (over the ranks in
        ascending order) plus whether the dimension is then reversed: a
        non-negative index, or ``(start, stop, step)`` with ``0 <= start <
        stop <= size`` and ``step >= 1``; together they select exactly
        ``range(size)[s]`` of this view, in that order. Raises as
        :meth:`select`."""
        sizes = self.sizes
        flips = dict(zip(self._impl.labels, self._flips))
        resolved: List[Tuple[str, Union[int, Tuple[int, int, int]], bool]] = []
        for name, sel in selectors.items():
            if name not in sizes:
                raise KeyError(f"unknown dimension {name!r} (dimensions: {', '.join(sizes) or 'none'})")
            size = sizes[name]
            picked = normalize_selector(name, sel, size)
            if isinstance(picked, int):
                resolved.append((name, size - 1 - picked if flips[name] else picked, False))
                continue
            if flips[name]:  # view index i is index size-1-i of the ascending order
                picked = range(size - 1 - picked.start, size - 1 - picked.stop, -picked.step)
            first, last = (picked[0], picked[-1]) if picked.step > 0 else (picked[-1], picked[0])
            step = abs(picked.step) if len(picked) > 1 else 1
            resolved.append((name, (first, last + 1, step), picked.step < 0 and len(picked) > 1))
        return resolved

    def flatten(self, name: str) -> "Shape":
        """All points as one dimension ``name`` (same ranks, same order).
        ValueError when the ranks cannot be viewed so without copying (e.g.
        a slice with a step on an inner dimension, or a shape reversed along
        some of its dimensions but not all)."""
        flips = [flip for flip, size in zip(self._flips, self._impl.sizes) if size > 1]
        if any(flips) and not all(flips):
            raise ValueError(f"cannot flatten {self}: it is reversed along {self.reversed_dims} only, so its "
                             f"order is not one strided run of ranks (slice with positive steps, flatten, then "
                             f"reverse the flattened dimension)")
        return Shape._of(self._impl.reshape([(name, len(self))]), [any(flips)])

    def rename(self, **names: str) -> "Shape":
        """Renames dimensions (``rename(hosts="dp", gpus="tp")``); the others
        keep their names."""
        for old, new in names.items():
            if old not in self.sizes:
                raise ValueError(f"cannot rename {old!r}: no such dimension (dimensions: {', '.join(self.labels)})")
            if not isinstance(new, str):
                raise ValueError(f"the new name of {old!r} must be a string, not {new!r}")
        labels = [names.get(label, label) for label in self.labels]
        impl = self._impl
        return Shape._of(_castmesh.Shape.from_slice(labels, impl.offset, impl.sizes, impl.strides), self._flips)

    def split(self, **kwargs: Any) -> "Shape":
        """Splits dimensions into several (Monarch's ``split``): an existing
        dimension maps to a sequence of new names, and a new name to its
        size; at most one new name per split may be left without a size (it
        is inferred), e.g. ``split(hosts=("dp", "pp"), gpus=("tp", "cp"),
        pp=2, cp=2)``. Dimensions not named stay as they are."""
        splits: Dict[str, Sequence[str]] = {}
        sizes_of: Dict[str, int] = {}
        for key, value in kwargs.items():
            if key in self.sizes:
                if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                    raise ValueError(f"{key}= must be a sequence of new dimension names, not {value!r}")
                splits[key] = tuple(value)
            elif isinstance(value, int) and not isinstance(value, bool) and value > 0:
                sizes_of[key] = value
            else:
                raise ValueError(f"{key!r} is not a dimension; as a new dimension its size must be a positive int, "
                                 f"not {value!r}")
        dims: List[Tuple[str, int]] = []
        flips: List[bool] = []
        flipped = dict(zip(self._impl.labels, self._flips))
        for label, size in self.sizes.items():
            names = splits.get(label, (label,))
            known = 1
            unknown = [n for n in names if n not in sizes_of]
            if len(unknown) > 1:
                raise ValueError(f"cannot infer the sizes of {unknown} when splitting {label!r}: give all but one")
            for n in names:
                known *= sizes_of.get(n, 1)
            if unknown:
                inferred, rest = divmod(size, known)
                if rest:
                    raise ValueError(f"dimension {label!r} of size {size} is not divisible into {names} "
                                     f"(the known sizes multiply to {known})")
                sizes_of[unknown[0]] = inferred
            elif known != size and names != (label,):
                raise ValueError(f"dimension {label!r} of size {size} cannot be split into {names} of sizes "
                                 f"{[sizes_of[n] for n in names]}")
            for n in names:
                dims.append((n, sizes_of.pop(n) if n in sizes_of else size))
                # The parts of a reversed dimension are each reversed.
                flips.append(flipped[label])
        if sizes_of:
            raise ValueError(f"sizes given for dimensions no split produces: {sorted(sizes_of)}")
        return Shape._of(self._impl.reshape(dims), flips)

    def size(self, dim: Union[None, str, Sequence[str]] = None) -> int:
        """The number of points (``dim=None``), or the product of the sizes
        of one dimension or of several."""
        if dim is None:
            return len(self)
        if isinstance(dim, str):
            if dim not in self.sizes:
                raise KeyError(f"{self} has no dimension {dim!r}")
            return self.sizes[dim]
        total = 1
        for d in dim:
            total *= self.size(d)
        return total

    @property
    def extent(self) -> "Extent":
        """The dimensions' names and sizes (without the ranks)."""
        return Extent(self.labels, list(self.sizes.values()))

    def point(self, position: int) -> "Point":
        """The point at a row-major position (0 .. len-1)."""
        coords, rank = self._impl.point_at(position)  # (also checks the position)
        if any(self._flips):
            rank = self._rank_at(coords)
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
        return isinstance(other, Shape) and self._impl == other._impl and self._flips == other._flips

    def __hash__(self) -> int:
        return hash((str(self._impl), self._flips))

    def __repr__(self) -> str:
        reversed_dims = self.reversed_dims
        return f"Shape({self._impl}" + (f", reversed: {', '.join(reversed_dims)})" if reversed_dims else ")")

    def __reduce__(self):
        return (_shape_from_state,
                (self._impl.labels, self._impl.offset, self._impl.sizes, self._impl.strides, self._flips))


class IndexOutOfRange(IndexError, ValueError):
    """An index past either end of a dimension: an IndexError as in Python
    (and Monarch), and a ValueError as castmesh raised before."""


def normalize_selector(name: str, sel: Any, size: int) -> Union[int, range]:
    """One selector for a dimension `name` of `size` indices, with Python's
    rules: a non-negative index, or the non-empty ``range(size)[s]`` of a
    slice (or range) ``s``. Raises as :meth:`Shape.select`."""
    if isinstance(sel, bool):
        raise TypeError(f"selector for {name!r} must be an int, slice or range, not bool")
    if isinstance(sel, (slice, range)):
        picked = range(size)[sel if isinstance(sel, slice) else slice(sel.start, sel.stop, sel.step)]
        if len(picked) == 0:
            raise ValueError(f"{_show(sel)} selects nothing from dimension {name!r} of size {size}")
        return picked
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


def _shape_from_state(labels: Sequence[str], offset: int, sizes: Sequence[int], strides: Sequence[int],
                      flips: Sequence[bool] = ()) -> Shape:
    impl = _castmesh.Shape.from_slice(list(labels), offset, list(sizes), list(strides))
    return Shape._of(impl, list(flips) or [False] * len(labels))


def shape_to_plain(shape: Shape) -> Tuple[Any, ...]:
    """`shape` as one flat tuple of numbers, strings and bools (plain data,
    which castmesh._serial pickles without cloudpickle): the offset, then
    each dimension's label, size, stride and whether it is reversed."""
    impl = shape._impl
    out: List[Any] = [impl.offset]
    for label, size, stride, flip in zip(impl.labels, impl.sizes, impl.strides, shape._flips):
        out += [label, size, stride, bool(flip)]
    return tuple(out)


def shape_from_plain(plain: Sequence[Any]) -> Shape:
    """The Shape of :func:`shape_to_plain`'s tuple."""
    dims = plain[1:]
    return _shape_from_state(dims[0::4], plain[0], dims[1::4], dims[2::4], dims[3::4])


class Extent(Mapping[str, int]):
    """Names and sizes of a mesh's dimensions (Monarch's Extent): a mapping
    from name to size, with ``labels``, ``sizes`` and ``nelements``."""

    __slots__ = ("labels", "sizes")

    def __init__(self, labels: Sequence[str], sizes: Sequence[int]) -> None:
        if len(labels) != len(sizes):
            raise ValueError(f"{len(labels)} names for {len(sizes)} sizes")
        self.labels = list(labels)
        self.sizes = list(sizes)

    @property
    def nelements(self) -> int:
        """The number of points."""
        total = 1
        for size in self.sizes:
            total *= size
        return total

    def __getitem__(self, label: str) -> int:
        try:
            return self.sizes[self.labels.index(label)]
        except ValueError:
            raise KeyError(label) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __repr__(self) -> str:
        return "Extent({" + ", ".join(f"{k!r}: {v}" for k, v in zip(self.labels, self.sizes)) + "})"


class MeshShapeOps:
    """Shape operations every mesh (ActorMesh, ProcMesh, ValueMesh) has, as
    Monarch's meshes do; the mesh gives ``shape`` and ``_with_shape``."""

    __slots__ = ()

    shape: Shape

    def _with_shape(self, shape: Shape) -> Any:
        raise NotImplementedError

    def flatten(self, name: str) -> Any:
        """The same members as one dimension ``name`` (see Shape.flatten)."""
        return self._with_shape(self.shape.flatten(name))

    def rename(self, **names: str) -> Any:
        """The same members with renamed dimensions (see Shape.rename)."""
        return self._with_shape(self.shape.rename(**names))

    def split(self, **kwargs: Any) -> Any:
        """The same members with split dimensions (see Shape.split)."""
        return self._with_shape(self.shape.split(**kwargs))

    def size(self, dim: Union[None, str, Sequence[str]] = None) -> int:
        """The number of members, or the size of one or several dimensions."""
        return self.shape.size(dim)

    @property
    def sizes(self) -> Dict[str, int]:
        """Size of each dimension by name."""
        return self.shape.sizes

    @property
    def extent(self) -> Extent:
        """The dimensions' names and sizes."""
        return self.shape.extent


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


class ValueMesh(MeshShapeOps, Generic[T]):
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

    def _with_shape(self, shape: Shape) -> "ValueMesh[T]":
        return ValueMesh(shape, self._values)

    def get(self, rank: int) -> T:
        """The value at row-major position ``rank`` (Monarch's
        ``ValueMesh.get``; negative counts from the end)."""
        return self[operator.index(rank)]

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

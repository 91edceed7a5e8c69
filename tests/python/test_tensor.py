"""castmesh.Tensor, castmesh.from_dlpack, empty/zeros: DLPack both ways
(versioned and legacy capsules), the buffer protocol, ownership, bad input.

NumPy is not a castmesh dependency: the tests that need it skip without it
(CI installs it so they run)."""

import array
import ctypes
import gc
import pickle
import sys
import weakref

import pytest

import castmesh
from castmesh import _castmesh

_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]


class CapsuleProducer:
    """Hands out one prepared capsule, as a producer's __dlpack__ would."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return self.capsule


class LegacyProducer:
    """A pre-1.0 producer: __dlpack__ knows only `stream`."""

    def __init__(self, tensor):
        self.tensor = tensor

    def __dlpack__(self, stream=None):
        return self.tensor.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()


# --- without NumPy ----------------------------------------------------------------


def test_zeros_and_empty():
    t = castmesh.zeros((2, 3), dtype="int32")
    assert isinstance(t, castmesh.Tensor)
    assert (t.shape, t.dtype, t.strides, t.ndim, t.size, t.itemsize, t.nbytes) == ((2, 3), "int32", (3, 1), 2, 6, 4, 24)
    assert t.tolist() == [[0, 0, 0], [0, 0, 0]]
    assert t.device == "cpu" and t.is_contiguous and not t.read_only and len(t) == 2
    assert t.data_ptr % 64 == 0
    assert castmesh.empty(4).shape == (4,) and castmesh.empty(4).dtype == "float32"
    assert castmesh.zeros([], "float64").tolist() == 0.0  # 0-d: a scalar
    assert castmesh.zeros(0, "bool").tolist() == []


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                                   "float16", "bfloat16", "float32", "float64", "bool"])
def test_every_dtype_allocates_and_round_trips(dtype):
    t = castmesh.zeros(3, dtype)
    assert t.dtype == dtype
    back = castmesh.from_dlpack(t)
    assert back.dtype == dtype and back.data_ptr == t.data_ptr
    legacy = castmesh.from_dlpack(LegacyProducer(t))
    assert legacy.dtype == dtype and legacy.data_ptr == t.data_ptr


def test_bad_allocations():
    with pytest.raises(TypeError, match="unknown castmesh dtype 'complex64'"):
        castmesh.zeros(2, "complex64")
    with pytest.raises(ValueError, match="shape\\[1\\] is -1"):
        castmesh.zeros((2, -1))
    with pytest.raises(ValueError, match="more than 2\\^63"):
        castmesh.zeros((1 << 40, 1 << 40))
    with pytest.raises(MemoryError):
        castmesh.zeros(1 << 62, "int8")
    with pytest.raises(TypeError, match="cannot read a castmesh dtype"):
        castmesh.zeros(2, 3.5)


def test_buffer_protocol_in_and_out():
    data = bytearray(b"\x01\x02\x03\x04")
    t = castmesh.from_dlpack(data)
    assert t.dtype == "uint8" and t.tolist() == [1, 2, 3, 4] and not t.read_only
    view = memoryview(t)
    view[0] = 9
    assert data[0] == 9  # zero-copy both ways
    assert view.format == "B" and view.shape == (4,)

    doubles = array.array("d", [1.5, 2.5, 3.5, 4.5])
    strided = castmesh.from_dlpack(memoryview(doubles)[::2])
    assert strided.tolist() == [1.5, 3.5] and strided.strides == (2,) and not strided.is_contiguous

    as_memory = memoryview(castmesh.zeros((2, 3), "float32"))
    assert as_memory.format == "f" and as_memory.strides == (12, 4) and as_memory.nbytes == 24


@pytest.mark.parametrize("code", "bBhHiIlLqQfd")
def test_buffer_formats_name_their_dtype(code):
    numbers = array.array(code, [1, 2, 3])
    t = castmesh.from_dlpack(numbers)  # the buffer protocol: array.array has no __dlpack__
    kind = "float" if code in "fd" else "uint" if code.isupper() else "int"
    assert t.dtype == f"{kind}{8 * numbers.itemsize}" and t.tolist() == [1, 2, 3]


def test_buffer_formats_with_a_byte_order_prefix():
    # ctypes arrays export explicit little-endian formats ("<i", "<d", "<?").
    ints = (ctypes.c_int32 * 3)(1, -2, 3)
    assert memoryview(ints).format == "<i"
    assert castmesh.from_dlpack(ints).dtype == "int32" and castmesh.from_dlpack(ints).tolist() == [1, -2, 3]
    assert castmesh.from_dlpack((ctypes.c_double * 2)(0.5, 1.5)).tolist() == [0.5, 1.5]
    flags = castmesh.from_dlpack((ctypes.c_bool * 2)(True, False))
    assert flags.dtype == "bool" and flags.tolist() == [True, False]
    if sys.byteorder == "little":  # a foreign byte order is refused, not misread
        with pytest.raises(BufferError, match="buffer format"):
            castmesh.from_dlpack((ctypes.c_int32.__ctype_be__ * 2)(1, 2))


def test_read_only_buffers():
    t = castmesh.from_dlpack(b"abc")
    assert t.read_only
    with pytest.raises(TypeError):
        memoryview(t)[0] = 1  # read-only memoryview
    with pytest.raises(BufferError, match="read-only"):
        _castmesh.as_tensor(b"abc", writable=True)
    assert _castmesh.as_tensor(bytearray(3), writable=True).tolist() == [0, 0, 0]


def test_not_an_array():
    with pytest.raises(TypeError, match="has neither __dlpack__ nor the buffer protocol"):
        castmesh.from_dlpack(object())
    with pytest.raises(BufferError, match="buffer format"):
        castmesh.from_dlpack(memoryview(array.array("u", "ab")))  # wchar_t is not a numeric dtype
    with pytest.raises(TypeError, match="not an unconsumed"):
        castmesh.from_dlpack(CapsuleProducer("not a capsule"))


def test_bfloat16_has_no_buffer_format_but_dlpacks():
    t = castmesh.zeros(2, "bfloat16")
    with pytest.raises(BufferError):
        memoryview(t)
    assert castmesh.from_dlpack(t).tolist() == [0.0, 0.0]


@pytest.mark.skipif(sys.version_info < (3, 12), reason="a Python class offers the buffer protocol (__buffer__) from 3.12 on")
def test_a_buffer_that_refuses_cpu_access_falls_back_to_dlpack():
    # CuPy arrays have a buffer slot that raises TypeError (no CPU access);
    # castmesh must then import them through __dlpack__ instead of failing.
    backing = castmesh.zeros(3)

    class DeviceLike:
        def __buffer__(self, flags):
            raise TypeError("no CPU access to this array")

        def __dlpack__(self, **kwargs):
            return backing.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return backing.__dlpack_device__()

    assert castmesh.from_dlpack(DeviceLike()).data_ptr == backing.data_ptr


def test_capsule_names_and_single_consumption():
    t = castmesh.zeros(3)
    versioned = t.__dlpack__(max_version=(1, 0))
    assert _capsule_name(versioned) == b"dltensor_versioned"
    legacy = t.__dlpack__()
    assert _capsule_name(legacy) == b"dltensor"
    assert castmesh.from_dlpack(CapsuleProducer(versioned)).data_ptr == t.data_ptr
    assert _capsule_name(versioned) == b"used_dltensor_versioned"
    castmesh.from_dlpack(CapsuleProducer(legacy))
    assert _capsule_name(legacy) == b"used_dltensor"
    with pytest.raises(TypeError, match="unconsumed"):
        castmesh.from_dlpack(CapsuleProducer(versioned))  # a capsule is consumed once


def test_dlpack_export_options():
    t = castmesh.zeros(2, "int16")
    assert t.__dlpack_device__() == (1, 0)
    t.__dlpack__(max_version=(1, 0), dl_device=(1, 0))
    with pytest.raises(BufferError, match="cannot be exported to DLPack device \\(2, 0\\)"):
        t.__dlpack__(max_version=(1, 0), dl_device=(2, 0))
    copied = castmesh.from_dlpack(CapsuleProducer(t.__dlpack__(max_version=(1, 0), copy=True)))
    assert copied.data_ptr != t.data_ptr and copied.tolist() == [0, 0]


def test_read_only_tensor_refuses_legacy_export():
    t = castmesh.from_dlpack(b"xy")
    with pytest.raises(BufferError, match="legacy DLPack capsule"):
        t.__dlpack__()
    assert castmesh.from_dlpack(CapsuleProducer(t.__dlpack__(max_version=(1, 0)))).read_only
    assert not castmesh.from_dlpack(CapsuleProducer(t.__dlpack__(copy=True))).read_only


def test_views_keep_their_source_alive():
    class Owner(bytearray):  # bytearray itself has no weak references
        pass

    source = Owner(b"\x07" * 8)
    alive = weakref.ref(source)
    t = castmesh.from_dlpack(source)
    capsule = t.__dlpack__(max_version=(1, 0))
    del source, t
    gc.collect()
    assert alive() is not None  # the unconsumed capsule holds the export, which holds the source
    del capsule  # its destructor calls the deleter (exactly once; twice would crash)
    gc.collect()
    assert alive() is None


def test_repr():
    assert repr(castmesh.zeros(2, "int8")) == "castmesh.Tensor([0, 0], dtype='int8')"
    assert repr(castmesh.zeros((100, 2))) == "castmesh.Tensor(shape=(100, 2), dtype='float32')"
    assert repr(castmesh.from_dlpack(b"a")) == "castmesh.Tensor([97], dtype='uint8', read_only=True)"


def test_pickle_round_trip():
    t = castmesh.from_dlpack(array.array("i", [1, 2, 3, 4, 5, 6]))
    back = pickle.loads(pickle.dumps(t))
    assert (back.dtype, back.shape, back.tolist()) == ("int32", (6,), [1, 2, 3, 4, 5, 6])
    assert back.data_ptr != t.data_ptr and not back.read_only
    strided = castmesh.from_dlpack(memoryview(array.array("h", range(6)))[::-2])
    assert pickle.loads(pickle.dumps(strided)).tolist() == [5, 3, 1]
    assert pickle.loads(pickle.dumps(castmesh.zeros((0, 3), "bfloat16"))).shape == (0, 3)
    assert pickle.loads(pickle.dumps(castmesh.zeros([], "float64"))).tolist() == 0.0
    with pytest.raises(ValueError, match="holds 3 bytes for 8"):
        castmesh.Tensor.__new__(castmesh.Tensor).__setstate__(("int32", [2], b"abc"))


# --- with NumPy ---------------------------------------------------------------------


def _np():
    return pytest.importorskip("numpy")


def _address(a):
    return a.__array_interface__["data"][0]


def test_numpy_into_castmesh_is_zero_copy():
    np = _np()
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = castmesh.from_dlpack(a)
    assert t.data_ptr == _address(a) and t.shape == (3, 4) and t.strides == (4, 1)
    a[0, 0] = 42
    assert t.tolist()[0][0] == 42.0
    transposed = castmesh.from_dlpack(a.T)
    assert transposed.strides == (1, 4) and transposed.tolist() == a.T.tolist()
    reversed_rows = castmesh.from_dlpack(a[::-1])
    assert reversed_rows.strides == (-4, 1) and reversed_rows.tolist() == a[::-1].tolist()


@pytest.mark.parametrize("legacy", [False, True])
def test_castmesh_into_numpy_is_zero_copy(legacy):
    np = _np()
    t = castmesh.zeros((2, 3), "int64")
    a = np.from_dlpack(LegacyProducer(t) if legacy else t)
    assert _address(a) == t.data_ptr
    assert a.dtype == np.int64 and a.shape == (2, 3)
    # NumPy marks arrays from legacy capsules read-only (they cannot say).
    assert a.flags.writeable == (not legacy)
    memoryview(t).cast("B").cast("q", (2, 3))[1, 2] = 7
    assert a[1, 2] == 7
    b = np.from_dlpack(t)
    assert np.shares_memory(a, b)


def test_numpy_round_trip_of_every_dtype():
    np = _np()
    for name in ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
                 "float64", "bool"]:
        a = (np.arange(5) % 2).astype(name)
        t = castmesh.from_dlpack(a)
        assert t.dtype == name
        assert t.tolist() == a.tolist()
        back = np.from_dlpack(t)
        assert back.dtype == a.dtype and np.shares_memory(a, back)
        assert np.array_equal(np.asarray(memoryview(t)), a)


def test_float16_values_convert_exactly():
    np = _np()
    values = np.array([0.0, -0.0, 1.0, -2.5, 65504.0, 6.1e-5, 6e-8, np.inf, -np.inf], dtype=np.float16)
    assert castmesh.from_dlpack(values).tolist() == values.astype(np.float64).tolist()
    assert np.isnan(castmesh.from_dlpack(np.array([np.nan], dtype=np.float16)).tolist()[0])


def test_read_only_numpy_arrays():
    np = _np()
    a = np.arange(4.0)
    a.flags.writeable = False
    t = castmesh.from_dlpack(a)
    assert t.read_only and t.data_ptr == _address(a)
    assert not np.from_dlpack(t).flags.writeable  # numpy >= 2 reads the versioned flag
    with pytest.raises(BufferError, match="read-only"):
        _castmesh.as_tensor(a, writable=True)


def test_numpy_array_lifetime_follows_the_view():
    np = _np()
    a = np.ones(16)
    alive = weakref.ref(a)
    t = castmesh.from_dlpack(a)
    del a
    gc.collect()
    assert alive() is not None and t.tolist() == [1.0] * 16
    b = np.from_dlpack(t)
    del t
    gc.collect()
    assert alive() is not None and b.sum() == 16.0  # b -> castmesh export -> view -> a
    del b
    gc.collect()
    assert alive() is None


def test_numpy_copy_request():
    np = _np()
    t = castmesh.zeros(3, "int32")
    c = np.from_dlpack(t, copy=True)
    assert _address(c) != t.data_ptr
    assert _address(np.from_dlpack(t, copy=False)) == t.data_ptr


def test_as_tensor_of_numpy_without_importing_it_here():
    np = _np()
    a = np.zeros((2, 2), dtype=np.uint16)
    t = _castmesh.as_tensor(a, writable=True)
    assert t.data_ptr == _address(a) and t.dtype == "uint16"

"""The Arrow PyCapsule Interface of memcuda.Tensor, read by a consumer written
here from the Arrow specification (ctypes and PyCapsule_GetPointer, no Arrow
library); pyarrow imports a host tensor where it is installed; a cuda tensor's
export carries the device and a sync event (GPU hosts)."""
from __future__ import annotations

import ctypes
import gc

import numpy as np
import pytest

import memcuda

try:
    import pyarrow
except ImportError:  # pragma: no cover - depends on the machine
    pyarrow = None
needs_pyarrow = pytest.mark.skipif(pyarrow is None, reason="pyarrow is not installed")


# ---- the specification's structs, and a capsule consumer -------------------
class Schema(ctypes.Structure):
    pass


Schema._fields_ = [("format", ctypes.c_char_p), ("name", ctypes.c_char_p), ("metadata", ctypes.c_void_p),
                   ("flags", ctypes.c_int64), ("n_children", ctypes.c_int64),
                   ("children", ctypes.POINTER(ctypes.POINTER(Schema))), ("dictionary", ctypes.c_void_p),
                   ("release", ctypes.c_void_p), ("private_data", ctypes.c_void_p)]


class Array(ctypes.Structure):
    pass


Array._fields_ = [("length", ctypes.c_int64), ("null_count", ctypes.c_int64), ("offset", ctypes.c_int64),
                  ("n_buffers", ctypes.c_int64), ("n_children", ctypes.c_int64),
                  ("buffers", ctypes.POINTER(ctypes.c_void_p)), ("children", ctypes.POINTER(ctypes.POINTER(Array))),
                  ("dictionary", ctypes.c_void_p), ("release", ctypes.c_void_p), ("private_data", ctypes.c_void_p)]


class DeviceArray(ctypes.Structure):
    _fields_ = [("array", Array), ("device_id", ctypes.c_int64), ("device_type", ctypes.c_int32),
                ("sync_event", ctypes.c_void_p), ("reserved", ctypes.c_int64 * 3)]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_release_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def take(capsule, name: bytes, struct):
    """The struct a capsule holds (PyCapsule_GetPointer raises ValueError for another name)."""
    return struct.from_address(_get_pointer(capsule, name))


def release(struct) -> None:
    _release_t(struct.release)(ctypes.addressof(struct))


def move(src, struct):
    """The specification's move: a bitwise copy; the source then reads released."""
    dst = struct()
    ctypes.memmove(ctypes.addressof(dst), ctypes.addressof(src), ctypes.sizeof(struct))
    inner = src.array if struct is DeviceArray else src
    inner.release = None
    return dst


def metadata(schema) -> dict:
    """Arrow's metadata encoding: int32 count, then int32-length-prefixed keys and values."""
    out, p = {}, schema.metadata
    n = ctypes.c_int32.from_address(p).value
    p += 4
    for _ in range(n):
        kv = []
        for _ in range(2):
            size = ctypes.c_int32.from_address(p).value
            kv.append(ctypes.string_at(p + 4, size).decode())
            p += 4 + size
        out[kv[0]] = kv[1]
    return out


def refcount(reg, name: str) -> int:
    gc.collect()
    reg.flush()
    return reg.info(name).refcount


# ---- host tensors ------------------------------------------------------------
def test_device_array_capsules_read_moved_and_released(reg):
    src = np.arange(12, dtype=np.int32).reshape(3, 4) * 3 - 5
    reg.put("a.x", src, persistent=True).release()
    t = reg.get("a.x")
    schema_cap, array_cap = t.__arrow_c_device_array__()
    s = take(schema_cap, b"arrow_schema", Schema)
    d = take(array_cap, b"arrow_device_array", DeviceArray)
    assert s.format == b"i" and s.name == b"a.x" and s.n_children == 0 and s.flags == 0
    assert metadata(s) == {"memcuda.dtype": "i32", "memcuda.shape": "[3,4]"}
    a = d.array
    assert d.device_type == 1 and d.device_id == 0 and d.sync_event is None
    assert (a.length, a.null_count, a.offset, a.n_buffers, a.n_children) == (12, 0, 0, 2, 0)
    assert a.buffers[0] is None and a.buffers[1] == t.data_ptr  # zero copy
    values = np.ctypeslib.as_array((ctypes.c_int32 * 12).from_address(a.buffers[1]))
    assert np.array_equal(values, src.ravel())

    moved, moved_schema = move(d, DeviceArray), move(s, Schema)
    del t, schema_cap, array_cap, s, d, a, values  # the capsules' destructors: released structs, so no-ops
    assert refcount(reg, "a.x") == 2  # the name's, and the moved array's share
    release(moved.array)
    release(moved_schema)
    assert moved.array.release is None and moved_schema.release is None
    assert refcount(reg, "a.x") == 1


def test_unconsumed_capsules_release_on_collection(reg):
    reg.put("a.u", np.ones(8, dtype=np.float32), persistent=True).release()
    t = reg.get("a.u")
    caps = t.__arrow_c_device_array__()
    del t
    assert refcount(reg, "a.u") == 2
    del caps
    assert refcount(reg, "a.u") == 1


def test_schema_dtypes_list_request_and_kwargs(reg):
    expect = {"bool": b"C", "u8": b"C", "i8": b"c", "i16": b"s", "i64": b"l", "u16": b"S", "u32": b"I",
              "u64": b"L", "f16": b"e", "bf16": b"w:2", "f32": b"f", "f64": b"g"}
    for dt, fmt in expect.items():
        t = reg.create("a.dt." + dt, (2, 3), dt)
        cap = t.__arrow_c_schema__()  # the capsule owns the struct: keep it while reading
        s = take(cap, b"arrow_schema", Schema)
        assert s.format == fmt, dt
        assert metadata(s)["memcuda.dtype"] == dt

    t = reg.create("a.l", (2, 3), "f32")
    # A requested fixed-size list ("+w:3") is honoured; the capsule holds a schema with no release.
    req = Schema(format=b"+w:3")
    scap, acap = t.__arrow_c_device_array__(requested_schema=_new_capsule(ctypes.addressof(req), b"arrow_schema",
                                                                          None))
    s, d = take(scap, b"arrow_schema", Schema), take(acap, b"arrow_device_array", DeviceArray)
    assert s.format == b"+w:3" and s.n_children == 1 and s.children[0].contents.format == b"f"
    assert d.array.length == 2 and d.array.n_buffers == 1 and d.array.children[0].contents.length == 6
    assert d.array.children[0].contents.buffers[1] == t.data_ptr

    t.__arrow_c_device_array__(some_future_keyword=None)  # keywords defaulting to None are accepted
    with pytest.raises(NotImplementedError):
        t.__arrow_c_device_array__(some_future_keyword=1)
    with pytest.raises(TypeError):
        t.__arrow_c_device_array__(requested_schema=t.__arrow_c_device_array__()[1])  # not a schema capsule


def test_arrow_array_capsule_of_a_host_tensor(reg):
    reg.put("a.c", np.arange(5, dtype=np.float64), persistent=True).release()
    t = reg.get("a.c")
    scap, acap = t.__arrow_c_array__()
    with pytest.raises(ValueError):
        take(acap, b"arrow_device_array", DeviceArray)  # the CPU-only protocol's capsule name
    a = take(acap, b"arrow_array", Array)
    assert take(scap, b"arrow_schema", Schema).format == b"g" and a.length == 5
    assert list((ctypes.c_double * 5).from_address(a.buffers[1])) == [0.0, 1.0, 2.0, 3.0, 4.0]
    del t
    assert refcount(reg, "a.c") == 2
    del scap, acap, a
    assert refcount(reg, "a.c") == 1


@needs_pyarrow
def test_pyarrow_imports_a_host_tensor(reg):
    _pyarrow_imports(reg)


def _pyarrow_imports(reg):
    reg.put("a.pa", np.arange(10, dtype=np.int64) * 2, persistent=True).release()
    t = reg.get("a.pa")
    a = pyarrow.array(t)  # __arrow_c_device_array__ or __arrow_c_array__, by pyarrow's version
    assert a.type == pyarrow.int64() and a.to_pylist() == list(range(0, 20, 2))
    assert a.buffers()[1].address == t.data_ptr  # zero copy
    del t
    assert refcount(reg, "a.pa") == 2  # pyarrow's array holds the export's share
    del a
    assert refcount(reg, "a.pa") == 1


def _pyarrow_array_shared_by_name(reg):
    """A pyarrow Array over shareable memory, registered by name without a
    copy (Registry.share through __arrow_c_array__), read back through the
    registry; pyarrow's buffer stays alive until the last reference goes."""
    import weakref
    buf = memcuda.shareable_empty((100,), "f64", like="numpy")
    buf[:] = np.arange(100)
    a = pyarrow.Array.from_buffers(pyarrow.float64(), 90, [None, pyarrow.py_buffer(buf)], offset=10)
    h = reg.share("a.imported", a)
    assert h.data_ptr == buf.ctypes.data + 80 and h.shape == (90,)  # no copy
    back = np.from_dlpack(reg.get("a.imported"))
    assert back.tolist() == list(range(10, 100))
    ref = weakref.ref(a)
    del a, back, h
    gc.collect()
    assert ref() is None  # pyarrow's Array object went; the registry holds its exported array
    reg.flush()
    from conftest import wait_for
    # The last reference went: the record, and the borrowed array with it.
    wait_for(lambda: not reg.list("a.imported"), what="the borrowed record to go")


@needs_pyarrow
def test_pyarrow_array_shared_by_name(reg):
    _pyarrow_array_shared_by_name(reg)


# ---- cuda tensors (GPU hosts) ------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(pyarrow is None, reason="pyarrow is not installed")
def test_gpu_host_pyarrow_imports_a_host_tensor(reg):
    _pyarrow_imports(reg)


@pytest.mark.gpu
@pytest.mark.skipif(pyarrow is None, reason="pyarrow is not installed")
def test_gpu_host_pyarrow_array_shared_by_name(reg):
    _pyarrow_array_shared_by_name(reg)


@pytest.mark.gpu
@pytest.mark.skipif(not memcuda.has_cuda(), reason="libmemcuda_c was built without the CUDA backend")
def test_gpu_cuda_tensor_exports_device_and_sync_event(redis_url, namespace):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    with memcuda.Registry(redis_url, namespace, default_backend="cuda") as greg:
        src = torch.arange(64, dtype=torch.float32, device="cuda")
        t = greg.put("a.g", src, persistent=True)  # copied and published on torch's current stream
        cap = t.__arrow_c_schema__()
        assert take(cap, b"arrow_schema", Schema).format == b"f"
        scap, acap = t.__arrow_c_device_array__()
        d = take(acap, b"arrow_device_array", DeviceArray)
        assert d.device_type == 2 and d.device_id == t.device
        assert d.array.buffers[1] == t.data_ptr
        assert d.sync_event is not None  # put published its copy
        assert ctypes.c_void_p.from_address(d.sync_event).value  # a cudaEvent_t
        t.release()
        assert refcount(greg, "a.g") == 2
        del scap, acap, d
        assert refcount(greg, "a.g") == 1

"""The Arrow PyCapsule Interface of memcuda.Tensor: ``__arrow_c_schema__``,
``__arrow_c_device_array__`` and (host tensors) ``__arrow_c_array__``, over
the C ABI's ``memcuda_tensor_to_arrow``. Zero copy: the array's data buffer is
the tensor's memory, and the array holds its own share of the reference
until its release callback runs (the consumer's, or the capsule's destructor
when the capsule is collected unconsumed). docs/interop.md has the rules.

    import pyarrow as pa
    a = pa.array(reg.get("col"))                     # a host tensor, as a pyarrow Array
    schema, array = t.__arrow_c_device_array__()     # any tensor: capsules for cuDF & co.
"""
from __future__ import annotations

import ctypes
from typing import Any, Optional, Tuple

from ._lib import lib
from .errors import InvalidArgument, check
from .tensor import _api, _PyCapsule_New
from .tensor import _PyCapsule_GetPointer as _PyCapsule_GetPointer_addr
from .tensor import _PyCapsule_IsValid as _PyCapsule_IsValid_addr

# memcuda_tensor_to_arrow flags (include/memcuda/c/arrow.h)
FIXED_SIZE_LIST, STRICT_TYPES, OPENED_EVENT = 1, 2, 4
ARROW_DEVICE_CPU, ARROW_DEVICE_CUDA = 1, 2

_release_schema_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_release_array_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class ArrowSchema(ctypes.Structure):
    """The Arrow C Data Interface's struct ArrowSchema."""


ArrowSchema._fields_ = [
    ("format", ctypes.c_char_p),
    ("name", ctypes.c_char_p),
    ("metadata", ctypes.c_void_p),  # binary: int32 lengths, not a C string
    ("flags", ctypes.c_int64),
    ("n_children", ctypes.c_int64),
    ("children", ctypes.POINTER(ctypes.POINTER(ArrowSchema))),
    ("dictionary", ctypes.POINTER(ArrowSchema)),
    ("release", _release_schema_t),
    ("private_data", ctypes.c_void_p),
]


class ArrowArray(ctypes.Structure):
    """The Arrow C Data Interface's struct ArrowArray."""


ArrowArray._fields_ = [
    ("length", ctypes.c_int64),
    ("null_count", ctypes.c_int64),
    ("offset", ctypes.c_int64),
    ("n_buffers", ctypes.c_int64),
    ("n_children", ctypes.c_int64),
    ("buffers", ctypes.POINTER(ctypes.c_void_p)),
    ("children", ctypes.POINTER(ctypes.POINTER(ArrowArray))),
    ("dictionary", ctypes.POINTER(ArrowArray)),
    ("release", _release_array_t),
    ("private_data", ctypes.c_void_p),
]


class ArrowDeviceArray(ctypes.Structure):
    """The Arrow C Device Data Interface's struct ArrowDeviceArray."""
    _fields_ = [
        ("array", ArrowArray),
        ("device_id", ctypes.c_int64),
        ("device_type", ctypes.c_int32),
        ("sync_event", ctypes.c_void_p),
        ("reserved", ctypes.c_int64 * 3),
    ]


_to_arrow = lib.memcuda_tensor_to_arrow
_to_arrow.restype = ctypes.c_int
_to_arrow.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.POINTER(ArrowSchema), ctypes.POINTER(ArrowDeviceArray)]

# ---- capsules ----------------------------------------------------------------
# Each capsule owns a struct allocated with PyMem_RawCalloc. Its destructor
# calls the struct's release callback unless a consumer moved the struct out
# (and so set release to NULL), then frees it. Destructors run with the GIL
# held and call the Python C API directly (PYFUNCTYPE), as the DLPack
# capsule's do (tensor.py, whose functions taking a capsule's address they share).
_PyCapsule_IsValid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_PyCapsule_GetPointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api))
_calloc = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)(("PyMem_RawCalloc", _api))
_free = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)(("PyMem_RawFree", _api))

SCHEMA, ARRAY, DEVICE_ARRAY = b"arrow_schema", b"arrow_array", b"arrow_device_array"
for _n in (SCHEMA, ARRAY, DEVICE_ARRAY):  # a capsule keeps a pointer to its name: never freed
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(_n))


def _destructor(name: bytes, struct: Any) -> Any:
    ptr_t = ctypes.POINTER(struct)

    # Default arguments keep what the destructor needs reachable while the
    # interpreter tears the module down.
    def destroy(capsule: int, _valid=_PyCapsule_IsValid_addr, _get=_PyCapsule_GetPointer_addr, _cast=ctypes.cast,
                _ptr=ptr_t, _free=_free, _name=name) -> None:
        if not _valid(capsule, _name):
            return
        p = _get(capsule, _name)
        base = _cast(p, _ptr).contents
        inner = base.array if hasattr(base, "array") else base  # a device array's release is its ArrowArray's
        if inner.release:
            inner.release(p)  # queues the reference's release only: no network I/O here
        _free(p)

    cb = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(destroy)
    # A capsule may outlive this module: the callback is never freed.
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(cb))
    return cb, ctypes.cast(cb, ctypes.c_void_p)


_DESTRUCTORS = {name: _destructor(name, s) for name, s in
                ((SCHEMA, ArrowSchema), (ARRAY, ArrowArray), (DEVICE_ARRAY, ArrowDeviceArray))}


def _new_capsule(name: bytes, struct: Any) -> Tuple[Any, int]:
    """A capsule owning a zeroed (so released) struct; the struct's address."""
    addr = _calloc(1, ctypes.sizeof(struct))
    if not addr:
        raise MemoryError(f"cannot allocate an Arrow {struct.__name__}")
    try:
        return _PyCapsule_New(addr, name, _DESTRUCTORS[name][1]), addr
    except BaseException:
        _free(addr)
        raise


def _requested_flags(requested_schema: Any, flags: int) -> int:
    """Best effort, as the PyCapsule Interface asks: a requested fixed-size
    list ("+w:<n>") gets one; any other request gets the default layout."""
    if requested_schema is None:
        return flags
    if not _PyCapsule_IsValid(requested_schema, SCHEMA):
        raise TypeError("requested_schema is not an \"arrow_schema\" capsule")
    s = ctypes.cast(_PyCapsule_GetPointer(requested_schema, SCHEMA), ctypes.POINTER(ArrowSchema)).contents
    if s.format and s.format.startswith(b"+w:"):
        flags |= FIXED_SIZE_LIST
    return flags


def schema_capsule(handle: int, flags: int = 0) -> Any:
    """An "arrow_schema" capsule describing the tensor (no reference, no I/O)."""
    cap, addr = _new_capsule(SCHEMA, ArrowSchema)
    check(_to_arrow(handle, flags, ctypes.cast(addr, ctypes.POINTER(ArrowSchema)), None))
    return cap


def device_array_capsules(handle: int, flags: int = 0, requested_schema: Any = None) -> Tuple[Any, Any]:
    """("arrow_schema", "arrow_device_array") capsules viewing the tensor; the
    array holds a share of the reference until it is released."""
    flags = _requested_flags(requested_schema, flags)
    scap, saddr = _new_capsule(SCHEMA, ArrowSchema)
    acap, aaddr = _new_capsule(DEVICE_ARRAY, ArrowDeviceArray)
    check(_to_arrow(handle, flags, ctypes.cast(saddr, ctypes.POINTER(ArrowSchema)),
                    ctypes.cast(aaddr, ctypes.POINTER(ArrowDeviceArray))))
    return scap, acap


def array_capsules(handle: int, flags: int = 0, requested_schema: Any = None) -> Tuple[Any, Any]:
    """("arrow_schema", "arrow_array") capsules of a host tensor: the device
    array's ArrowArray moved into a capsule of its own (the specification's
    move: bitwise copy, then the source reads released)."""
    scap, dcap = device_array_capsules(handle, flags, requested_schema)
    d = ctypes.cast(_PyCapsule_GetPointer(dcap, DEVICE_ARRAY), ctypes.POINTER(ArrowDeviceArray)).contents
    if d.device_type != ARROW_DEVICE_CPU:
        raise InvalidArgument("__arrow_c_array__ is for host tensors (CPU memory); use __arrow_c_device_array__ "
                              "for a cuda tensor")
    acap, aaddr = _new_capsule(ARRAY, ArrowArray)
    ctypes.memmove(aaddr, ctypes.addressof(d.array), ctypes.sizeof(ArrowArray))
    d.array.release = _release_array_t()  # moved: dcap's destructor only frees its struct
    return scap, acap


def check_kwargs(kwargs: dict) -> None:
    """The PyCapsule Interface: keywords it may add later default to None; a
    non-None one this producer does not know is refused."""
    unknown = [k for k, v in kwargs.items() if v is not None]
    if unknown:
        raise NotImplementedError(f"unsupported keyword argument(s): {unknown}")


def struct_of(capsule: Any, name: bytes, struct: Any) -> Optional[Any]:
    """The struct a capsule holds (for tests and consumers written in Python)."""
    if not _PyCapsule_IsValid(capsule, name):
        return None
    return ctypes.cast(_PyCapsule_GetPointer(capsule, name), ctypes.POINTER(struct)).contents

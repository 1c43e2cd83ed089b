"""Borrowed tensors: share a tensor this process already has by name, without a copy.

``Registry.share(name, tensor)`` registers the memory of anything with
``__dlpack__`` (a torch tensor, a NumPy array, a CuPy array), or with the
Arrow PyCapsule interface (``__arrow_c_device_array__`` / ``__arrow_c_array__``:
a pyarrow Array, a cuDF column), as it is: no copy,
no new memory, ``data_ptr`` unchanged. The registry keeps the object alive
until the last reference anywhere is released (or this process exits). The
tensor is *borrowed*: it lives only as long as this process; after it exits,
other processes' next ``get`` raises ``Lost``. Copy it with ``put`` instead
when readers must outlive the producer (docs/python.md, "Borrow or copy").

What can be borrowed: CUDA memory of ``cudaMalloc`` (PyTorch's caching
allocator included, and its expandable segments by their cuMem fd), and host memory in a
``MAP_SHARED`` mapping of a memfd, which ``shareable_empty`` allocates for a
framework. Ordinary host tensors (malloc'd) cannot be shared without a copy:
``share`` raises ``InvalidArgument`` saying so.
"""
from __future__ import annotations

import atexit
import ctypes
import mmap
import os
from typing import Any, Dict, Mapping, Sequence

from . import dtypes
from ._lib import lib
from .errors import InvalidArgument, check
from .tensor import Tensor

_capsule_get = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get.restype = ctypes.c_void_p
_capsule_get.argtypes = [ctypes.py_object, ctypes.c_char_p]
# What is still borrowed at exit is leaked, not released: the registry's
# threads would otherwise run DLPack deleters and Arrow release callbacks
# (Python code, the GIL) while the interpreter tears down, and crash it.
atexit.register(lib.memcuda_stop_callbacks)
_capsule_rename = ctypes.pythonapi.PyCapsule_SetName
_capsule_rename.restype = ctypes.c_int
_capsule_rename.argtypes = [ctypes.py_object, ctypes.c_char_p]


def share(reg: Any, name: str, data: Any, *, persistent: bool = False) -> Tensor:
    """Registers ``data`` (anything with ``__dlpack__``, else with the Arrow
    PyCapsule interface) under ``name`` without a copy and returns this
    process's handle. The registry holds ``data`` (through its DLPack capsule,
    or the Arrow array it moved out of its capsule) until the last reference
    anywhere goes."""
    if persistent:
        raise InvalidArgument("share: persistent=True is not offered from Python yet (remove() would have to "
                              "drop the Python object); hold the returned handle instead")
    if not hasattr(data, "__dlpack__"):
        if hasattr(data, "__arrow_c_device_array__") or hasattr(data, "__arrow_c_array__"):
            return _share_arrow(reg, name, data)
        raise InvalidArgument(f"share: {type(data).__name__} has neither __dlpack__ (a torch tensor, a NumPy or "
                              "CuPy array) nor __arrow_c_device_array__ / __arrow_c_array__ (a pyarrow Array); "
                              "copy it with put() instead")
    capsule = data.__dlpack__()
    ptr = _capsule_get(capsule, b"dltensor")
    # The C library owns the DLManagedTensor from here (its deleter runs when
    # the registry lets go): the capsule must not call it.
    if _capsule_rename(capsule, b"used_dltensor") != 0:
        raise InvalidArgument("share: cannot take over the DLPack capsule")
    h = ctypes.c_void_p()
    check(lib.memcuda_share_dlpack(reg._handle(), name.encode(), ptr, None, ctypes.byref(h)))
    return Tensor(h.value)


def share_state_dict(reg: Any, prefix: str, state_dict: Mapping[str, Any]) -> Dict[str, Tensor]:
    """``share`` of every entry under ``prefix + key`` in one Redis round trip,
    all or nothing; keys without the prefix. Each value needs ``__dlpack__``."""
    items = list(state_dict.items())
    for key, value in items:
        if not hasattr(value, "__dlpack__"):
            raise InvalidArgument(f"share_state_dict: '{key}' ({type(value).__name__}) has no __dlpack__; copy the "
                                  "dict with put_state_dict() instead")
    n = len(items)
    names = (ctypes.c_char_p * n)(*[(prefix + key).encode() for key, _ in items])
    ptrs = (ctypes.c_void_p * n)()
    capsules = []
    for i, (_, value) in enumerate(items):
        capsule = value.__dlpack__()
        ptrs[i] = _capsule_get(capsule, b"dltensor")
        capsules.append(capsule)
    # The C library owns every DLManagedTensor from here, failures included.
    for capsule in capsules:
        if _capsule_rename(capsule, b"used_dltensor") != 0:
            raise InvalidArgument("share_state_dict: cannot take over a DLPack capsule")
    out = (ctypes.c_void_p * n)()
    check(lib.memcuda_share_many_dlpack(reg._handle(), names, ptrs, n, None, out))
    return {key: Tensor(out[i]) for i, (key, _) in enumerate(items)}


def _share_arrow(reg: Any, name: str, data: Any) -> Tensor:
    """The Arrow form: the C library moves the array out of its capsule (the
    capsule's struct then reads released, so its destructor releases nothing)
    and calls the array's release once the last reference goes; the schema is
    only read (its capsule releases it)."""
    if hasattr(data, "__arrow_c_device_array__"):
        schema, array = data.__arrow_c_device_array__()
        array_ptr, fn = _capsule_get(array, b"arrow_device_array"), lib.memcuda_share_arrow
    else:
        schema, array = data.__arrow_c_array__()
        array_ptr, fn = _capsule_get(array, b"arrow_array"), lib.memcuda_share_arrow_array
    schema_ptr = _capsule_get(schema, b"arrow_schema")
    h = ctypes.c_void_p()
    check(fn(reg._handle(), name.encode(), schema_ptr, array_ptr, None, ctypes.byref(h)))
    return Tensor(h.value)


def shareable_empty(shape: Sequence[int], dtype: dtypes.DType = "f32", *, like: str = "torch") -> Any:
    """A host tensor (``like="torch"``) or NumPy array (``like="numpy"``) whose
    memory is a memfd mapped ``MAP_SHARED``: ``Registry.share`` lends it to
    other processes without a copy, its ``data_ptr`` never changing. Contents
    are zeros. The mapping (and its fd) lives as long as the array does."""
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise InvalidArgument(f"shareable_empty: negative dimension in {dims}")
    code = dtypes.code_of(dtype)
    n = lib.memcuda_dtype_itemsize(code)
    for d in dims:
        n *= d
    if n == 0:
        raise InvalidArgument(f"shareable_empty: shape {dims} has no bytes")
    fd = os.memfd_create("memcuda-shareable", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, n)
        buf = mmap.mmap(fd, n, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)  # the mmap object keeps a dup of it: share() finds that one
    import numpy as np
    raw = np.frombuffer(buf, dtype=np.uint8)
    if like == "numpy":
        if dtypes.NUMPY[code] is None:
            raise InvalidArgument("shareable_empty: NumPy has no bfloat16; use like='torch'")
        return raw.view(np.dtype(dtypes.NUMPY[code])).reshape(dims)
    if like != "torch":
        raise InvalidArgument(f"shareable_empty: like={like!r}, expected 'torch' or 'numpy'")
    import torch
    return torch.from_numpy(raw).view(dtypes.torch_dtype(code)).reshape(dims)

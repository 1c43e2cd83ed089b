"""Zero-copy torch views straight from a C array of handles, for
``Registry.get_state_dict(prefix, framework="torch")`` and
``tensor.torch_views``: no ``Tensor`` object per tensor.

One ``memcuda_tensors_fields`` call reads every handle's fields; each
allocation (a packed dict is one) gets one DLPack span export, one import
and an ``as_strided`` view per tensor (per-tensor Python work dominates a
291-tensor open: benchmarks/python/bench_open_breakdown.py)."""
from __future__ import annotations

import ctypes
from typing import Any, List, Tuple

from . import dtypes
from ._lib import DLManagedTensor, TensorFieldsC, lib
from ._zero_copy import torch_dtype_or_refuse
from .errors import check
from .tensor import Tensor, _capsule_of

_FIELDS_SIZE = ctypes.sizeof(TensorFieldsC)


def torch_views_of_handles(arr: Any, n: int) -> Tuple[List[str], List[Any]]:
    """(names, zero-copy torch tensors) of the n handles at `arr` (a
    memcuda_tensor**), in order. The handles stay the caller's to release;
    the views hold their own shares (one span export per allocation), so
    releasing the handles right after keeps the views valid. CUDA views are
    ordered on torch's current stream after the events their records
    carried (``memcuda_tensors_wait_opened``: one wait per distinct event)."""
    import torch
    import torch.utils.dlpack
    fields = (TensorFieldsC * n)()
    check(lib.memcuda_tensors_fields(arr, n, fields, _FIELDS_SIZE))
    names: List[str] = [""] * n
    facts = []  # (dtype, shape, strides, data) per tensor: a shard's view has its tensor's strides
    groups: "dict[tuple, list[int]]" = {}
    waits = set()  # CUDA devices whose current stream waits for a record's event
    for i, f in enumerate(fields):
        names[i] = f.name.decode()
        facts.append((f.dtype, tuple(f.shape[:f.ndim]), tuple(f.strides[:f.ndim]), f.data or 0))
        groups.setdefault((f.backend, f.device, f.alloc_base or 0), []).append(i)
        if f.has_event and f.backend == 0:
            waits.add(f.device)
    out: List[Any] = [None] * n
    for (backend, device, _), idx in groups.items():
        if len(idx) == n:
            part = arr  # one allocation (a packed dict): the C array as it came
        else:
            part = (ctypes.c_void_p * len(idx))(*(arr[i] for i in idx))
        if backend == 0 and device in waits:
            s = torch.cuda.current_stream(device).cuda_stream
            check(lib.memcuda_tensors_wait_opened(part, len(idx), s or 1))  # 1: cudaStreamLegacy
        m = ctypes.POINTER(DLManagedTensor)()
        check(lib.memcuda_tensors_to_dlpack_span(part, len(idx), ctypes.byref(m)))
        start = m.contents.dl_tensor.data or 0
        flat = torch.utils.dlpack.from_dlpack(_capsule_of(m))  # uint8, the span's bytes
        typed: "dict[int, Any]" = {}
        for i in idx:
            code, shape, strides, data = facts[i]
            size = dtypes.ITEMSIZE[code]
            off = data - start
            base = typed.get(code)
            if base is None:
                dt = torch_dtype_or_refuse(code, names[i])
                base = flat[:flat.numel() - flat.numel() % size].view(dt)
                typed[code] = base
            if off % size:
                # Not a whole number of its elements from the span's start
                # (never with the pool's 256-byte alignment): its own export.
                h = ctypes.c_void_p()
                check(lib.memcuda_tensor_retain(arr[i], ctypes.byref(h)))
                out[i] = Tensor(h.value).torch(newest=False)
                continue
            out[i] = base.as_strided(shape, strides, off // size)
    return names, out


def release_handles(arr: Any, n: int) -> None:
    """Releases the n handles at `arr` and frees the array (no network I/O)."""
    rel = lib.memcuda_tensor_release
    for i in range(n):
        rel(arr[i])
    lib.memcuda_free_tensor_array(arr)

"""Zero copy or an error (docs/python.md): where a view cannot be had (a cuda
tensor asked for as a NumPy array, a dtype the framework lacks), a typed
``NotZeroCopy`` says why; with ``allow_copy=True`` a copy is made instead,
warned about (``ZeroCopyWarning``) and counted in ``Registry.stats()``
(``copies``, ``copied_bytes``; the C ABI's ``memcuda_note_copy``)."""
from __future__ import annotations

import warnings
from typing import Any

from . import dtypes
from ._lib import lib
from .errors import InvalidArgument, NotZeroCopy, ZeroCopyWarning, check

_BF16 = dtypes.NAMES.index("bf16")


def reader_ordinal(device: Any) -> int:
    """A reader device as the C ABI takes it: a CUDA ordinal, or -1 for host
    code ("cpu", "host", -1, torch.device("cpu"))."""
    if isinstance(device, int):
        return device
    text = str(device)
    if text in ("cpu", "host"):
        return -1
    if text.startswith("cuda:"):
        return int(text.split(":", 1)[1])
    raise InvalidArgument(f"device must be an int, 'cuda:N' or 'cpu', got {device!r}")


def note_copy(t: Any, site: str, nbytes: int, why: str) -> None:
    """Counts one opted-in copy in this process's stats and warns (Python's
    warnings filter shows it once per call site and tensor)."""
    check(lib.memcuda_note_copy(t._handle(), site.encode(), nbytes, why.encode()))
    warnings.warn(f"memcuda: copied {nbytes} bytes of tensor '{t.name}' ({site}): {why}", ZeroCopyWarning,
                  stacklevel=4)


def numpy_refusal(t: Any) -> str:
    """Why tensor `t` has no zero-copy NumPy view ("" when it has one)."""
    if t._backend == 0:
        return (f"tensor '{t.name}' is device memory on CUDA device {t.device}: a NumPy array is host memory, "
                "so it cannot view it; use Tensor.torch() or cupy.from_dlpack(t) for zero copy, or "
                "numpy(allow_copy=True) for a host copy (counted in stats)")
    if dtypes.NUMPY[t._dtype] is None:
        return (f"tensor '{t.name}' is {t.dtype}: NumPy has no bfloat16, so it cannot view it; use "
                "Tensor.torch() for zero copy, or numpy(allow_copy=True) for a float32 copy (counted in stats)")
    return ""


def numpy_of(t: Any, allow_copy: bool) -> Any:
    """A zero-copy NumPy view of host tensor `t`; else NotZeroCopy, or with
    `allow_copy` a copy (bf16 widened to float32), warned and counted."""
    import numpy
    why = numpy_refusal(t)
    if not why:
        return numpy.asarray(t)
    if not allow_copy:
        raise NotZeroCopy(why)
    raw = numpy.empty(t.shape, dtype="uint16" if t._dtype == _BF16 else dtypes.NUMPY[t._dtype])
    t.copy_to_host(raw.ctypes.data, t.nbytes)
    note_copy(t, "Tensor.numpy(allow_copy=True)", t.nbytes,
              "NumPy cannot view " + ("device memory" if t._backend == 0 else "bfloat16"))
    if t._dtype == _BF16:
        return (raw.astype(numpy.uint32) << 16).view(numpy.float32)
    return raw


def torch_dtype_or_refuse(code: int, name: str) -> Any:
    """The torch dtype of a tensor's dtype code, or NotZeroCopy where this
    torch has none (torch 1.13: no uint16/uint32/uint64)."""
    import torch
    dt = getattr(torch, dtypes.TORCH[code], None) if code else torch.uint8  # bool: uint8, as DLPack 0.6 gives it
    if dt is None:
        raise NotZeroCopy(f"tensor '{name}' is {dtypes.NAMES[code]}: torch {torch.__version__} has no "
                          f"{dtypes.TORCH[code]} dtype, so it cannot view it; open it with framework=None "
                          "(memcuda Tensors) or read it through NumPy (host) or CuPy (cuda)")
    return dt

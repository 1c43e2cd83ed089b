"""mem-cuda for Python: share named GPU (and host) tensors between processes
through a Redis registry, zero copy, with PyTorch, CuPy and NumPy.

    import memcuda, torch
    with memcuda.Registry("unix:///run/redis.sock") as reg:
        reg.put("w", torch.randn(4, 4, device="cuda"), persistent=True)   # producer
        w = torch.from_dlpack(reg.get("w"))                                # consumer

A pure-Python package over the C ABI (libmemcuda_c.so, include/memcuda/c/memcuda.h)
through ctypes; docs/python.md explains lifetimes, streams, threads and fork safety.
"""
from ._lib import lib as _lib
from .dtypes import NAMES as DTYPES
from .errors import (AlreadyExists, AuthError, BudgetExceeded, ConnectionError, CudaError, InternalError,
                     InvalidArgument, Lost, MemcudaError, NotFound, NotLeader, OutOfMemory, ProtocolError,
                     RedisError, ReplyError, StaleHandle, TimeoutError, TypeMismatch, Unavailable, UnknownError)
from .errors import LayoutMismatch  # Python-side, no C code of its own
from .errors import NotZeroCopy, ZeroCopyWarning
from .model_versions import ModelVersionWriter, PinnedModel
from .registry import GcReport, Registry, Stats
from .share import shareable_empty
from .shard import Shard
from .tensor import Tensor, TensorInfo

__version__: str = _lib.memcuda_version_string().decode()
library_path: str = _lib._name


def has_cuda() -> bool:
    """Whether libmemcuda_c was built with the CUDA backend."""
    return bool(_lib.memcuda_has_cuda())


__all__ = [
    "Registry", "Tensor", "Shard", "shareable_empty", "TensorInfo", "Stats", "GcReport", "DTYPES", "has_cuda", "library_path",
    "MemcudaError", "InvalidArgument", "NotFound", "AlreadyExists", "TypeMismatch", "StaleHandle",
    "BudgetExceeded", "Lost", "NotLeader", "Unavailable", "InternalError", "ProtocolError", "CudaError",
    "RedisError", "ConnectionError", "AuthError", "TimeoutError", "ReplyError", "OutOfMemory", "UnknownError",
    "LayoutMismatch", "NotZeroCopy", "ZeroCopyWarning",
    "ModelVersionWriter", "PinnedModel",
]

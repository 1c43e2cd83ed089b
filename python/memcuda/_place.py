"""Where data goes: backend and device codes of the C ABI, and what a
tensor-like (torch, CuPy, NumPy) says about its dtype, shape and device."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Union

from . import dtypes
from .errors import InvalidArgument
from .tensor import Stream, Tensor, stream_ptr

Device = Union[None, int, str, Any]  # None, a CUDA ordinal, "cuda:1", "cpu"/"host", a torch.device

# MEMCUDA_BACKEND_* of memcuda/c/common.h, by the names Python takes (None: the registry's default).
BACKEND_CODES: Dict[Optional[str], int] = {None: -1, "cuda": 0, "host": 1, "cpu": 1}
# ... and the name each code reads back as.
BACKEND_NAMES: Dict[int, Optional[str]] = {-1: None, 0: "cuda", 1: "host"}


def backend_device(backend: Optional[str], device: Device) -> tuple:
    """(MEMCUDA_BACKEND_*, ordinal or -1) from the user's backend and device."""
    b = BACKEND_CODES.get(backend, None)
    if b is None:
        raise InvalidArgument(f"backend must be 'cuda' or 'host', got {backend!r}")
    if device is None:
        return b, -1
    if isinstance(device, int):
        return (0 if b == -1 else b), device
    text = str(device)  # "cuda:1", "cuda", "cpu", torch.device(...)
    if text in ("cpu", "host"):
        return 1, -1
    if text == "cuda" or text.startswith("cuda:"):
        return 0, int(text.split(":", 1)[1]) if ":" in text else -1
    raise InvalidArgument(f"device must be an int, 'cuda[:N]' or 'cpu', got {device!r}")


def normalized(data: Any) -> Tuple[Any, int, Tuple[int, ...]]:
    """(data, MEMCUDA_DTYPE_* code, shape); what has no shape goes through numpy.asarray."""
    if not hasattr(data, "shape"):
        import numpy
        data = numpy.asarray(data)
    return data, dtypes.code_of(dtype_of(data)), tuple(int(d) for d in data.shape)


def dtype_of(data: Any) -> Any:
    dt = getattr(data, "dtype", None)
    if dt is None:
        import numpy
        return numpy.asarray(data).dtype
    return dt


def device_of(data: Any) -> Device:
    mod = type(data).__module__.split(".")[0]
    if mod == "torch":
        return data.device.index if data.is_cuda else "cpu"
    if mod == "cupy":
        return data.device.id
    return None  # NumPy and friends: the registry's default backend


def copy_into(dst: Tensor, data: Any, stream: Stream) -> None:
    """Copies data into dst (same shape and dtype), publishing GPU writes."""
    mod = type(data).__module__.split(".")[0]
    if mod == "torch":
        import torch
        import torch.utils.dlpack
        src = data.detach()
        # stream=-1: we are the writer, there is nothing of ours to wait for.
        view = torch.utils.dlpack.from_dlpack(dst.__dlpack__(stream=-1))
        if view.dtype != src.dtype:  # bool travels as uint8 through DLPack 0.6
            src = src.to(view.dtype)
        if dst.backend == "cuda":
            s = torch.cuda.current_stream(view.device) if stream is None else stream
            with torch.cuda.stream(s if isinstance(s, torch.cuda.Stream) else torch.cuda.ExternalStream(s)):
                view.copy_(src)
            dst.publish(s)
        else:
            view.copy_(src)
        del view
        return
    if mod == "cupy":
        import cupy
        view = cupy.from_dlpack(dst)
        s = cupy.cuda.get_current_stream() if stream is None else stream
        with (s if isinstance(s, cupy.cuda.Stream) else cupy.cuda.ExternalStream(stream_ptr(s))):
            view[...] = data
        dst.publish(s)
        del view
        return
    import numpy
    arr = numpy.ascontiguousarray(data)
    dst.copy_from_host(arr.ctypes.data, arr.nbytes)

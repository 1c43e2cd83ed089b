"""Tensor: one open handle to a named shared tensor, with DLPack and array-interface export."""
from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from . import dtypes
from ._lib import DLManagedTensor, TensorFieldsC, TensorInfoC, lib
from ._scoped import Scoped
from .errors import InvalidArgument, MemcudaError, check

BACKENDS = ("cuda", "host")
_release_lock = threading.Lock()  # two threads releasing one handle drop it once
STATES = ("pending", "ready", "lost")
KDLCPU, KDLCUDA = 1, 2  # DLPack device types

Stream = Any  # None, an int (a cudaStream_t), a torch.cuda.Stream, a cupy Stream


def stream_ptr(stream: Stream) -> Optional[int]:
    """The cudaStream_t of a stream given as an int, a torch.cuda.Stream
    (``cuda_stream``) or a CuPy stream (``ptr``); None for None (the legacy
    default stream)."""
    if stream is None:
        return None
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    raise InvalidArgument(f"not a CUDA stream: {stream!r} (want an int, a torch.cuda.Stream or a cupy Stream)")


@dataclass(frozen=True)
class TensorInfo:
    """A tensor's registry record (``Registry.info``, ``Registry.list``, ``Tensor.info``)."""
    name: str
    dtype: str
    shape: Tuple[int, ...]
    backend: str
    device: int  # ordinal in the allocator of record's view; -1 for host
    device_uuid: str
    node: str
    bytes: int
    refcount: int
    state: str
    generation: int
    owner_pid: int
    ctime_ms: int
    event_version: int
    holders: int

    @staticmethod
    def from_c(c: TensorInfoC) -> "TensorInfo":
        return TensorInfo(
            name=c.name.decode(), dtype=dtypes.name_of(c.dtype), shape=tuple(c.shape[:c.ndim]),
            backend=BACKENDS[c.backend], device=c.device, device_uuid=c.device_uuid.decode(errors="replace"),
            node=c.node.decode(errors="replace"), bytes=c.bytes, refcount=c.refcount, state=STATES[c.state],
            generation=c.generation, owner_pid=c.owner_pid, ctime_ms=c.ctime_ms, event_version=c.event_version,
            holders=c.holders)


def new_info_c() -> TensorInfoC:
    c = TensorInfoC()
    lib.memcuda_tensor_info_init(ctypes.byref(c))
    return c


# ---- the DLPack capsule ---------------------------------------------------
# A consumer that takes the capsule renames it "used_dltensor" and owns the
# DLManagedTensor (it calls the deleter when done). A capsule never consumed
# still holds a share of the reference: its destructor calls the deleter.
# The destructor runs with the GIL held and uses the Python C API directly
# (PYFUNCTYPE: no GIL release, exceptions stay in Python's state).
_api = ctypes.pythonapi
_PyCapsule_New = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", _api))
_PyCapsule_IsValid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_PyCapsule_GetPointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api))
_DLTENSOR = b"dltensor"


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _capsule_destructor(capsule: int, _valid=_PyCapsule_IsValid, _get=_PyCapsule_GetPointer,
                        _cast=ctypes.cast, _ptr=ctypes.POINTER(DLManagedTensor), _name=_DLTENSOR) -> None:
    # Default arguments keep what the destructor needs reachable even while
    # the interpreter tears the module down.
    if _valid(capsule, _name):
        p = _get(capsule, _name)
        m = _cast(p, _ptr).contents
        m.deleter(p)  # queues the release only: no network I/O here


# A capsule may outlive this module (a global of __main__ is destroyed late
# at exit): the callback must never be freed, so it keeps one extra reference.
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_capsule_destructor))
_DESTRUCTOR_ADDR = ctypes.cast(_capsule_destructor, ctypes.c_void_p)


def _to_capsule(handle: int) -> Any:
    out = ctypes.POINTER(DLManagedTensor)()
    check(lib.memcuda_tensor_to_dlpack(handle, ctypes.byref(out)))
    return _capsule_of(out)


def _capsule_of(out: Any) -> Any:
    """A "dltensor" capsule owning a DLManagedTensor the library made (its
    deleter runs when the consumer is done, or when the capsule is collected
    unconsumed)."""
    addr = ctypes.cast(out, ctypes.c_void_p).value
    try:
        return _PyCapsule_New(addr, _DLTENSOR, _DESTRUCTOR_ADDR)
    except BaseException:
        out.contents.deleter(addr)
        raise


class Tensor(Scoped):
    """An open handle to a named tensor: this process holds one reference to it
    in the registry while the handle, or any array made from it (torch, NumPy,
    CuPy through DLPack or the array interfaces), is alive.

    Zero copy: ``torch.from_dlpack(t)``, ``cupy.from_dlpack(t)``,
    ``numpy.from_dlpack(t)`` (host backend) and ``numpy.asarray(t)`` (host,
    writable) view the shared memory itself.
    """

    __slots__ = ("_h", "_pid", "_name", "_dtype", "_shape", "_strides", "_backend", "_device", "_gen", "_ptr",
                 "_bytes", "_base", "_has_event", "__weakref__")
    _end = "release"

    def __init__(self, handle: int, fields: Optional[TensorFieldsC] = None) -> None:
        """Owns `handle` (a memcuda_tensor*). `fields`: its memcuda_tensor_fields
        when the caller read a batch's at once (one C call for many handles)."""
        self._h: Optional[int] = handle
        self._pid = os.getpid()
        if fields is None:
            fields = TensorFieldsC()
            arr = (ctypes.c_void_p * 1)(handle)
            check(lib.memcuda_tensors_fields(arr, 1, ctypes.byref(fields), ctypes.sizeof(TensorFieldsC)))
        f = fields
        self._name = f.name.decode()
        self._dtype = f.dtype
        self._shape = tuple(f.shape[:f.ndim])
        self._strides = tuple(f.strides[:f.ndim])
        self._backend = f.backend
        self._device = f.device
        self._gen = f.generation
        self._ptr = f.data or 0
        self._bytes = f.bytes
        self._base = f.alloc_base or 0  # equal bases (and device): one allocation
        self._has_event = bool(f.has_event)

    @staticmethod
    def adopt_all(handles: Any) -> "list[Tensor]":
        """Tensors owning the C handles of one batch call, their fields read in
        one C call. If wrapping one fails (an interrupt, no memory), the handles
        not yet owned are released, so a batch never leaks a reference."""
        handles = list(handles)
        out = []
        try:
            n = len(handles)
            if n:
                arr = (ctypes.c_void_p * n)(*handles)
                fields = (TensorFieldsC * n)()
                check(lib.memcuda_tensors_fields(arr, n, fields, ctypes.sizeof(TensorFieldsC)))
                for h, f in zip(handles, fields):
                    out.append(Tensor(h, f))
        except BaseException:
            for h in handles[len(out):]:
                lib.memcuda_tensor_release(h)
            raise
        return out

    @staticmethod
    def adopt_array(call: Any) -> "list[Tensor]":
        """``adopt_all`` of the array of handles a C call answers through the
        (memcuda_tensor***, size_t*) it is given by `call`; frees the array."""
        arr = ctypes.POINTER(ctypes.c_void_p)()
        n = ctypes.c_size_t()
        check(call(ctypes.byref(arr), ctypes.byref(n)))
        try:
            return Tensor.adopt_all(arr[:n.value])
        finally:
            lib.memcuda_free_tensor_array(arr)

    # ---- lifetime --------------------------------------------------------
    def release(self) -> None:
        """Drops this handle's share now (arrays made from it keep theirs).
        No network I/O: the registry's thread sends the release."""
        with _release_lock:
            h, self._h = self._h, None
        if h is not None and self._pid == os.getpid():
            lib.memcuda_tensor_release(h)
        # In a forked child the handle belongs to the parent: leak it there.

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:
            pass

    def _handle(self) -> int:
        if self._h is None:
            raise InvalidArgument(f"tensor '{self._name}' was released")
        if self._pid != os.getpid():
            raise MemcudaError(f"tensor '{self._name}' was opened in process {self._pid}, before a fork; "
                               "open it again in this process")
        return self._h

    # ---- description -----------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def dtype(self) -> str:
        """memcuda's dtype name: "f32", "bf16", ..."""
        return dtypes.name_of(self._dtype)

    @property
    def shape(self) -> Tuple[int, ...]:
        return self._shape

    @property
    def strides(self) -> Tuple[int, ...]:
        """Strides in elements: row-major for a whole tensor, the tensor's for a slice."""
        return self._strides

    @property
    def ndim(self) -> int:
        return len(self._shape)

    def slice(self, dim: int, start: int, length: Optional[int] = None) -> "Tensor":
        """Elements [start, start + length) of dimension `dim` (None: to the
        end): a view sharing this handle's reference (no Redis call, no copy).
        InvalidArgument for a range that does not fit."""
        h = ctypes.c_void_p()
        check(lib.memcuda_tensor_slice(self._handle(), dim, start, -1 if length is None else length, ctypes.byref(h)))
        return Tensor(h.value)

    def shard(self, dim: int, rank: int, world: int) -> "Tensor":
        """Tensor-parallel shard `rank` of `world` along `dim` (n/world elements
        of it; InvalidArgument where the dimension does not divide evenly)."""
        h = ctypes.c_void_p()
        check(lib.memcuda_tensor_slice_tp(self._handle(), dim, rank, world, ctypes.byref(h)))
        return Tensor(h.value)

    @property
    def nbytes(self) -> int:
        """The bytes of the tensor's (a slice's) elements."""
        return self._bytes

    @property
    def backend(self) -> str:
        """"cuda" (device memory) or "host" (shared host memory)."""
        return BACKENDS[self._backend]

    @property
    def device(self) -> int:
        """This process's CUDA ordinal of the tensor's GPU; -1 for host."""
        return self._device

    @property
    def generation(self) -> int:
        """Unique per tensor ever created: tells a re-created name apart."""
        return self._gen

    @property
    def data_ptr(self) -> int:
        """The device (cuda) or host address of the first element."""
        self._handle()
        return self._ptr

    def info(self) -> TensorInfo:
        """The record as it was when this handle was opened."""
        c = new_info_c()
        check(lib.memcuda_tensor_get_info(self._handle(), ctypes.byref(c)))
        return TensorInfo.from_c(c)

    def valid(self) -> bool:
        """Whether the name still means this tensor (one Redis round trip)."""
        v = ctypes.c_int()
        check(lib.memcuda_tensor_valid(self._handle(), ctypes.byref(v)))
        return bool(v.value)

    def __repr__(self) -> str:
        state = "" if self._h is not None else ", released"
        return (f"memcuda.Tensor(name={self._name!r}, dtype={self.dtype}, shape={self._shape}, "
                f"backend={self.backend}, device={self._device}, generation={self._gen}{state})")

    # ---- streams ---------------------------------------------------------
    def publish(self, stream: Stream = None) -> int:
        """Producer side: records an event on `stream` (None: the legacy default
        stream) after the work that wrote the tensor, and publishes it.
        Consumers that pass a stream to ``Registry.get`` or ``__dlpack__`` order
        their work after it. Returns the event version. Host: only bumps it."""
        v = ctypes.c_uint64()
        check(lib.memcuda_tensor_publish(self._handle(), stream_ptr(stream), ctypes.byref(v)))
        return v.value

    def wait_published(self, stream: Stream = None) -> None:
        """Consumer side: makes `stream` wait for the producer's last publish."""
        check(lib.memcuda_tensor_wait_published(self._handle(), stream_ptr(stream)))

    def wait_opened(self, stream: Stream = None) -> None:
        """Makes `stream` wait for the producer's publish that was current when
        this handle was opened (its record carries the event): no Redis round
        trip, unlike ``wait_published``, which asks for the newest."""
        check(lib.memcuda_tensor_wait_opened(self._handle(), stream_ptr(stream)))

    # ---- copies ----------------------------------------------------------
    def copy_from_host(self, address: int, nbytes: int, offset: int = 0) -> None:
        """Copies `nbytes` from host memory at `address` into the tensor at byte
        `offset`; synchronous, bounds-checked, either backend. A strided slice
        is copied whole only (offset 0, `nbytes` its nbytes, host memory dense)."""
        check(lib.memcuda_tensor_copy_from_host(self._handle(), address, nbytes, offset))

    def copy_to_host(self, address: int, nbytes: int, offset: int = 0) -> None:
        """copy_from_host's reverse, with its rules."""
        check(lib.memcuda_tensor_copy_to_host(self._handle(), address, nbytes, offset))

    def tobytes(self) -> bytes:
        """A copy of the tensor's bytes (either backend)."""
        buf = ctypes.create_string_buffer(self._bytes)
        self.copy_to_host(ctypes.addressof(buf), self._bytes)
        return buf.raw

    # ---- interop -----------------------------------------------------------
    def __dlpack_device__(self) -> Tuple[int, int]:
        return (KDLCUDA, self._device) if self._backend == 0 else (KDLCPU, 0)

    def __dlpack__(self, stream: Optional[int] = None, max_version: Any = None, dl_device: Any = None,
                   copy: Optional[bool] = None) -> Any:
        """A "dltensor" capsule viewing the tensor (DLPack 0.6 layout), holding
        its own share of the reference until the consumer's deleter runs (or the
        capsule is collected unconsumed).

        stream (cuda): the consumer's stream; it is made to wait for the
        producer's last ``publish`` (one Redis round trip). None: the legacy
        default stream; -1: no ordering. Ignored for the host backend."""
        if copy:
            raise BufferError("memcuda tensors are exported without copying (copy=True is not supported)")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"tensor '{self._name}' lives on {self.__dlpack_device__()}, not {tuple(dl_device)}")
        h = self._handle()
        if self._backend == 0 and stream != -1:
            check(lib.memcuda_tensor_wait_published(h, stream or None))
        return _to_capsule(h)

    def __arrow_c_schema__(self) -> Any:
        """Arrow PyCapsule Interface: an "arrow_schema" capsule of the flat array
        ``__arrow_c_device_array__`` exports (docs/interop.md: the dtype table)."""
        from . import arrow
        return arrow.schema_capsule(self._handle())

    def __arrow_c_device_array__(self, requested_schema: Any = None, **kwargs: Any) -> Tuple[Any, Any]:
        """Arrow PyCapsule Interface: ("arrow_schema", "arrow_device_array")
        capsules viewing the tensor (zero copy; cuda or CPU device), the array
        holding a share of the reference until released. A requested "+w:<n>"
        schema gets a fixed-size list of the innermost dimension. cuda:
        sync_event follows the producer's newest publish (one Redis round trip)."""
        from . import arrow
        arrow.check_kwargs(kwargs)
        return arrow.device_array_capsules(self._handle(), 0, requested_schema)

    def __arrow_c_array__(self, requested_schema: Any = None) -> Tuple[Any, Any]:
        """Arrow PyCapsule Interface, CPU only: ("arrow_schema", "arrow_array")
        capsules of a host tensor (``pyarrow.array(t)``); InvalidArgument on cuda."""
        from . import arrow
        return arrow.array_capsules(self._handle(), 0, requested_schema)

    def _interface(self) -> dict:
        ts = dtypes.TYPESTR[self._dtype]
        if ts is None:
            raise AttributeError(f"{self.dtype} has no array-interface type string; use DLPack "
                                 "(torch.from_dlpack) for bf16")
        size = dtypes.ITEMSIZE[self._dtype]
        dense = _row_major(self._shape) == self._strides
        return {"shape": self._shape, "typestr": ts, "data": (self.data_ptr, False),
                "strides": None if dense else tuple(s * size for s in self._strides), "version": 3}

    @property
    def __array_interface__(self) -> dict:
        """Host backend: ``numpy.asarray(t)`` is a writable zero-copy view that keeps
        this handle (and so the reference) alive."""
        if self._backend != 1:
            raise AttributeError("__array_interface__ is for host tensors; this one is on cuda")
        return self._interface()

    @property
    def __cuda_array_interface__(self) -> dict:
        """CUDA backend (CuPy, Numba): the consumer's work is ordered after the
        producer's last publish through the legacy default stream ("stream": 1)."""
        if self._backend != 0:
            raise AttributeError("__cuda_array_interface__ is for cuda tensors; this one is on the host")
        d = self._interface()
        check(lib.memcuda_tensor_wait_published(self._handle(), None))
        d["stream"] = 1
        return d

    def __array__(self, dtype: Any = None) -> Any:
        """Reached only where ``__array_interface__`` is refused (a cuda or a
        bf16 tensor): NotZeroCopy rather than a 0-d object array."""
        from ._zero_copy import numpy_refusal
        from .errors import NotZeroCopy
        raise NotZeroCopy(numpy_refusal(self) or f"tensor '{self._name}' has no NumPy view")

    def numpy(self, allow_copy: bool = False):
        """A writable NumPy view of a host tensor (zero copy; keeps the handle
        alive). NotZeroCopy for a cuda or a bf16 tensor; allow_copy=True: a
        host copy there instead (bf16 as float32), with a ZeroCopyWarning and
        counted in ``Registry.stats()`` (copies, copied_bytes)."""
        from ._zero_copy import numpy_of
        return numpy_of(self, allow_copy)

    def check_device(self, device: Any) -> None:
        """NotZeroCopy unless code on `device` (a CUDA ordinal or "cuda:N";
        -1 or "cpu": host code) can use this tensor's memory in place: its
        own device, or a peer that reaches it (cudaDeviceCanAccessPeer).
        Never copies."""
        from ._zero_copy import reader_ordinal
        check(lib.memcuda_tensor_check_device(self._handle(), reader_ordinal(device)))

    def torch(self, newest: bool = True):
        """``torch.from_dlpack(self)``: a zero-copy torch tensor (bf16 included),
        ordered on torch's current stream after the producer's newest publish
        (one Redis round trip). newest=False: after the publish known when the
        handle was opened (``wait_opened``, no round trip; what
        ``Registry.get_state_dict`` uses for a whole batch)."""
        import torch.utils.dlpack
        from ._zero_copy import torch_dtype_or_refuse
        torch_dtype_or_refuse(self._dtype, self._name)  # NotZeroCopy before torch's untyped error
        if newest or self._backend != 0:
            return torch.utils.dlpack.from_dlpack(self)
        import torch
        s = torch.cuda.current_stream(self._device).cuda_stream
        self.wait_opened(s or 1)  # 1: cudaStreamLegacy, torch's default stream
        return torch.utils.dlpack.from_dlpack(self.__dlpack__(stream=-1))


def _row_major(shape: Tuple[int, ...]) -> Tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(out))


def torch_views(tensors: "list[Tensor]") -> "list[Any]":
    """Zero-copy torch tensors of `tensors`, in order, with ONE DLPack import
    per allocation (a packed batch: one for the whole batch) and one
    ``as_strided`` view per tensor, instead of one export and import each
    (``_torch_open.torch_views_of_handles``). CUDA ones are ordered on
    torch's current stream of their device after the publish each record
    carried (``wait_opened``, one wait per distinct event).

    The views of one allocation share one DLPack export that holds a share of
    every one of those tensors: their references are released when the last
    of those views is gone (not each with its own view)."""
    if not tensors:
        return []
    from ._torch_open import torch_views_of_handles
    arr = (ctypes.c_void_p * len(tensors))(*(t._handle() for t in tensors))
    return torch_views_of_handles(arr, len(tensors))[1]

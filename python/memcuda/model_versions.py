"""A/B model versions (C++: memcuda/model_ab.hpp; docs/design.md, "A/B model versions").

A producer writes version N+1 of a model into a SECOND set of buffers while
readers keep using N; one atomic commit makes N+1 current; each reader keeps
the version it opened until it calls ``advance`` (stream-ordered, no host
synchronisation); N's memory goes when its last reader leaves. Reached
through ``Registry.begin_model_version``, ``Registry.publish_model`` and
``Registry.open_model``.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Dict, Mapping, Optional, Sequence

from . import dtypes
from ._lib import ModelVersionOptionsC, TensorSpecC, lib
from .errors import InvalidArgument, check
from ._scoped import Scoped
from ._place import backend_device, copy_into, device_of, normalized
from .tensor import Stream, Tensor, stream_ptr, torch_views

_FRAMEWORKS = (None, "torch", "numpy")


def _is_layout(value: Any) -> bool:
    """(shape, dtype): a layout to fill, not data to copy (torch.Size is a tuple)."""
    if not isinstance(value, tuple) or len(value) != 2 or hasattr(value, "shape"):
        return False
    return isinstance(value[0], (tuple, list))


def _adopt(fn: Any, handle: int) -> Dict[str, Tensor]:
    """{relative name: Tensor} of a writer's or pinned model's tensors."""
    off = ctypes.c_size_t()
    tensors = Tensor.adopt_array(lambda arr, n: fn(handle, arr, n, ctypes.byref(off)))
    return {t.name[off.value:]: t for t in tensors}


def _as(framework: Optional[str], tensors: Dict[str, Tensor]) -> Dict[str, Any]:
    if framework == "torch":
        return dict(zip(tensors, torch_views(list(tensors.values()))))
    if framework == "numpy":
        return {k: t.numpy() for k, t in tensors.items()}
    return dict(tensors)


class ModelVersionWriter(Scoped):
    """A version being staged: ``tensors`` are writable and invisible to
    readers until ``commit``. A context manager: leaving it by an exception
    aborts; leaving it normally without commit aborts too."""

    _end = "abort"

    def __init__(self, prefix: str, handle: int) -> None:
        self.prefix = prefix
        self._h: Optional[int] = handle
        self._lock = threading.Lock()
        v = ctypes.c_uint64()
        check(lib.memcuda_model_writer_version(handle, ctypes.byref(v)))
        self.version = v.value  # the version commit makes current
        self.tensors: Dict[str, Tensor] = _adopt(lib.memcuda_model_writer_tensors, handle)

    def torch(self) -> Dict[str, Any]:
        """Zero-copy torch views of the staged tensors (write the new weights there)."""
        return _as("torch", self.tensors)

    def _release(self) -> None:
        for t in self.tensors.values():
            t.release()
        self.tensors = {}

    def commit(self, stream: Stream = None) -> int:
        """Makes the version current in one atomic step, ordered after the work
        enqueued on `stream` (cuda; None: the legacy default stream; host: the
        writes must be done). Returns the version. The writer's handles go;
        views taken from them keep their memory until dropped."""
        with self._lock:
            if self._h is None:
                raise InvalidArgument(f"model '{self.prefix}' version {self.version}: the writer is closed")
            v = ctypes.c_uint64()
            check(lib.memcuda_model_writer_commit(self._h, stream_ptr(stream), ctypes.byref(v)))
            self.version = v.value
            self._release()
            lib.memcuda_model_writer_free(self._h)
            self._h = None
            return self.version

    def abort(self) -> None:
        """Gives the staging up; its tensors go. Idempotent."""
        with self._lock:
            if self._h is None:
                return
            self._release()
            try:
                check(lib.memcuda_model_writer_abort(self._h))
            finally:
                lib.memcuda_model_writer_free(self._h)
                self._h = None

    def __del__(self) -> None:
        h, self._h = getattr(self, "_h", None), None
        if h is not None:
            lib.memcuda_model_writer_free(h)  # no network I/O: the next begin gives the staging up


class PinnedModel(Scoped):
    """A reader's model: ``tensors`` of the version it opened, kept until
    ``advance`` moves to a newer one or ``close``. A context manager."""

    def __init__(self, prefix: str, handle: int, framework: Optional[str]) -> None:
        self.prefix = prefix
        self.framework = framework
        self._h: Optional[int] = handle
        self._lock = threading.Lock()
        self._load()

    def _load(self) -> None:
        self._raw = _adopt(lib.memcuda_pinned_model_tensors, self._h)
        self.tensors: Dict[str, Any] = _as(self.framework, self._raw)
        v = ctypes.c_uint64()
        check(lib.memcuda_pinned_model_version(self._h, ctypes.byref(v)))
        self.version = v.value

    def _handle(self) -> int:
        if self._h is None:
            raise InvalidArgument(f"model '{self.prefix}' is closed")
        return self._h

    def latest(self) -> int:
        """The model's current version (one round trip; orders nothing)."""
        v = ctypes.c_uint64()
        check(lib.memcuda_pinned_model_latest(self._handle(), ctypes.byref(v)))
        return v.value

    def advance(self, stream: Stream = None) -> bool:
        """Moves to the current version when it is newer: `stream` (None: the
        legacy default stream) waits for the producer's writes of it, then
        ``tensors`` holds the new version's tensors; the old ones are released
        when no other reference (a view you kept) holds them. False when the
        pinned version is current."""
        with self._lock:
            moved = ctypes.c_int(0)
            check(lib.memcuda_pinned_model_advance(self._handle(), stream_ptr(stream), ctypes.byref(moved)))
            if not moved.value:
                return False
            old = self._raw
            self._load()
            for t in old.values():
                t.release()
            return True

    def close(self) -> None:
        """Drops the pinned version (its release is queued). Idempotent."""
        with self._lock:
            h, self._h = self._h, None
            if h is None:
                return
            for t in self._raw.values():
                t.release()
            self._raw, self.tensors = {}, {}
            lib.memcuda_pinned_model_free(h)

    def __del__(self) -> None:
        h, self._h = getattr(self, "_h", None), None
        if h is not None:
            lib.memcuda_pinned_model_free(h)


def begin_model_version(reg: Any, prefix: str, state_dict_or_layout: Mapping[str, Any], *, device: Any = None,
                        backend: Optional[str] = None, max_versions: int = 2,
                        replicas: Optional[Sequence[int]] = None) -> ModelVersionWriter:
    """See ``Registry.begin_model_version``."""
    items = list(state_dict_or_layout.items())
    if not items:
        raise InvalidArgument(f"begin_model_version of '{prefix}' with no tensor")
    data: Dict[str, Any] = {}
    specs = (TensorSpecC * len(items))()
    keep = []
    for c, (key, value) in zip(specs, items):
        if _is_layout(value):
            shape, code = tuple(int(d) for d in value[0]), dtypes.code_of(value[1])
        else:
            v, code, shape = normalized(value)
            data[key] = v
        lib.memcuda_tensor_spec_init(ctypes.byref(c))
        c_shape = (ctypes.c_int64 * max(1, len(shape)))(*shape)
        c_name = str(key).encode()
        keep += [c_shape, c_name]
        c.name, c.dtype, c.ndim = c_name, code, len(shape)
        c.shape = ctypes.cast(c_shape, ctypes.POINTER(ctypes.c_int64))
    if backend is None and device is None and data:
        device = device_of(next(iter(data.values())))
    o = ModelVersionOptionsC()
    lib.memcuda_model_version_options_init(ctypes.byref(o))
    o.backend, o.device = backend_device(backend, device)
    o.max_versions = int(max_versions)
    reps = [int(d) for d in (replicas or [])]
    c_reps = (ctypes.c_int * max(1, len(reps)))(*reps)
    o.replicas, o.n_replicas = ctypes.cast(c_reps, ctypes.POINTER(ctypes.c_int)), len(reps)
    h = ctypes.c_void_p()
    check(lib.memcuda_begin_model_version(reg._handle(), prefix.encode(), specs, len(items), ctypes.byref(o),
                                          ctypes.byref(h)))
    w = ModelVersionWriter(prefix, h.value)
    try:
        for key, v in data.items():
            copy_into(w.tensors[key], v, None)
    except BaseException:
        w.abort()
        raise
    return w


def publish_model(reg: Any, prefix: str, state_dict: Mapping[str, Any], *, stream: Stream = None,
                  device: Any = None, backend: Optional[str] = None, max_versions: int = 2,
                  replicas: Optional[Sequence[int]] = None) -> int:
    """See ``Registry.publish_model``."""
    with begin_model_version(reg, prefix, state_dict, device=device, backend=backend,
                             max_versions=max_versions, replicas=replicas) as w:
        return w.commit(stream)


def open_model(reg: Any, prefix: str, framework: Optional[str] = None, stream: Stream = None, *,
               local: bool = False, device: Optional[int] = None) -> PinnedModel:
    """See ``Registry.open_model``."""
    if framework not in _FRAMEWORKS:
        raise InvalidArgument(f"framework must be None, 'torch' or 'numpy', got {framework!r}")
    h = ctypes.c_void_p()
    if local:
        check(lib.memcuda_open_model_local(reg._handle(), prefix.encode(), stream_ptr(stream),
                                           -1 if device is None else int(device), ctypes.byref(h)))
    else:
        check(lib.memcuda_open_model(reg._handle(), prefix.encode(), stream_ptr(stream), ctypes.byref(h)))
    try:
        return PinnedModel(prefix, h.value, framework)
    except BaseException:
        lib.memcuda_pinned_model_free(h.value)
        raise

"""The Registry's state-dict and model methods: publishing and opening a
model's tensors as one dict, in-place weight sync (model versions) and A/B
model versions (model_versions.py). A base class of ``Registry``, which
supplies ``_handle``, ``get_prefix``, ``_by_name``, ``create_many`` and ``remove``."""
from __future__ import annotations

import ctypes
import os
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence

from . import dtypes, model_versions
from ._lib import CreateOptions, lib
from ._place import Device, backend_device, copy_into, device_of, normalized
from .errors import InvalidArgument, MemcudaError, TypeMismatch, check
from .tensor import Stream, Tensor, stream_ptr


class ModelMethods:
    """State dicts and model versions of a ``Registry``."""

    # ---- state dicts -----------------------------------------------------------
    def put_state_dict(self, prefix: str, state_dict: Mapping[str, Any], *, device: Device = None,
                       backend: Optional[str] = None, persistent: bool = False, update: bool = False,
                       stream: Stream = None) -> Dict[str, Tensor]:
        """``put`` of every entry under ``prefix + key``, the creates in one
        ``create_many`` (all or nothing: AlreadyExists names the first taken
        name, and none is created); returns the handles by key. The keywords
        are ``put``'s. update=True: the entries that exist (one ``get_prefix``)
        are overwritten in place (same shape and dtype, else TypeMismatch before
        anything is written): the weight-sync flow; the others are created.
        A failed copy gives back (and removes) what this call created."""
        entries = []  # (key, data, code, shape, device)
        for key, value in state_dict.items():
            data, code, shape = normalized(value)
            dev = device if (backend is not None or device is not None) else device_of(data)
            entries.append((key, data, code, shape, dev))
        existing: Dict[str, Tensor] = {}
        if update:
            held = self.get_prefix(prefix)
            wanted = {prefix + e[0] for e in entries}
            existing = {n: t for n, t in held.items() if n in wanted}
            for n, t in held.items():
                if n not in wanted:
                    t.release()
            for key, _, code, shape, _ in entries:
                t = existing.get(prefix + key)
                if t is not None and (t.shape != shape or t._dtype != code):
                    got = (t.shape, t.dtype)
                    for h in existing.values():
                        h.release()
                    raise TypeMismatch(f"put_state_dict(update=True): '{prefix + key}' is {got[1]}{list(got[0])}, "
                                       f"the data is {dtypes.name_of(code)}{list(shape)}")
        to_create = [e for e in entries if prefix + e[0] not in existing]
        created = self.create_many([(prefix + key, shape, dtypes.name_of(code), {"device": dev})
                                    for key, _, code, shape, dev in to_create],
                                   backend=backend, persistent=persistent)
        out: Dict[str, Tensor] = {e[0]: t for e, t in zip(to_create, created)}
        out.update({n[len(prefix):]: t for n, t in existing.items()})
        try:
            for key, data, _, _, _ in entries:
                copy_into(out[key], data, stream)
        except BaseException:
            for t in out.values():
                t.release()
            for t in created:
                try:
                    self.remove(t.name)
                except MemcudaError:
                    pass
            raise
        result = {e[0]: out[e[0]] for e in entries}
        if result and (persistent or update):
            # get_state_dict then opens it with one O(1) script and one
            # reference, when this holds (else refused: name by name).
            self.link_state_dict(prefix, result.values())
        return result

    def put_safetensors(self, prefix: str, path: str, *, device: Device = None, backend: Optional[str] = None,
                        persistent: bool = False, staging_bytes: int = 64 << 20) -> Dict[str, Tensor]:
        """Publishes every tensor of a safetensors file under ``prefix`` in C:
        created all or nothing, then filled by reading the file in pieces;
        device tensors go through at most ``staging_bytes`` of pinned host
        memory, so a model larger than the memory a producer can spare is
        published with that much (the file is never loaded whole). Returns the
        handles by key (names without the prefix). NotFound for a missing
        file, InvalidArgument naming the fault of a malformed one (a failed
        read removes what was made); persistent=True links a state-dict
        record, as ``put_state_dict`` does."""
        co = CreateOptions()
        lib.memcuda_create_options_init(ctypes.byref(co))
        co.backend, co.device = backend_device(backend, device)
        co.persistent = 1 if persistent else 0
        tensors = Tensor.adopt_array(lambda arr, n: lib.memcuda_publish_safetensors(
            self._handle(), prefix.encode(), os.fsencode(path), ctypes.byref(co), int(staging_bytes), arr, n))
        return {t.name[len(prefix):]: t for t in tensors}

    def link_state_dict(self, prefix: str, tensors: Iterable[Tensor]) -> bool:
        """Links a state-dict record over `tensors`, a dict already published
        under `prefix` (``put_state_dict(..., persistent=True)`` does it): they
        must be exactly the names under the prefix, each persistent and still
        current; the events published so far are recorded. ``get_state_dict``
        then takes one reference for the whole dict with one O(1) script.
        Returns False, changing nothing, when that does not hold."""
        ts = list(tensors)
        arr = (ctypes.c_void_p * len(ts))(*(t._handle() for t in ts))
        linked = ctypes.c_int(0)
        check(lib.memcuda_link_state_dict(self._handle(), prefix.encode(), arr, len(ts), ctypes.byref(linked)))
        return bool(linked.value)

    # ---- model versions: in-place weight sync (C++: memcuda/model.hpp) ---------
    def publish_version(self, prefix: str, stream: Stream = None, backend: Optional[str] = None,
                        device: Optional[int] = None) -> int:
        """Producer side of weight sync, after ENQUEUEING the writes of the new
        weights (of the tensors named ``prefix*``) on `stream` (an int
        cudaStream_t, a torch or CuPy stream; None: the legacy default stream):
        records one interprocess event there, bumps the model's version and
        wakes every ``wait_version``. backend: "cuda"/"host" of the model's
        tensors (None: the registry's default; host records no event: the
        writes must be done). device: the stream's ordinal (None: current).
        Returns the new version (1, 2, ...). Raises NotFound (no such tensor)."""
        b, _ = backend_device(backend, None)
        v = ctypes.c_uint64()
        check(lib.memcuda_publish_version(self._handle(), prefix.encode(), stream_ptr(stream), b,
                                          -1 if device is None else int(device), ctypes.byref(v)))
        return v.value

    def wait_version(self, prefix: str, after: int = 0, timeout: float = 10.0, stream: Stream = None) -> Optional[int]:
        """Consumer side: blocks (no polling) until the model's version is greater
        than `after`, makes `stream` wait on the producer's event (no host
        synchronisation) and returns the version; None when `timeout` seconds
        pass first. Raises NotFound (no version and no tensor under prefix)."""
        v = ctypes.c_uint64()
        check(lib.memcuda_wait_version(self._handle(), prefix.encode(), int(after), max(0, int(timeout * 1000)),
                                       stream_ptr(stream), ctypes.byref(v)))
        return v.value or None

    def current_version(self, prefix: str) -> int:
        """The model's current version (0: tensors, but no version published yet)."""
        v = ctypes.c_uint64()
        check(lib.memcuda_current_version(self._handle(), prefix.encode(), ctypes.byref(v)))
        return v.value

    # ---- A/B model versions (C++: memcuda/model_ab.hpp; model_versions.py) -----
    def begin_model_version(self, prefix: str, state_dict_or_layout: Mapping[str, Any], *, device: Device = None,
                            backend: Optional[str] = None, max_versions: int = 2,
                            replicas: Optional[Sequence[int]] = None) -> Any:
        """Stages version N+1 of model `prefix` in a SECOND set of tensors while
        readers keep N: returns a ``ModelVersionWriter`` (``version``, ``tensors``,
        ``torch()``, ``commit(stream=None)``, ``abort()``; a context manager that
        aborts on exception). Values are tensor-likes (copied in) or
        ``(shape, dtype)`` layouts (left for the caller to fill). AlreadyExists
        while another live process stages a version; BudgetExceeded when
        `max_versions` versions (the current one and older ones a reader still
        holds) have memory. `replicas`: CUDA devices that get a copy of the
        version before commit makes it current (``open_model(local=True)``
        there reads it)."""
        return model_versions.begin_model_version(self, prefix, state_dict_or_layout, device=device, backend=backend,
                                   max_versions=max_versions, replicas=replicas)

    def publish_model(self, prefix: str, state_dict: Mapping[str, Any], *, stream: Stream = None,
                      device: Device = None, backend: Optional[str] = None, max_versions: int = 2,
                      replicas: Optional[Sequence[int]] = None) -> int:
        """``begin_model_version`` + copy + ``commit(stream)``: returns the new version."""
        return model_versions.publish_model(self, prefix, state_dict, stream=stream, device=device, backend=backend,
                             max_versions=max_versions, replicas=replicas)

    def open_model(self, prefix: str, framework: Optional[str] = None, stream: Stream = None, *,
                   local: bool = False, device: Optional[int] = None) -> Any:
        """Pins the model's current version (one reference): a ``PinnedModel``
        (``version``, ``tensors``, ``latest()``, ``advance(stream=None)``,
        ``close()``; a context manager). `stream` is ordered after the
        producer's writes of that version (None: the legacy default stream).
        `local`: each tensor from the replica on `device` (default: the
        current one) where the version was replicated there."""
        return model_versions.open_model(self, prefix, framework, stream, local=local, device=device)

    def get_state_dict(self, prefix: str, framework: Optional[str] = None, *,
                       allow_copy: bool = False, shard: Any = None) -> Dict[str, Any]:
        """Opens every tensor named ``prefix*`` in one Redis round trip
        (``get_prefix``'s names); keys without the prefix. Where the dict was
        put with ``put_state_dict(..., persistent=True)`` (and is unchanged
        since), the open is one O(1) script and this process holds ONE
        reference for the whole dict, released when the last of its tensors
        and views is gone.

        framework: None (memcuda Tensors), "torch" (zero-copy torch tensors,
        CUDA ones ordered on torch's current stream after the publish each
        record carried: no further round trip) or "numpy" (host tensors).
        Zero copy either way, or NotZeroCopy (a cuda or bf16 tensor for
        "numpy", a dtype this torch lacks for "torch"); allow_copy=True:
        "numpy" copies those instead, warned and counted in ``stats()``.

        With "torch", the tensors of one allocation (a packed dict is one) are
        views of ONE DLPack import (``_torch_open``, as ``tensor.torch_views``): they hold the
        references of all of them together, released when the last of those
        views is gone.

        shard: a ``memcuda.Shard(rank, world, rules)``: the tensors its rules
        match come as rank's shard, zero-copy views of the same open (still
        one script and one reference for a linked dict)."""
        if framework not in (None, "torch", "numpy"):
            raise InvalidArgument(f"framework must be None, 'torch' or 'numpy', got {framework!r}")
        if framework == "torch":
            # Straight from the C array: one DLPack import per allocation (a
            # packed dict: one), ordered by the batch's records, no Tensor
            # object per tensor (memcuda/_torch_open.py).
            from ._torch_open import release_handles, torch_views_of_handles
            arr = ctypes.POINTER(ctypes.c_void_p)()
            n = ctypes.c_size_t()
            if shard is None:
                check(lib.memcuda_open_state_dict(self._handle(), prefix.encode(), ctypes.byref(arr), ctypes.byref(n)))
            else:
                check(shard.open(lib, self._handle(), prefix, ctypes.byref(arr), ctypes.byref(n)))
            try:
                names, views = torch_views_of_handles(arr, n.value) if n.value else ([], [])
            finally:
                release_handles(arr, n.value)
            cut = len(prefix)
            return {name[cut:]: v for name, v in zip(names, views)}
        if shard is None:
            got = self._by_name(lib.memcuda_open_state_dict, prefix)
        else:
            got = self._by_name(lambda reg, p, arr, n: shard.open(lib, reg, prefix, arr, n), prefix)
        out: Dict[str, Any] = {}
        for name, t in got.items():
            out[name[len(prefix):]] = t if framework is None else t.numpy(allow_copy=allow_copy)
        return out

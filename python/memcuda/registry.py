"""Registry: a connection to the mem-cuda tensor registry (C++: memcuda::TensorRegistry)."""
from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import _options, dtypes
from ._lib import CreateOptions, GcReportC, RegistryOptions, StatsC, TensorSpecC, lib
from .errors import InvalidArgument, MemcudaError, NotFound, TypeMismatch, check
from .tensor import Stream, Tensor, TensorInfo, new_info_c, stream_ptr

_close_lock = threading.Lock()  # two threads closing one registry close it once
Device = Union[None, int, str, Any]  # None, a CUDA ordinal, "cuda:1", "cpu"/"host", a torch.device


@dataclass(frozen=True)
class Stats:
    """What ``Registry.stats`` reports (the registry and this process)."""
    leader_present: bool
    leader_is_self: bool
    leader_epoch: int
    leader_session: str
    sessions: int
    tensors: int
    bytes: int
    queue_length: int
    pools: int
    pool_in_use: int
    pool_reserved: int
    owned_allocations: int
    owned_bytes: int
    creates: int
    frees: int
    live_imports: int
    import_opens: int
    import_hits: int
    copies: int  # copies made in place of zero copy, opted in (allow_copy=True)
    copied_bytes: int


@dataclass(frozen=True)
class GcReport:
    """What one ``Registry.collect_garbage`` found and did."""
    dead_holders: int
    references_dropped: int
    tensors_freed: int
    sessions_pruned: int
    tensors_migrated: int
    tensors_lost: int


def _backend_device(backend: Optional[str], device: Device) -> tuple:
    """(MEMCUDA_BACKEND_*, ordinal or -1) from the user's backend and device."""
    b = {None: -1, "cuda": 0, "host": 1, "cpu": 1}.get(backend, None)
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


class Registry:
    """A connection to the tensor registry in Redis, with the same options as C++.

    Args:
        url: ``redis://host:port/db`` or ``unix:///path.sock`` (default:
            ``$MEMCUDA_REDIS_URL``, else ``redis://127.0.0.1:6379``). A URL
            without a password takes ``$MEMCUDA_REDIS_PASSWORD`` (and
            ``$MEMCUDA_REDIS_USER``) when set.
        namespace: prefixes every key ("ns:"), isolating registries in one Redis.
        control_thread: host the allocator-of-record role (the process that
            allocates memory for everybody); a pure consumer may switch it off,
            but some process of the machine must host it.
        request_timeout, lease_ttl, session_ttl, gc_interval, connect_timeout,
        command_timeout: seconds (None: the C++ defaults 5, 1.5, 2, 0.5, 1, 2).
        default_backend: "cuda" or "host" for ``create`` (None: cuda when built
            with CUDA and a device is visible, else host).
        default_device: CUDA ordinal for ``create`` (default 0).
        client_connections, waiting_connections: the two Redis connection
            pools' sizes (None: 4 and 16).
        share_references: a ``get`` of a name this registry holds shares its
            handle without a Redis round trip (None: ``$MEMCUDA_SHARE_REFERENCES``,
            else True).
        release_linger: seconds a dropped ``get``'s reference lingers for a
            later get of the name, at most 60 (None: ``$MEMCUDA_RELEASE_LINGER_MS``,
            else 0; 0: none).
        cuda_allocation: "auto", "vmm" or "ipc" (None: ``$MEMCUDA_CUDA_ALLOCATION``,
            else "auto").
        serve_stall_timeout: seconds after which a leader whose loop stalls gives
            up its lease (None: 30; 0: never).
        runtime_dir: directory of the fd server sockets through which processes
            hand each other cuda_vmm_fd memory; processes that share memory
            (containers: one volume at one path) use one (None:
            ``$MEMCUDA_RUNTIME_DIR``, else /tmp/memcuda-<uid>).
        allowed_uids, allowed_gids: peers served besides this uid and root
            (None: ``$MEMCUDA_ALLOWED_UIDS`` / ``$MEMCUDA_ALLOWED_GIDS``, else
            none). One runtime_dir and policy per process.

    Options left None take the MEMCUDA_* variables (docs/operations.md,
    "Environment"), else the C++ defaults; ``options`` shows what the registry
    runs with.

    Every method may be called from any thread (the C calls release the GIL).
    Tensors stay usable after ``close``. A forked child must open its own Registry.
    """

    def __init__(self, url: Optional[str] = None, namespace: Optional[str] = None, *, control_thread: bool = True,
                 request_timeout: Optional[float] = None, lease_ttl: Optional[float] = None,
                 session_ttl: Optional[float] = None, gc_interval: Optional[float] = None,
                 connect_timeout: Optional[float] = None, command_timeout: Optional[float] = None,
                 default_backend: Optional[str] = None, default_device: int = 0,
                 client_connections: Optional[int] = None, waiting_connections: Optional[int] = None,
                 share_references: Optional[bool] = None, release_linger: Optional[float] = None,
                 cuda_allocation: Optional[str] = None, serve_stall_timeout: Optional[float] = None,
                 runtime_dir: Optional[str] = None, allowed_uids: Optional[Sequence[int]] = None,
                 allowed_gids: Optional[Sequence[int]] = None) -> None:
        self._h: Optional[int] = None
        self._pid = os.getpid()
        o = RegistryOptions()
        lib.memcuda_registry_options_init(ctypes.byref(o))
        o.url = url.encode() if url else None
        o.name_space = namespace.encode() if namespace else None
        o.control_thread = 1 if control_thread else 0
        o.default_backend, _ = _backend_device(default_backend, None)
        o.default_device = default_device
        _options.fill(o, request_timeout=request_timeout, lease_ttl=lease_ttl, session_ttl=session_ttl,
                      gc_interval=gc_interval, connect_timeout=connect_timeout, command_timeout=command_timeout,
                      client_connections=client_connections, waiting_connections=waiting_connections,
                      share_references=share_references, release_linger=release_linger,
                      cuda_allocation=cuda_allocation, serve_stall_timeout=serve_stall_timeout)
        keep = _options.fill_transfer(o, runtime_dir=runtime_dir, allowed_uids=allowed_uids,
                                      allowed_gids=allowed_gids)
        h = ctypes.c_void_p()
        check(lib.memcuda_registry_open(ctypes.byref(o), ctypes.byref(h)))
        del keep
        self._h = h.value
        self.url = url
        self.namespace = namespace

    # ---- lifetime ----------------------------------------------------------
    def close(self) -> None:
        """Stops the registry's thread, gives up the allocator-of-record lease and
        ends the session. Open tensors stay valid. Idempotent."""
        with _close_lock:
            h, self._h = self._h, None
        if h is not None and self._pid == os.getpid():
            lib.memcuda_registry_close(h)

    def __enter__(self) -> "Registry":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _handle(self) -> int:
        if self._h is None:
            raise InvalidArgument("the registry is closed")
        if self._pid != os.getpid():
            raise MemcudaError(f"this Registry was opened in process {self._pid}, before a fork; "
                               "open a new Registry in the child")
        return self._h

    @property
    def options(self) -> Dict[str, Any]:
        """What this registry runs with, after the environment and the defaults
        (the keyword names of the constructor; times in seconds)."""
        o = RegistryOptions()
        lib.memcuda_registry_options_init(ctypes.byref(o))
        check(lib.memcuda_registry_get_options(self._handle(), ctypes.byref(o)))
        return _options.as_dict(o)

    @property
    def session_id(self) -> str:
        return lib.memcuda_registry_session_id(self._handle()).decode()

    @property
    def is_leader(self) -> bool:
        """True while this registry holds the allocator-of-record lease (no I/O)."""
        v = ctypes.c_int()
        check(lib.memcuda_registry_is_leader(self._handle(), ctypes.byref(v)))
        return bool(v.value)

    # ---- tensors -------------------------------------------------------------
    def create(self, name: str, shape: Sequence[int], dtype: dtypes.DType, device: Device = None,
               persistent: bool = False, backend: Optional[str] = None) -> Tensor:
        """Creates a tensor (contents unspecified) and returns the creator's handle.

        device: a CUDA ordinal, "cuda:N", "cpu"/"host" or a torch.device (None:
        the registry's default). persistent: the tensor outlives every handle
        until ``remove``. Raises AlreadyExists, InvalidArgument, BudgetExceeded,
        NotLeader (no allocator of record), CudaError."""
        code = dtypes.code_of(dtype)
        dims = tuple(int(d) for d in shape)
        arr = (ctypes.c_int64 * max(1, len(dims)))(*dims)
        co = CreateOptions()
        lib.memcuda_create_options_init(ctypes.byref(co))
        co.backend, co.device = _backend_device(backend, device)
        co.persistent = 1 if persistent else 0
        h = ctypes.c_void_p()
        check(lib.memcuda_create(self._handle(), name.encode(), code, arr, len(dims), ctypes.byref(co),
                                 ctypes.byref(h)))
        return Tensor(h.value)

    def share(self, name: str, data: Any, *, persistent: bool = False) -> Tensor:
        """Registers ``data`` (anything with ``__dlpack__``, or an Arrow array with
        ``__arrow_c_device_array__`` / ``__arrow_c_array__``) under ``name``
        WITHOUT a copy: the tensor is borrowed, it lives only as long as this process
        (memcuda/share.py; docs/python.md, "Borrow or copy")."""
        from .share import share
        return share(self, name, data, persistent=persistent)

    def share_state_dict(self, prefix: str, state_dict: Mapping[str, Any]) -> Dict[str, Tensor]:
        """``share`` of every entry (a loaded model's ``state_dict()``) under
        ``prefix + key`` in ONE Redis round trip, all or nothing: no copy, no
        new memory; keys without the prefix. Borrowed, like ``share``."""
        from .share import share_state_dict
        return share_state_dict(self, prefix, state_dict)

    def get(self, name: str, dtype: Optional[dtypes.DType] = None, stream: Stream = None) -> Tensor:
        """Opens a tensor by name (one Redis round trip; the memory is mapped once
        per process). dtype: check the stored dtype (TypeMismatch). stream: make
        this CUDA stream wait for the producer's last ``publish``.
        Raises NotFound, TypeMismatch, Lost, Unavailable."""
        code = -1 if dtype is None else dtypes.code_of(dtype)
        h = ctypes.c_void_p()
        if stream is None:
            check(lib.memcuda_get(self._handle(), name.encode(), code, ctypes.byref(h)))
        else:
            check(lib.memcuda_get_on_stream(self._handle(), name.encode(), code, stream_ptr(stream),
                                            ctypes.byref(h)))
        return Tensor(h.value)

    def get_many(self, names: Iterable[str]) -> List[Tensor]:
        """Opens several tensors (any dtype) in one Redis round trip, in the
        order given (a name given twice: two handles of one reference; no
        names: [] without I/O). A malformed name raises InvalidArgument before
        anything is taken. All or nothing: when a name is refused, every
        reference is given back and the error of the first refused name in the
        order given is raised (NotFound, Lost, ...). The same contract as C++
        get_all and C memcuda_get_many (docs/protocol.md, "The get_many
        contract")."""
        names = list(names)
        if not names:
            return []
        c_names = (ctypes.c_char_p * len(names))(*(n.encode() for n in names))
        out = (ctypes.c_void_p * len(names))()
        check(lib.memcuda_get_many(self._handle(), c_names, len(names), out))
        return Tensor.adopt_all(out)

    def get_prefix(self, prefix: str) -> Dict[str, Tensor]:
        """Opens every tensor whose name starts with `prefix`, in one Redis round
        trip: {full name: Tensor}, sorted by name ({} when none). All or nothing,
        like ``get_many`` (the first refused name in name order is raised)."""
        return self._by_name(lib.memcuda_get_prefix, prefix)

    def _by_name(self, fn: Any, prefix: str) -> Dict[str, Tensor]:
        """{full name: Tensor} of a C call answering a name-ordered array of handles."""
        arr = ctypes.POINTER(ctypes.c_void_p)()
        n = ctypes.c_size_t()
        check(fn(self._handle(), prefix.encode(), ctypes.byref(arr), ctypes.byref(n)))
        try:
            tensors = Tensor.adopt_all(arr[:n.value])
        finally:
            lib.memcuda_free_tensor_array(arr)
        return {t.name: t for t in tensors}

    def create_many(self, specs: Sequence[Tuple[str, Sequence[int], dtypes.DType]], device: Device = None,
                    persistent: bool = False, backend: Optional[str] = None) -> List[Tensor]:
        """Creates every (name, shape, dtype) in one request to the allocator of
        record; returns the creators' handles in the order given. All or nothing:
        AlreadyExists (naming the first taken name), InvalidArgument (a name given
        twice, a bad shape), BudgetExceeded, NotLeader; then none is created.
        device/backend/persistent: as ``create``, for every tensor, or per tensor
        as a 4th element of a spec: a dict of those keywords."""
        specs = list(specs)
        if not specs:
            return []
        arr = (TensorSpecC * len(specs))()
        keep = []  # the encoded names and shape arrays live until the call returns
        for c, spec in zip(arr, specs):
            name, shape, dtype = spec[0], spec[1], spec[2]
            opts = dict(device=device, persistent=persistent, backend=backend)
            if len(spec) > 3:
                opts.update(spec[3])
            lib.memcuda_tensor_spec_init(ctypes.byref(c))
            dims = tuple(int(d) for d in shape)
            c_shape = (ctypes.c_int64 * max(1, len(dims)))(*dims)
            c_name = name.encode()
            keep += [c_shape, c_name]
            c.name, c.dtype, c.ndim = c_name, dtypes.code_of(dtype), len(dims)
            c.shape = ctypes.cast(c_shape, ctypes.POINTER(ctypes.c_int64))
            c.options.backend, c.options.device = _backend_device(opts["backend"], opts["device"])
            c.options.persistent = 1 if opts["persistent"] else 0
        out = (ctypes.c_void_p * len(specs))()
        check(lib.memcuda_create_many(self._handle(), arr, len(specs), out))
        return Tensor.adopt_all(out)

    def put(self, name: str, data: Any, *, device: Device = None, backend: Optional[str] = None,
            persistent: bool = False, update: bool = False, stream: Stream = None) -> Tensor:
        """Creates `name` with `data`'s shape and dtype and copies `data` in.

        data: a torch tensor (CPU or CUDA), a NumPy array, a CuPy array, or
        anything ``numpy.asarray`` accepts. Where it lives follows `data` (a
        CUDA torch/CuPy tensor goes to its GPU) unless device/backend say
        otherwise. update=True: when `name` exists, copy into it in place
        (same shape and dtype, else TypeMismatch): every holder sees the new
        values; this is the weight-sync flow. GPU copies are ordered on
        `stream` (default: the current torch/CuPy stream) and published there.
        Returns the handle (the creator's reference: keep it, or persistent=True)."""
        data, code, shape = _normalized(data)
        if backend is None and device is None:
            device = _device_of(data)
        dst = None
        if update:
            try:
                dst = self.get(name)
            except NotFound:
                dst = None
            if dst is not None and (dst.shape != shape or dst._dtype != code):
                got = (dst.shape, dst.dtype)
                dst.release()
                raise TypeMismatch(f"put(update=True): '{name}' is {got[1]}{list(got[0])}, "
                                   f"the data is {dtypes.name_of(code)}{list(shape)}")
        if dst is None:
            dst = self.create(name, shape, dtypes.name_of(code), device=device, persistent=persistent, backend=backend)
        try:
            _copy_into(dst, data, stream)
        except BaseException:
            if not update:
                dst.release()
                try:
                    self.remove(name)
                except MemcudaError:
                    pass
            raise
        return dst

    def remove(self, name: str) -> None:
        """Unlinks the name now; open handles stay usable (their memory goes with
        the last holder). Raises NotFound."""
        check(lib.memcuda_remove(self._handle(), name.encode()))

    def wait(self, name: str, timeout: float) -> bool:
        """Blocks until the tensor exists and is ready (True) or `timeout` seconds pass (False)."""
        ready = ctypes.c_int()
        check(lib.memcuda_wait(self._handle(), name.encode(), max(0, int(timeout * 1000)), ctypes.byref(ready)))
        return bool(ready.value)

    def info(self, name: str) -> TensorInfo:
        """The current record of one tensor. Raises NotFound."""
        c = new_info_c()
        check(lib.memcuda_info(self._handle(), name.encode(), ctypes.byref(c)))
        return TensorInfo.from_c(c)

    def iter_list(self, pattern: str = "*", page: int = 1000) -> Iterator[TensorInfo]:
        """The records of list(pattern), read a page at a time: memory stays that of one
        page whatever the registry holds; only names under the glob's literal prefix are read."""
        from ._lib import TensorInfoC
        after = b""
        while True:
            arr = ctypes.POINTER(TensorInfoC)()
            n = ctypes.c_size_t()
            nxt = ctypes.create_string_buffer(256)
            check(lib.memcuda_list_page(self._handle(), pattern.encode(), after, page, ctypes.byref(arr),
                                        ctypes.byref(n), nxt))
            try:
                infos = [TensorInfo.from_c(arr[i]) for i in range(n.value)]
            finally:
                lib.memcuda_free_infos(arr)
            yield from infos
            after = nxt.value
            if not after:
                return

    def list(self, pattern: str = "*") -> List[TensorInfo]:
        """Records of the tensors whose names match a glob, sorted by name."""
        from ._lib import TensorInfoC
        arr = ctypes.POINTER(TensorInfoC)()
        n = ctypes.c_size_t()
        check(lib.memcuda_list(self._handle(), pattern.encode(), ctypes.byref(arr), ctypes.byref(n)))
        try:
            return [TensorInfo.from_c(arr[i]) for i in range(n.value)]
        finally:
            lib.memcuda_free_infos(arr)

    def stats(self) -> Stats:
        """Counts and bytes of the registry, its leader, and this process."""
        s = StatsC()
        lib.memcuda_stats_init(ctypes.byref(s))
        check(lib.memcuda_stats_get(self._handle(), ctypes.byref(s)))
        vals = {f: getattr(s, f) for f, _ in StatsC._fields_ if f != "struct_size"}
        vals["leader_present"] = bool(vals["leader_present"])
        vals["leader_is_self"] = bool(vals["leader_is_self"])
        vals["leader_session"] = vals["leader_session"].decode(errors="replace")
        return Stats(**vals)

    def flush(self, timeout: Optional[float] = None) -> None:
        """Waits until the releases this process queued (dropped handles, DLPack
        deleters) are in Redis. Raises TimeoutError."""
        check(lib.memcuda_flush(self._handle(), -1 if timeout is None else int(timeout * 1000)))

    def collect_garbage(self) -> GcReport:
        """Drops the references of dead processes now (the allocator of record
        also does it on its own every gc_interval)."""
        r = GcReportC()
        r.struct_size = ctypes.sizeof(GcReportC)
        check(lib.memcuda_collect_garbage(self._handle(), ctypes.byref(r)))
        return GcReport(**{f: getattr(r, f) for f, _ in GcReportC._fields_ if f != "struct_size"})

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
            data, code, shape = _normalized(value)
            dev = device if (backend is not None or device is not None) else _device_of(data)
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
                _copy_into(out[key], data, stream)
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
        co.backend, co.device = _backend_device(backend, device)
        co.persistent = 1 if persistent else 0
        arr = ctypes.POINTER(ctypes.c_void_p)()
        n = ctypes.c_size_t()
        check(lib.memcuda_publish_safetensors(self._handle(), prefix.encode(), os.fsencode(path), ctypes.byref(co),
                                              int(staging_bytes), ctypes.byref(arr), ctypes.byref(n)))
        try:
            tensors = Tensor.adopt_all(arr[:n.value])
        finally:
            lib.memcuda_free_tensor_array(arr)
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
        b, _ = _backend_device(backend, None)
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
                            backend: Optional[str] = None, max_versions: int = 2) -> Any:
        """Stages version N+1 of model `prefix` in a SECOND set of tensors while
        readers keep N: returns a ``ModelVersionWriter`` (``version``, ``tensors``,
        ``torch()``, ``commit(stream=None)``, ``abort()``; a context manager that
        aborts on exception). Values are tensor-likes (copied in) or
        ``(shape, dtype)`` layouts (left for the caller to fill). AlreadyExists
        while another live process stages a version; BudgetExceeded when
        `max_versions` versions (the current one and older ones a reader still
        holds) have memory."""
        from .model_versions import begin_model_version
        return begin_model_version(self, prefix, state_dict_or_layout, device=device, backend=backend,
                                   max_versions=max_versions)

    def publish_model(self, prefix: str, state_dict: Mapping[str, Any], *, stream: Stream = None,
                      device: Device = None, backend: Optional[str] = None, max_versions: int = 2) -> int:
        """``begin_model_version`` + copy + ``commit(stream)``: returns the new version."""
        from .model_versions import publish_model
        return publish_model(self, prefix, state_dict, stream=stream, device=device, backend=backend,
                             max_versions=max_versions)

    def open_model(self, prefix: str, framework: Optional[str] = None, stream: Stream = None) -> Any:
        """Pins the model's current version (one reference): a ``PinnedModel``
        (``version``, ``tensors``, ``latest()``, ``advance(stream=None)``,
        ``close()``; a context manager). `stream` is ordered after the
        producer's writes of that version (None: the legacy default stream)."""
        from .model_versions import open_model
        return open_model(self, prefix, framework, stream)

    def get_state_dict(self, prefix: str, framework: Optional[str] = None, *,
                       allow_copy: bool = False) -> Dict[str, Any]:
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
        views is gone."""
        if framework not in (None, "torch", "numpy"):
            raise InvalidArgument(f"framework must be None, 'torch' or 'numpy', got {framework!r}")
        if framework == "torch":
            # Straight from the C array: one DLPack import per allocation (a
            # packed dict: one), ordered by the batch's records, no Tensor
            # object per tensor (memcuda/_torch_open.py).
            from ._torch_open import release_handles, torch_views_of_handles
            arr = ctypes.POINTER(ctypes.c_void_p)()
            n = ctypes.c_size_t()
            check(lib.memcuda_open_state_dict(self._handle(), prefix.encode(), ctypes.byref(arr), ctypes.byref(n)))
            try:
                names, views = torch_views_of_handles(arr, n.value) if n.value else ([], [])
            finally:
                release_handles(arr, n.value)
            cut = len(prefix)
            return {name[cut:]: v for name, v in zip(names, views)}
        got = self._by_name(lib.memcuda_open_state_dict, prefix)
        out: Dict[str, Any] = {}
        for name, t in got.items():
            out[name[len(prefix):]] = t if framework is None else t.numpy(allow_copy=allow_copy)
        return out


def _normalized(data: Any) -> Tuple[Any, int, Tuple[int, ...]]:
    """(data, MEMCUDA_DTYPE_* code, shape); what has no shape goes through numpy.asarray."""
    if not hasattr(data, "shape"):
        import numpy
        data = numpy.asarray(data)
    return data, dtypes.code_of(_dtype_of(data)), tuple(int(d) for d in data.shape)


def _dtype_of(data: Any) -> Any:
    dt = getattr(data, "dtype", None)
    if dt is None:
        import numpy
        return numpy.asarray(data).dtype
    return dt


def _device_of(data: Any) -> Device:
    mod = type(data).__module__.split(".")[0]
    if mod == "torch":
        return data.device.index if data.is_cuda else "cpu"
    if mod == "cupy":
        return data.device.id
    return None  # NumPy and friends: the registry's default backend


def _copy_into(dst: Tensor, data: Any, stream: Stream) -> None:
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

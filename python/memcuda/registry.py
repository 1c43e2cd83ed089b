"""Registry: a connection to the mem-cuda tensor registry (C++: memcuda::TensorRegistry)."""
from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from . import _options, dtypes
from ._lib import CreateOptions, GcReportC, RegistryOptions, StatsC, TensorSpecC, lib
from ._models import ModelMethods
from ._scoped import Scoped
from ._place import Device, backend_device, copy_into, device_of, normalized
from .errors import InvalidArgument, MemcudaError, NotFound, TypeMismatch, check
from .tensor import Stream, Tensor, TensorInfo, new_info_c, stream_ptr

_close_lock = threading.Lock()  # two threads closing one registry close it once


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
    pulls: int  # a fleet node's allocator of record: tensors pulled from other nodes
    pulled_bytes: int


@dataclass(frozen=True)
class GcReport:
    """What one ``Registry.collect_garbage`` found and did."""
    dead_holders: int
    references_dropped: int
    tensors_freed: int
    sessions_pruned: int
    tensors_migrated: int
    tensors_lost: int


class Registry(ModelMethods, Scoped):
    """A connection to the tensor registry in Redis, with the same options as C++.

    Args:
        url: ``redis://host:port/db``, ``unix:///path.sock``,
            ``redis+sentinel://h:p,h:p/service`` or ``redis+cluster://h:p,h:p`` (default:
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

        The pool this registry allocates from while it is the allocator of
        record (C++ PoolOptions; docs/operations.md, "Timings and their knobs"):
        slab_bytes, host_slab_bytes: slab sizes of the cuda and host pools
            (None: 256 MiB and 32 MiB).
        dedicated_threshold: bytes from which a tensor gets an allocation of
            its own (None: half a slab).
        pack_batches_min_bytes: a ``create_many`` this large on one device is
            placed in one allocation (None: 64 MiB; 0: never).
        alignment: of every block, a power of two of at least 256 (None: 256).
        retain_empty_slabs: empty slabs kept per pool (None: 1; 0: none).
        budget_bytes: bytes each device's pool may hold; a create past it
            raises BudgetExceeded (None: no budget).
        device_budgets: {CUDA ordinal or -1 (host): bytes}, overriding
            budget_bytes per device.
        upstream: where cuda slabs come from: an object with
            ``allocate(bytes, device) -> int`` (a cudaMalloc pointer) and
            ``deallocate(ptr, bytes, device)``, called from registry threads
            (None: cudaMalloc). Kept for the life of the process; not called
            once the interpreter exits (its slabs are left to the process's end).
        poison: fill freed blocks and padding with 0xDD (None:
            ``$MEMCUDA_DEBUG_POISON``, else False).

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
                 allowed_gids: Optional[Sequence[int]] = None, slab_bytes: Optional[int] = None,
                 host_slab_bytes: Optional[int] = None, dedicated_threshold: Optional[int] = None,
                 pack_batches_min_bytes: Optional[int] = None, alignment: Optional[int] = None,
                 retain_empty_slabs: Optional[int] = None, budget_bytes: Optional[int] = None,
                 device_budgets: Optional[Mapping[int, int]] = None, upstream: Any = None,
                 poison: Optional[bool] = None) -> None:
        self._h: Optional[int] = None
        self._pid = os.getpid()
        o = RegistryOptions()
        lib.memcuda_registry_options_init(ctypes.byref(o))
        o.url = url.encode() if url else None
        o.name_space = namespace.encode() if namespace else None
        o.control_thread = 1 if control_thread else 0
        o.default_backend, _ = backend_device(default_backend, None)
        o.default_device = default_device
        _options.fill(o, request_timeout=request_timeout, lease_ttl=lease_ttl, session_ttl=session_ttl,
                      gc_interval=gc_interval, connect_timeout=connect_timeout, command_timeout=command_timeout,
                      client_connections=client_connections, waiting_connections=waiting_connections,
                      share_references=share_references, release_linger=release_linger,
                      cuda_allocation=cuda_allocation, serve_stall_timeout=serve_stall_timeout)
        keep = _options.fill_transfer(o, runtime_dir=runtime_dir, allowed_uids=allowed_uids,
                                      allowed_gids=allowed_gids)
        keep += _options.fill_pool(o, dict(
            slab_bytes=slab_bytes, host_slab_bytes=host_slab_bytes, dedicated_threshold=dedicated_threshold,
            pack_batches_min_bytes=pack_batches_min_bytes, alignment=alignment,
            retain_empty_slabs=retain_empty_slabs, budget_bytes=budget_bytes, device_budgets=device_budgets,
            upstream=upstream, poison=poison))
        self._upstream = upstream
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
        return dict(_options.as_dict(o), upstream=self._upstream)

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
        co.backend, co.device = backend_device(backend, device)
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

    def get(self, name: str, dtype: Optional[dtypes.DType] = None, stream: Stream = None, *,
            local: bool = False, device: Optional[int] = None) -> Tensor:
        """Opens a tensor by name (one Redis round trip; the memory is mapped once
        per process). dtype: check the stored dtype (TypeMismatch). stream: make
        this CUDA stream wait for the producer's last ``publish``. local: the
        copy on the reader's device (``device``, default the current one) when
        ``replicate`` made one and it is current, else the tensor itself
        (``Tensor.name`` says which); stream then waits for that copy.
        Raises NotFound, TypeMismatch, Lost, Unavailable."""
        code = -1 if dtype is None else dtypes.code_of(dtype)
        h = ctypes.c_void_p()
        if local:
            check(lib.memcuda_get_local(self._handle(), name.encode(), code, -1 if device is None else int(device),
                                        stream_ptr(stream), ctypes.byref(h)))
        elif stream is None:
            check(lib.memcuda_get(self._handle(), name.encode(), code, ctypes.byref(h)))
        else:
            check(lib.memcuda_get_on_stream(self._handle(), name.encode(), code, stream_ptr(stream),
                                            ctypes.byref(h)))
        return Tensor(h.value)

    def replicate(self, name: str, devices: Optional[Sequence[int]] = None, *, prefix: bool = False,
                  idle: Optional[float] = None) -> int:
        """Makes (or finds current) a copy of tensor ``name`` (``prefix``: of
        every tensor under it) on each of ``devices`` (CUDA ordinals; default:
        every visible device) but the source's own, shared by every process of
        that device; ``get(name, local=True)`` there returns it. idle: seconds
        unused after which a copy is removed (default: kept while the source
        lives). A later ``publish`` of the source copies it into them again, in
        place. Returns the number of copies. Raises InvalidArgument (a host
        tensor), NotFound, Unavailable, NotZeroCopy, BudgetExceeded."""
        arr, count = _ordinals(devices)
        n = ctypes.c_size_t()
        check(lib.memcuda_replicate(self._handle(), name.encode(), 1 if prefix else 0, arr, count,
                                    0 if idle is None else int(idle * 1000), ctypes.byref(n)))
        return n.value

    def drop_replicas(self, name: str, devices: Optional[Sequence[int]] = None, *, prefix: bool = False) -> int:
        """Removes the copies of ``name`` (``prefix``: of every tensor under
        it) on ``devices`` (default every visible one); readers keep what they
        hold. Returns how many were removed."""
        arr, count = _ordinals(devices)
        n = ctypes.c_size_t()
        check(lib.memcuda_drop_replicas(self._handle(), name.encode(), 1 if prefix else 0, arr, count,
                                        ctypes.byref(n)))
        return n.value

    def get_slice(self, name: str, dim: int, start: int, length: Optional[int] = None) -> Tensor:
        """``get(name).slice(dim, start, length)``: a zero-copy view of one
        dimension's range, holding the get's reference."""
        with self.get(name) as t:
            return t.slice(dim, start, length)

    def get_shard(self, name: str, dim: int, rank: int, world: int) -> Tensor:
        """Tensor-parallel shard `rank` of `world` of tensor `name` along `dim`
        (``get(name).shard(dim, rank, world)``)."""
        with self.get(name) as t:
            return t.shard(dim, rank, world)

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
        tensors = Tensor.adopt_array(lambda arr, n: fn(self._handle(), prefix.encode(), arr, n))
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
            c.options.backend, c.options.device = backend_device(opts["backend"], opts["device"])
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
        data, code, shape = normalized(data)
        if backend is None and device is None:
            device = device_of(data)
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
            copy_into(dst, data, stream)
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


def _ordinals(devices: Optional[Sequence[int]]):
    """A C array of device ordinals and its length (None, 0: every device)."""
    devs = [int(d) for d in (devices or [])]
    return ((ctypes.c_int * len(devs))(*devs) if devs else None), len(devs)

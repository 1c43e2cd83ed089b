"""Registry options between Python keywords and the C struct memcuda_registry_options."""
from __future__ import annotations

import ctypes
from typing import Any, Dict, Iterable, List, Mapping, Optional

from ._lib import ALLOCATE_FN, DEALLOCATE_FN, DeviceBudgetC, DeviceResourceC
from ._place import BACKEND_NAMES
from .errors import InvalidArgument

CUDA_ALLOCATIONS = {None: 0, "auto": 1, "vmm": 2, "ipc": 3}  # MEMCUDA_CUDA_ALLOCATION_*
_SHARING = {None: 0, True: 1, False: 2}  # MEMCUDA_SHARING_*
_POISON = {None: 0, True: 1, False: 2}  # MEMCUDA_POISON_*
# PoolOptions' fields (Registry keywords): None keeps the default.
POOL_KEYWORDS = ("slab_bytes", "host_slab_bytes", "dedicated_threshold", "pack_batches_min_bytes", "alignment",
                 "retain_empty_slabs", "budget_bytes", "device_budgets", "upstream", "poison")
# Upstream callbacks live as long as the process: a pool's slabs may go back
# to them after its Registry is closed (open tensors keep their memory).
_upstreams: List[Any] = []


def _ms(seconds: Optional[float], what: str, off: bool = False) -> int:
    """0 (the default) for None; with `off`, -1 for 0 (off); else whole milliseconds."""
    if seconds is None:
        return 0
    if seconds < 0 or (seconds == 0 and not off):
        raise InvalidArgument(f"{what} must be {'non-negative' if off else 'positive'} seconds, got {seconds!r}")
    return -1 if seconds == 0 else max(1, int(round(seconds * 1000)))


def _int(n: Optional[int], what: str, least: int = 0, off: bool = False) -> int:
    """0 (the default) for None; with `off`, -1 for 0 (none/never)."""
    if n is None:
        return 0
    if isinstance(n, bool) or not isinstance(n, int) or n < least:
        raise InvalidArgument(f"{what} must be an int of at least {least}, got {n!r}")
    return -1 if off and n == 0 else n


def _ids(ids: Optional[Iterable[int]], what: str) -> Optional[Any]:
    """None (the default: the MEMCUDA_* variable) or a uint32 array the
    struct points to; the caller keeps it alive until the open returns."""
    if ids is None:
        return None
    if isinstance(ids, (str, bytes)):
        raise InvalidArgument(f"{what} must be a list of ints, got {ids!r}")
    out: List[int] = []
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < 0xFFFFFFFF:
            raise InvalidArgument(f"{what} must hold uids/gids (ints 0..4294967294), got {i!r}")
        out.append(i)
    return (ctypes.c_uint32 * max(1, len(out)))(*out), len(out)


def fill_transfer(o: Any, *, runtime_dir: Optional[str], allowed_uids: Optional[Iterable[int]],
                  allowed_gids: Optional[Iterable[int]]) -> List[Any]:
    """Sets runtime_dir and the peer policy; returns the arrays to keep alive."""
    if runtime_dir is not None and not isinstance(runtime_dir, str):
        raise InvalidArgument(f"runtime_dir must be a str path, got {runtime_dir!r}")
    o.runtime_dir = runtime_dir.encode() if runtime_dir else None
    keep = []
    for field, ids in (("allowed_uids", allowed_uids), ("allowed_gids", allowed_gids)):
        arr = _ids(ids, field)
        if arr is not None:
            setattr(o, field, ctypes.cast(arr[0], ctypes.POINTER(ctypes.c_uint32)))
            setattr(o, field + "_count", arr[1])
            keep.append(arr[0])
    return keep


def fill(o: Any, *, request_timeout: Optional[float], lease_ttl: Optional[float], session_ttl: Optional[float],
         gc_interval: Optional[float], connect_timeout: Optional[float], command_timeout: Optional[float],
         client_connections: Optional[int], waiting_connections: Optional[int],
         share_references: Optional[bool], release_linger: Optional[float], cuda_allocation: Optional[str],
         serve_stall_timeout: Optional[float]) -> None:
    """Sets the struct's timing, pool, sharing and allocation fields (0: the
    default, which the C ABI takes from the MEMCUDA_* variables)."""
    o.request_timeout_ms = _ms(request_timeout, "request_timeout")
    o.lease_ttl_ms = _ms(lease_ttl, "lease_ttl")
    o.session_ttl_ms = _ms(session_ttl, "session_ttl")
    o.gc_interval_ms = _ms(gc_interval, "gc_interval")
    o.connect_timeout_ms = _ms(connect_timeout, "connect_timeout")
    o.command_timeout_ms = _ms(command_timeout, "command_timeout")
    o.client_connections = _int(client_connections, "client_connections", 1)
    o.waiting_connections = _int(waiting_connections, "waiting_connections", 1)
    o.share_references = _SHARING[None if share_references is None else bool(share_references)]
    o.release_linger_ms = _ms(release_linger, "release_linger", off=True)
    if cuda_allocation not in CUDA_ALLOCATIONS:
        raise InvalidArgument(f"cuda_allocation must be 'auto', 'vmm' or 'ipc', got {cuda_allocation!r}")
    o.cuda_allocation = CUDA_ALLOCATIONS[cuda_allocation]
    o.serve_stall_timeout_ms = _ms(serve_stall_timeout, "serve_stall_timeout", off=True)


def _upstream(res: Any) -> Any:
    """A memcuda_device_resource calling res.allocate(bytes, device) -> int
    pointer and res.deallocate(ptr, bytes, device)."""
    if not callable(getattr(res, "allocate", None)) or not callable(getattr(res, "deallocate", None)):
        raise InvalidArgument(f"upstream must have allocate(bytes, device) and deallocate(ptr, bytes, device), "
                              f"got {res!r}")
    c = DeviceResourceC(ALLOCATE_FN(lambda _u, n, d: res.allocate(n, d) or None),
                        DEALLOCATE_FN(lambda _u, p, n, d: res.deallocate(p, n, d)), None)
    _upstreams.append((res, c))
    return c


def fill_pool(o: Any, kw: Mapping[str, Any]) -> List[Any]:
    """Sets the struct's pool from the PoolOptions keywords; returns what to keep alive."""
    p = o.pool
    for field in ("slab_bytes", "host_slab_bytes", "dedicated_threshold", "alignment", "budget_bytes"):
        setattr(p, field, _int(kw.get(field), field))
    p.pack_batches_min_bytes = _int(kw.get("pack_batches_min_bytes"), "pack_batches_min_bytes", off=True)
    p.retain_empty_slabs = _int(kw.get("retain_empty_slabs"), "retain_empty_slabs", off=True)
    p.poison = _POISON[None if kw.get("poison") is None else bool(kw.get("poison"))]
    keep: List[Any] = []
    budgets = kw.get("device_budgets")
    if budgets is not None:
        if not isinstance(budgets, Mapping):
            raise InvalidArgument(f"device_budgets must be a dict {{device: bytes}}, got {budgets!r}")
        arr = (DeviceBudgetC * max(1, len(budgets)))(
            *((_int_device(d), _int(b, f"device_budgets[{d!r}]")) for d, b in budgets.items()))
        p.device_budgets, p.device_budgets_count = arr, len(budgets)
        keep.append(arr)
    if kw.get("upstream") is not None:
        c = _upstream(kw["upstream"])
        p.upstream = ctypes.pointer(c)
    return keep


def _int_device(d: Any) -> int:
    if isinstance(d, bool) or not isinstance(d, int) or d < -1:
        raise InvalidArgument(f"device_budgets keys must be CUDA ordinals or -1 (host), got {d!r}")
    return d


def _pool_dict(p: Any) -> Dict[str, Any]:
    return {
        "slab_bytes": p.slab_bytes,
        "host_slab_bytes": p.host_slab_bytes,
        "dedicated_threshold": p.dedicated_threshold,
        "pack_batches_min_bytes": max(0, p.pack_batches_min_bytes),
        "alignment": p.alignment,
        "retain_empty_slabs": max(0, p.retain_empty_slabs),
        "budget_bytes": p.budget_bytes,
        "device_budgets": {p.device_budgets[i].device: p.device_budgets[i].bytes
                           for i in range(p.device_budgets_count)},
        "poison": p.poison == 1,
    }


def as_dict(o: Any) -> Dict[str, Any]:
    """The struct memcuda_registry_get_options filled, as constructor keywords
    (the pool's included, but upstream: the Registry keeps that)."""
    kinds = {v: k for k, v in CUDA_ALLOCATIONS.items() if k}
    return {
        "namespace": (o.name_space or b"").decode() or None,
        "control_thread": bool(o.control_thread),
        "default_backend": BACKEND_NAMES[o.default_backend],
        "default_device": o.default_device,
        "request_timeout": o.request_timeout_ms / 1000,
        "lease_ttl": o.lease_ttl_ms / 1000,
        "session_ttl": o.session_ttl_ms / 1000,
        "gc_interval": o.gc_interval_ms / 1000,
        "connect_timeout": o.connect_timeout_ms / 1000,
        "command_timeout": o.command_timeout_ms / 1000,
        "client_connections": o.client_connections,
        "waiting_connections": o.waiting_connections,
        "share_references": o.share_references == 1,
        "release_linger": max(0, o.release_linger_ms) / 1000,
        "cuda_allocation": kinds[o.cuda_allocation],
        "serve_stall_timeout": max(0, o.serve_stall_timeout_ms) / 1000,
        "runtime_dir": (o.runtime_dir or b"").decode() or None,
        "allowed_uids": [o.allowed_uids[i] for i in range(o.allowed_uids_count)],
        "allowed_gids": [o.allowed_gids[i] for i in range(o.allowed_gids_count)],
        **_pool_dict(o.pool),
    }

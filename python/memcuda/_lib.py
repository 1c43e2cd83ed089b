"""Loads libmemcuda_c.so and declares its C ABI (include/memcuda/c/memcuda.h) for ctypes.

The library is looked up, in order, at:

1. ``$MEMCUDA_LIBRARY`` (a path to the .so, or a name for the loader): an
   override for developers, tried alone: a path that does not exist or does
   not load is an error, not a fallback to the others;
2. inside this package (``memcuda/libmemcuda_c.so``: what ``pip install
   ./python`` builds and ships, and what the CMake option
   ``MEMCUDA_BUILD_PYTHON`` stages);
3. the build trees of a source checkout (``<repo>/build*/src/c_api/``), for
   ``PYTHONPATH=python``;
4. the dynamic loader's search path (``libmemcuda_c.so`` after ``cmake --install``).
"""
from __future__ import annotations

import ctypes
import glob
import os
from typing import Optional

_LIBNAME = "libmemcuda_c.so"
ABI_VERSION = 2  # MEMCUDA_C_ABI_VERSION this package was written against

c_int, c_int64, c_uint64, c_uint32, c_size_t = (ctypes.c_int, ctypes.c_int64, ctypes.c_uint64,
                                                 ctypes.c_uint32, ctypes.c_size_t)
c_char_p, c_void_p, c_uint = ctypes.c_char_p, ctypes.c_void_p, ctypes.c_uint
P = ctypes.POINTER

MAX_RANK = 8


class DeviceBudgetC(ctypes.Structure):
    """memcuda_device_budget: one entry of PoolOptions::device_budgets."""
    _fields_ = [("device", c_int), ("bytes", c_uint64)]


ALLOCATE_FN = ctypes.CFUNCTYPE(c_void_p, c_void_p, c_size_t, c_int)
DEALLOCATE_FN = ctypes.CFUNCTYPE(None, c_void_p, c_void_p, c_size_t, c_int)


class DeviceResourceC(ctypes.Structure):
    """memcuda_device_resource: where cuda slabs come from (PoolOptions::upstream)."""
    _fields_ = [("allocate", ALLOCATE_FN), ("deallocate", DEALLOCATE_FN), ("user_data", c_void_p)]


class PoolOptionsC(ctypes.Structure):
    """memcuda_pool_options (PoolOptions)."""
    _fields_ = [
        ("slab_bytes", c_uint64),
        ("host_slab_bytes", c_uint64),
        ("dedicated_threshold", c_uint64),
        ("pack_batches_min_bytes", c_int64),
        ("alignment", c_uint64),
        ("retain_empty_slabs", c_int64),
        ("budget_bytes", c_uint64),
        ("device_budgets", P(DeviceBudgetC)),
        ("device_budgets_count", c_size_t),
        ("upstream", P(DeviceResourceC)),
        ("poison", c_int),
    ]


class RegistryOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("url", c_char_p),
        ("name_space", c_char_p),
        ("control_thread", c_int),
        ("default_backend", c_int),
        ("default_device", c_int),
        ("request_timeout_ms", c_int64),
        ("lease_ttl_ms", c_int64),
        ("session_ttl_ms", c_int64),
        ("gc_interval_ms", c_int64),
        ("connect_timeout_ms", c_int64),
        ("command_timeout_ms", c_int64),
        ("client_connections", c_int64),
        ("waiting_connections", c_int64),
        ("share_references", c_int),
        ("release_linger_ms", c_int64),
        ("cuda_allocation", c_int),
        ("serve_stall_timeout_ms", c_int64),
        ("runtime_dir", c_char_p),
        ("allowed_uids", ctypes.POINTER(c_uint32)),
        ("allowed_uids_count", ctypes.c_size_t),
        ("allowed_gids", ctypes.POINTER(c_uint32)),
        ("allowed_gids_count", ctypes.c_size_t),
        ("pool", PoolOptionsC),
    ]


class CreateOptions(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32), ("backend", c_int), ("device", c_int), ("persistent", c_int)]


class TensorSpecC(ctypes.Structure):
    """memcuda_tensor_spec: one tensor of memcuda_create_many."""
    _fields_ = [("struct_size", c_uint32), ("name", c_char_p), ("dtype", c_int), ("ndim", c_int),
                ("shape", P(c_int64)), ("options", CreateOptions)]


class ModelVersionOptionsC(ctypes.Structure):
    """memcuda_model_version_options: A/B model versions (memcuda_begin_model_version)."""
    _fields_ = [("struct_size", c_uint32), ("backend", c_int), ("device", c_int), ("max_versions", c_uint32),
                ("replicas", P(c_int)), ("n_replicas", c_size_t)]


class TensorInfoC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("name", ctypes.c_char * 256),
        ("dtype", c_int),
        ("ndim", c_int),
        ("shape", c_int64 * MAX_RANK),
        ("backend", c_int),
        ("device", c_int),
        ("device_uuid", ctypes.c_char * 64),
        ("node", ctypes.c_char * 128),
        ("bytes", c_uint64),
        ("refcount", c_int64),
        ("state", c_int),
        ("generation", c_uint64),
        ("owner_pid", c_int64),
        ("ctime_ms", c_int64),
        ("event_version", c_uint64),
        ("holders", c_int64),
    ]


class StatsC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("leader_present", c_int),
        ("leader_is_self", c_int),
        ("leader_epoch", c_uint64),
        ("leader_session", ctypes.c_char * 128),
    ] + [(f, c_uint64) for f in (
        "sessions", "tensors", "bytes", "queue_length", "pools", "pool_in_use", "pool_reserved",
        "owned_allocations", "owned_bytes", "creates", "frees", "live_imports", "import_opens", "import_hits",
        "copies", "copied_bytes", "pulls", "pulled_bytes")]


class GcReportC(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32)] + [(f, c_uint64) for f in (
        "dead_holders", "references_dropped", "tensors_freed", "sessions_pruned", "tensors_migrated",
        "tensors_lost")]


class TensorFieldsC(ctypes.Structure):
    """memcuda_tensor_fields: a handle's fields, many handles per call."""
    _fields_ = [
        ("struct_size", c_uint32),
        ("name", c_char_p),
        ("data", c_void_p),
        ("dtype", c_int),
        ("ndim", c_int),
        ("shape", P(c_int64)),
        ("backend", c_int),
        ("device", c_int),
        ("bytes", c_uint64),
        ("generation", c_uint64),
        ("alloc_base", c_void_p),
        ("offset", c_uint64),
        ("alloc_bytes", c_uint64),
        ("has_event", c_int),
        ("strides", P(c_int64)),
    ]


# DLPack 0.6 (the layout every DLPack consumer of the unversioned
# "dltensor" capsule reads).
class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", P(c_int64)),
        ("strides", P(c_int64)),
        ("byte_offset", c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DLDeleter = ctypes.CFUNCTYPE(None, c_void_p)
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p), ("deleter", DLDeleter)]

# (name, restype, argtypes) of every function used.
_SIGNATURES = [
    ("memcuda_last_error_code", c_int, []),
    ("memcuda_last_error_message", c_char_p, []),
    ("memcuda_last_error_cuda_status", c_int, []),
    ("memcuda_error_name", c_char_p, [c_int]),
    ("memcuda_error_parent", c_int, [c_int]),
    ("memcuda_version_string", c_char_p, []),
    ("memcuda_abi_version", c_int, []),
    ("memcuda_has_cuda", c_int, []),
    ("memcuda_dtype_name", c_char_p, [c_int]),
    ("memcuda_dtype_from_name", c_int, [c_char_p]),
    ("memcuda_dtype_itemsize", c_size_t, [c_int]),
    ("memcuda_registry_options_init", None, [P(RegistryOptions)]),
    ("memcuda_registry_open", c_int, [P(RegistryOptions), P(c_void_p)]),
    ("memcuda_registry_get_options", c_int, [c_void_p, P(RegistryOptions)]),
    ("memcuda_registry_close", None, [c_void_p]),
    ("memcuda_registry_session_id", c_char_p, [c_void_p]),
    ("memcuda_registry_is_leader", c_int, [c_void_p, P(c_int)]),
    ("memcuda_create_options_init", None, [P(CreateOptions)]),
    ("memcuda_create", c_int, [c_void_p, c_char_p, c_int, P(c_int64), c_int, P(CreateOptions), P(c_void_p)]),
    ("memcuda_get", c_int, [c_void_p, c_char_p, c_int, P(c_void_p)]),
    ("memcuda_get_on_stream", c_int, [c_void_p, c_char_p, c_int, c_void_p, P(c_void_p)]),
    ("memcuda_get_local", c_int, [c_void_p, c_char_p, c_int, c_int, c_void_p, P(c_void_p)]),
    ("memcuda_replicate", c_int, [c_void_p, c_char_p, c_int, P(c_int), c_size_t, c_int64, P(c_size_t)]),
    ("memcuda_drop_replicas", c_int, [c_void_p, c_char_p, c_int, P(c_int), c_size_t, P(c_size_t)]),
    ("memcuda_get_many", c_int, [c_void_p, P(c_char_p), c_size_t, P(c_void_p)]),
    ("memcuda_get_prefix", c_int, [c_void_p, c_char_p, P(P(c_void_p)), P(c_size_t)]),
    ("memcuda_free_tensor_array", None, [P(c_void_p)]),
    ("memcuda_open_state_dict", c_int, [c_void_p, c_char_p, P(P(c_void_p)), P(c_size_t)]),
    ("memcuda_open_state_dict_sharded", c_int, [c_void_p, c_char_p, c_uint, c_uint, c_void_p, c_size_t, c_int,
                                                P(P(c_void_p)), P(c_size_t)]),
    ("memcuda_tensor_slice", c_int, [c_void_p, c_int, c_int64, c_int64, P(c_void_p)]),
    ("memcuda_tensor_slice_tp", c_int, [c_void_p, c_int, c_uint, c_uint, P(c_void_p)]),
    ("memcuda_publish_safetensors", c_int, [c_void_p, c_char_p, c_char_p, c_void_p, c_size_t, P(P(c_void_p)),
                                            P(c_size_t)]),
    ("memcuda_link_state_dict", c_int, [c_void_p, c_char_p, P(c_void_p), c_size_t, P(c_int)]),
    ("memcuda_tensor_spec_init", None, [P(TensorSpecC)]),
    ("memcuda_create_many", c_int, [c_void_p, P(TensorSpecC), c_size_t, P(c_void_p)]),
    ("memcuda_publish_version", c_int, [c_void_p, c_char_p, c_void_p, c_int, c_int, P(c_uint64)]),
    ("memcuda_wait_version", c_int, [c_void_p, c_char_p, c_uint64, c_int64, c_void_p, P(c_uint64)]),
    ("memcuda_current_version", c_int, [c_void_p, c_char_p, P(c_uint64)]),
    ("memcuda_model_version_options_init", None, [P(ModelVersionOptionsC)]),
    ("memcuda_begin_model_version", c_int,
     [c_void_p, c_char_p, P(TensorSpecC), c_size_t, P(ModelVersionOptionsC), P(c_void_p)]),
    ("memcuda_model_writer_version", c_int, [c_void_p, P(c_uint64)]),
    ("memcuda_model_writer_tensors", c_int, [c_void_p, P(P(c_void_p)), P(c_size_t), P(c_size_t)]),
    ("memcuda_model_writer_commit", c_int, [c_void_p, c_void_p, P(c_uint64)]),
    ("memcuda_model_writer_abort", c_int, [c_void_p]),
    ("memcuda_model_writer_free", None, [c_void_p]),
    ("memcuda_open_model", c_int, [c_void_p, c_char_p, c_void_p, P(c_void_p)]),
    ("memcuda_open_model_local", c_int, [c_void_p, c_char_p, c_void_p, c_int, P(c_void_p)]),
    ("memcuda_pinned_model_version", c_int, [c_void_p, P(c_uint64)]),
    ("memcuda_pinned_model_tensors", c_int, [c_void_p, P(P(c_void_p)), P(c_size_t), P(c_size_t)]),
    ("memcuda_pinned_model_latest", c_int, [c_void_p, P(c_uint64)]),
    ("memcuda_pinned_model_advance", c_int, [c_void_p, c_void_p, P(c_int)]),
    ("memcuda_pinned_model_free", None, [c_void_p]),
    ("memcuda_remove", c_int, [c_void_p, c_char_p]),
    ("memcuda_wait", c_int, [c_void_p, c_char_p, c_int64, P(c_int)]),
    ("memcuda_flush", c_int, [c_void_p, c_int64]),
    ("memcuda_tensor_info_init", None, [P(TensorInfoC)]),
    ("memcuda_info", c_int, [c_void_p, c_char_p, P(TensorInfoC)]),
    ("memcuda_list", c_int, [c_void_p, c_char_p, P(P(TensorInfoC)), P(c_size_t)]),
    ("memcuda_free_infos", None, [P(TensorInfoC)]),
    ("memcuda_list_page", c_int, [c_void_p, c_char_p, c_char_p, c_size_t, P(P(TensorInfoC)), P(c_size_t), c_char_p]),
    ("memcuda_stats_init", None, [P(StatsC)]),
    ("memcuda_stats_get", c_int, [c_void_p, P(StatsC)]),
    ("memcuda_collect_garbage", c_int, [c_void_p, P(GcReportC)]),
    ("memcuda_tensor_release", None, [c_void_p]),
    ("memcuda_tensor_retain", c_int, [c_void_p, P(c_void_p)]),
    ("memcuda_tensor_get_info", c_int, [c_void_p, P(TensorInfoC)]),
    ("memcuda_tensor_valid", c_int, [c_void_p, P(c_int)]),
    ("memcuda_tensor_publish", c_int, [c_void_p, c_void_p, P(c_uint64)]),
    ("memcuda_tensor_wait_published", c_int, [c_void_p, c_void_p]),
    ("memcuda_tensor_wait_opened", c_int, [c_void_p, c_void_p]),
    ("memcuda_tensor_copy_from_host", c_int, [c_void_p, c_void_p, c_uint64, c_uint64]),
    ("memcuda_tensor_copy_to_host", c_int, [c_void_p, c_void_p, c_uint64, c_uint64]),
    ("memcuda_tensor_to_dlpack", c_int, [c_void_p, P(P(DLManagedTensor))]),
    ("memcuda_tensors_fields", c_int, [P(c_void_p), c_size_t, P(TensorFieldsC), c_size_t]),
    ("memcuda_tensors_wait_opened", c_int, [P(c_void_p), c_size_t, c_void_p]),
    ("memcuda_tensors_to_dlpack_span", c_int, [P(c_void_p), c_size_t, P(P(DLManagedTensor))]),
    ("memcuda_tensor_check_device", c_int, [c_void_p, c_int]),
    ("memcuda_note_copy", c_int, [c_void_p, c_char_p, c_uint64, c_char_p]),
    ("memcuda_share_dlpack", c_int, [c_void_p, c_char_p, c_void_p, c_void_p, P(c_void_p)]),
    ("memcuda_share_many_dlpack", c_int, [c_void_p, P(c_char_p), P(c_void_p), c_size_t, c_void_p, P(c_void_p)]),
    ("memcuda_share_arrow", c_int, [c_void_p, c_char_p, c_void_p, c_void_p, c_void_p, P(c_void_p)]),
    ("memcuda_share_arrow_array", c_int, [c_void_p, c_char_p, c_void_p, c_void_p, c_void_p, P(c_void_p)]),
    ("memcuda_stop_callbacks", None, []),
]


def _candidates() -> list:
    env = os.environ.get("MEMCUDA_LIBRARY")
    if env:
        if os.sep in env and not os.path.isfile(env):
            raise ImportError(f"memcuda: MEMCUDA_LIBRARY={env} is not a file (unset it to use the library "
                              "shipped inside the package)")
        return [env]  # an override: nothing else is tried
    here = os.path.dirname(os.path.abspath(__file__))
    out = [os.path.join(here, _LIBNAME)]
    repo = os.path.dirname(os.path.dirname(here))  # <repo>/python/memcuda -> <repo>
    out += sorted(glob.glob(os.path.join(repo, "build*", "src", "c_api", _LIBNAME)))
    out.append(_LIBNAME)
    return out


def _load() -> ctypes.CDLL:
    errors = []
    candidates = _candidates()
    for path in candidates:
        if os.sep in path and not os.path.exists(path):
            continue
        try:
            lib = ctypes.CDLL(path)
            break
        except OSError as e:
            errors.append(f"{path}: {e}")
    else:
        raise ImportError(
            "memcuda: cannot load libmemcuda_c.so (pip install ./python builds it into the package; "
            "or set MEMCUDA_LIBRARY to a libmemcuda_c.so built with CMake, target memcuda_c); tried: "
            + "; ".join(errors or candidates))
    for name, restype, argtypes in _SIGNATURES:
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    abi = lib.memcuda_abi_version()
    if abi != ABI_VERSION:
        raise ImportError(f"memcuda: {lib._name} has C ABI version {abi}, this package needs {ABI_VERSION}")
    return lib


lib = _load()
path: Optional[str] = lib._name

/* The options of memcuda_registry_open (C++: RegistryOptions and its
 * PoolOptions, include/memcuda/options.hpp), part of <memcuda/c/memcuda.h>. */
#ifndef MEMCUDA_C_OPTIONS_H
#define MEMCUDA_C_OPTIONS_H

#include "memcuda/c/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* memcuda_registry_options.share_references */
#define MEMCUDA_SHARING_DEFAULT 0 /* $MEMCUDA_SHARE_REFERENCES, else on */
#define MEMCUDA_SHARING_ON 1
#define MEMCUDA_SHARING_OFF 2

/* memcuda_registry_options.cuda_allocation (RegistryOptions::cuda_allocation) */
#define MEMCUDA_CUDA_ALLOCATION_DEFAULT 0 /* $MEMCUDA_CUDA_ALLOCATION, else auto */
#define MEMCUDA_CUDA_ALLOCATION_AUTO 1    /* vmm where the device supports it, else ipc */
#define MEMCUDA_CUDA_ALLOCATION_VMM 2     /* cuMem allocations shared as fds */
#define MEMCUDA_CUDA_ALLOCATION_IPC 3     /* legacy cudaIpc handles */

/* memcuda_pool_options.poison */
#define MEMCUDA_POISON_DEFAULT 0 /* $MEMCUDA_DEBUG_POISON, else off */
#define MEMCUDA_POISON_ON 1
#define MEMCUDA_POISON_OFF 2

/* One device's budget (PoolOptions::device_budgets). */
typedef struct memcuda_device_budget {
  int device;     /* CUDA ordinal; -1: the host backend */
  uint64_t bytes; /* what the pool of that device may hold; 0: no budget */
} memcuda_device_budget;

/* Where cuda slabs come from (PoolOptions::upstream; C++:
 * DeviceMemoryResource, include/memcuda/memory_resource.hpp, whose rules
 * hold: plain cudaMalloc memory, one allocation per call). allocate returns
 * NULL on failure (the create fails with MEMCUDA_ERR_CUDA); both are called
 * from registry threads for as long as the registry's pools live, until
 * memcuda_stop_callbacks (memcuda/c/memcuda_share.h). */
typedef struct memcuda_device_resource {
  void* (*allocate)(void* user_data, size_t bytes, int device);
  void (*deallocate)(void* user_data, void* p, size_t bytes, int device);
  void* user_data;
} memcuda_device_resource;

/* The allocator of record's memory pool (PoolOptions). 0 (or NULL) in a
 * field: the C++ default. */
typedef struct memcuda_pool_options {
  uint64_t slab_bytes;            /* cuda slab size (default 256 MiB) */
  uint64_t host_slab_bytes;       /* host slab size (default 32 MiB) */
  uint64_t dedicated_threshold;   /* tensors this large get an allocation of their own (default half a slab) */
  int64_t pack_batches_min_bytes; /* a create_many this large on one device gets one allocation
                                     (default 64 MiB; -1: never) */
  uint64_t alignment;             /* of every block: a power of two, at least 256 (default 256) */
  int64_t retain_empty_slabs;     /* empty slabs kept per pool (default 1; -1: none) */
  uint64_t budget_bytes;          /* bytes each device's pool may hold (default: no budget) */
  const memcuda_device_budget* device_budgets; /* device_budgets_count overrides of budget_bytes */
  size_t device_budgets_count;
  const memcuda_device_resource* upstream;     /* NULL: cudaMalloc; copied by memcuda_registry_open */
  int poison;                     /* MEMCUDA_POISON_*: fill freed blocks and padding with 0xDD */
} memcuda_pool_options;

/* Options of memcuda_registry_open. Fill with memcuda_registry_options_init,
 * then change what you need; 0 (or NULL) in a field means "the default": the
 * MEMCUDA_* variable of that option where there is one (docs/operations.md,
 * "Environment": the C ABI starts from RegistryOptions::from_env()), else
 * the C++ default. struct_size must be the library's sizeof (the _init
 * function sets it): a header and library that differ are refused with
 * MEMCUDA_ERR_INVALID_ARGUMENT. */
typedef struct memcuda_registry_options {
  uint32_t struct_size;       /* sizeof(memcuda_registry_options) */
  const char* url;            /* redis://..., unix:///path.sock or redis+sentinel://h:p,h:p/service or redis+cluster://h:p,h:p; NULL: $MEMCUDA_REDIS_URL, else redis://127.0.0.1:6379;
                                 a URL without a password takes $MEMCUDA_REDIS_PASSWORD (and $MEMCUDA_REDIS_USER) */
  const char* name_space;     /* NULL or "": none */
  int control_thread;         /* 1 (default): may become the allocator of record; 0: client only */
  int default_backend;        /* MEMCUDA_BACKEND_*: backend of create() when not given */
  int default_device;         /* CUDA ordinal of create() when not given (default 0) */
  int64_t request_timeout_ms; /* a create served by another process (default 5000) */
  int64_t lease_ttl_ms;       /* allocator-of-record lease (default 1500) */
  int64_t session_ttl_ms;     /* a dead process's references are dropped after about this (default 2000) */
  int64_t gc_interval_ms;     /* default 500 */
  int64_t connect_timeout_ms; /* one connect to Redis (default 1000) */
  int64_t command_timeout_ms; /* one Redis command (default 2000) */
  int64_t client_connections;     /* connections at most for short calls (default 4) */
  int64_t waiting_connections;    /* connections at most for calls that wait in Redis (default 16) */
  int share_references;           /* MEMCUDA_SHARING_*: a get of a held name shares its handle (default on) */
  int64_t release_linger_ms;      /* with sharing: how long a dropped get's reference lingers;
                                     0: the default ($MEMCUDA_RELEASE_LINGER_MS, else none); -1: none; at most 60000 */
  int cuda_allocation;            /* MEMCUDA_CUDA_ALLOCATION_* */
  int64_t serve_stall_timeout_ms; /* a leader whose loop stalls this long gives up its lease (default 30000; -1: never) */
  /* The fd servers' runtime directory and peer policy (docs/fd-transfer.md); one per process. */
  const char* runtime_dir;        /* NULL or "": $MEMCUDA_RUNTIME_DIR, else /tmp/memcuda-<uid> */
  const uint32_t* allowed_uids;   /* peers served besides this uid and root; NULL: $MEMCUDA_ALLOWED_UIDS,
                                     else none; else allowed_uids_count entries (0: none) */
  size_t allowed_uids_count;
  const uint32_t* allowed_gids;   /* by effective gid; NULL: $MEMCUDA_ALLOWED_GIDS, else none */
  size_t allowed_gids_count;
  memcuda_pool_options pool;      /* the pool this registry allocates from while allocator of record */
} memcuda_registry_options;

MEMCUDA_C_EXPORT void memcuda_registry_options_init(memcuda_registry_options* opts);
/* The options an open registry runs with (after the environment and the
 * defaults), in the struct's terms: every field set, none left 0 for "the
 * default" (release_linger_ms: -1 for none, serve_stall_timeout_ms: -1 for
 * never, pool.pack_batches_min_bytes and pool.retain_empty_slabs: -1 for
 * none; pool.dedicated_threshold 0 for half a slab); url is NULL;
 * name_space, runtime_dir, allowed_uids, allowed_gids, pool.device_budgets
 * and pool.upstream are valid while reg is open (NULL when empty). Call
 * memcuda_registry_options_init on *out first. */
MEMCUDA_C_EXPORT int memcuda_registry_get_options(const memcuda_registry* reg, memcuda_registry_options* out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MEMCUDA_C_OPTIONS_H */

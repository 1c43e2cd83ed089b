/* The C ABI of mem-cuda: what Python (ctypes), Rust, Go or Julia bind to.
 *
 * A plain C99 header over libmemcuda_c.so. No C++ type crosses it: handles
 * are opaque pointers, option and record structs are plain data that start
 * with their size (struct_size, set by their _init function) so a header and
 * library that differ are refused, and every call that can fail returns an int status
 * (MEMCUDA_OK = 0, else one of the MEMCUDA_ERR_* codes of memcuda/c/common.h,
 * one per class of the C++ memcuda::Error tree). The message of the last failure is kept per
 * thread (memcuda_last_error_message).
 *
 * Threads: every function may be called from any thread; a registry and a
 * tensor handle may be shared between threads. Releasing a tensor (and a
 * DLPack deleter) never does network I/O on the caller's thread: the release
 * is queued and sent by the registry's own thread (memcuda_flush waits for it).
 *
 * Fork: a child process must not use (nor close) handles made before fork();
 * it opens its own registry. See docs/python.md, "Fork safety".
 */
#ifndef MEMCUDA_C_MEMCUDA_H
#define MEMCUDA_C_MEMCUDA_H

#include "memcuda/c/common.h"
#include "memcuda/c/options.h"

/* Declared apart, in the same C ABI (each includes only common.h):
 * publishing from files (memcuda_publish_safetensors), borrowed buffers
 * (memcuda_share), Arrow export and import (memcuda_tensor_to_arrow), A/B model versions (memcuda_model_*) and
 * zero copy or an error (memcuda_tensor_check_device, memcuda_note_copy). */
#include "memcuda/c/arrow.h"
#include "memcuda/c/memcuda_publish.h"
#include "memcuda/c/memcuda_share.h"
#include "memcuda/c/model_ab.h"
#include "memcuda/c/replicas.h"
#include "memcuda/c/slice.h"
#include "memcuda/c/zero_copy.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The code of the last failing call on this thread (MEMCUDA_OK if none). */
MEMCUDA_C_EXPORT int memcuda_last_error_code(void);
/* Its message; "" if none. Valid until the next failing call on this thread. */
MEMCUDA_C_EXPORT const char* memcuda_last_error_message(void);
/* For MEMCUDA_ERR_CUDA: the cudaError_t status (-1 when unknown); else 0. */
MEMCUDA_C_EXPORT int memcuda_last_error_cuda_status(void);
/* Forgets the last error of this thread. */
MEMCUDA_C_EXPORT void memcuda_clear_error(void);
/* The stable wire name of a code ("not_found", "redis_auth", ...), as
 * memcuda::Error::code() spells it; "unknown" for a code not listed above. */
MEMCUDA_C_EXPORT const char* memcuda_error_name(int code);
/* The code of the base class (MEMCUDA_ERR_PROTOCOL -> INVALID_ARGUMENT,
 * MEMCUDA_ERR_REDIS_AUTH -> REDIS_CONNECTION, ...); MEMCUDA_OK for the root
 * MEMCUDA_ERR_ERROR and for codes outside the tree. */
MEMCUDA_C_EXPORT int memcuda_error_parent(int code);

/* ---- version ------------------------------------------------------------ */
/* major * 10000 + minor * 100 + patch of the library (MEMCUDA_VERSION). */
MEMCUDA_C_EXPORT int memcuda_version(void);
MEMCUDA_C_EXPORT const char* memcuda_version_string(void);
/* MEMCUDA_C_ABI_VERSION of the library (compare with the header's). */
MEMCUDA_C_EXPORT int memcuda_abi_version(void);
/* 1 when the library was built with the CUDA backend. */
MEMCUDA_C_EXPORT int memcuda_has_cuda(void);

/* ---- dtypes (MEMCUDA_DTYPE_*, memcuda/c/common.h) ------------------------ */
/* Canonical name ("f32", "bf16", ...); NULL for an unknown value. */
MEMCUDA_C_EXPORT const char* memcuda_dtype_name(int dtype);
/* Parses a canonical name or an alias ("float32", "bfloat16", ...); -1 if unknown. */
MEMCUDA_C_EXPORT int memcuda_dtype_from_name(const char* name);
/* Bytes per element; 0 for an unknown value. */
MEMCUDA_C_EXPORT size_t memcuda_dtype_itemsize(int dtype);

/* ---- the registry (options: memcuda/c/options.h) ------------------------ */
/* Connects and starts the registry's thread (TensorRegistry's constructor).
 * opts may be NULL (all defaults). On success *out owns the registry. */
MEMCUDA_C_EXPORT int memcuda_registry_open(const memcuda_registry_options* opts, memcuda_registry** out);
/* Stops the registry's thread and ends its session; NULL is a no-op. Tensors
 * still open stay valid (they keep what they need alive). The one call that
 * must not race with other calls on the same registry. */
MEMCUDA_C_EXPORT void memcuda_registry_close(memcuda_registry* reg);

/* This registry's session id ("<pid>-<random>"); valid while reg is open. */
MEMCUDA_C_EXPORT const char* memcuda_registry_session_id(const memcuda_registry* reg);
/* *out = 1 while this registry holds the allocator-of-record lease (no I/O). */
MEMCUDA_C_EXPORT int memcuda_registry_is_leader(const memcuda_registry* reg, int* out);

/* Creates a tensor (contents unspecified) and returns the creator's share.
 * shape may be NULL when ndim is 0 (a scalar). opts may be NULL. */
MEMCUDA_C_EXPORT int memcuda_create(memcuda_registry* reg, const char* name, int dtype, const int64_t* shape,
                                    int ndim, const memcuda_create_options* opts, memcuda_tensor** out);

/* Opens a tensor by name. dtype: the expected dtype (MEMCUDA_ERR_TYPE_MISMATCH
 * when it differs) or MEMCUDA_DTYPE_ANY. */
MEMCUDA_C_EXPORT int memcuda_get(memcuda_registry* reg, const char* name, int dtype, memcuda_tensor** out);
/* memcuda_get, then makes `stream` (a cudaStream_t; NULL: the legacy default
 * stream) wait for the producer's last publish. Host backend: no wait. */
MEMCUDA_C_EXPORT int memcuda_get_on_stream(memcuda_registry* reg, const char* name, int dtype, void* stream,
                                           memcuda_tensor** out);
/* Opens `count` tensors (any dtype) into out[0..count), in the order given,
 * in one Redis round trip (TensorRegistry::get_all; the contract of all three
 * languages is docs/protocol.md, "The get_many contract"). count 0: OK, no
 * I/O. A NULL or malformed name fails the call before anything is taken. A
 * name given twice gets two shares of one reference. All or nothing: when a
 * name is refused, every reference the batch took is given back, out[] is
 * all NULL, and the status and message are those of the first refused name
 * in the order given (what memcuda_get of that name alone reports:
 * NOT_FOUND, LOST, ...). */
MEMCUDA_C_EXPORT int memcuda_get_many(memcuda_registry* reg, const char* const* names, size_t count,
                                      memcuda_tensor** out);
/* Opens every tensor whose name starts with `prefix` ("" or NULL: every
 * name), in one Redis round trip (TensorRegistry::get_prefix): *out is an
 * array of *count handles sorted by name (memcuda_tensor_name tells which),
 * to give back with memcuda_free_tensor_array after releasing each handle;
 * NULL when count is 0. All or nothing, like memcuda_get_many: the status
 * and message are those of the first refused name in name order. */
MEMCUDA_C_EXPORT int memcuda_get_prefix(memcuda_registry* reg, const char* prefix, memcuda_tensor*** out,
                                        size_t* count);
/* memcuda_get_prefix's names and contract, for a state dict: where a
 * state-dict record is linked at the prefix (memcuda_link_state_dict, or a
 * persistent publish_state_dict in C++), one O(1) script opens all of them
 * and the handles share ONE reference of this process, released when the
 * last of them (and of their DLPack views) goes; otherwise as get_prefix. */
MEMCUDA_C_EXPORT int memcuda_open_state_dict(memcuda_registry* reg, const char* prefix, memcuda_tensor*** out,
                                             size_t* count);
/* Links a state-dict record over ts[0..count): they must be exactly the
 * names under `prefix`, each persistent and still of its generation (the
 * events published so far are recorded; a later publish on one unlinks
 * it). *linked (may be NULL) = 1 when linked, 0 when refused (nothing
 * changed: opens then go name by name). */
MEMCUDA_C_EXPORT int memcuda_link_state_dict(memcuda_registry* reg, const char* prefix, const memcuda_tensor* const* ts,
                                             size_t count, int* linked);
/* Frees an array of memcuda_get_prefix (not the handles in it); NULL is a no-op. */
MEMCUDA_C_EXPORT void memcuda_free_tensor_array(memcuda_tensor** arr);

/* Creates `count` tensors (contents unspecified) in one request to the
 * allocator of record (TensorRegistry::create_many); out[i] is the
 * creator's share of specs[i]. All or nothing: on a failure (ALREADY_EXISTS
 * naming the first taken name, INVALID_ARGUMENT for a bad spec or a name
 * given twice, BUDGET_EXCEEDED, NOT_LEADER, ...) none is created and out[]
 * is all NULL. */
MEMCUDA_C_EXPORT int memcuda_create_many(memcuda_registry* reg, const memcuda_tensor_spec* specs, size_t count,
                                         memcuda_tensor** out);

/* ---- model versions (include/memcuda/model.hpp): in-place weight sync -----
 * A model is the set of tensors whose names start with `prefix`. */
/* Producer side, after ENQUEUEING the writes of the new weights on `stream`
 * (a cudaStream_t; NULL: legacy default): records one interprocess event on
 * it, bumps the model's version and wakes every waiter. backend:
 * MEMCUDA_BACKEND_* of the model's tensors (DEFAULT: the registry's; host:
 * no event, the writes must be done); device: the stream's CUDA ordinal (-1:
 * the calling thread's current device). *version (may be NULL) gets the new
 * version (1, 2, ...). NOT_FOUND when no tensor name starts with prefix. */
MEMCUDA_C_EXPORT int memcuda_publish_version(memcuda_registry* reg, const char* prefix, void* stream, int backend,
                                             int device, uint64_t* version);
/* Consumer side: blocks (no polling) until the model's version is greater
 * than `after`, then makes `stream` wait on the producer's event (no host
 * synchronisation) and sets *version; *version = 0 when timeout_ms passed
 * first (not an error). NOT_FOUND when the model has no version and no
 * tensor; UNAVAILABLE when published from a device this process cannot see. */
MEMCUDA_C_EXPORT int memcuda_wait_version(memcuda_registry* reg, const char* prefix, uint64_t after,
                                          int64_t timeout_ms, void* stream, uint64_t* version);
/* The model's current version (0: tensors but no version yet); orders nothing. */
MEMCUDA_C_EXPORT int memcuda_current_version(memcuda_registry* reg, const char* prefix, uint64_t* version);

/* Unlinks the name (open handles stay valid; memory goes with the last holder). */
MEMCUDA_C_EXPORT int memcuda_remove(memcuda_registry* reg, const char* name);
/* Waits until the tensor exists and is ready: *ready = 1, or 0 after timeout_ms. */
MEMCUDA_C_EXPORT int memcuda_wait(memcuda_registry* reg, const char* name, int64_t timeout_ms, int* ready);
/* Waits until the releases this process queued are in Redis; timeout_ms < 0:
 * the registry's request timeout. MEMCUDA_ERR_TIMEOUT when they are not. */
MEMCUDA_C_EXPORT int memcuda_flush(memcuda_registry* reg, int64_t timeout_ms);

/* One tensor's registry record. Strings are NUL-terminated, cut to fit. */
typedef struct memcuda_tensor_info {
  uint32_t struct_size;
  char name[MEMCUDA_MAX_NAME_BYTES + 1];
  int dtype;
  int ndim;
  int64_t shape[MEMCUDA_MAX_RANK];
  int backend;
  int device;             /* ordinal in the allocator's view; -1 host */
  char device_uuid[64];
  char node[128];
  uint64_t bytes;
  int64_t refcount;
  int state;              /* MEMCUDA_STATE_* */
  uint64_t generation;
  int64_t owner_pid;
  int64_t ctime_ms;
  uint64_t event_version; /* 0: never published */
  int64_t holders;        /* processes (sessions) holding a reference */
} memcuda_tensor_info;

/* The current record of one tensor (MEMCUDA_ERR_NOT_FOUND if none). Set
 * info->struct_size first (memcuda_tensor_info_init). */
MEMCUDA_C_EXPORT void memcuda_tensor_info_init(memcuda_tensor_info* info);
MEMCUDA_C_EXPORT int memcuda_info(memcuda_registry* reg, const char* name, memcuda_tensor_info* info);
/* Records of the tensors matching a glob (NULL: "*"), sorted by name.
 * *out is an array of *count records (each with struct_size set) to give
 * back with memcuda_free_infos; NULL when count is 0. */
MEMCUDA_C_EXPORT int memcuda_list(memcuda_registry* reg, const char* pattern, memcuda_tensor_info** out,
                                  size_t* count);
MEMCUDA_C_EXPORT void memcuda_free_infos(memcuda_tensor_info* infos);
/* One page of memcuda_list: at most `limit` (1..) records of names after
 * `after` (NULL or "": from the first), in name order, with memory bounded
 * by the page whatever the registry holds. `next` (a buffer of at least
 * MEMCUDA_MAX_NAME_BYTES + 1 bytes) receives where the next page starts:
 * "" when this page was the last. *out as for memcuda_list. */
MEMCUDA_C_EXPORT int memcuda_list_page(memcuda_registry* reg, const char* pattern, const char* after, size_t limit,
                                       memcuda_tensor_info** out, size_t* count, char* next);

typedef struct memcuda_stats {
  uint32_t struct_size;
  int leader_present;
  int leader_is_self;
  uint64_t leader_epoch;
  char leader_session[128];
  uint64_t sessions;
  uint64_t tensors;
  uint64_t bytes;
  uint64_t queue_length;
  uint64_t pools;             /* the leader's pools, summed below */
  uint64_t pool_in_use;
  uint64_t pool_reserved;
  /* this process */
  uint64_t owned_allocations;
  uint64_t owned_bytes;
  uint64_t creates;
  uint64_t frees;
  uint64_t live_imports;
  uint64_t import_opens;
  uint64_t import_hits;
  uint64_t copies;       /* opted-in copies in place of zero copy (c/zero_copy.h) */
  uint64_t copied_bytes;
  uint64_t pulls;        /* a fleet node's allocator of record: tensors pulled from other nodes */
  uint64_t pulled_bytes; /* and their bytes */
} memcuda_stats;

MEMCUDA_C_EXPORT void memcuda_stats_init(memcuda_stats* stats);
MEMCUDA_C_EXPORT int memcuda_stats_get(memcuda_registry* reg, memcuda_stats* stats);

typedef struct memcuda_gc_report {
  uint32_t struct_size;
  uint64_t dead_holders;
  uint64_t references_dropped;
  uint64_t tensors_freed;
  uint64_t sessions_pruned;
  uint64_t tensors_migrated;
  uint64_t tensors_lost;
} memcuda_gc_report;

/* Drops the references of dead processes now. report may be NULL. */
MEMCUDA_C_EXPORT int memcuda_collect_garbage(memcuda_registry* reg, memcuda_gc_report* report);

/* ---- tensors ---------------------------------------------------------------- */
/* A memcuda_tensor is one share of this process's reference to one
 * generation of a named tensor. Accessors of a valid handle cannot fail. */

/* Drops this share; the process's reference goes with the last share
 * (handles, DLPack tensors). No network I/O here; NULL is a no-op. */
MEMCUDA_C_EXPORT void memcuda_tensor_release(memcuda_tensor* t);
/* A new share of the same reference (release both). */
MEMCUDA_C_EXPORT int memcuda_tensor_retain(const memcuda_tensor* t, memcuda_tensor** out);

/* Device pointer (cuda backend, valid on memcuda_tensor_device) or host pointer. */
MEMCUDA_C_EXPORT void* memcuda_tensor_data(const memcuda_tensor* t);
MEMCUDA_C_EXPORT const char* memcuda_tensor_name(const memcuda_tensor* t);
MEMCUDA_C_EXPORT int memcuda_tensor_dtype(const memcuda_tensor* t);
MEMCUDA_C_EXPORT int memcuda_tensor_ndim(const memcuda_tensor* t);
/* ndim dimensions, outermost first; valid while the handle lives. Tensors
 * are contiguous, row-major; a slice (memcuda/c/slice.h) answers its view's
 * shape, data and bytes, its strides memcuda_tensor_strides. */
MEMCUDA_C_EXPORT const int64_t* memcuda_tensor_shape(const memcuda_tensor* t);
MEMCUDA_C_EXPORT uint64_t memcuda_tensor_bytes(const memcuda_tensor* t);
MEMCUDA_C_EXPORT int memcuda_tensor_backend(const memcuda_tensor* t);
/* This process's CUDA ordinal of the tensor's device; -1 for host. */
MEMCUDA_C_EXPORT int memcuda_tensor_device(const memcuda_tensor* t);
MEMCUDA_C_EXPORT uint64_t memcuda_tensor_generation(const memcuda_tensor* t);
/* The record as it was when the handle was opened. */
MEMCUDA_C_EXPORT int memcuda_tensor_get_info(const memcuda_tensor* t, memcuda_tensor_info* info);
/* *valid = 1 while the name still means this tensor (one Redis round trip). */
MEMCUDA_C_EXPORT int memcuda_tensor_valid(const memcuda_tensor* t, int* valid);

/* Producer side: records an interprocess event on `stream` (a cudaStream_t
 * of the tensor's device; NULL: legacy default) after the work that wrote
 * the tensor and publishes it; *version (may be NULL) gets the new version. */
MEMCUDA_C_EXPORT int memcuda_tensor_publish(const memcuda_tensor* t, void* stream, uint64_t* version);
/* Consumer side: makes `stream` wait for the last published event (one
 * Redis round trip to learn the newest). */
MEMCUDA_C_EXPORT int memcuda_tensor_wait_published(const memcuda_tensor* t, void* stream);
/* Makes `stream` wait for the event that had been published when this
 * handle's record was read (memcuda_get_on_stream's ordering), without a
 * Redis round trip: what a batch (memcuda_get_prefix, memcuda_get_many)
 * opens is ordered per tensor for free. To order after a publish made
 * since, use memcuda_tensor_wait_published (or a model version). Host
 * backend, or nothing published by then: no-op. */
MEMCUDA_C_EXPORT int memcuda_tensor_wait_opened(const memcuda_tensor* t, void* stream);

/* Synchronous, bounds-checked byte copies between host memory and the
 * tensor (either backend), starting at byte `offset` of the tensor. A slice
 * that is not contiguous is copied whole (offset 0, all its bytes, host
 * memory dense), as one 2D copy; one sliced in two dimensions that do not
 * merge is not one 2D copy: INVALID_ARGUMENT. */
MEMCUDA_C_EXPORT int memcuda_tensor_copy_from_host(const memcuda_tensor* t, const void* src, uint64_t bytes,
                                                   uint64_t offset);
MEMCUDA_C_EXPORT int memcuda_tensor_copy_to_host(const memcuda_tensor* t, void* dst, uint64_t bytes,
                                                 uint64_t offset);

/* DLPack (0.6+, <dlpack/dlpack.h>): a DLManagedTensor viewing the tensor
 * (kDLCUDA or kDLCPU), holding its own share of the reference; the
 * consumer calls its deleter exactly once, from any thread; the deleter
 * only queues the release (no network I/O). Ownership passes to the caller. */
MEMCUDA_C_EXPORT int memcuda_tensor_to_dlpack(const memcuda_tensor* t, struct DLManagedTensor** out);

/* ---- many handles at once (src/c_api/batch_views.cpp) -----------------------
 * For bindings whose per-call cost dominates a model's open (ctypes: about
 * ten accessor calls a tensor): the fields of a whole batch in one call, one
 * stream order for a batch, and one DLPack tensor over a packed batch. */

/* A handle's fields, as its accessors answer them. Pointers stay valid while
 * the handle lives. */
typedef struct memcuda_tensor_fields {
  uint32_t struct_size;  /* set by the library: sizeof(memcuda_tensor_fields) */
  const char* name;
  void* data;            /* as memcuda_tensor_data */
  int dtype;
  int ndim;
  const int64_t* shape;  /* ndim dimensions */
  int backend;           /* MEMCUDA_BACKEND_CUDA or _HOST */
  int device;            /* this process's CUDA ordinal; -1 host */
  uint64_t bytes;
  uint64_t generation;
  void* alloc_base;      /* start of the mapped allocation holding the tensor: equal
                            values (and device) mean one allocation, e.g. a packed batch */
  uint64_t offset;       /* data - alloc_base, in bytes (a view's data: its first element) */
  uint64_t alloc_bytes;  /* size of that allocation */
  int has_event;         /* the record carried a published event (memcuda_tensor_wait_opened orders on it) */
  const int64_t* strides; /* ndim strides in elements, as memcuda_tensor_strides */
} memcuda_tensor_fields;

/* Fills out[0..count) with the fields of ts[0..count). fields_size:
 * sizeof(memcuda_tensor_fields) as the caller knows it (INVALID_ARGUMENT
 * when header and library differ). A NULL handle fails the whole call. */
MEMCUDA_C_EXPORT int memcuda_tensors_fields(const memcuda_tensor* const* ts, size_t count, memcuda_tensor_fields* out,
                                            size_t fields_size);
/* memcuda_tensor_wait_opened for each of ts[0..count), one wait per
 * distinct event (a batch published with one event orders `stream` once). */
MEMCUDA_C_EXPORT int memcuda_tensors_wait_opened(const memcuda_tensor* const* ts, size_t count, void* stream);
/* One DLPack tensor (1-D, uint8) viewing the bytes from the lowest tensor
 * start of ts[0..count) (a view's data lies past its tensor's start) to the
 * end of the highest tensor, which must all
 * lie in one allocation of one device (same alloc_base: INVALID_ARGUMENT
 * otherwise). It holds a share of every one of them until its deleter runs:
 * views a framework cuts from it keep the whole batch's references alive
 * (dropped, queued, when the last view goes). Ownership passes to the caller. */
MEMCUDA_C_EXPORT int memcuda_tensors_to_dlpack_span(const memcuda_tensor* const* ts, size_t count,
                                                    struct DLManagedTensor** out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MEMCUDA_C_MEMCUDA_H */

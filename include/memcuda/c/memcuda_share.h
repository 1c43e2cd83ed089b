/* The C ABI's borrowed buffers: memory this process already has, shared by
 * name without a copy. Part of
 * <memcuda/c/memcuda.h> (which includes this header). */
#ifndef MEMCUDA_C_MEMCUDA_SHARE_H
#define MEMCUDA_C_MEMCUDA_SHARE_H

#include "memcuda/c/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- borrowed buffers: shared by name without a copy (src/c_api/share.cpp) --
 * The memory stays the caller's: the record says "borrowed" and lives only as
 * long as this process keeps it (after its exit other processes' next open
 * reports MEMCUDA_ERR_LOST). Host memory must lie in a MAP_SHARED mapping of
 * a memfd this process holds an fd of (plain malloc'd memory cannot be shared
 * without a copy: MEMCUDA_ERR_INVALID_ARGUMENT saying so); device memory must
 * be cudaMalloc memory (a framework's caching allocator included), shared
 * with legacy CUDA IPC, or cuMem memory exportable as a POSIX fd (PyTorch's
 * expandable segments), shared by that fd. docs/design.md, "Borrowed
 * tensors". */
typedef void (*memcuda_release_fn)(void* user_data);
typedef struct memcuda_share_options {
  uint32_t struct_size;       /* sizeof(memcuda_share_options) */
  int persistent;             /* 1: also held by its name until memcuda_remove */
  memcuda_release_fn release; /* NULL, or called once (any thread) when the registry lets go of the
                                 buffer: its last reference anywhere went, the share failed, or the
                                 registry ended */
  void* user_data;            /* passed to release */
} memcuda_share_options;

MEMCUDA_C_EXPORT void memcuda_share_options_init(memcuda_share_options* opts);
/* Registers `data` (dtype x shape) under `name` and returns this process's
 * share (refcount 1, as memcuda_create). opts may be NULL. */
MEMCUDA_C_EXPORT int memcuda_share(memcuda_registry* reg, const char* name, void* data, int dtype,
                                   const int64_t* shape, int ndim, const memcuda_share_options* opts,
                                   memcuda_tensor** out);
/* The same for a DLPack tensor (CPU or CUDA, C-contiguous). The registry
 * takes `m` over in every case, failures included: its deleter runs when the
 * registry lets go of the buffer (so a framework's tensor stays alive until
 * then). opts->release, when set, runs too. */
MEMCUDA_C_EXPORT int memcuda_share_dlpack(memcuda_registry* reg, const char* name, struct DLManagedTensor* m,
                                          const memcuda_share_options* opts, memcuda_tensor** out);
/* memcuda_share_dlpack of n tensors in one Redis round trip (a loaded
 * model's), all or nothing (memcuda::TensorRegistry::share_many): out[i] is
 * names[i]'s share; on failure none is registered (those already were are
 * released) and the first refused tensor's error is returned. The registry
 * takes every ms[i] over in every case. opts may be NULL; opts->release must
 * be NULL (each DLPack deleter keeps its tensor). */
MEMCUDA_C_EXPORT int memcuda_share_many_dlpack(memcuda_registry* reg, const char* const* names,
                                               struct DLManagedTensor* const* ms, size_t n,
                                               const memcuda_share_options* opts, memcuda_tensor** out);

/* From now on the registry no longer calls the caller's callbacks (share
 * release callbacks, DLPack deleters, Arrow release callbacks, a pool's
 * upstream resource): whatever is still borrowed is leaked instead, and a
 * slab the pool needs fails with MEMCUDA_ERR_UNAVAILABLE. For a language runtime that is shutting
 * down and cannot take a callback from a registry thread any more (the
 * Python package calls it from atexit). Irreversible; any thread. */
MEMCUDA_C_EXPORT void memcuda_stop_callbacks(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MEMCUDA_C_MEMCUDA_SHARE_H */

/* The C ABI of replicas (docs/design.md, "Replicas"), part of
 * <memcuda/c/memcuda.h> (which includes this header): one copy of a tensor
 * per device, made by the allocator of record, and a get that asks for the
 * reader's device's copy. */
#ifndef MEMCUDA_C_REPLICAS_H
#define MEMCUDA_C_REPLICAS_H

#include "memcuda/c/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Copies `name` (prefix != 0: every tensor under it) to the devices
 * `devices[0..n_devices)` (ordinals of this process; n_devices 0: every
 * visible device), skipping the source's own. idle_ms > 0: a replica nobody
 * holds for that long is removed; 0: kept while its source lives. *count
 * (may be NULL): the replicas made, refreshed or found current. Returns
 * once the copies are done and the replicas' records name their events; a
 * later publish of the source refreshes them in place. INVALID_ARGUMENT (a host tensor, a replica, no such
 * device), NOT_FOUND, UNAVAILABLE (a device the allocator of record does
 * not see), NOT_ZERO_COPY (no peer path), BUDGET_EXCEEDED, STALE_HANDLE. */
MEMCUDA_C_EXPORT int memcuda_replicate(memcuda_registry* reg, const char* name, int prefix, const int* devices,
                                       size_t n_devices, int64_t idle_ms, size_t* count);
/* Unlinks the replicas of `name` (prefix != 0: of every tensor under it) on
 * `devices` (n 0: every visible device); their memory goes with their last
 * reader. *dropped may be NULL. */
MEMCUDA_C_EXPORT int memcuda_drop_replicas(memcuda_registry* reg, const char* name, int prefix, const int* devices,
                                           size_t n, size_t* dropped);
/* memcuda_get of the copy on `reader_device` (-1: the calling thread's
 * current device) when it is current, else of the source itself; `stream`
 * (may be NULL: the legacy default stream) waits for what is returned (the
 * replica's copy, or the source's last publish). memcuda_tensor_name says
 * which: `.memcuda-rep/<uuid>/<name>` for a replica. */
MEMCUDA_C_EXPORT int memcuda_get_local(memcuda_registry* reg, const char* name, int dtype, int reader_device,
                                       void* stream, memcuda_tensor** out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MEMCUDA_C_REPLICAS_H */

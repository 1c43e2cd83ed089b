/* The C ABI of "zero copy or an error" (docs/design.md), part of
 * <memcuda/c/memcuda.h> (which includes this header). */
#ifndef MEMCUDA_C_ZERO_COPY_H
#define MEMCUDA_C_ZERO_COPY_H

#include "memcuda/c/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* MEMCUDA_ERR_NOT_ZERO_COPY unless code on `device` (this process's CUDA
 * ordinal; -1: host code) can use the tensor's data pointer in place: its
 * own device, or a peer that reaches it (cudaDeviceCanAccessPeer); host
 * memory from host code only. MEMCUDA_ERR_INVALID_ARGUMENT for a device
 * that does not exist. Never copies. */
MEMCUDA_C_EXPORT int memcuda_tensor_check_device(const memcuda_tensor* t, int device);

/* For bindings that copy where zero copy cannot be had and their caller
 * opted in (Python's allow_copy=True): counts one copy of `bytes` of `t` in
 * this process's stats (memcuda_stats copies, copied_bytes) and logs a
 * warning naming `site` and `why` (NULL: generic text), once per site and
 * tensor. */
MEMCUDA_C_EXPORT int memcuda_note_copy(const memcuda_tensor* t, const char* site, uint64_t bytes, const char* why);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MEMCUDA_C_ZERO_COPY_H */

/* The C ABI's publishing from files: a model's tensors created and filled
 * from a file in pieces, with bounded host memory. Part of
 * <memcuda/c/memcuda.h> (which includes this header). */
#ifndef MEMCUDA_C_MEMCUDA_PUBLISH_H
#define MEMCUDA_C_MEMCUDA_PUBLISH_H

#include "memcuda/c/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Publishes every tensor of a safetensors file under `prefix` (C++:
 * publish_state_dict of safetensors_entries): created all or nothing with
 * opts (may be NULL), filled by reading the file in pieces; device tensors
 * through at most staging_bytes of pinned host memory (0: 64 MiB; at least
 * 8192), so a model larger than the host memory one can spare is published
 * with that much. A persistent publish links a state-dict record. *out (free
 * with memcuda_free_tensor_array) gets the handles in name order. NOT_FOUND
 * for a missing file, INVALID_ARGUMENT naming the fault of a malformed one;
 * a failed read removes what was made. */
MEMCUDA_C_EXPORT int memcuda_publish_safetensors(memcuda_registry* reg, const char* prefix, const char* path,
                                                 const memcuda_create_options* opts, size_t staging_bytes,
                                                 memcuda_tensor*** out, size_t* count);

#ifdef __cplusplus
}
#endif

#endif /* MEMCUDA_C_MEMCUDA_PUBLISH_H */

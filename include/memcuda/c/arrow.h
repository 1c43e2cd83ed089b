/* The C ABI's Arrow C Device Data Interface export, part of
 * <memcuda/c/memcuda.h> (which includes this header). */
#ifndef MEMCUDA_C_ARROW_H
#define MEMCUDA_C_ARROW_H

#include "memcuda/c/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Arrow C Device Data Interface (src/c_api/arrow.cpp) --------------------
 * Zero-copy export for data-frame libraries (pyarrow, cuDF, Polars). The
 * structs are the Arrow specification's: include them from
 * <memcuda/arrow.hpp> (C++), Arrow's or nanoarrow's headers, or a copy of the
 * specification's definitions. docs/interop.md has the dtype table and the
 * lifetime rules. */

/* memcuda_tensor_to_arrow flags (or-ed; 0: the defaults) */
#define MEMCUDA_ARROW_FIXED_SIZE_LIST 1u /* "+w:<n>" of the innermost dimension, not a flat array */
#define MEMCUDA_ARROW_STRICT_TYPES 2u    /* bool and bf16: TYPE_MISMATCH, not uint8 "C" / binary "w:2" */
#define MEMCUDA_ARROW_OPENED_EVENT 4u    /* sync_event from the publish the handle's record carried
                                            (no Redis round trip), not the newest */

struct ArrowSchema;
struct ArrowDeviceArray;
/* Fills the caller's *out_schema and *out_array (memcuda::export_arrow): a
 * flat array of every element (length = element count) or a fixed-size
 * list, whose data buffer is the tensor's memory. out_array may be NULL
 * (the schema only: no reference, no I/O). The array holds its own share of
 * the reference until its release callback runs (from any thread; it only
 * queues the release, no network I/O). device_type ARROW_DEVICE_CUDA (2)
 * with this process's ordinal, or ARROW_DEVICE_CPU (1) for host tensors;
 * sync_event (cuda) a cudaEvent_t* completing once the producer's last
 * publish has, NULL when nothing was published. The caller releases both
 * structs exactly once; on failure both read released (release NULL).
 * INVALID_ARGUMENT for an unknown flag or a scalar as a fixed-size list. */
MEMCUDA_C_EXPORT int memcuda_tensor_to_arrow(const memcuda_tensor* t, unsigned flags, struct ArrowSchema* out_schema,
                                             struct ArrowDeviceArray* out_array);

/* ---- Arrow import: an array this process has, shared by name without a copy
 * (memcuda::share_arrow, memcuda/arrow_share.hpp; docs/interop.md, "Import").
 * The array's data becomes a borrowed tensor (memcuda_share's rules: host
 * memory must be a MAP_SHARED memfd mapping, device memory cudaMalloc
 * memory). What imports: a primitive array "e f g c s i l C S I L" or a
 * fixed-size list "+w:<n>" of one, without nulls; memcuda's own export
 * metadata (memcuda.dtype, memcuda.shape) restores bool, bf16 and the shape.
 * The registry takes *array over in every case, failures included (the
 * caller's struct reads released afterwards): its release callback runs
 * once the last reference anywhere goes, from a registry thread. The schema
 * is only read; the caller releases it. A CUDA sync_event is waited for
 * before the tensor is registered. opts may be NULL. */
struct ArrowArray;
struct memcuda_share_options;
MEMCUDA_C_EXPORT int memcuda_share_arrow(memcuda_registry* reg, const char* name, const struct ArrowSchema* schema,
                                         struct ArrowDeviceArray* array, const struct memcuda_share_options* opts,
                                         memcuda_tensor** out);
/* The same for a CPU ArrowArray (the C Data Interface without a device). */
MEMCUDA_C_EXPORT int memcuda_share_arrow_array(memcuda_registry* reg, const char* name,
                                               const struct ArrowSchema* schema, struct ArrowArray* array,
                                               const struct memcuda_share_options* opts, memcuda_tensor** out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MEMCUDA_C_ARROW_H */

/* The C ABI of sliced reads (docs/design.md, "Sliced reads"), part of
 * <memcuda/c/memcuda.h> (which includes this header). A slice is a view
 * handle sharing its tensor's reference (no Redis call, no copy):
 * memcuda_tensor_data, _shape, _strides and _bytes answer the view's;
 * release it with memcuda_tensor_release like any handle. */
#ifndef MEMCUDA_C_SLICE_H
#define MEMCUDA_C_SLICE_H

#include <limits.h>

#include "memcuda/c/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Elements [start, start + length) of dimension `dim` of t (length -1: to
 * the end). INVALID_ARGUMENT, naming the tensor, its shape and the
 * dimension, for a range that does not fit. Slices of slices compose. */
MEMCUDA_C_EXPORT int memcuda_tensor_slice(const memcuda_tensor* t, int dim, int64_t start, int64_t length,
                                          memcuda_tensor** out);
/* Tensor-parallel shard `rank` of `world` along `dim`: start rank*n/world,
 * length n/world; INVALID_ARGUMENT when n is not divisible by world, world
 * is 0 or rank >= world. */
MEMCUDA_C_EXPORT int memcuda_tensor_slice_tp(const memcuda_tensor* t, int dim, unsigned rank, unsigned world,
                                             memcuda_tensor** out);
/* ndim strides in elements (row-major for a whole tensor, the tensor's for
 * a view); valid while the handle lives. */
MEMCUDA_C_EXPORT const int64_t* memcuda_tensor_strides(const memcuda_tensor* t);

/* A shard rule: tensors whose name relative to the prefix matches the
 * fnmatch(3) `pattern` are split along `dim`; a negative dim counts from the
 * end (-1: the last), MEMCUDA_SHARD_WHOLE opens them whole. An array
 * element, so frozen: a new field comes as a new struct and function. */
#define MEMCUDA_SHARD_WHOLE INT_MIN
typedef struct memcuda_shard_rule {
  const char* pattern;
  int dim;
} memcuda_shard_rule;

/* memcuda_open_state_dict, then each tensor the first matching rule names
 * narrowed to rank's shard (memcuda_tensor_slice_tp); unmatched tensors are
 * whole. A rule that matched nothing, or only names an earlier rule took, is
 * INVALID_ARGUMENT unless allow_unused; so is a dim out of range for a
 * tensor it takes. A linked dict is still one script and one reference. */
MEMCUDA_C_EXPORT int memcuda_open_state_dict_sharded(memcuda_registry* reg, const char* prefix, unsigned rank,
                                                     unsigned world, const memcuda_shard_rule* rules, size_t n_rules,
                                                     int allow_unused, memcuda_tensor*** out, size_t* count);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MEMCUDA_C_SLICE_H */

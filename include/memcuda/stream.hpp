// StreamHandle: the stream type of every stream-ordered call (a
// cudaStream_t, or a placeholder pointer in a build without CUDA, so that
// signatures are the same in both).
#pragma once

#include "memcuda/config.hpp"

#if MEMCUDA_HAS_CUDA()
#include <cuda_runtime_api.h>
#endif

MEMCUDA_NAMESPACE_BEGIN

#if MEMCUDA_HAS_CUDA()
using StreamHandle = cudaStream_t;
#else
using StreamHandle = void*;
#endif

MEMCUDA_NAMESPACE_END

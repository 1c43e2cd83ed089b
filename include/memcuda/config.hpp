// Feature macros. They are function-like (as in CCCL) so that a misspelt
// MEMCUDA_HAS_CUDA() is a compile error instead of a silent 0.
#pragma once

// The CMake target defines MEMCUDA_ENABLE_CUDA=1 when it links CUDA::cudart,
// 0 when CUDA was switched off or not found. A consumer not using CMake may
// define it; without a definition we use the CUDA backend if the runtime
// header is reachable.
#if !defined(MEMCUDA_ENABLE_CUDA)
#  if defined(__has_include)
#    if __has_include(<cuda_runtime_api.h>)
#      define MEMCUDA_ENABLE_CUDA 1
#    endif
#  endif
#endif
#if !defined(MEMCUDA_ENABLE_CUDA)
#  define MEMCUDA_ENABLE_CUDA 0
#endif

#if MEMCUDA_ENABLE_CUDA
#  define MEMCUDA_HAS_CUDA() 1
#else
#  define MEMCUDA_HAS_CUDA() 0
#endif

// True while compiling device code with nvcc (kernels in examples and tests).
#if defined(__CUDACC__)
#  define MEMCUDA_IS_NVCC() 1
#else
#  define MEMCUDA_IS_NVCC() 0
#endif

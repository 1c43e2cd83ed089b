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

// The CMake target defines MEMCUDA_ENABLE_UCX=1 when UCX was found (the byte
// mover between nodes, detail/transfer/; a program that uses it links
// memcuda::ucx); off unless defined.
#if !defined(MEMCUDA_ENABLE_UCX)
#  define MEMCUDA_ENABLE_UCX 0
#endif
#if MEMCUDA_ENABLE_UCX
#  define MEMCUDA_HAS_UCX() 1
#else
#  define MEMCUDA_HAS_UCX() 0
#endif

// True while compiling device code with nvcc (kernels in examples and tests).
#if defined(__CUDACC__)
#  define MEMCUDA_IS_NVCC() 1
#else
#  define MEMCUDA_IS_NVCC() 0
#endif

// The versioned, configuration-tagged inline namespace (as {fmt}'s
// FMT_BEGIN_NAMESPACE and CUB's CUB_NAMESPACE_BEGIN): everything mem-cuda
// declares lives in memcuda::v<major>_<minor>_{cuda,host}. Users still write
// memcuda::TensorRegistry; but two translation units built with and without
// the CUDA backend (whose types differ in layout) mangle their names
// differently, so linking them together fails at link time instead of
// mixing layouts silently at run time. tests/compile_fail checks it.
#include "memcuda/version.hpp"

#define MEMCUDA_PP_CAT_(a, b) a##b
#define MEMCUDA_PP_CAT(a, b) MEMCUDA_PP_CAT_(a, b)
#if MEMCUDA_HAS_CUDA()
#  define MEMCUDA_ABI_CONFIG _cuda
#else
#  define MEMCUDA_ABI_CONFIG _host
#endif
#define MEMCUDA_ABI_NAMESPACE                                                                       \
  MEMCUDA_PP_CAT(MEMCUDA_PP_CAT(MEMCUDA_PP_CAT(v, MEMCUDA_VERSION_MAJOR), MEMCUDA_PP_CAT(_, MEMCUDA_VERSION_MINOR)), \
                 MEMCUDA_ABI_CONFIG)
#define MEMCUDA_NAMESPACE_BEGIN \
  namespace memcuda {           \
  inline namespace MEMCUDA_ABI_NAMESPACE {
#define MEMCUDA_NAMESPACE_END \
  }                           \
  }

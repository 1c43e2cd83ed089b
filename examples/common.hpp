// Shared bits of the examples: the --backend flag.
#pragma once

#include <cstring>
#include <iostream>
#include <optional>
#include <string>

#include <memcuda/memcuda.hpp>
#if MEMCUDA_HAS_CUDA()
#include <memcuda/detail/cuda/runtime.hpp>  // device_count()
#endif

namespace examples {

// Whether this process sees a GPU (the registry's own default does the same).
inline bool cuda_usable() {
#if MEMCUDA_HAS_CUDA()
  return memcuda::detail::device_count() > 0;
#else
  return false;
#endif
}

// --backend host|cuda|auto (default auto: cuda when a GPU is usable).
inline memcuda::BackendKind backend_from_args(int argc, char** argv) {
  std::string want = "auto";
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--backend") == 0) want = argv[i + 1];
  if (want == "auto") return cuda_usable() ? memcuda::BackendKind::cuda : memcuda::BackendKind::host;
  auto b = memcuda::backend_from_string(want);
  if (!b) {
    std::cerr << "unknown backend '" << want << "' (host, cuda or auto)\n";
    std::exit(2);
  }
  return *b;
}

inline bool has_flag(int argc, char** argv, const char* flag) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], flag) == 0) return true;
  return false;
}

}  // namespace examples

// Defines describe() in whatever configuration this TU is built with; see
// abi_mix_user.cpp.
// Always the host configuration (the build passes no definition).
#define MEMCUDA_ENABLE_CUDA 0
#include "abi_mix.hpp"

std::string describe(const memcuda::TensorInfo& t) { return t.name; }

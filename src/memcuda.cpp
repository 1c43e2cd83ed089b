// The compiled part of memcuda::memcuda: mem-cuda's implementation unit
// (include/memcuda/implementation.hpp), built once into a small static
// library instead of once per program. The build tree compiles it as the
// `memcuda` target; an installed package ships this file and
// find_package(memcuda) compiles it in the consumer's project, with the
// consumer's compiler, flags and CUDA choice (cmake/memcudaConfig.cmake.in).
#include <memcuda/implementation.hpp>

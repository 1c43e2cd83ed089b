// The implementation unit of mem-cuda: include this header in exactly ONE
// translation unit of each program (executable or shared library) that uses
// mem-cuda, after or instead of memcuda/memcuda.hpp:
//
//     // memcuda_impl.cpp
//     #include <memcuda/implementation.hpp>
//
// CMake does it for you: memcuda_add_implementation(<target>) (from
// find_package(memcuda) or add_subdirectory) adds such a one-line source.
//
// Why (the pattern of doctest's DOCTEST_CONFIG_IMPLEMENT, Boost.JSON's
// <boost/json/src.hpp> and stb): memcuda/memcuda.hpp only declares the API,
// so a translation unit that includes it does not parse the registry's
// internals, the Redis layer, the wire protocol or Boost.JSON (docs/design.md,
// "Compile cost"). Their definitions live here, in memcuda/impl/*.ipp, and
// are compiled once. The library stays header-only: there is no prebuilt
// library to build, install or match.
//
// The functions defined here are deliberately NOT inline, so a mistake is a
// link error naming a mem-cuda symbol rather than a silent surprise:
//   - no translation unit includes this header: "undefined reference to
//     `memcuda::v<M>_<m>_{host,cuda}::TensorRegistry::TensorRegistry(...)'"
//     (or another member);
//   - two translation units include it: "multiple definition of
//     `memcuda::v<M>_<m>_{host,cuda}::...'".
//   - the implementation unit and a user translation unit are built in
//     different configurations (CUDA on/off): "undefined reference" naming
//     the other inline namespace (memcuda::v<M>_<m>_cuda vs _host).
// README.md, "Troubleshooting", shows the exact messages.
//
// Process-wide state (the release queue, the mapping cache, the fd table,
// the CUDA event cache: detail/process/process.hpp) is one object defined
// here (Process::get()): one per program.
#pragma once

#include "memcuda/memcuda.hpp"

// The internals (inline class definitions; tests and tools that include them
// directly keep working).
#include "memcuda/detail/cuda/ipc_event.hpp"
#include "memcuda/detail/registry/control_loop.hpp"
#include "memcuda/detail/registry/core.hpp"
#include "memcuda/protocol.hpp"

// The out-of-line definitions of the public API.
#include "memcuda/impl/arrow.ipp"
#include "memcuda/impl/model.ipp"
#include "memcuda/impl/model_ab.ipp"
#include "memcuda/impl/options.ipp"
#include "memcuda/impl/process.ipp"
#include "memcuda/impl/safetensors.ipp"
#include "memcuda/impl/shape.ipp"
#include "memcuda/impl/share.ipp"
#include "memcuda/impl/shared_tensor.ipp"
#include "memcuda/impl/state_dict.ipp"
#include "memcuda/impl/tensor_registry.ipp"

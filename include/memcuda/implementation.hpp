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
// memcuda/memcuda.hpp only declares the API, so a translation unit that
// includes it parses none of the internals (docs/design.md, "Compile cost");
// their definitions, in memcuda/impl/*.ipp (each a part of this unit), are
// compiled here once. They are
// deliberately NOT inline, so that no implementation unit, two of them, or
// one built in the other configuration (CUDA on/off) is a link error naming
// a mem-cuda symbol: README.md, "Troubleshooting", shows the messages.
//
// Process-wide state (detail/process/process.hpp) is one object defined
// here (Process::get()): one per program.
#pragma once

#include "memcuda/memcuda.hpp"

// The internals (inline class definitions).
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
#include "memcuda/impl/replicas.ipp"
#include "memcuda/impl/safetensors.ipp"
#include "memcuda/impl/shape.ipp"
#include "memcuda/impl/share.ipp"
#include "memcuda/impl/shared_tensor.ipp"
#include "memcuda/impl/state_dict.ipp"
#include "memcuda/impl/tensor_registry.ipp"

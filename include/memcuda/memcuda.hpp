// Umbrella header: everything a mem-cuda user needs to call the API. It
// declares; one translation unit of the program must also include
// memcuda/implementation.hpp, which defines (CMake:
// memcuda_add_implementation(<target>)). Cheap to include by design: no
// Boost.JSON, hiredis, wire protocol or registry internals are reachable
// from here (docs/design.md, "Compile cost"); memcuda/protocol.hpp, the wire
// formats, is included on its own by code that needs it.
#pragma once

#include "memcuda/config.hpp"
#include "memcuda/dtype.hpp"
#include "memcuda/error.hpp"
#include "memcuda/local_tensor.hpp"
#include "memcuda/model.hpp"
#include "memcuda/options.hpp"
#include "memcuda/shape.hpp"
#include "memcuda/shared_tensor.hpp"
#include "memcuda/state_dict.hpp"
#include "memcuda/stats.hpp"
#include "memcuda/stream.hpp"
#include "memcuda/tensor_info.hpp"
#include "memcuda/tensor_registry.hpp"
#include "memcuda/version.hpp"

#if __has_include(<dlpack/dlpack.h>)
#include "memcuda/dlpack.hpp"
#endif

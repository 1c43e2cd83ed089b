// Umbrella header: every public header of the C++ API (include/memcuda/*.hpp)
// but two: memcuda/protocol.hpp, the wire formats (Boost.JSON), which code
// that needs it includes on its own, and memcuda/implementation.hpp, the
// definitions, which the build compiles once per program
// (memcuda_add_implementation(<target>)). Cheap to include by design: no
// Boost.JSON, hiredis, wire protocol or registry internals are reachable
// from here (docs/design.md, "Compile cost").
#pragma once

#include "memcuda/config.hpp"
#include "memcuda/arrow.hpp"
#include "memcuda/arrow_share.hpp"
#include "memcuda/batch.hpp"
#include "memcuda/dtype.hpp"
#include "memcuda/error.hpp"
#include "memcuda/local_tensor.hpp"
#include "memcuda/memory_resource.hpp"
#include "memcuda/model.hpp"
#include "memcuda/model_ab.hpp"
#include "memcuda/options.hpp"
#include "memcuda/replicas.hpp"
#include "memcuda/safetensors.hpp"
#include "memcuda/shape.hpp"
#include "memcuda/share_options.hpp"
#include "memcuda/shared_tensor.hpp"
#include "memcuda/slice.hpp"
#include "memcuda/state_dict.hpp"
#include "memcuda/stats.hpp"
#include "memcuda/stream.hpp"
#include "memcuda/tensor_info.hpp"
#include "memcuda/tensor_registry.hpp"
#include "memcuda/version.hpp"

#if __has_include(<dlpack/dlpack.h>)
#include "memcuda/dlpack.hpp"
#include "memcuda/share.hpp"
#endif

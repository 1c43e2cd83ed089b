// Umbrella header: everything a mem-cuda user needs.
#pragma once

#include "memcuda/config.hpp"
#include "memcuda/dtype.hpp"
#include "memcuda/error.hpp"
#include "memcuda/local_tensor.hpp"
#include "memcuda/options.hpp"
#include "memcuda/protocol.hpp"
#include "memcuda/shape.hpp"
#include "memcuda/shared_tensor.hpp"
#include "memcuda/stats.hpp"
#include "memcuda/tensor_info.hpp"
#include "memcuda/tensor_registry.hpp"
#include "memcuda/version.hpp"

#if __has_include(<dlpack/dlpack.h>)
#include "memcuda/dlpack.hpp"
#endif

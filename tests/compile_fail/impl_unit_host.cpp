// mem-cuda's implementation unit, host configuration.
#define MEMCUDA_ENABLE_CUDA 0
#include "memcuda/implementation.hpp"

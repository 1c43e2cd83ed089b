// Compatibility header: the registry's core is now split by role under
// detail/registry/ (core.hpp composes them); RegistryCore names Core.
#pragma once

#include "memcuda/detail/registry/core.hpp"

// mem-cuda version. CMake reads MEMCUDA_VERSION_{MAJOR,MINOR,PATCH} from this
// file, so it is the single source of the version number.
#pragma once

#define MEMCUDA_VERSION_MAJOR 0
#define MEMCUDA_VERSION_MINOR 1
#define MEMCUDA_VERSION_PATCH 0

// major * 10000 + minor * 100 + patch, as {fmt} does, for #if comparisons.
#define MEMCUDA_VERSION \
  (MEMCUDA_VERSION_MAJOR * 10000 + MEMCUDA_VERSION_MINOR * 100 + MEMCUDA_VERSION_PATCH)

namespace memcuda {
inline constexpr int kVersionMajor = MEMCUDA_VERSION_MAJOR;
inline constexpr int kVersionMinor = MEMCUDA_VERSION_MINOR;
inline constexpr int kVersionPatch = MEMCUDA_VERSION_PATCH;
inline constexpr const char* kVersionString = "0.1.0";
}  // namespace memcuda

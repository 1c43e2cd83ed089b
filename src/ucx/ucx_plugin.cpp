// libmemcuda_ucx.so: the UCX byte mover for programs that link none (the C
// library, the Python package), loaded by a fleet's allocator of record
// when it first needs a mover (detail/transfer/mover_plugin.hpp). A plugin
// so that UCX, which hooks memory functions when it loads, stays out of
// every process that never joins a fleet.
#include "memcuda/detail/transfer/ucx_mover.hpp"

#include <cstdio>
#include <cstring>
#include <exception>

#include "memcuda/detail/transfer/mover_plugin.hpp"

// A new UcxMover (a memcuda::detail::transfer::Mover*, deleted by its
// virtual destructor), or null with the reason in err. `abi`: the caller's
// ABI namespace, which must be this build's (the Mover's layout is C++).
extern "C" __attribute__((visibility("default"))) void* memcuda_ucx_mover(const char* abi, char* err,
                                                                           std::size_t n) noexcept {
  namespace tr = memcuda::detail::transfer;
  try {
    if (!abi || std::strcmp(abi, tr::kMoverPluginAbi) != 0) {
      std::snprintf(err, n, "libmemcuda_ucx.so is built for mem-cuda ABI %s, the caller is %s", tr::kMoverPluginAbi,
                    abi ? abi : "(none)");
      return nullptr;
    }
    return static_cast<tr::Mover*>(new tr::UcxMover());
  } catch (const std::exception& e) {
    std::snprintf(err, n, "%s", e.what());
  } catch (...) {
    std::snprintf(err, n, "unknown error");
  }
  return nullptr;
}

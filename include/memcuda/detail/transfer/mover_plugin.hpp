// The byte mover of a program that links none (the C library and the
// Python package): libmemcuda_ucx.so (src/ucx/), loaded when a fleet's
// allocator of record first needs a mover, so that UCX stays out of every
// process that never joins a fleet. Looked for next to the binary that
// holds this code (libmemcuda_c.so, or the program), then on the dynamic
// loader's path. Process-wide: loaded once, never unloaded (the mover's
// code and its regions' deleters live there).
#pragma once

#include "memcuda/config.hpp"

#include <dlfcn.h>

#include <cstddef>
#include <memory>
#include <string>

#include "memcuda/detail/transfer/mover.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::transfer {

#define MEMCUDA_MOVER_PLUGIN_STR_(x) #x
#define MEMCUDA_MOVER_PLUGIN_STR(x) MEMCUDA_MOVER_PLUGIN_STR_(x)
// The plugin's Mover must be of this very build's layout. Its errors
// (TransferError, Unavailable) cross the boundary as exceptions: one C++
// runtime on both sides (GCC's libstdc++ matches their types by name).
inline constexpr const char* kMoverPluginAbi = MEMCUDA_MOVER_PLUGIN_STR(MEMCUDA_ABI_NAMESPACE);
#undef MEMCUDA_MOVER_PLUGIN_STR
#undef MEMCUDA_MOVER_PLUGIN_STR_
inline constexpr const char* kMoverPlugin = "libmemcuda_ucx.so";

// A mover from the plugin; null, with what was tried in `why`, when none
// loads. Throws Unavailable when the plugin loads and refuses (a UCX that
// fails to start, another build's ABI).
inline std::unique_ptr<Mover> load_mover_plugin(std::string& why) {
  using Entry = void* (*)(const char*, char*, std::size_t) noexcept;
  std::string here;
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&load_mover_plugin), &info) && info.dli_fname) {
    here = info.dli_fname;
    here = here.substr(0, here.find_last_of('/') + 1);
  }
  for (const std::string& path : {here.empty() ? std::string() : here + kMoverPlugin, std::string(kMoverPlugin)}) {
    if (path.empty()) continue;
    void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = ::dlerror();
      why += std::string(why.empty() ? "" : "; ") + (e ? e : path);
      continue;
    }
    auto make = reinterpret_cast<Entry>(::dlsym(h, "memcuda_ucx_mover"));
    if (!make) {
      why += std::string(why.empty() ? "" : "; ") + path + " has no entry 'memcuda_ucx_mover'";
      continue;
    }
    char err[512] = {};
    void* m = make(kMoverPluginAbi, err, sizeof err);
    if (!m) throw Unavailable(path + ": " + err);
    return std::unique_ptr<Mover>(static_cast<Mover*>(m));
  }
  return nullptr;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::transfer

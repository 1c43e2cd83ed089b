// A shared library Python loads with ctypes to hand a mem-cuda tensor to
// PyTorch through DLPack (tests/dlpack_check.py).
#include <exception>
#include <iostream>
#include <memory>

#include "memcuda/dlpack.hpp"
#include "memcuda/memcuda.hpp"

namespace {
std::unique_ptr<memcuda::TensorRegistry> registry;
}

extern "C" void* memcuda_probe_open(const char* url, const char* name) {
  try {
    if (!registry) {
      memcuda::RegistryOptions o;
      o.redis = memcuda::redis::parse_url(url);
      o.control_thread = false;  // a reader only
      registry = std::make_unique<memcuda::TensorRegistry>(o);
    }
    return memcuda::to_dlpack(registry->get<void>(name));
  } catch (const std::exception& e) {
    std::cerr << "memcuda_probe_open: " << e.what() << "\n";
    return nullptr;
  }
}

extern "C" long long memcuda_probe_refcount(const char* name) {
  try {
    return registry ? registry->info(name).refcount : -1;
  } catch (const std::exception&) {
    return -1;
  }
}

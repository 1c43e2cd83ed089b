// The C ABI's model versions (include/memcuda/model.hpp): the weight-sync
// loop of a producer that overwrites a model's tensors in place and
// publishes a version, and consumers that wait for the next one.
#include "c_api_internal.hpp"
#include "memcuda/model.hpp"

using memcuda_c::guarded;

extern "C" {

int memcuda_publish_version(memcuda_registry* reg, const char* prefix, void* stream, int backend, int device,
                            uint64_t* version) {
  return guarded([&] {
    memcuda::VersionPublishOptions o;
    o.backend = memcuda_c::backend_arg(backend);
    o.device = device < 0 ? -1 : device;
    auto v = memcuda::publish_version(memcuda_c::registry(reg), memcuda_c::prefix_arg(prefix),
                                      static_cast<memcuda::StreamHandle>(stream), o);
    if (version) *version = v;
  });
}

int memcuda_wait_version(memcuda_registry* reg, const char* prefix, uint64_t after, int64_t timeout_ms, void* stream,
                         uint64_t* version) {
  return guarded([&] {
    if (!version) throw memcuda::InvalidArgument("version is NULL");
    *version = 0;
    if (timeout_ms < 0) throw memcuda::InvalidArgument("timeout_ms must not be negative");
    auto v = memcuda::wait_version(memcuda_c::registry(reg), memcuda_c::prefix_arg(prefix), after,
                                   std::chrono::milliseconds(timeout_ms), static_cast<memcuda::StreamHandle>(stream));
    if (v) *version = *v;
  });
}

int memcuda_current_version(memcuda_registry* reg, const char* prefix, uint64_t* version) {
  return guarded([&] {
    if (!version) throw memcuda::InvalidArgument("version is NULL");
    *version = memcuda::current_version(memcuda_c::registry(reg), memcuda_c::prefix_arg(prefix));
  });
}

}  // extern "C"

// The C ABI of replicas: replicate and drop (memcuda_get_local is a get,
// in registry.cpp).
#include <string>
#include <vector>

#include "c_api_internal.hpp"
#include "memcuda/replicas.hpp"

using memcuda_c::guarded;

namespace {

std::vector<int> devices_arg(const int* devices, size_t n) {
  if (n > 0 && !devices) throw memcuda::InvalidArgument("devices is NULL");
  return n ? std::vector<int>(devices, devices + n) : std::vector<int>{};
}

}  // namespace

extern "C" {

int memcuda_replicate(memcuda_registry* reg, const char* name, int prefix, const int* devices, size_t n_devices,
                      int64_t idle_ms, size_t* count) {
  return guarded([&] {
    if (count) *count = 0;
    memcuda::ReplicateOptions o;
    o.devices = devices_arg(devices, n_devices);
    o.prefix = prefix != 0;
    o.idle = std::chrono::milliseconds(idle_ms);
    auto made = memcuda::replicate(memcuda_c::registry(reg), prefix ? (name ? name : "") : memcuda_c::name_arg(name), o);
    if (count) *count = made.size();
  });
}

int memcuda_drop_replicas(memcuda_registry* reg, const char* name, int prefix, const int* devices, size_t n,
                          size_t* dropped) {
  return guarded([&] {
    if (dropped) *dropped = 0;
    memcuda::ReplicaTargets which;
    which.devices = devices_arg(devices, n);
    which.prefix = prefix != 0;
    auto k = memcuda::drop_replicas(memcuda_c::registry(reg), prefix ? (name ? name : "") : memcuda_c::name_arg(name),
                                    which);
    if (dropped) *dropped = k;
  });
}

}  // extern "C"

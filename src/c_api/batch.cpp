// The C ABI's batch calls: memcuda_get_many, memcuda_get_prefix and
// memcuda_create_many, each one TensorRegistry batch operation (one Redis
// round trip, or one request to the allocator of record), all or nothing.
//
// No path leaks a reference: the C++ batch result owns every reference it
// took until the C handles exist, and the handles are made (each one an
// allocation that may throw) before any is handed out, so a failure at any
// point drops them all and the releases are queued.
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "c_api_internal.hpp"
#include "memcuda/safetensors.hpp"
#include "memcuda/state_dict.hpp"

using memcuda_c::guarded;

namespace {

using Handles = std::vector<std::unique_ptr<memcuda_tensor>>;

}  // namespace

extern "C" {

int memcuda_get_many(memcuda_registry* reg, const char* const* names, size_t count, memcuda_tensor** out) {
  return guarded([&] {
    if (count > 0 && (!names || !out)) throw memcuda::InvalidArgument("names or out is NULL");
    for (size_t i = 0; i < count; ++i) out[i] = nullptr;
    auto& r = memcuda_c::registry(reg);
    if (count == 0) return;
    std::vector<std::string> order;
    order.reserve(count);
    for (size_t i = 0; i < count; ++i) order.emplace_back(memcuda_c::name_arg(names[i]));
    // get_all is the strict form with the error of the first refused name
    // in the order given (docs/protocol.md, "The get_many contract").
    auto taken = r.get_all(order);
    Handles made;
    made.reserve(count);
    // A name given twice: the same SharedTensor copied, one reference.
    for (const auto& n : order) made.push_back(std::make_unique<memcuda_tensor>(taken.at(n)));
    for (size_t i = 0; i < count; ++i) out[i] = made[i].release();
  });
}

int memcuda_get_prefix(memcuda_registry* reg, const char* prefix, memcuda_tensor*** out, size_t* count) {
  return guarded([&] {
    if (!out || !count) throw memcuda::InvalidArgument("out or count is NULL");
    *out = nullptr;
    *count = 0;
    memcuda_c::to_array(memcuda_c::registry(reg).get_prefix(prefix ? prefix : "").take_all(), out, count);
  });
}

void memcuda_free_tensor_array(memcuda_tensor** arr) { std::free(arr); }

int memcuda_open_state_dict(memcuda_registry* reg, const char* prefix, memcuda_tensor*** out, size_t* count) {
  return guarded([&] {
    if (!out || !count) throw memcuda::InvalidArgument("out or count is NULL");
    *out = nullptr;
    *count = 0;
    memcuda_c::to_array(memcuda::open_state_dict(memcuda_c::registry(reg), prefix ? prefix : ""), out, count);
  });
}

int memcuda_publish_safetensors(memcuda_registry* reg, const char* prefix, const char* path,
                                const memcuda_create_options* opts, size_t staging_bytes, memcuda_tensor*** out,
                                size_t* count) {
  return guarded([&] {
    if (!out || !count) throw memcuda::InvalidArgument("out or count is NULL");
    *out = nullptr;
    *count = 0;
    if (!path) throw memcuda::InvalidArgument("path is NULL");
    memcuda::PublishOptions po;
    po.create = memcuda_c::create_spec("x", MEMCUDA_DTYPE_U8, nullptr, 0, opts).options;
    if (staging_bytes) po.staging_bytes = staging_bytes;
    memcuda_c::to_array(memcuda::publish_state_dict(memcuda_c::registry(reg), prefix ? prefix : "",
                                         memcuda::safetensors_entries(path), po),
             out, count);
  });
}

int memcuda_link_state_dict(memcuda_registry* reg, const char* prefix, const memcuda_tensor* const* ts, size_t count,
                            int* linked) {
  return guarded([&] {
    if (count > 0 && !ts) throw memcuda::InvalidArgument("tensors is NULL");
    std::vector<memcuda::SharedTensor<void>> v;
    v.reserve(count);
    for (size_t i = 0; i < count; ++i) v.push_back(memcuda_c::tensor(ts[i]));
    const bool ok = memcuda::link_state_dict(memcuda_c::registry(reg), prefix ? prefix : "", v);
    if (linked) *linked = ok ? 1 : 0;
  });
}

void memcuda_tensor_spec_init(memcuda_tensor_spec* spec) {
  if (!spec) return;
  *spec = memcuda_tensor_spec{};
  spec->struct_size = sizeof *spec;
  memcuda_create_options_init(&spec->options);
}

int memcuda_create_many(memcuda_registry* reg, const memcuda_tensor_spec* specs, size_t count, memcuda_tensor** out) {
  return guarded([&] {
    if (count > 0 && (!specs || !out)) throw memcuda::InvalidArgument("specs or out is NULL");
    for (size_t i = 0; i < count; ++i) out[i] = nullptr;
    auto& r = memcuda_c::registry(reg);
    if (count == 0) return;
    std::vector<memcuda::TensorSpec> cxx;
    cxx.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      const auto& s = specs[i];
      memcuda_c::check_struct(&s, ("specs[" + std::to_string(i) + "]").c_str());
      cxx.push_back(memcuda_c::create_spec(s.name, s.dtype, s.shape, s.ndim, &s.options));
    }
    auto made_by_name = r.create_many(cxx);
    Handles made;
    made.reserve(count);
    for (const auto& s : cxx) made.push_back(std::make_unique<memcuda_tensor>(std::move(made_by_name.at(s.name))));
    for (size_t i = 0; i < count; ++i) out[i] = made[i].release();
  });
}

}  // extern "C"

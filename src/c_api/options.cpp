// The C ABI's registry options: memcuda_registry_options (and its pool
// options) to and from memcuda::RegistryOptions.
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "c_api_internal.hpp"

using memcuda_c::guarded;

namespace {

using std::chrono::milliseconds;

// Slabs from the caller's allocate/deallocate (memcuda_pool_options.upstream).
class CResource final : public memcuda::DeviceMemoryResource {
 public:
  explicit CResource(const memcuda_device_resource& r) : r_(r) {}
  const memcuda_device_resource& c() const noexcept { return r_; }

 private:
  void* do_allocate(std::size_t bytes, int device) override {
    if (!memcuda_c::callbacks_allowed())
      throw memcuda::Unavailable("the upstream resource's callbacks were stopped (memcuda_stop_callbacks)");
    void* p = r_.allocate(r_.user_data, bytes, device);
    if (!p)
      throw memcuda::CudaError(-1, "memcuda_device_resource.allocate",
                               "the upstream resource could not allocate " + std::to_string(bytes) +
                                   " bytes on device " + std::to_string(device));
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, int device) noexcept override {
    if (memcuda_c::callbacks_allowed()) r_.deallocate(r_.user_data, p, bytes, device);  // else leaked at exit
  }
  memcuda_device_resource r_;
};

[[noreturn]] void bad(const std::string& what) { throw memcuda::InvalidArgument(what); }

// A duration field: 0 keeps the default; with `off`, -1 sets zero (never/none).
void set_ms(std::int64_t v, milliseconds& field, const char* what, bool off = false) {
  if (v < (off ? -1 : 0)) bad(std::string(what) + (off ? " must be -1, 0 (the default) or positive" : " must not be negative (0: the default)"));
  if (v == -1) field = milliseconds(0);
  if (v > 0) field = milliseconds(v);
}
// A count: 0 keeps the default; with `off`, -1 sets zero.
template <class T>
void set_count(std::int64_t v, T& field, const char* what, bool off = false) {
  if (v < (off ? -1 : 0)) bad(std::string(what) + (off ? " must be -1 (none), 0 (the default) or positive" : " must not be negative (0: the default)"));
  if (v == -1) field = 0;
  if (v > 0) field = static_cast<T>(v);
}
template <class T>
void set_bytes(std::uint64_t v, T& field) {
  if (v > 0) field = v;
}

void set_ids(const std::uint32_t* p, std::size_t n, std::vector<std::uint32_t>& field, const char* what) {
  if (!p) return;  // the default (the variable)
  if (n > 65536) bad(std::string(what) + "_count " + std::to_string(n) + " is too large");
  field.assign(p, p + n);
}

void to_pool(const memcuda_pool_options& c, memcuda::PoolOptions& p) {
  set_bytes(c.slab_bytes, p.slab_bytes);
  set_bytes(c.host_slab_bytes, p.host_slab_bytes);
  set_bytes(c.dedicated_threshold, p.dedicated_threshold);
  set_count(c.pack_batches_min_bytes, p.pack_batches_min_bytes, "pool.pack_batches_min_bytes", true);
  if (c.alignment && (c.alignment < 256 || (c.alignment & (c.alignment - 1))))
    bad("pool.alignment " + std::to_string(c.alignment) + " is not a power of two of at least 256");
  set_bytes(c.alignment, p.alignment);
  set_count(c.retain_empty_slabs, p.retain_empty_slabs, "pool.retain_empty_slabs", true);
  p.budget_bytes = c.budget_bytes;
  if (c.device_budgets_count && !c.device_budgets) bad("pool.device_budgets is NULL with a count");
  for (std::size_t i = 0; i < c.device_budgets_count; ++i) {
    const auto& b = c.device_budgets[i];
    if (b.device < -1) bad("pool.device_budgets[" + std::to_string(i) + "].device must be -1 (host) or an ordinal");
    p.device_budgets[b.device] = b.bytes;
  }
  if (c.upstream) {
    if (!c.upstream->allocate || !c.upstream->deallocate) bad("pool.upstream needs allocate and deallocate");
    p.upstream = std::make_shared<CResource>(*c.upstream);
  }
  switch (c.poison) {
    case MEMCUDA_POISON_DEFAULT: break;
    case MEMCUDA_POISON_ON: p.poison = true; break;
    case MEMCUDA_POISON_OFF: p.poison = false; break;
    default: bad("pool.poison " + std::to_string(c.poison) + " is not a MEMCUDA_POISON_* value");
  }
}

void to_enums(const memcuda_registry_options* c, memcuda::RegistryOptions& o) {
  if (auto k = memcuda_c::backend_arg(c->default_backend, "default_backend")) o.default_backend = k;
  switch (c->share_references) {
    case MEMCUDA_SHARING_DEFAULT: break;
    case MEMCUDA_SHARING_ON: o.share_references = true; break;
    case MEMCUDA_SHARING_OFF: o.share_references = false; break;
    default: bad("share_references " + std::to_string(c->share_references) + " is not a MEMCUDA_SHARING_* value");
  }
  switch (c->cuda_allocation) {
    case MEMCUDA_CUDA_ALLOCATION_DEFAULT: break;
    case MEMCUDA_CUDA_ALLOCATION_AUTO: o.cuda_allocation = memcuda::CudaAllocation::automatic; break;
    case MEMCUDA_CUDA_ALLOCATION_VMM: o.cuda_allocation = memcuda::CudaAllocation::vmm; break;
    case MEMCUDA_CUDA_ALLOCATION_IPC: o.cuda_allocation = memcuda::CudaAllocation::ipc; break;
    default: bad("cuda_allocation " + std::to_string(c->cuda_allocation) + " is not a MEMCUDA_CUDA_ALLOCATION_* value");
  }
}

void from_pool(const memcuda::PoolOptions& p, const std::vector<memcuda_device_budget>& budgets,
               memcuda_pool_options& c) {
  c.slab_bytes = p.slab_bytes;
  c.host_slab_bytes = p.host_slab_bytes;
  c.dedicated_threshold = p.dedicated_threshold;
  c.pack_batches_min_bytes = p.pack_batches_min_bytes ? static_cast<std::int64_t>(p.pack_batches_min_bytes) : -1;
  c.alignment = p.alignment;
  c.retain_empty_slabs = p.retain_empty_slabs ? static_cast<std::int64_t>(p.retain_empty_slabs) : -1;
  c.budget_bytes = p.budget_bytes;
  c.device_budgets = budgets.empty() ? nullptr : budgets.data();
  c.device_budgets_count = budgets.size();
  auto r = std::dynamic_pointer_cast<const CResource>(p.upstream);
  c.upstream = r ? &r->c() : nullptr;  // the registry's options keep it alive
  c.poison = p.poison ? MEMCUDA_POISON_ON : MEMCUDA_POISON_OFF;
}

}  // namespace

namespace memcuda_c {

memcuda::RegistryOptions to_options(const memcuda_registry_options* c) {
  auto o = memcuda::RegistryOptions::from_env();  // the MEMCUDA_* variables; the struct's fields win
  if (!c) return o;
  check_struct(c, "options");
  if (c->url && *c->url) o.redis = memcuda::redis::with_password_from_env(memcuda::redis::parse_url(c->url));
  if (c->name_space) o.name_space = c->name_space;
  o.control_thread = c->control_thread != 0;
  to_enums(c, o);
  if (c->default_device < 0) bad("default_device must not be negative");
  o.default_device = c->default_device;
  set_ms(c->request_timeout_ms, o.request_timeout, "request_timeout_ms");
  set_ms(c->lease_ttl_ms, o.lease_ttl, "lease_ttl_ms");
  set_ms(c->session_ttl_ms, o.session_ttl, "session_ttl_ms");
  set_ms(c->gc_interval_ms, o.gc_interval, "gc_interval_ms");
  set_ms(c->connect_timeout_ms, o.redis.connect_timeout, "connect_timeout_ms");
  set_ms(c->command_timeout_ms, o.redis.command_timeout, "command_timeout_ms");
  set_ms(c->serve_stall_timeout_ms, o.serve_stall_timeout, "serve_stall_timeout_ms", true);
  set_count(c->client_connections, o.client_connections, "client_connections");
  set_count(c->waiting_connections, o.waiting_connections, "waiting_connections");
  if (c->release_linger_ms < -1 || c->release_linger_ms > 60000)
    bad("release_linger_ms " + std::to_string(c->release_linger_ms) +
        " is out of range (-1: none, 0: the default, at most 60000)");
  if (c->release_linger_ms == -1) o.release_linger = std::chrono::microseconds(0);
  if (c->release_linger_ms > 0) o.release_linger = milliseconds(c->release_linger_ms);
  if (c->runtime_dir && *c->runtime_dir) o.runtime_dir = c->runtime_dir;
  set_ids(c->allowed_uids, c->allowed_uids_count, o.allowed_uids, "allowed_uids");
  set_ids(c->allowed_gids, c->allowed_gids_count, o.allowed_gids, "allowed_gids");
  to_pool(c->pool, o.pool);
  return o;
}

}  // namespace memcuda_c

memcuda_registry::memcuda_registry(memcuda::RegistryOptions o) : reg(std::move(o)), session(reg.session_id()) {
  for (const auto& [device, bytes] : reg.options().pool.device_budgets) budgets.push_back({device, bytes});
}

extern "C" {

void memcuda_registry_options_init(memcuda_registry_options* o) {
  if (!o) return;
  *o = memcuda_registry_options{};
  o->struct_size = sizeof *o;
  o->control_thread = 1;
  o->default_backend = MEMCUDA_BACKEND_DEFAULT;
}

int memcuda_registry_get_options(const memcuda_registry* reg, memcuda_registry_options* out) {
  return guarded([&] {
    if (!reg) bad("registry is NULL");
    memcuda_c::check_struct(out, "out");
    const auto& o = reg->reg.options();
    memcuda_registry_options f{};
    f.struct_size = sizeof f;
    f.name_space = o.name_space.c_str();
    f.control_thread = o.control_thread ? 1 : 0;
    f.default_backend = !o.default_backend                                  ? MEMCUDA_BACKEND_DEFAULT
                        : *o.default_backend == memcuda::BackendKind::cuda ? MEMCUDA_BACKEND_CUDA
                                                                            : MEMCUDA_BACKEND_HOST;
    f.default_device = o.default_device;
    f.request_timeout_ms = o.request_timeout.count();
    f.lease_ttl_ms = o.lease_ttl.count();
    f.session_ttl_ms = o.session_ttl.count();
    f.gc_interval_ms = o.gc_interval.count();
    f.connect_timeout_ms = o.redis.connect_timeout.count();
    f.command_timeout_ms = o.redis.command_timeout.count();
    f.client_connections = static_cast<std::int64_t>(o.client_connections);
    f.waiting_connections = static_cast<std::int64_t>(o.waiting_connections);
    f.share_references = o.share_references ? MEMCUDA_SHARING_ON : MEMCUDA_SHARING_OFF;
    const auto linger = std::chrono::duration_cast<milliseconds>(o.release_linger).count();
    f.release_linger_ms = linger > 0 ? linger : -1;
    using memcuda::CudaAllocation;
    const auto kind = o.cuda_allocation.value_or(CudaAllocation::automatic);
    f.cuda_allocation = kind == CudaAllocation::vmm   ? MEMCUDA_CUDA_ALLOCATION_VMM
                        : kind == CudaAllocation::ipc ? MEMCUDA_CUDA_ALLOCATION_IPC
                                                      : MEMCUDA_CUDA_ALLOCATION_AUTO;
    f.serve_stall_timeout_ms = o.serve_stall_timeout.count() > 0 ? o.serve_stall_timeout.count() : -1;
    f.runtime_dir = o.runtime_dir.c_str();
    f.allowed_uids = o.allowed_uids.empty() ? nullptr : o.allowed_uids.data();
    f.allowed_uids_count = o.allowed_uids.size();
    f.allowed_gids = o.allowed_gids.empty() ? nullptr : o.allowed_gids.data();
    f.allowed_gids_count = o.allowed_gids.size();
    from_pool(o.pool, reg->budgets, f.pool);
    *out = f;
  });
}

}  // extern "C"

// The C ABI's borrowed buffers (TensorRegistry::share, memcuda/share.hpp):
// a caller's buffer registered by name without a copy.
#include <atomic>
#include <memory>
#include <vector>

#include "c_api_internal.hpp"
#include "memcuda/arrow_share.hpp"
#include "memcuda/share.hpp"

using memcuda_c::guarded;

namespace {

// Set by memcuda_stop_callbacks: from then on the caller's callbacks are
// leaked, not run (a language runtime shutting down cannot take them).
std::atomic<bool> g_callbacks_stopped{false};

using memcuda_c::callbacks_allowed;

// Takes a DLManagedTensor over (NULL stays NULL): its deleter runs when the
// last share goes, unless callbacks were stopped.
std::shared_ptr<void> dl_owner(DLManagedTensor* m) {
  if (!m) return nullptr;
  return std::shared_ptr<void>(m, [](void* p) {
    auto* t = static_cast<DLManagedTensor*>(p);
    if (t->deleter && callbacks_allowed()) t->deleter(t);
  });
}

// An array of our own in place of the caller's: its release runs the
// caller's unless callbacks were stopped. Buffers and children stay the
// caller's (only read).
struct HeldArrow {
  ArrowDeviceArray original;
};

ArrowDeviceArray guarded_arrow(const ArrowDeviceArray& in) {
  ArrowDeviceArray out = in;
  out.array.private_data = new HeldArrow{in};
  out.array.release = [](ArrowArray* a) {
    auto* held = static_cast<HeldArrow*>(a->private_data);
    if (held->original.array.release && callbacks_allowed()) held->original.array.release(&held->original.array);
    delete held;
    a->release = nullptr;
  };
  return out;
}

// The keep-alive of a C caller: its release callback, run once when the
// registry lets go (the last reference, a failed share, the registry's end).
memcuda::ShareOptions share_options(const memcuda_share_options* opts) {
  memcuda::ShareOptions o;
  if (!opts) return o;
  memcuda_c::check_struct(opts, "share options");
  o.persistent = opts->persistent != 0;
  if (opts->release) {
    auto fn = opts->release;
    o.keep_alive = std::shared_ptr<void>(opts->user_data, [fn](void* user) {
      if (callbacks_allowed()) fn(user);
    });
  }
  return o;
}

}  // namespace

bool memcuda_c::callbacks_allowed() noexcept { return !g_callbacks_stopped.load(std::memory_order_acquire); }

extern "C" {

void memcuda_stop_callbacks(void) { g_callbacks_stopped.store(true, std::memory_order_release); }

void memcuda_share_options_init(memcuda_share_options* opts) {
  if (!opts) return;
  *opts = memcuda_share_options{};
  opts->struct_size = sizeof(memcuda_share_options);
}

int memcuda_share(memcuda_registry* reg, const char* name, void* data, int dtype, const int64_t* shape, int ndim,
                  const memcuda_share_options* opts, memcuda_tensor** out) {
  // The release callback runs on every failure below too (the keep-alive goes).
  return guarded([&] {
    auto o = share_options(opts);
    memcuda_c::out_arg(out);
    auto& r = memcuda_c::registry(reg);
    auto s = memcuda_c::create_spec(name, dtype, shape, ndim, nullptr);  // name, dtype and shape checked
    auto t = r.share(s.name, data, s.dtype, std::move(s.shape), std::move(o));
    *out = new memcuda_tensor(std::move(t));
  });
}

int memcuda_share_dlpack(memcuda_registry* reg, const char* name, struct DLManagedTensor* m,
                         const memcuda_share_options* opts, memcuda_tensor** out) {
  // Taken over first, so that its deleter runs whatever fails.
  std::shared_ptr<void> owner = dl_owner(m);
  return guarded([&] {
    auto o = share_options(opts);
    memcuda_c::out_arg(out);
    if (!m) throw memcuda::InvalidArgument("the DLManagedTensor is NULL");
    o.keep_alive = o.keep_alive ? std::make_shared<std::pair<std::shared_ptr<void>, std::shared_ptr<void>>>(
                                      std::move(o.keep_alive), std::move(owner))
                                : std::move(owner);
    auto t = memcuda::share(memcuda_c::registry(reg), memcuda_c::name_arg(name), m->dl_tensor, std::move(o));
    *out = new memcuda_tensor(std::move(t));
  });
}

int memcuda_share_many_dlpack(memcuda_registry* reg, const char* const* names, struct DLManagedTensor* const* ms,
                              size_t n, const memcuda_share_options* opts, memcuda_tensor** out) {
  // Taken over first, so that every deleter runs whatever fails.
  std::vector<std::shared_ptr<void>> owners(ms ? n : 0);
  for (std::size_t i = 0; i < owners.size(); ++i) owners[i] = dl_owner(ms[i]);
  return guarded([&] {
    auto o = share_options(opts);
    if (o.keep_alive) throw memcuda::InvalidArgument("share_many: opts->release must be NULL (each tensor's "
                                                     "DLPack deleter is what keeps it)");
    if (n > 0 && (!names || !ms || !out)) throw memcuda::InvalidArgument("names, tensors or out is NULL");
    std::vector<memcuda::ShareRequest> items(n);
    for (std::size_t i = 0; i < n; ++i) {
      if (!ms[i]) throw memcuda::InvalidArgument("tensor " + std::to_string(i) + " is NULL");
      const DLTensor& t = ms[i]->dl_tensor;
      items[i].name = std::string(memcuda_c::name_arg(names[i]));
      items[i].opts.persistent = o.persistent;
      items[i].opts.keep_alive = owners[i];
      memcuda::detail::dl_share_layout(t, items[i].name, items[i].data, items[i].dtype, items[i].shape);
    }
    owners.clear();  // held by the requests now
    auto made = memcuda_c::registry(reg).share_many(std::move(items));
    for (std::size_t i = 0; i < n; ++i) out[i] = new memcuda_tensor(made.at(names[i]));
  });
}

int memcuda_share_arrow(memcuda_registry* reg, const char* name, const struct ArrowSchema* schema,
                        struct ArrowDeviceArray* array, const memcuda_share_options* opts, memcuda_tensor** out) {
  // Moved out first, so that its release runs whatever fails (share_arrow
  // takes it over; anything before that leaves it here).
  ArrowDeviceArray moved{};
  if (array && array->array.release) {
    moved = guarded_arrow(*array);
    array->array.release = nullptr;
  }
  int rc = guarded([&] {
    auto o = share_options(opts);
    memcuda_c::out_arg(out);
    auto t = memcuda::share_arrow(memcuda_c::registry(reg), memcuda_c::name_arg(name), schema, &moved, std::move(o));
    *out = new memcuda_tensor(std::move(t));
  });
  if (moved.array.release) moved.array.release(&moved.array);
  return rc;
}

int memcuda_share_arrow_array(memcuda_registry* reg, const char* name, const struct ArrowSchema* schema,
                              struct ArrowArray* array, const memcuda_share_options* opts, memcuda_tensor** out) {
  ArrowDeviceArray d{};
  d.device_type = ARROW_DEVICE_CPU;
  if (array) {
    d.array = *array;
    array->release = nullptr;
  }
  return memcuda_share_arrow(reg, name, schema, array ? &d : nullptr, opts, out);
}

}  // extern "C"

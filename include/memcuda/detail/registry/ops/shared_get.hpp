// get() with in-process reference sharing (holdings.hpp): the handle this
// registry already holds for the name when the table has one (no Redis),
// else one acquire script, whose handle is remembered for the next get.
// Apart from TensorRegistry so that its body stays a thin layer; needs the
// complete TensorHandle, hence after shared_tensor.hpp.
#pragma once

#include "memcuda/config.hpp"

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "memcuda/detail/registry/core.hpp"
#include "memcuda/detail/store/replica_scripts.hpp"
#if MEMCUDA_HAS_CUDA()
#include "memcuda/detail/cuda/runtime.hpp"
#endif
#include "memcuda/options.hpp"
#include "memcuda/shared_tensor.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// The handle of a reference just taken. If its constructor throws (a
// device this process cannot see, bad_alloc), the reference is given back
// rather than leaked until the session ends.
inline std::shared_ptr<TensorHandle> handle_of(const std::shared_ptr<Core>& core, Opened o) {
  std::string name = o.info.name;
  const std::uint64_t gen = o.info.generation;
  try {
    return std::make_shared<TensorHandle>(core, std::move(o.info), o.data, std::move(o.keep));
  } catch (...) {
    Core::release_later(core, std::move(name), gen);
    throw;
  }
}

struct SharedGet {
  std::shared_ptr<TensorHandle> handle;
  bool from_cache = false;  // shared without reading the record now (its event may be newer)
};

// Remembers a handle this registry just took (a get's, or a create's)
// unless an invalidation since `token` concerns it; returns the handle to
// use (one already held for that generation wins: its extra reference is
// released by the queue, so the process keeps one).
inline std::shared_ptr<TensorHandle> remember(Core& c, std::shared_ptr<TensorHandle> h, std::uint64_t token) {
  if (!c.ctx.opts.share_references || !h) return h;
  const auto& i = h->info();
  return c.holdings.insert(i.name, i.generation, i.dtype, std::move(h), token);
}

// get() of the reader's device's replica (GetOptions::replica): always one
// script, which checks the replica against its source as of now (a held
// replica of a source published or re-created since is not shared).
// Nothing for a name too long to have a replica, or without a CUDA device:
// a plain get then.
inline std::optional<SharedGet> get_local(const std::shared_ptr<Core>& core, std::string_view name,
                                          std::optional<DType> want, const GetOptions& o) {
#if MEMCUDA_HAS_CUDA()
  Core& c = *core;
  if (device_count() == 0) return std::nullopt;  // no device here: no replica of it either
  int dev = o.reader_device;
  if (dev < 0) MEMCUDA_CUDA_TRY(cudaGetDevice(&dev));
  const std::string uuid = device_uuid(dev);
  const std::string rep = replica_name(uuid, name);
  if (!is_valid_name(rep)) return std::nullopt;
  auto found = c.holdings.find(rep, want, false);
  c.see_own_releases();
  auto h = handle_of(core, c.client.acquire_local(name, want, uuid, std::move(found.record)));
  const TensorHandle* taken = h.get();
  auto use = remember(c, std::move(h), found.token);
  const bool shared = use.get() != taken;
  return SharedGet{std::move(use), shared};
#else
  (void)core, (void)name, (void)want, (void)o;
  return std::nullopt;
#endif
}

// The body of TensorRegistry::get. Only a call that goes to Redis waits for
// this process's queued releases (a shared get talks to nobody). One look
// in the holdings table gives the shared handle, or the token and the
// record the acquire goes to Redis with.
inline SharedGet get_shared(const std::shared_ptr<Core>& core, std::string_view name, std::optional<DType> want,
                            const GetOptions& o) {
  Core& c = *core;
  if (o.replica == LocalReplica::use)
    if (auto g = get_local(core, name, want, o)) return std::move(*g);
  const bool share = c.ctx.opts.share_references;
  auto found = c.holdings.find(name, want, share && !o.fresh);
  if (found.handle) return {std::move(found.handle), true};
  c.see_own_releases();
  if (share && o.fresh) {
    // Held: one HGET says whether the name still means our generation; if
    // so the held handle is shared (no second reference).
    if (auto held = c.holdings.held_generation(name)) {
      const std::uint64_t token = c.holdings.begin();
      auto now = c.client.current_generation(name);
      if (now && *now == *held) {
        if (auto h = c.holdings.find(name, want, true).handle) return {std::move(h), true};
      } else if (token != 0) {
        c.holdings.forget_generation(*held);  // the message is on its way; don't wait for it
      }
    }
    found.token = c.holdings.begin();
  }
  auto h = handle_of(core, c.client.acquire(name, want, std::move(found.record)));
  const TensorHandle* taken = h.get();
  auto use = remember(c, std::move(h), found.token);
  const bool shared = use.get() != taken;
  return {std::move(use), shared};
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

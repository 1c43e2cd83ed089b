// The copy path of a migration, one step each: who can copy a dead
// exporter's tensor, where it goes, the copy itself (here, or by a holder
// asked through its inbox) and the script that republishes the record.
#pragma once

#include "memcuda/config.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "memcuda/detail/backend/process_cache.hpp"
#include "memcuda/detail/backend/select.hpp"
#include "memcuda/detail/pool/device_pool.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/create/placement.hpp"
#include "memcuda/detail/registry/inbox.hpp"
#include "memcuda/detail/store/lists.hpp"
#include "memcuda/detail/store/records.hpp"
#include "memcuda/detail/store/sessions.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// A record's allocation as log lines show it: the vmm key or the shm name;
// a legacy IPC handle is 64 raw bytes, so only its kind.
inline std::string handle_for_log(const TensorInfo& t) {
  if (t.alloc_kind == alloc_kind::cuda_vmm_fd) return vmm_key(t.ipc_handle);
  if (t.backend == BackendKind::cuda) return "(cuda IPC handle)";
  return t.ipc_handle;
}

// Copies a tensor of a dead exporter, through this process's existing
// mapping of it, into its replacement. Throws when this process no longer
// maps the old memory.
inline void copy_for_migration(const TensorInfo& from, const TensorInfo& to) {
  auto [src, keep_src] = Process::get().cache().find(from.owner, from.alloc_id);
  if (!src)
    throw Unavailable("this process does not map the memory of '" + from.name + "' (owner " + from.owner + ")");
  auto [dst, keep_dst] =
      Process::get().cache().resolve(to.owner, to.alloc_id, [&] { return backend_for(to).open(to); });
  int dev = -1;
#if MEMCUDA_HAS_CUDA()
  if (to.backend == BackendKind::cuda) dev = ordinal_of_uuid(to.device_uuid, to.device);
#endif
  backend_for(to).copy(static_cast<char*>(dst) + to.offset, static_cast<const char*>(src) + from.offset,
                               from.bytes, dev);
}

// The live registry sessions that hold `t` and so map its memory (this
// process first): who can copy it. A state dict's reference counts for the
// sessions that hold the dict.
inline std::vector<std::string> live_copiers(const Context& ctx, redis::Connection& c, const TensorInfo& t) {
  const std::string& session = ctx.session;
  std::vector<std::string> live;
  auto consider = [&](const std::string& h) {
    if (HolderId::is_session_id(h) && std::find(live.begin(), live.end(), h) == live.end() &&
        (h == session || store::session_exists(c, ctx.keys, h)))
      live.push_back(h);
  };
  for (const auto& [h, n] : t.holders) {
    if (n <= 0) continue;
    if (h.starts_with(Keys::kDictHolder)) {
      auto f = store::field_names(c, ctx.keys.dict_of_holder(h));
      for (std::size_t i = 0; i < f.size(); ++i)
        if (store::is_holder_field(f[i].str())) consider(std::string(store::holder_of_field(f[i].str())));
      continue;
    }
    consider(h);
  }
  std::stable_partition(live.begin(), live.end(), [&](const std::string& h) { return h == session; });
  return live;
}

// The record of `t` as it reads once moved into block `pb` of this leader.
inline TensorInfo placed_in(const TensorInfo& t, const PoolBlock& pb, const Context& ctx, std::uint64_t epoch) {
  TensorInfo n = t;
  place_in(n, pb, ctx, epoch);
  return n;
}

// Sends a holder the old and new places of a tensor and waits for it to
// copy (its registry thread executes the inbox message). The wait runs
// on a connection of the waiting pool; no lock is held meanwhile.
inline void ask_holder_to_copy(Context& ctx, std::uint64_t id, const std::string& holder, const TensorInfo& from,
                               const TensorInfo& to) {
  const std::string rk = ctx.keys.migrate_reply(ctx.session);
  auto c = ctx.waits.acquire();
  inbox::send(*c, ctx.keys, holder, inbox::Migrate{id, rk, from, to});
  auto deadline = std::chrono::steady_clock::now() + ctx.opts.request_timeout;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      throw TimeoutError("holder " + holder + " did not copy '" + from.name + "' within " +
                         std::to_string(ctx.opts.request_timeout.count()) + " ms");
    auto r = store::pop_wait(*c, rk, left);
    if (r.is_nil()) continue;
    auto ans = inbox::decode_answer(r[1].str());
    if (ans.id != id) continue;  // a late answer to an earlier ask
    if (!ans.ok) throw Unavailable(ans.error);
    return;
  }
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

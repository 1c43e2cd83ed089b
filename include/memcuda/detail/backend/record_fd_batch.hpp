// A batched open's fds (get_many, a state dict; docs/fd-transfer.md,
// "Batches and prefetch", says which): before their allocations are opened
// one by one, the fds an owner would serve over its socket anyway are
// fetched in one request per owner and parked (FdTable), so that each open
// takes its fd without a round trip. Any failure here is left to the open,
// which reports it for its own tensor.
#pragma once

#include "memcuda/config.hpp"

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "memcuda/detail/backend/process_cache.hpp"
#include "memcuda/detail/fd/fd_client.hpp"
#include "memcuda/detail/fd/fd_table.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/detail/fd/fd_socket_dir.hpp"
#include "memcuda/detail/fd/fd_source.hpp"
#include "memcuda/detail/backend/backend.hpp"
#include "memcuda/tensor_info.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// At most this many fds are fetched ahead at once (FdTable keeps 256).
inline constexpr std::size_t kPrefetchChunk = 128;

inline void prefetch_record_fds(const std::vector<const TensorInfo*>& ts) {
  if (Process::get().fds().window().count() <= 0) return;
  // address -> (served id -> allocation key)
  std::map<std::string, std::map<std::uint64_t, std::string>> per;
  std::set<std::pair<std::string, std::uint64_t>> seen;
  for (const TensorInfo* t : ts) {
    if (t->fd_source.empty() || (t->alloc_kind != alloc_kind::host_memfd && t->alloc_kind != alloc_kind::cuda_vmm_fd))
      continue;
    if (!seen.emplace(t->owner, t->alloc_id).second || Process::get().cache().mapped(t->owner, t->alloc_id)) continue;
    const std::string key = vmm_key(t->ipc_handle);  // host handles carry no padding: the same key
    if (Process::get().fds().held(key)) continue;
    try {
      ServedSource src = decode_fd_source(t->fd_source);
      check_fd_source(src, t->owner_pid, "tensor '" + t->name + "'");
      if (owner_pid_is_ours(src.source.address) && pidfd_fast_path_disabled_errno() == 0) continue;
      per[src.source.address].emplace(src.id, key);
    } catch (const std::exception&) {
      // the open says what is wrong with this record
    }
  }
  for (auto& [address, ids] : per) {
    if (ids.size() < 2) continue;  // one fd: the open asks for it (and for offers) itself
    std::vector<std::uint64_t> list;
    for (const auto& [id, key] : ids) list.push_back(id);
    try {
      for (auto& b : fetch_many(address, list, std::chrono::milliseconds(2000), 0))
        if (b.fd) Process::get().fds().park(address, b.id, ids[b.id], std::move(b.fd));
    } catch (const std::exception&) {
      // no server, refused, timeout: each open reports it for its tensor
    }
  }
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

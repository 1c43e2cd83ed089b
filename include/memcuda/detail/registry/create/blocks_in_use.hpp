// Blocks of its own that the allocator of record's replicate copies from
// or into without holding a Redis reference to them (replicator.hpp): a
// free of one while a copy may still touch it (an unlink by another
// process) must not hand it to a new tensor. So such a free waits here,
// and goes on once the last user of the block has let it go.
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <iterator>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "memcuda/detail/registry/create/held_frees.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class BlocksInUse {
 public:
  // Where a block's memory starts: what users name it by.
  static const void* base_of(const OwnedBlock& o) {
    return static_cast<const char*>(o.pb.slab->base()) + o.pb.block.offset;
  }
  void add(const void* block) {
    std::lock_guard lk(mu_);
    used_.insert(block);
  }
  // Takes a freed block that is in use (true), to hand back later.
  bool defer(OwnedBlock& o) {
    std::lock_guard lk(mu_);
    if (used_.empty() || !used_.count(base_of(o))) return false;
    deferred_.push_back(std::move(o));
    return true;
  }
  // One use of each of `blocks` ends. -> the freed blocks no use holds any more
  std::vector<OwnedBlock> remove(const std::vector<const void*>& blocks) {
    std::lock_guard lk(mu_);
    for (const void* b : blocks)
      if (auto it = used_.find(b); it != used_.end()) used_.erase(it);
    auto it = std::partition(deferred_.begin(), deferred_.end(),
                             [&](const OwnedBlock& o) { return used_.count(base_of(o)) != 0; });
    std::vector<OwnedBlock> go(std::make_move_iterator(it), std::make_move_iterator(deferred_.end()));
    deferred_.erase(it, deferred_.end());
    return go;
  }

 private:
  std::mutex mu_;  // leaf: guards used_, deferred_; no pool's call under it
  std::unordered_multiset<const void*> used_;
  std::vector<OwnedBlock> deferred_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

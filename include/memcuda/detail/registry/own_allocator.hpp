// The allocator as the roles that do not lead see it. A registry whose own
// process holds the lease creates and frees directly (Client), a release
// that dropped the last reference hands memory this process owns back to
// its pool (Client, ReleaseQueue), and Recovery republishes what this
// process owns. The leader's Allocator (create/allocator.hpp) implements
// it; Core hands it out. Each call runs on the connection its caller holds.
#pragma once

#include "memcuda/config.hpp"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "memcuda/detail/pool/device_pool.hpp"
#include "memcuda/detail/store/script_call.hpp"
#include "memcuda/protocol/command.hpp"
#include "memcuda/redis/connection.hpp"
#include "memcuda/tensor_info.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class OwnAllocator {
 public:
  struct Created {
    std::uint64_t generation;
    std::int64_t refcount;
    TensorInfo info;
    PoolBlock block;  // slab null on a replay
  };

  // Allocates, exports and publishes a tensor (as the allocator of record).
  virtual Created create(redis::Connection& c, const protocol::Command& cmd) = 0;
  // Drops `holder`'s reference (all of them with `all`); returns the
  // remaining refcount, and frees the memory when it was the last.
  virtual std::int64_t release(redis::Connection& c, const std::string& name, std::uint64_t gen,
                               const std::string& holder, const std::string& token, bool all = false) = 0;
  // What a release script's answer means (also for pipelined releases).
  virtual std::int64_t release_outcome(redis::Connection& c, const store::Answer& r, const std::string& name,
                                       std::uint64_t gen, const std::string& holder) = 0;
  // Frees an unlinked tensor whose last reference is gone.
  virtual void free_unlinked(redis::Connection& c, std::uint64_t generation, bool record_gone = false) = 0;
  // The records of what this process owns, and whether each is persistent.
  virtual std::vector<std::pair<TensorInfo, bool>> owned_records() const = 0;
  // Whether it still owns that generation (not freed since).
  virtual bool owns(std::uint64_t generation) = 0;

 protected:
  ~OwnAllocator() = default;  // never owned through this view
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

// Replicas: one name, a copy per device. A reader on GPU d asks get() for
// its own device's copy (GetOptions::replica) and reads HBM at local speed
// instead of the source through a peer mapping.
//
//   memcuda::ReplicateOptions o;                  // once, in any process
//   o.devices = {1, 2, 3};
//   o.prefix = true;
//   memcuda::replicate(reg, "llm/", o);
//   memcuda::GetOptions g;                        // a reader on GPU 2 gets GPU 2's copy,
//   g.replica = memcuda::LocalReplica::use;       // its stream ordered after the copy
//   g.stream = stream;
//   auto w = reg.get<bf16>("llm/w", g);
//
// The allocator of record makes them (it must see every device it copies
// to), one persistent record per device under the reserved name
// `.memcuda-rep/<device uuid>/<name>`, shared by every process of that
// device, counted in its budget and statistics, and copies into them on its
// own streams after the source's last published event. A replica is
// current while its source keeps the generation and event version it was
// copied from. A publish of the source has the allocator of record copy it
// into its replicas again, in place (readers get the source until that copy
// is marked); a re-create makes them stale until the next replicate. A
// replica is removed with its source, after `idle` unused, or by
// drop_replicas (docs/design.md, "Replicas").
#pragma once

#include "memcuda/config.hpp"

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/tensor_registry.hpp"

MEMCUDA_NAMESPACE_BEGIN

// Which replicas a call means.
struct ReplicaTargets {
  std::vector<int> devices;  // ordinals in this process; empty: every visible device
  bool prefix = false;       // the name is a prefix: every tensor under it
};

struct ReplicateOptions : ReplicaTargets {
  // Removed after this long with no reader; 0: kept while the source lives.
  std::chrono::milliseconds idle{0};
};

// One replica, made by this call or found current.
struct ReplicaRef {
  std::string name;  // `.memcuda-rep/<uuid>/<source name>`
  std::uint64_t generation = 0;
};

// Makes (or finds current) a copy of `name` (or of every tensor under it)
// on each device but the source's own. Returns once the copies are enqueued:
// a reader's get(stream) waits for its copy. Throws InvalidArgument (a host
// tensor, a replica, no device, too many), NotFound, Unavailable (a device
// the allocator of record does not see), NotZeroCopy (no peer path between
// the source's device and a target), BudgetExceeded, StaleHandle (the source
// was published or re-created meanwhile), NotLeader/TimeoutError as create.
// A prefix is replicated in parts of growing size: after a refusal, the
// replicas of the parts before it are made and current (a retry finds
// them), those of its part and after are not.
std::vector<ReplicaRef> replicate(TensorRegistry& reg, std::string_view name, const ReplicateOptions& opts = {});

// Unlinks the replicas of `name` (which.prefix: of every tensor under it) on
// which.devices (empty: every visible device); their memory goes with their
// last reader. Returns how many were unlinked.
std::size_t drop_replicas(TensorRegistry& reg, std::string_view name, const ReplicaTargets& which = {});

MEMCUDA_NAMESPACE_END  // namespace memcuda

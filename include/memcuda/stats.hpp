// What TensorRegistry::stats() reports.
#pragma once

#include "memcuda/config.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "memcuda/tensor_info.hpp"

MEMCUDA_NAMESPACE_BEGIN

// Registered tensors and their bytes on one device of one backend.
struct DeviceUsage {
  BackendKind backend = BackendKind::host;
  int device = -1;          // ordinal in the allocator's view; -1 for host
  std::string device_uuid;  // "" for host
  std::uint64_t tensors = 0;
  std::uint64_t bytes = 0;  // logical bytes (dtype size * elements)
};

// Who holds the allocator-of-record lease.
struct LeaderInfo {
  bool present = false;      // false: nobody (commands wait in the list)
  std::string session;       // "<pid>-<random>" of the leader's registry
  std::uint64_t epoch = 0;   // increments at every takeover
  std::int64_t ttl_ms = 0;   // lease time left
  bool is_self = false;      // this registry is the leader
};

// This process's side: what it allocated as allocator of record and what
// it has mapped from others.
struct ProcessStats {
  std::uint64_t owned_allocations = 0;
  std::uint64_t owned_bytes = 0;
  std::uint64_t creates = 0;
  std::uint64_t frees = 0;
  std::uint64_t live_imports = 0;  // foreign allocations mapped right now
  std::uint64_t import_opens = 0;  // IPC opens / shm maps performed
  std::uint64_t import_hits = 0;   // gets served by an existing mapping
  // Copies made where zero copy could not be had and the caller opted in
  // (Python's allow_copy=True, memcuda_note_copy): each one also logged a
  // warning. Reads never copy without that (docs/design.md, "Zero copy or
  // an error"). Not the pools' copied_bytes (migration).
  std::uint64_t copies = 0;
  std::uint64_t copied_bytes = 0;
  // Fd transfer (docs/fd-transfer.md, "Batches and prefetch"): requests
  // this process sent to other processes' fd servers, fds parked now
  // (sent along or fetched by a batched open, waiting for their open),
  // opens that found theirs parked, and parked fds dropped unused.
  std::uint64_t fd_requests = 0;
  std::uint64_t fd_parked = 0;
  std::uint64_t fd_parked_hits = 0;
  std::uint64_t fd_parked_dropped = 0;
  // Creates and version flips no Redis replica acknowledged within
  // RegistryOptions::redis.replica_wait (docs/operations.md, "Redis Sentinel").
  std::uint64_t replica_wait_misses = 0;
  // On Sentinel or Cluster, freed blocks held out of the pool until no
  // failover can undo the free, and frees a failover did undo (the record
  // came back, or a holder re-registered it): docs/operations.md.
  std::uint64_t frees_held = 0;
  std::uint64_t frees_undone = 0;
  // In a fleet (RegistryOptions::fleet), as its node's allocator of record:
  // tensors of other nodes pulled into this node's replicas, and their bytes.
  std::uint64_t pulls = 0;
  std::uint64_t pulled_bytes = 0;
};

// The allocator of record's memory pool on one device and backend. The
// leader publishes its pools to Redis (memcuda:pool_stats) at every lease
// renewal, so every process can report them.
struct PoolStats {
  BackendKind backend = BackendKind::host;
  int device = -1;
  std::string device_uuid;
  std::uint64_t in_use = 0;        // bytes handed out (rounded to the pool's alignment)
  std::uint64_t reserved = 0;      // bytes held from the driver / the OS (slabs)
  std::uint64_t peak_in_use = 0;   // since start or the last reset_peak
  std::uint64_t budget = 0;        // byte budget; 0 = none
  std::uint64_t slabs = 0;
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t largest_free = 0;  // largest free block in any slab
  // What takeovers of dead allocators of record cost this pool: bytes of
  // tensors adopted in place (host shm: no copy) and bytes copied into new
  // memory (legacy CUDA IPC migration), since this process started.
  std::uint64_t adopted_bytes = 0;
  std::uint64_t copied_bytes = 0;
};

// What one garbage collection found and did.
struct GcReport {
  std::uint64_t dead_holders = 0;        // sessions or pids found dead
  std::uint64_t references_dropped = 0;  // references they held
  std::uint64_t tensors_freed = 0;       // tensors whose last reference that was
  std::uint64_t sessions_pruned = 0;     // stale entries removed from the session index
  // Tensors of a dead allocator of record: moved to this allocator (adopted
  // in place on host, copied by a live holder on cuda; the pool statistics'
  // adopted_bytes / copied_bytes tell which), or given up because no live
  // process held them.
  std::uint64_t tensors_migrated = 0;
  std::uint64_t tensors_lost = 0;
  // Malformed records moved aside (a key of the wrong Redis type under a
  // listed name, fields that do not parse): TensorRegistry::quarantined().
  std::uint64_t records_quarantined = 0;
};

// A malformed record the allocator of record moved aside so that it stops
// breaking listings, garbage collection and creates of its name. Its data
// is kept, unchanged, under `key` until cleared (`memcuda quarantine`).
struct QuarantinedRecord {
  std::string id;      // what clear_quarantined() takes: "tensor:<name>" or "removed:<generation>"; an
                       // index key of the wrong type moved aside: the key less "memcuda:" ("usage")
  std::string key;     // the Redis key that holds the record's data now
  std::string reason;  // why it was moved
  std::int64_t since_ms = 0;  // Unix time in ms it was moved
};

struct RegistryStats {
  LeaderInfo leader;
  std::vector<PoolStats> pools;  // the leader's pools (as last published)
  std::uint64_t sessions = 0;    // live registry sessions
  std::uint64_t tensors = 0;  // named tensors (removed-but-held ones excluded)
  std::uint64_t bytes = 0;
  std::vector<DeviceUsage> per_device;
  std::uint64_t queue_length = 0;  // commands waiting in tensor_lifecycle
  std::uint64_t quarantined = 0;   // malformed records moved aside (TensorRegistry::quarantined)
  ProcessStats process;
};

MEMCUDA_NAMESPACE_END  // namespace memcuda

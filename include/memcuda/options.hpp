// Option structs of the client API. Every field has a default, and no
// default reads the environment: RegistryOptions::from_env() applies the
// MEMCUDA_* variables (docs/operations.md, "Environment").
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/memory_resource.hpp"
#include "memcuda/stream.hpp"

#include "memcuda/redis/options.hpp"
#include "memcuda/tensor_info.hpp"

MEMCUDA_NAMESPACE_BEGIN

// How the cuda backend allocates and shares device memory (docs/design.md,
// "Allocation kinds"):
//   vmm  cuMem (virtual memory management) allocations exported once as a
//        POSIX fd; importers take the fd from the owner (unix socket,
//        SCM_RIGHTS, or pidfd_getfd) and map it. The memory lives while any
//        process holds the fd, so standby holders keep it across the death
//        of the allocator of record (records say "cuda_vmm_fd").
//   ipc  legacy cudaIpcGetMemHandle / cudaIpcOpenMemHandle ("cuda_ipc"): the
//        memory dies with its exporter; a takeover saves it by copy.
//   automatic  vmm where the device reports POSIX-fd handle support and no
//        user upstream resource (PoolOptions::upstream) is given, else ipc.
enum class CudaAllocation : std::uint8_t { automatic, vmm, ipc };

constexpr std::string_view to_string(CudaAllocation a) noexcept {
  switch (a) {
    case CudaAllocation::automatic: return "auto";
    case CudaAllocation::vmm: return "vmm";
    case CudaAllocation::ipc: return "ipc";
  }
  return "";
}

// "auto", "vmm" or "ipc" (case-sensitive); nullopt for anything else.
inline std::optional<CudaAllocation> cuda_allocation_from_string(std::string_view s) noexcept {
  if (s == "auto") return CudaAllocation::automatic;
  if (s == "vmm") return CudaAllocation::vmm;
  if (s == "ipc") return CudaAllocation::ipc;
  return std::nullopt;
}

// The allocator of record's memory pool, one per device and backend. Slabs
// are allocated and exported once; tensors are suballocated from them and
// published as (slab handle, offset), so creating and freeing a tensor
// costs no cudaMalloc/cudaFree and a process maps a slab once for all the
// tensors in it.
struct PoolOptions {
  std::uint64_t slab_bytes = std::uint64_t{256} << 20;       // cuda
  std::uint64_t host_slab_bytes = std::uint64_t{32} << 20;   // host (shm pages are committed up front)
  // Tensors of at least this many bytes get an allocation of their own
  // (0: half the slab size), so one huge tensor never pins a slab's neighbours.
  std::uint64_t dedicated_threshold = 0;
  // A create_many whose tensors on one device add up to at least this many
  // bytes (two tensors or more) is placed in one allocation sized to it, so
  // a consumer maps the whole batch with one open (docs/design.md, "Fewer
  // opens"); when that cannot be had, tensor by tensor. 0: never pack.
  std::uint64_t pack_batches_min_bytes = std::uint64_t{64} << 20;
  // Every block is aligned to this (a power of two, at least 256).
  std::uint64_t alignment = 256;
  // Empty slabs kept for reuse per pool; the control thread returns the
  // others to the driver (never on the create/release path).
  std::uint64_t retain_empty_slabs = 1;
  // Byte budget of the memory the pool holds (reserved) per device; 0 means
  // none. device_budgets overrides it per CUDA ordinal (-1: host).
  std::uint64_t budget_bytes = 0;
  std::map<int, std::uint64_t> device_budgets;
  // Where cuda slabs come from (null: cudaMalloc). Must hand out plain
  // cudaMalloc memory: see memory_resource.hpp.
  std::shared_ptr<DeviceMemoryResource> upstream;
  // Fill freed blocks, and the padding after a new tensor's bytes, with
  // 0xDD to expose reads of freed memory or past a tensor's end (a new
  // tensor itself always reads as zeros). from_env: MEMCUDA_DEBUG_POISON
  // (set and not "0").
  bool poison = false;
};

// RegistryOptions, in five groups. Every field has a plain default and
// RegistryOptions{} reads no environment; RegistryOptions::from_env() starts
// from the same defaults and applies the MEMCUDA_* variables (the list:
// docs/operations.md, "Environment"). The groups are bases of
// RegistryOptions, so each field is reached directly (o.lease_ttl) and a
// group as a whole through o.control() etc.

// Where the registry lives and how its calls reach Redis.
struct ConnectionOptions {
  // The Redis server: redis://127.0.0.1:6379 (from_env: MEMCUDA_REDIS_URL,
  // with MEMCUDA_REDIS_PASSWORD / _PASSWORD_FILE / _USER).
  redis::Options redis;

  // Isolates registries sharing one Redis: every key gets the prefix "ns:".
  // Empty (default): the lifecycle list is plain `tensor_lifecycle`.
  std::string name_space;

  // Several machines share this Redis (from_env: MEMCUDA_FLEET=1): each
  // node has an allocator of record of its own (its lease and lifecycle
  // list are "...@<node>"), which exposes its memory to the other nodes'
  // through the byte mover, and a get of another node's tensor pulls it
  // into a replica on this node (docs/scale-out.md). Every registry on the
  // Redis and namespace must agree on it.
  bool fleet = false;

  // How long a create sent to the allocator of record waits for its reply.
  std::chrono::milliseconds request_timeout{5000};

  // Client calls borrow a Redis connection from a pool of at most this many
  // (made as needed), so one thread's call never waits behind another's.
  std::size_t client_connections = 4;
  // Calls that wait in Redis for long (create through the allocator of
  // record, wait()) borrow from a second pool of at most this many, so
  // waiting threads never take the connections short calls need.
  std::size_t waiting_connections = 16;
};

// The registry's thread: the allocator-of-record lease, the session, GC.
struct ControlOptions {
  // Host the allocator-of-record role: campaign for the lease, serve the
  // lifecycle list while holding it, follow otherwise. A process that only
  // reads tensors may switch it off; some process must host it. (The
  // registry's thread runs either way, to keep its session alive.)
  bool control_thread = true;

  // Allocator-of-record lease. The leader renews every ttl/3; followers
  // campaign every ttl/3, so a dead leader is replaced within about
  // ttl + ttl/3. A killed leader of this node and pid namespace is replaced
  // sooner, within about 50 ms: its followers watch its pid (lease.hpp).
  std::chrono::milliseconds lease_ttl{1500};
  // A leader whose control loop has not completed a pass for this long (a
  // call stuck in the driver, a pass failing on every try) stops renewing
  // its lease and gives it up, so a standby takes over; it campaigns again
  // once its loop runs. Zero: never.
  std::chrono::milliseconds serve_stall_timeout{30000};

  // Every registry keeps a session key alive in Redis (refreshed by its
  // thread every session_ttl/3, also when control_thread is off). When a
  // process dies, the allocator of record drops the references it held,
  // checking every gc_interval: within about gc_interval when the session
  // names a process of this node and pid namespace that is gone, else once
  // its key has expired (about session_ttl + gc_interval).
  std::chrono::milliseconds session_ttl{2000};
  std::chrono::milliseconds gc_interval{500};

  // How often the thread renews the lease and the session (and campaigns).
  std::chrono::milliseconds heartbeat_period() const {
    return std::max(std::min(lease_ttl, session_ttl) / 3, std::chrono::milliseconds(10));
  }
};

// In-process reference sharing (docs/design.md, "In-process reference sharing").
struct SharingOptions {
  // A get() of a tensor this registry already holds returns the held
  // handle without a Redis round trip (one Redis reference per process and
  // tensor while any local copy lives), kept correct by an invalidation
  // connection (Redis client tracking). False: every get() takes its own
  // reference in Redis. from_env: MEMCUDA_SHARE_REFERENCES ("0" or "1").
  bool share_references = true;
  // With share_references: how long the process's reference outlives the
  // last local handle of a get, so that a get of the name within the window
  // takes it back with no Redis round trip (docs/design.md, "Lingering
  // releases"; Redis still counts the reference meanwhile). 0: the release
  // is queued at once; at most 60 s. from_env: MEMCUDA_RELEASE_LINGER_MS.
  std::chrono::microseconds release_linger{0};
};

// Where create() puts tensors, and how memory is allocated and shared.
struct AllocationOptions {
  // Backend and device of create() when CreateOptions leaves them unset.
  // nullopt: cuda when this build has CUDA and a device is visible, else host.
  std::optional<BackendKind> default_backend;
  int default_device = 0;

  // How cuda memory is allocated and shared (CudaAllocation above); nullopt:
  // automatic. from_env: MEMCUDA_CUDA_ALLOCATION ("auto", "vmm" or "ipc").
  // It decides only what this process creates: a reader opens every kind a
  // record names (cuda_ipc, cuda_vmm_fd, host_memfd), whatever it is.
  std::optional<CudaAllocation> cuda_allocation;

  // How many mappings of other processes' allocations that no tensor of
  // this process uses any more are kept open, most recently used first, so
  // that a get/release loop does not pay an open each time (an idle
  // mapping keeps its memory allocated until it is closed); 0 closes them
  // at once. from_env: MEMCUDA_IMPORT_CACHE (a count, 0..65536).
  // Process-wide: the last registry made sets it.
  std::size_t import_cache = 16;

  // The pool this registry allocates from while it is allocator of record
  // (from_env: MEMCUDA_DEBUG_POISON sets pool.poison).
  PoolOptions pool;
};

// How processes hand each other the fds of their memory (cuda_vmm_fd;
// docs/fd-transfer.md, "Runtime directory and peer policy"). These are the
// process's: every registry of a process must give the same values (another
// one throws InvalidArgument while the first lives).
struct TransferOptions {
  // The directory of this process's fd server socket: processes that share
  // memory (containers included: share it as a volume, mounted at one path)
  // use one directory. Empty: /tmp/memcuda-<euid>. An absolute path of at
  // most 63 bytes (docs/fd-transfer.md says what is refused). from_env:
  // MEMCUDA_RUNTIME_DIR.
  std::string runtime_dir;
  // Peers served besides this process's uid and root: by uid, and by
  // effective gid (SO_PEERCRED's). With gids the directory and sockets are
  // group-accessible (2770/0660, group: the first gid); with uids only,
  // open to all (1777/0666) with the uid check as the gate. from_env:
  // MEMCUDA_ALLOWED_UIDS, MEMCUDA_ALLOWED_GIDS ("1000,1001").
  std::vector<std::uint32_t> allowed_uids;
  std::vector<std::uint32_t> allowed_gids;
  // Prefetch over the fd socket: how many fds of an owner's other
  // allocations its server may send along with an answer, at most (servers
  // cap at 64; docs/fd-transfer.md, "Batches and prefetch"); 0: none.
  // from_env: MEMCUDA_FD_PREFETCH. Process-wide: the last registry made sets it.
  int fd_prefetch = 64;
  // How long a parked fd waits for its open. It keeps its memory allocated
  // meanwhile (also after the owner frees it, until the owner's notice
  // arrives), so keep it short; 0: nothing is parked (no prefetch, and
  // batched opens fetch one fd at a time). from_env: MEMCUDA_FD_PARK_MS.
  std::chrono::milliseconds fd_park_window{1500};
};

struct RegistryOptions : ConnectionOptions, ControlOptions, SharingOptions, AllocationOptions, TransferOptions {
  // The defaults with every MEMCUDA_* variable of docs/operations.md
  // ("Environment") applied; what TensorRegistry's default constructor, the
  // C ABI, Python and the memcuda tool start from. Unset or empty variables
  // leave the default; a malformed one throws InvalidArgument naming it.
  static RegistryOptions from_env();

  ConnectionOptions& connection() noexcept { return *this; }
  const ConnectionOptions& connection() const noexcept { return *this; }
  ControlOptions& control() noexcept { return *this; }
  const ControlOptions& control() const noexcept { return *this; }
  SharingOptions& sharing() noexcept { return *this; }
  const SharingOptions& sharing() const noexcept { return *this; }
  AllocationOptions& allocation() noexcept { return *this; }
  const AllocationOptions& allocation() const noexcept { return *this; }
  TransferOptions& transfer() noexcept { return *this; }
  const TransferOptions& transfer() const noexcept { return *this; }
};

// What a get() does with replicas (replicas.hpp): `use` returns the
// reader's device's copy when it is current, else the source itself (read
// through a peer mapping, or NotZeroCopy where there is no peer path; never
// a silent copy).
enum class LocalReplica : std::uint8_t { no, use };

// Options of one get().
struct GetOptions {
  // Ask Redis even when this process holds the name: the get sees the
  // name's mapping as of now rather than as of the last invalidation
  // message (one round trip; a held handle of the current generation is
  // still shared, no second reference is taken).
  bool fresh = false;
  LocalReplica replica = LocalReplica::no;
  int reader_device = -1;  // with `replica`: the reader's CUDA ordinal; -1: the calling thread's current device
  // Set: `stream` waits for the producer's last publish (a replica: for its
  // copy), as get(name, stream) does.
  std::optional<StreamHandle> stream;
};

struct CreateOptions {
  std::optional<int> device;            // CUDA ordinal in this process; unset: registry default
  std::optional<BackendKind> backend;   // unset: registry default
  // A persistent tensor is also held by its name: it outlives every handle
  // and is freed only after remove() and the last release. Without it, the
  // tensor is freed when its last holder releases.
  bool persistent = false;
};

MEMCUDA_NAMESPACE_END  // namespace memcuda

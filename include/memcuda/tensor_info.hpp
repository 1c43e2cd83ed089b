// What the registry knows about one tensor: the contents of its Redis Hash
// (docs/protocol.md, "The tensor Hash"). A plain value type; the codec that
// turns it into Hash fields and back is protocol::encode_record/decode_record.
#pragma once

#include "memcuda/config.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/dtype.hpp"
#include "memcuda/shape.hpp"

MEMCUDA_NAMESPACE_BEGIN

// Where a tensor's memory lives: device memory exported with CUDA IPC, or a
// POSIX shared memory object on the host.
enum class BackendKind : std::uint8_t { cuda, host };

// pending: the name is reserved and the memory is being allocated/exported;
// ready: usable; lost: the memory died with its allocator (see memcuda::Lost).
enum class TensorState : std::uint8_t { pending, ready, lost };

constexpr std::string_view to_string(BackendKind b) noexcept {
  switch (b) {
    case BackendKind::cuda: return "cuda";
    case BackendKind::host: return "host";
  }
  return "";
}

inline std::optional<BackendKind> backend_from_string(std::string_view s) noexcept {
  if (s == "cuda") return BackendKind::cuda;
  if (s == "host") return BackendKind::host;
  return std::nullopt;
}

constexpr std::string_view to_string(TensorState s) noexcept {
  switch (s) {
    case TensorState::pending: return "pending";
    case TensorState::ready: return "ready";
    case TensorState::lost: return "lost";
  }
  return "";
}

inline std::optional<TensorState> state_from_string(std::string_view s) noexcept {
  if (s == "pending") return TensorState::pending;
  if (s == "ready") return TensorState::ready;
  if (s == "lost") return TensorState::lost;
  return std::nullopt;
}

// Size of a cudaIpcMemHandle_t / cudaIpcEventHandle_t (CUDA_IPC_HANDLE_SIZE).
inline constexpr std::size_t kIpcHandleBytes = 64;

// One tensor's registry record. The Hash field of each member is given in
// quotes; integers are stored as decimal text. A default TensorInfo is well
// defined (zeros, empty strings, a cuda/pending f32 scalar) but is not a
// valid record until name, shape, bytes, ipc_handle... are filled in.
struct TensorInfo {
  std::string name;                          // "name"
  DType dtype = DType::f32;                  // "dtype", canonical name
  Shape shape;                               // "shape", "[2,3]"
  std::int64_t ctime_ms = 0;                 // "ctime", ms since the Unix epoch
  std::string node;                          // "node", node id of the allocator
  int device = -1;                           // "device", ordinal in the allocator's view; -1 host
  std::string device_uuid;                   // "device_uuid", "" for host
  std::uint64_t bytes = 0;                   // "bytes", itemsize * elements
  BackendKind backend = BackendKind::cuda;   // "backend"
  std::string ipc_handle;                    // "ipc_handle", 64 raw bytes (cuda) or shm name (host)
  std::uint64_t offset = 0;                  // "offset", of the tensor in the exported allocation
  std::uint64_t alloc_bytes = 0;             // "alloc_bytes", size of the exported allocation
  std::uint64_t alloc_id = 0;                // "alloc_id", unique per allocator
  // "alloc_kind": how ipc_handle is opened, "host_memfd", "cuda_ipc" or
  // "cuda_vmm_fd" (ipc_handle is then a unique key, not a handle); "" in a
  // cuda record written before the field existed (read as cuda_ipc).
  std::string alloc_kind;
  // "fd_source": for "cuda_vmm_fd", where an importer obtains the
  // allocation's fd: "v1;<served id>;<owner pid>;<fd number>;<st_dev>;<st_ino>;<fd
  // server address>" (docs/protocol.md, detail/fd/fd_source.hpp); "" otherwise.
  std::string fd_source;
  std::int64_t refcount = 0;                 // "refcount"
  TensorState state = TensorState::pending;  // "state"
  std::uint64_t generation = 0;              // "generation", unique per tensor ever created
  std::uint64_t epoch = 0;                   // "epoch", leader epoch that allocated it
  std::string owner;                         // "owner", session id of the allocator of record
  std::int64_t owner_pid = 0;                // "owner_pid"
  std::string create_id;                     // "create_id", may be empty
  std::string event_handle;                  // "event_handle", "" or 64 raw bytes
  std::uint64_t event_version = 0;           // "event_version", 0 = none
  std::map<std::string, std::int64_t> holders;  // "holder:<id>" -> count, one field each
  // "borrowed" ("1"; absent otherwise): the memory is a buffer the owner
  // process shared without a copy (TensorRegistry::share). It lives only as
  // long as that process keeps it: never pooled, adopted or migrated, and
  // marked lost when the owner dies (docs/protocol.md, "Borrowed tensors").
  bool borrowed = false;
  // A replica (replicas.hpp): the source's name and generation it copies
  // ("replica_of", "source_generation"; empty and 0 for any other tensor),
  // the source event version its last copy reflects ("copied_version";
  // absent until the first copy is enqueued), how it was copied
  // ("replica_path": "peer" or "host" on a device, "node" for a pull from another node), and the unused time after which it goes
  // ("idle_ms"; 0: kept while its source lives).
  std::string replica_of;
  std::uint64_t source_generation = 0;
  std::optional<std::uint64_t> copied_version;
  std::string replica_path;
  std::int64_t idle_ms = 0;

  // Row-major strides in elements. Throws ProtocolError for an invalid shape.
  Shape strides() const { return contiguous_strides(shape); }
  // Number of elements. Throws ProtocolError for an invalid shape.
  std::uint64_t elements() const { return element_count(shape); }

  friend bool operator==(const TensorInfo&, const TensorInfo&) = default;
};

// One page of a listing (TensorRegistry::list_page): records in name order,
// and the name the next page starts after ("" when this page was the last).
struct ListPage {
  std::vector<TensorInfo> tensors;
  std::string next;
};

MEMCUDA_NAMESPACE_END  // namespace memcuda

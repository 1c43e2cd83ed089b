// The byte mover between nodes: what a transfer engine (UCX today; NCCL or
// NIXL could stand behind the same calls) must offer the registry. It knows
// nothing of Redis or of records: a node's endpoint and a region's key are
// opaque bytes that the registry stores and hands back (docs/scale-out.md,
// section 2). One-sided: the reader pulls from memory the owner exposed,
// and the owner's code takes no part in a transfer.
#pragma once

#include "memcuda/config.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::transfer {

// A transfer failed in the engine: a peer unreachable or gone, a key it
// does not accept, a deadline passed. An Unavailable (wire code
// "unavailable"), carrying the engine's status code and its text.
class TransferError : public Unavailable {
 public:
  TransferError(int status, std::string status_text, const std::string& what)
      : Unavailable(what + ": " + status_text), status_(status), status_text_(std::move(status_text)) {}
  int status() const noexcept { return status_; }
  const std::string& status_text() const noexcept { return status_text_; }

 private:
  int status_;
  std::string status_text_;
};

// Where memory lives. A mover that cannot reach device memory directly
// refuses it with Unavailable; a bounded pinned staging buffer in front of
// such a mover is where device memory would go through.
enum class MemoryKind : std::uint8_t { host, cuda };

// Memory exposed to peers: its address and size as peers name them, and the
// packed key a peer needs to read it. The registration lasts as long as the
// Region (and keeps its mover's engine alive); move-only.
class Region {
 public:
  Region() = default;
  Region(std::uint64_t address, std::size_t size, std::string key, std::shared_ptr<void> registration)
      : address_(address), size_(size), key_(std::move(key)), registration_(std::move(registration)) {}
  std::uint64_t address() const noexcept { return address_; }
  std::size_t size() const noexcept { return size_; }
  const std::string& key() const noexcept { return key_; }
  explicit operator bool() const noexcept { return registration_ != nullptr; }

 private:
  std::uint64_t address_ = 0;
  std::size_t size_ = 0;
  std::string key_;
  std::shared_ptr<void> registration_;
};

// A peer's exposed region, as the registry hands it to a reader: the peer's
// endpoint (Mover::endpoint() there) and its Region's address, size and key.
struct RemoteRegion {
  std::string endpoint;
  std::uint64_t address = 0;
  std::size_t size = 0;
  std::string key;
};

class Mover {
 public:
  using Deadline = std::chrono::steady_clock::time_point;
  virtual ~Mover() = default;

  // The engine's name ("ucx"), recorded next to the endpoint so that a peer
  // with another engine refuses it rather than misreads it.
  virtual const char* kind() const noexcept = 0;
  // What a peer needs to reach this mover (for UCX the packed worker address).
  virtual const std::string& endpoint() const noexcept = 0;
  // Registers [p, p + n) for peers to read. Throws InvalidArgument for an
  // empty range, Unavailable for memory this mover cannot reach.
  Region expose(void* p, std::size_t n, MemoryKind kind = MemoryKind::host) { return do_expose(p, n, kind); }
  // Copies `n` bytes at `offset` of `src` into dst, returning when they are
  // there. Throws InvalidArgument for a range outside `src`, TransferError
  // when the engine fails or `deadline` passes (nothing is written into dst
  // after it returned or threw). Safe from any thread.
  void get(const RemoteRegion& src, std::uint64_t offset, void* dst, std::size_t n, Deadline deadline,
           MemoryKind dst_kind = MemoryKind::host) {
    do_get(src, offset, dst, n, deadline, dst_kind);
  }

 protected:
  virtual Region do_expose(void* p, std::size_t n, MemoryKind kind) = 0;
  virtual void do_get(const RemoteRegion& src, std::uint64_t offset, void* dst, std::size_t n, Deadline deadline,
                      MemoryKind dst_kind) = 0;
};

// The mover a fleet's registries make (RegistryOptions::fleet): installed
// by the engine's header where a program includes it (ucx_mover.hpp), so
// that only programs that link an engine load it. Process-wide: which
// engines a program was linked with is.
using MoverFactory = std::unique_ptr<Mover> (*)();
inline std::atomic<MoverFactory>& mover_factory() noexcept {
  static std::atomic<MoverFactory> f{nullptr};
  return f;
}
inline bool install_mover_factory(MoverFactory f) noexcept {
  mover_factory().store(f);
  return true;
}

// Endpoints and keys are bytes; where they travel as text (a node record's
// region fields, a test's or benchmark's pipe) they are lower-case hex.
inline std::string to_hex(std::string_view b) {
  static constexpr char d[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * b.size());
  for (unsigned char ch : b) {
    out += d[ch >> 4];
    out += d[ch & 15];
  }
  return out;
}
inline std::string from_hex(std::string_view h) {
  auto v = [](char ch) { return ch <= '9' ? ch - '0' : (ch | 0x20) - 'a' + 10; };
  std::string out;
  out.reserve(h.size() / 2);
  for (std::size_t i = 0; i + 1 < h.size(); i += 2) out += static_cast<char>(v(h[i]) << 4 | v(h[i + 1]));
  return out;
}

// The range check every mover makes before it moves anything.
inline void check_range(const RemoteRegion& src, std::uint64_t offset, std::size_t n) {
  if (n == 0 || offset > src.size || n > src.size - offset)
    throw InvalidArgument("transfer of " + std::to_string(n) + " bytes at offset " + std::to_string(offset) +
                          " outside the remote region of " + std::to_string(src.size) + " bytes");
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::transfer

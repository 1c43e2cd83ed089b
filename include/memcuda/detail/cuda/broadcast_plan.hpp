// What a broadcast copies and along which route: the host half of the
// broadcast engine (broadcast.hpp runs it). No CUDA call here, so that the
// merging, the chunking and the route are tested without a GPU: the peer
// and rank matrices come in as plain data.
//
// Addresses are plain integers (a device pointer, or an offset in tests):
// merging and cutting only add and compare them.
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

inline constexpr std::uint64_t kBroadcastChunkUnit = std::uint64_t{2} << 20;     // 2 MiB
inline constexpr std::uint64_t kBroadcastMaxChunk = std::uint64_t{256} << 20;    // 256 MiB
inline constexpr std::uint64_t kBroadcastDefaultChunk = std::uint64_t{16} << 20;  // 16 MiB

// Throws InvalidArgument unless `chunk_bytes` is a multiple of 2 MiB in
// [2 MiB, 256 MiB]: the relay ring holds four chunks of pinned memory.
inline void check_chunk_bytes(std::uint64_t chunk_bytes) {
  if (chunk_bytes < kBroadcastChunkUnit || chunk_bytes > kBroadcastMaxChunk || chunk_bytes % kBroadcastChunkUnit)
    throw InvalidArgument("broadcast chunk_bytes " + std::to_string(chunk_bytes) +
                          ": want a multiple of 2 MiB (2097152) from 2 MiB to 256 MiB");
}

// `bytes` at `src` on the source device go to dst[t] of every target t.
struct BroadcastSegment {
  std::uint64_t src = 0;
  std::vector<std::uint64_t> dst;  // one per target, in the targets' order
  std::uint64_t bytes = 0;
};

// One copy unit: `bytes` from `offset` into segment `segment`.
struct BroadcastChunk {
  std::size_t segment = 0;
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
};

namespace broadcast_detail {
inline void check_range(std::uint64_t a, std::uint64_t n, std::size_t i, const char* what) {
  if (a > std::numeric_limits<std::uint64_t>::max() - n)
    throw InvalidArgument("broadcast segment " + std::to_string(i) + ": " + what + " address + " +
                          std::to_string(n) + " bytes overflows");
}
}  // namespace broadcast_detail

// Drops empty segments and merges each segment into the one before when
// they touch in the source and in every destination: a packed source
// (tensors laid out back to back in the same order everywhere) becomes a
// few long copies. Every segment must name `targets` destinations.
inline std::vector<BroadcastSegment> merge_segments(const std::vector<BroadcastSegment>& in, std::size_t targets) {
  std::vector<BroadcastSegment> out;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const auto& s = in[i];
    if (s.dst.size() != targets)
      throw InvalidArgument("broadcast segment " + std::to_string(i) + " has " + std::to_string(s.dst.size()) +
                            " destination(s) for " + std::to_string(targets) + " target(s)");
    broadcast_detail::check_range(s.src, s.bytes, i, "source");
    for (auto d : s.dst) broadcast_detail::check_range(d, s.bytes, i, "destination");
    if (s.bytes == 0) continue;
    if (!out.empty()) {
      auto& b = out.back();
      bool touch = b.src + b.bytes == s.src;
      for (std::size_t t = 0; touch && t < targets; ++t) touch = b.dst[t] + b.bytes == s.dst[t];
      if (touch) {
        b.bytes += s.bytes;  // cannot overflow: s.src + s.bytes was checked
        continue;
      }
    }
    out.push_back(s);
  }
  return out;
}

// Cuts segments into chunks of at most `chunk_bytes`, in order; the last
// chunk of a segment holds the rest.
inline std::vector<BroadcastChunk> cut_chunks(const std::vector<BroadcastSegment>& segments,
                                              std::uint64_t chunk_bytes) {
  check_chunk_bytes(chunk_bytes);
  std::vector<BroadcastChunk> out;
  for (std::size_t i = 0; i < segments.size(); ++i)
    for (std::uint64_t off = 0; off < segments[i].bytes; off += chunk_bytes)
      out.push_back({i, off, std::min(chunk_bytes, segments[i].bytes - off)});
  return out;
}

// The links between devices, by ordinal. can_access[i * n + j]: device i
// can access device j's memory (cudaDeviceCanAccessPeer(&r, i, j)); rank:
// cudaDevP2PAttrPerformanceRank of i -> j, lower is faster.
struct PeerMatrix {
  int devices = 0;
  std::vector<std::uint8_t> can_access;
  std::vector<int> rank;

  bool access(int i, int j) const { return can_access[static_cast<std::size_t>(i * devices + j)] != 0; }
  int rank_of(int i, int j) const { return rank[static_cast<std::size_t>(i * devices + j)]; }
};

enum class HopPath : std::uint8_t {
  device,  // source and target on one device: a plain device copy
  peer,    // the receiving device pulls over its peer link
  host,    // no peer path: through pinned host memory
};

inline const char* to_string(HopPath p) noexcept {
  switch (p) {
    case HopPath::device: return "device";
    case HopPath::peer: return "peer";
    case HopPath::host: return "host";
  }
  return "unknown";
}

// One hop of the route: target `to` is filled from `from` (-1: the source,
// else a target filled by an earlier hop).
struct BroadcastHop {
  int from = -1;
  int to = 0;
  int from_device = 0;
  int to_device = 0;
  HopPath path = HopPath::device;
};

struct RouteOptions {
  bool no_peer = false;  // every hop goes through host memory (also same-device ones): the relay's test
};

// The route: a chain from the source that repeatedly appends the unvisited
// target with the best rank among those that can pull from the chain's end
// (a target on the end's own device first, then the lowest rank, then the
// lowest index). When the end reaches none, a target that can pull from an
// earlier link of the chain hangs off that link; when none can, the lowest
// unvisited target is a relay hop from the end. A chain sends from each
// device once and keeps every link busy; a tree would make the source send
// twice. Targets may repeat devices and may sit on the source's device.
inline std::vector<BroadcastHop> plan_route(int source, const std::vector<int>& targets, const PeerMatrix& m,
                                            RouteOptions opt = {}) {
  const auto n = static_cast<std::size_t>(m.devices);
  if (m.devices < 0 || m.can_access.size() != n * n || m.rank.size() != n * n)
    throw InvalidArgument("broadcast peer matrix for " + std::to_string(m.devices) + " device(s) has " +
                          std::to_string(m.can_access.size()) + " access and " + std::to_string(m.rank.size()) +
                          " rank entries, want " + std::to_string(n * n) + " each");
  auto check_device = [&](int d, const std::string& who) {
    if (d < 0 || d >= m.devices)
      throw InvalidArgument("broadcast " + who + " device " + std::to_string(d) + " does not exist (" +
                            std::to_string(m.devices) + " device(s))");
  };
  check_device(source, "source");
  if (targets.empty()) throw InvalidArgument("broadcast with no target");
  for (std::size_t t = 0; t < targets.size(); ++t) check_device(targets[t], "target " + std::to_string(t));

  auto device_of = [&](int node) { return node < 0 ? source : targets[static_cast<std::size_t>(node)]; };
  // Whether `to` can be filled from `from` without the host, and how well
  // (lower is better; a same-device copy beats any link).
  auto link = [&](int from, int to, int& score) {
    if (opt.no_peer) return false;
    const int a = device_of(from), b = device_of(to);
    if (a != b && !m.access(b, a)) return false;  // the receiver pulls: it must reach the sender's memory
    score = a == b ? std::numeric_limits<int>::min() : m.rank_of(a, b);
    return true;
  };
  auto best_from = [&](int from, const std::vector<bool>& done) {
    int best = -1, best_score = 0;
    for (int t = 0; t < static_cast<int>(targets.size()); ++t) {
      int score = 0;
      if (!done[static_cast<std::size_t>(t)] && link(from, t, score) && (best < 0 || score < best_score))
        best = t, best_score = score;
    }
    return best;
  };

  std::vector<BroadcastHop> hops;
  std::vector<int> chain{-1};
  std::vector<bool> done(targets.size(), false);
  while (hops.size() < targets.size()) {
    int from = chain.back();
    int to = best_from(from, done);
    for (auto it = chain.rbegin() + 1; to < 0 && it != chain.rend(); ++it)  // the nearest earlier link that reaches one
      if ((to = best_from(*it, done)) >= 0) from = *it;
    HopPath path = HopPath::host;
    if (to < 0) {
      from = chain.back();
      for (to = 0; done[static_cast<std::size_t>(to)];) ++to;
    } else {
      path = device_of(from) == device_of(to) ? HopPath::device : HopPath::peer;
    }
    done[static_cast<std::size_t>(to)] = true;
    chain.push_back(to);
    hops.push_back({from, to, device_of(from), device_of(to), path});
  }
  return hops;
}

// Everything a broadcast run needs, computed once.
struct BroadcastPlan {
  int source_device = 0;
  std::vector<int> target_devices;
  std::vector<BroadcastHop> hops;          // in the order they are filled
  std::vector<BroadcastSegment> segments;  // merged
  std::vector<BroadcastChunk> chunks;
  std::uint64_t chunk_bytes = kBroadcastDefaultChunk;
  std::uint64_t bytes = 0;  // per target

  // The distinct target devices, in the order they first appear among the targets.
  std::vector<int> devices() const {
    std::vector<int> out;
    for (int d : target_devices) {
      bool seen = false;
      for (int o : out) seen = seen || o == d;
      if (!seen) out.push_back(d);
    }
    return out;
  }
};

inline BroadcastPlan make_broadcast_plan(int source, std::vector<int> targets,
                                         const std::vector<BroadcastSegment>& segments, const PeerMatrix& m,
                                         std::uint64_t chunk_bytes = kBroadcastDefaultChunk, RouteOptions opt = {}) {
  check_chunk_bytes(chunk_bytes);
  BroadcastPlan p;
  p.source_device = source;
  p.hops = plan_route(source, targets, m, opt);
  p.segments = merge_segments(segments, targets.size());
  p.chunks = cut_chunks(p.segments, chunk_bytes);
  p.chunk_bytes = chunk_bytes;
  for (const auto& s : p.segments) p.bytes += s.bytes;
  p.target_devices = std::move(targets);
  return p;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

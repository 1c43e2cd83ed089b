// The broadcast engine: copies the bytes of a BroadcastPlan from the source
// device to every target along the plan's chain, chunk by chunk, so that
// every link of the chain is busy at once: the copy behind per-device
// replicas, made by the allocator of record.
//
// Everything is enqueued, nothing waited for on the host: chunk c of hop
// i -> j runs on stream c % streams_per_hop of j (the receiver's copy
// engines pull), after chunk c arrived on i (an event of a ring of 64 per
// target), and records its own arrival on j. A hop without a peer path
// goes through a ring of four pinned chunks: D2H on a stream of i, H2D on
// j, a slot's next D2H after its last H2D. run() returns, per target
// device, an event recorded after all that device's copies.
#pragma once

#include "memcuda/config.hpp"

#include "memcuda/detail/cuda/broadcast_plan.hpp"

#if MEMCUDA_HAS_CUDA()
#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "memcuda/detail/base/fault.hpp"
#include "memcuda/detail/cuda/driver.hpp"
#include "memcuda/detail/cuda/handles.hpp"
#include "memcuda/detail/cuda/runtime.hpp"
#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

struct BroadcastOptions {
  std::uint64_t chunk_bytes = kBroadcastDefaultChunk;  // 2 MiB..256 MiB, a multiple of 2 MiB
  int streams_per_hop = 2;                             // 1..4, on the receiving device
  bool no_peer = false;                                // every hop through host memory
};

// Bytes enqueued so far, by path.
struct BroadcastCounters {
  std::uint64_t device_bytes = 0;  // same-device copies
  std::uint64_t peer_bytes = 0;    // over a peer link
  std::uint64_t host_bytes = 0;    // relayed through pinned host memory (each byte counted once)
  std::uint64_t runs = 0;
};

// The links of this process's devices (cudaDeviceCanAccessPeer and
// cudaDevP2PAttrPerformanceRank): fixed for the process's life.
inline PeerMatrix query_peer_matrix() {
  PeerMatrix m;
  m.devices = device_count();
  const auto n = static_cast<std::size_t>(m.devices);
  m.can_access.assign(n * n, 0);
  m.rank.assign(n * n, 0);
  for (int i = 0; i < m.devices; ++i)
    for (int j = 0; j < m.devices; ++j) {
      if (i == j) continue;
      int a = 0, r = 0;
      MEMCUDA_CUDA_TRY(cudaDeviceCanAccessPeer(&a, i, j));
      if (a) MEMCUDA_CUDA_TRY(cudaDeviceGetP2PAttribute(&r, cudaDevP2PAttrPerformanceRank, i, j));
      m.can_access[static_cast<std::size_t>(i) * n + static_cast<std::size_t>(j)] = a ? 1 : 0;
      m.rank[static_cast<std::size_t>(i) * n + static_cast<std::size_t>(j)] = r;
    }
  return m;
}

// What run() returns: one event per target device, recorded after all the
// copies into that device. The caller waits on it (cudaStreamWaitEvent) or
// records its own after it; it stays valid as long as this object.
class BroadcastEvents {
 public:
  const std::vector<int>& devices() const noexcept { return devices_; }
  cudaEvent_t event(int device) const {
    for (std::size_t i = 0; i < devices_.size(); ++i)
      if (devices_[i] == device) return events_[i].get();
    throw InvalidArgument("device " + std::to_string(device) + " is not a target of this broadcast");
  }

 private:
  friend class Broadcaster;
  std::vector<int> devices_;
  std::vector<UniqueEvent> events_;
};

class Broadcaster {
 public:
  static constexpr std::size_t kEventRing = 64;  // arrival events per target
  static constexpr std::size_t kRelaySlots = 4;  // pinned chunks of the relay ring

  explicit Broadcaster(BroadcastOptions opt = {}) : opt_(opt) {
    check_chunk_bytes(opt.chunk_bytes);
    if (opt.streams_per_hop < 1 || opt.streams_per_hop > 4)
      throw InvalidArgument("broadcast streams_per_hop " + std::to_string(opt.streams_per_hop) + ": want 1 to 4");
  }
  Broadcaster(const Broadcaster&) = delete;
  Broadcaster& operator=(const Broadcaster&) = delete;
  // Waits for its own streams first: no copy may still read the relay ring
  // when it is freed, nor run on a destroyed stream.
  ~Broadcaster() {
    std::lock_guard lk(mu_);
    synchronize_all(/*log_only=*/true);
  }

  const BroadcastOptions& options() const noexcept { return opt_; }

  // The plan over this process's devices with the options' chunk size; the
  // fault point broadcast.no_peer makes every hop a relay.
  BroadcastPlan plan(int source, std::vector<int> targets, const std::vector<BroadcastSegment>& segments) {
    RouteOptions ro;
    ro.no_peer = opt_.no_peer || MEMCUDA_FAULT("broadcast.no_peer");
    std::lock_guard lk(mu_);
    if (!topology_) topology_ = query_peer_matrix();
    return make_broadcast_plan(source, std::move(targets), segments, *topology_, opt_.chunk_bytes, ro);
  }

  // Enqueues the plan's copies and returns without waiting for them. The
  // hops from the source wait on `wait` first (the producer's event; null:
  // nothing to wait for). Pointers in the plan are device pointers of this
  // process (UVA); each receiver of a peer hop gets peer access to its
  // sender (cudaDeviceEnablePeerAccess, or the sender's cuMem mappings).
  BroadcastEvents run(const BroadcastPlan& p, cudaEvent_t wait = nullptr) {
    std::lock_guard lk(mu_);
    check_plan(p);
    std::vector<Lane*> lanes = lanes_for(p);
    for (const auto& h : p.hops) {
      if (h.path == HopPath::peer) enable_peer(h.from_device, h.to_device);
      if (h.path == HopPath::host) prepare_relay(p, h.from_device, h.to_device);
    }
    grant_mappings(p);
    for (std::size_t c = 0; c < p.chunks.size(); ++c)
      for (const auto& h : p.hops) enqueue(p, h, c, wait, lanes);
    ++runs_;
    return join(p, lanes);
  }

  // Frees the relay ring after the copies that use it are done (streams
  // and events stay: they are cheap and the next run reuses them).
  void trim() {
    std::lock_guard lk(mu_);
    if (!ring_) return;
    synchronize_all(/*log_only=*/false);
    ring_ = PinnedBuffer();
    last_free_.fill(nullptr);
  }

  BroadcastCounters counters() const {
    BroadcastCounters c;
    c.device_bytes = device_bytes_.load(std::memory_order_relaxed);
    c.peer_bytes = peer_bytes_.load(std::memory_order_relaxed);
    c.host_bytes = host_bytes_.load(std::memory_order_relaxed);
    c.runs = runs_.load(std::memory_order_relaxed);
    return c;
  }

  // Bytes of pinned host memory held for the relay (0 until a relay hop, and after trim()).
  std::size_t relay_bytes() const {
    std::lock_guard lk(mu_);
    return ring_.bytes();
  }

 private:
  // What one target receives through: its streams and its arrival ring.
  struct Lane {
    std::vector<UniqueStream> streams;
    std::vector<UniqueEvent> arrived;
    std::vector<UniqueEvent> tails;  // one per stream, for the join
  };
  // A device's lanes (one per target on it, by order of appearance) and
  // what its relay hops send and receive with.
  struct DeviceState {
    std::deque<Lane> lanes;                // a deque: a run holds pointers to lanes while adding more
    std::vector<UniqueStream> send;        // D2H into the ring
    std::vector<UniqueEvent> slot_full;    // recorded on send after a D2H, per slot
    std::vector<UniqueEvent> slot_free;    // recorded on a lane after an H2D, per slot
  };

  void check_plan(const BroadcastPlan& p) const {
    const std::size_t k = p.target_devices.size();
    if (k == 0 || p.hops.size() != k)
      throw InvalidArgument("broadcast plan has " + std::to_string(p.hops.size()) + " hop(s) for " +
                            std::to_string(k) + " target(s)");
    check_chunk_bytes(p.chunk_bytes);
    std::vector<bool> filled(k, false);
    for (const auto& h : p.hops) {
      const auto to = static_cast<std::size_t>(h.to), from = static_cast<std::size_t>(h.from);
      if (h.to < 0 || to >= k || filled[to] || p.target_devices[to] != h.to_device ||
          (h.from < 0 ? h.from_device != p.source_device
                      : from >= k || !filled[from] || p.target_devices[from] != h.from_device))
        throw InvalidArgument("broadcast plan hop " + std::to_string(h.from) + " -> " + std::to_string(h.to) +
                              " does not follow its targets");
      filled[to] = true;
    }
    for (const auto& s : p.segments)
      if (s.dst.size() != k)
        throw InvalidArgument("broadcast plan segment has " + std::to_string(s.dst.size()) + " destination(s) for " +
                              std::to_string(k) + " target(s)");
    for (const auto& c : p.chunks)
      if (c.segment >= p.segments.size() || c.bytes > p.chunk_bytes ||
          c.offset + c.bytes > p.segments[c.segment].bytes)
        throw InvalidArgument("broadcast plan chunk outside its segment");
  }

  DeviceState& device(int d) { return devices_[d]; }

  Lane make_lane(int d) {
    Lane l;
    for (int s = 0; s < opt_.streams_per_hop; ++s) {
      l.streams.emplace_back(d);
      l.tails.emplace_back(d);
    }
    for (std::size_t i = 0; i < kEventRing; ++i) l.arrived.emplace_back(d);
    return l;
  }

  // Target t's lane: the n-th lane of its device for the n-th target there.
  std::vector<Lane*> lanes_for(const BroadcastPlan& p) {
    std::map<int, std::size_t> seen;
    std::vector<Lane*> out;
    for (int d : p.target_devices) {
      auto& ds = device(d);
      const std::size_t n = seen[d]++;
      while (ds.lanes.size() <= n) ds.lanes.push_back(make_lane(d));
      out.push_back(&ds.lanes[n]);
    }
    return out;
  }

  // The receiver pulls from the sender: peer access from `to` into `from`.
  void enable_peer(int from, int to) {
    if (!peers_.insert({to, from}).second) return;
    DeviceGuard g(to);
    cudaError_t st = cudaDeviceEnablePeerAccess(from, 0);
    if (st == cudaErrorPeerAccessAlreadyEnabled) {
      cudaGetLastError();
    } else if (st != cudaSuccess) {
      peers_.erase({to, from});
      throw_cuda(st, "cudaDeviceEnablePeerAccess");
    }
  }

  // A cuMem mapping grants only its own device: the receiver of a peer hop
  // gets access to each sender-side mapping the segments touch, once per
  // mapping and receiver in a run (milliseconds for a large mapping).
  // cudaMalloc and legacy IPC memory need none (enable_peer covers them).
  void grant_mappings(const BroadcastPlan& p) {
    const auto& d = cu_driver();
    if (!d.ok()) return;  // no cuMem calls: no cuMem mappings either
    std::set<std::pair<CUdeviceptr, int>> granted;
    for (const auto& h : p.hops) {
      if (h.path != HopPath::peer) continue;
      DeviceGuard g(h.from_device);
      for (const auto& s : p.segments) {
        const std::uint64_t start = h.from < 0 ? s.src : s.dst[static_cast<std::size_t>(h.from)];
        for (std::uint64_t a = start; a < start + s.bytes;) {  // a merged segment may span mappings
          CUdeviceptr base = 0;
          std::size_t size = 0;
          if (CUresult r = d.MemGetAddressRange(&base, &size, static_cast<CUdeviceptr>(a)); r != CUDA_SUCCESS)
            throw_cu(r, "cuMemGetAddressRange", "broadcast source of device " + std::to_string(h.from_device));
          a = base + size;
          if (!granted.insert({base, h.to_device}).second) continue;
          CUmemGenericAllocationHandle handle{};
          if (d.MemRetainAllocationHandle(&handle, reinterpret_cast<void*>(base)) != CUDA_SUCCESS) continue;
          (void)d.MemRelease(handle);  // only asked whether it is a cuMem mapping
          grant_access(reinterpret_cast<const void*>(base), h.to_device);
        }
      }
    }
  }

  void prepare_relay(const BroadcastPlan& p, int from, int to) {
    if (ring_.bytes() < kRelaySlots * p.chunk_bytes) {
      if (ring_) synchronize_all(/*log_only=*/false);  // a larger chunk: the old ring may still be read
      ring_ = PinnedBuffer();
      ring_ = PinnedBuffer(kRelaySlots * p.chunk_bytes);
      slot_bytes_ = p.chunk_bytes;
      last_free_.fill(nullptr);
    }
    auto& s = device(from);
    while (s.send.size() < static_cast<std::size_t>(opt_.streams_per_hop)) s.send.emplace_back(from);
    while (s.slot_full.size() < kRelaySlots) s.slot_full.emplace_back(from);
    auto& r = device(to);
    while (r.slot_free.size() < kRelaySlots) r.slot_free.emplace_back(to);
  }

  // Chunk c of hop h: wait for it on the sender, copy, record its arrival.
  void enqueue(const BroadcastPlan& p, const BroadcastHop& h, std::size_t c, cudaEvent_t wait,
               const std::vector<Lane*>& lanes) {
    const BroadcastChunk& ch = p.chunks[c];
    const BroadcastSegment& seg = p.segments[ch.segment];
    const std::uint64_t from_addr = (h.from < 0 ? seg.src : seg.dst[static_cast<std::size_t>(h.from)]) + ch.offset;
    void* dst = reinterpret_cast<void*>(seg.dst[static_cast<std::size_t>(h.to)] + ch.offset);
    const void* src = reinterpret_cast<const void*>(from_addr);
    cudaEvent_t ready = h.from < 0 ? wait : lanes[static_cast<std::size_t>(h.from)]->arrived[c % kEventRing].get();
    Lane& in = *lanes[static_cast<std::size_t>(h.to)];
    cudaStream_t s = in.streams[c % in.streams.size()].get();
    const auto n = static_cast<std::size_t>(ch.bytes);
    if (h.path == HopPath::host) {
      src = relay_out(h.from_device, src, n, c, ready);
      ready = device(h.from_device).slot_full[relay_slot_].get();
    }
    DeviceGuard g(h.to_device);
    if (ready) MEMCUDA_CUDA_TRY(cudaStreamWaitEvent(s, ready, 0));
    MEMCUDA_CUDA_TRY(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s));
    MEMCUDA_CUDA_TRY(cudaEventRecord(in.arrived[c % kEventRing].get(), s));
    if (h.path == HopPath::host) {
      auto& freed = device(h.to_device).slot_free[relay_slot_];
      MEMCUDA_CUDA_TRY(cudaEventRecord(freed.get(), s));
      last_free_[relay_slot_] = freed.get();
      relay_slot_ = (relay_slot_ + 1) % kRelaySlots;
    }
    counter(h.path).fetch_add(ch.bytes, std::memory_order_relaxed);
  }

  // The first half of a relayed chunk: D2H into the next ring slot, after
  // the chunk arrived on the sender and the slot's last H2D is done.
  const void* relay_out(int from_device, const void* src, std::size_t n, std::size_t c, cudaEvent_t ready) {
    auto& ds = device(from_device);
    cudaStream_t s = ds.send[c % ds.send.size()].get();
    unsigned char* slot = ring_.get() + relay_slot_ * slot_bytes_;
    DeviceGuard g(from_device);
    if (ready) MEMCUDA_CUDA_TRY(cudaStreamWaitEvent(s, ready, 0));
    if (cudaEvent_t f = last_free_[relay_slot_]) MEMCUDA_CUDA_TRY(cudaStreamWaitEvent(s, f, 0));
    MEMCUDA_CUDA_TRY(cudaMemcpyAsync(slot, src, n, cudaMemcpyDefault, s));
    MEMCUDA_CUDA_TRY(cudaEventRecord(ds.slot_full[relay_slot_].get(), s));
    return slot;
  }

  // Per target device: its first lane's first stream waits for every other
  // stream of its lanes, then records the device's event.
  BroadcastEvents join(const BroadcastPlan& p, const std::vector<Lane*>& lanes) {
    BroadcastEvents out;
    for (int d : p.devices()) {
      DeviceGuard g(d);
      Lane* first = nullptr;
      for (std::size_t t = 0; t < lanes.size(); ++t) {
        if (p.target_devices[t] != d) continue;
        if (!first) first = lanes[t];
        for (std::size_t i = 0; i < lanes[t]->streams.size(); ++i) {
          if (lanes[t] == first && i == 0) continue;
          MEMCUDA_CUDA_TRY(cudaEventRecord(lanes[t]->tails[i].get(), lanes[t]->streams[i].get()));
          MEMCUDA_CUDA_TRY(cudaStreamWaitEvent(first->streams[0].get(), lanes[t]->tails[i].get(), 0));
        }
      }
      UniqueEvent done(d);
      MEMCUDA_CUDA_TRY(cudaEventRecord(done.get(), first->streams[0].get()));
      out.devices_.push_back(d);
      out.events_.push_back(std::move(done));
    }
    return out;
  }

  // Waits for every stream this object owns. In the destructor a failure
  // is logged (a broken context has nothing left to wait for).
  void synchronize_all(bool log_only) {
    for (auto& [d, ds] : devices_) {
      auto sync = [&](const UniqueStream& s) {
        if (log_only) MEMCUDA_CUDA_LOG(cudaStreamSynchronize(s.get()));
        else MEMCUDA_CUDA_TRY(cudaStreamSynchronize(s.get()));
      };
      for (auto& l : ds.lanes)
        for (auto& s : l.streams) sync(s);
      for (auto& s : ds.send) sync(s);
    }
  }

  std::atomic<std::uint64_t>& counter(HopPath p) {
    return p == HopPath::host ? host_bytes_ : p == HopPath::peer ? peer_bytes_ : device_bytes_;
  }

  const BroadcastOptions opt_;
  mutable std::mutex mu_;
  std::optional<PeerMatrix> topology_;
  std::set<std::pair<int, int>> peers_;  // (receiver, sender) with peer access enabled
  std::map<int, DeviceState> devices_;   // std::map: a run holds references into it
  PinnedBuffer ring_;                    // freed before the streams: the destructor synchronised them first
  std::size_t slot_bytes_ = 0;
  std::size_t relay_slot_ = 0;                          // the next slot to fill
  std::array<cudaEvent_t, kRelaySlots> last_free_{};    // the last H2D out of each slot
  std::atomic<std::uint64_t> device_bytes_{0}, peer_bytes_{0}, host_bytes_{0}, runs_{0};
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
#endif  // MEMCUDA_HAS_CUDA()

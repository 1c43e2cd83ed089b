// The replicator's copies (create/replicator.hpp): one call's streams,
// events and mappings (ReplicaCopies), and the engine that enqueues them as
// chained broadcasts and records one interprocess event per target device
// (ReplicaCopier). No Redis here.
#pragma once

#include "memcuda/config.hpp"
#if MEMCUDA_HAS_CUDA()

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "memcuda/detail/backend/process_cache.hpp"
#include "memcuda/detail/backend/select.hpp"
#include "memcuda/detail/cuda/broadcast.hpp"
#include "memcuda/detail/cuda/ipc_event.hpp"
#include "memcuda/detail/cuda/runtime.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/tensor_info.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// One call's streams (one per target device), events and the source
// mappings its copies read. Destroyed before the sources' references go
// (the replicator's scope), it waits for the copies: a source freed and its
// block reused while a copy still reads would copy another tensor's
// bytes. Readers need not wait for that: their streams wait on the events.
struct ReplicaCopies {
  std::map<int, cudaStream_t> streams;
  std::vector<std::shared_ptr<void>> keeps;
  std::vector<BroadcastEvents> runs;
  std::vector<UniqueEvent> gates;
  ReplicaCopies() = default;
  ReplicaCopies(const ReplicaCopies&) = delete;
  ReplicaCopies& operator=(const ReplicaCopies&) = delete;
  ~ReplicaCopies() {
    settle();
    for (auto& [dev, st] : streams) {
      DeviceGuard g(dev, std::nothrow);
      MEMCUDA_CUDA_LOG(cudaStreamDestroy(st));
    }
  }
  // Waits for every copy enqueued so far.
  void settle() noexcept {
    for (const auto& r : runs)  // a failure may have come before a stream waited on one
      for (int d : r.devices()) MEMCUDA_CUDA_LOG(cudaEventSynchronize(r.event(d)));
    for (auto& [dev, st] : streams) {
      DeviceGuard g(dev, std::nothrow);
      MEMCUDA_CUDA_LOG(cudaStreamSynchronize(st));
    }
  }
  cudaStream_t stream(int dev) {
    auto& s = streams[dev];
    if (!s) {
      DeviceGuard g(dev);
      MEMCUDA_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    }
    return s;
  }
};

struct ReplicaTarget {
  std::size_t src;  // index into the sources
  std::string uuid;
  int device;
};
// A replica a copy writes: made now, or refreshed in place.
struct ReplicaDest {
  ReplicaTarget t;
  std::string name;
  std::uint64_t generation;
  void* ptr;
};

// One per registry; enqueue() is safe from any thread: the broadcast engine
// serialises only its enqueues, the events their records.
class ReplicaCopier {
 public:
  // Enqueues every copy through the broadcast engine: per source device
  // and set of targets one chained broadcast (a device that has a chunk
  // forwards it), which first waits for the sources' producers; then one
  // interprocess event per target device, after its copies.
  // -> device -> {its event's handle, "peer" | "host"}
  std::map<int, std::pair<std::string, std::string>> enqueue(const std::vector<ReplicaDest>& dests,
                                                             const std::vector<TensorInfo>& src, ReplicaCopies& cp) {
    // source -> (device -> destination), and the groups of one broadcast
    std::map<std::size_t, std::map<int, void*>> dst;
    for (const auto& d : dests) dst[d.t.src][d.t.device] = d.ptr;
    std::map<std::pair<int, std::vector<int>>, std::vector<std::size_t>> groups;
    for (const auto& [i, to] : dst) {
      std::vector<int> devs;
      for (const auto& [d, p] : to) devs.push_back(d);
      groups[{ordinal_of_uuid(src[i].device_uuid, src[i].device), devs}].push_back(i);
    }
    std::map<int, std::pair<std::string, std::string>> out;
    for (const auto& [key, members] : groups) {
      const auto& [sdev, targets] = key;
      std::vector<BroadcastSegment> segs;
      cudaStream_t gate_stream = cp.stream(sdev);
      DeviceGuard g(sdev);
      std::set<std::string> waited;
      for (auto i : members) {
        const auto& s = src[i];
        BroadcastSegment seg{reinterpret_cast<std::uint64_t>(pointer_of(s, cp)), {}, s.bytes};
        for (int d : targets) seg.dst.push_back(reinterpret_cast<std::uint64_t>(dst[i][d]));
        segs.push_back(std::move(seg));
        if (!s.event_handle.empty() && waited.insert(s.event_handle).second)
          stream_wait_ipc_event(gate_stream, s.event_handle);
      }
      auto& gate = cp.gates.emplace_back(sdev);
      MEMCUDA_CUDA_TRY(cudaEventRecord(gate.get(), gate_stream));
      const BroadcastPlan plan = broadcaster_.plan(sdev, targets, segs);
      cp.runs.push_back(broadcaster_.run(plan, gate.get()));
      for (int d : targets) {
        bool relayed = false;
        for (const auto& h : plan.hops) relayed |= h.to_device == d && h.path == HopPath::host;
        DeviceGuard gd(d);
        MEMCUDA_CUDA_TRY(cudaStreamWaitEvent(cp.stream(d), cp.runs.back().event(d), 0));
        out[d].second = relayed || out[d].second == "host" ? "host" : "peer";
      }
    }
    for (auto& [dev, mark] : out) mark.first = record_event(dev, cp.stream(dev));
    return out;
  }

  // A record's bytes, mapped through this process's cache while `cp` lives.
  void* pointer_of(const TensorInfo& t, ReplicaCopies& cp) {
    auto [base, keep] = Process::get().cache().resolve(t.owner, t.alloc_id, [&] { return backend_for(t).open(t); });
    cp.keeps.push_back(std::move(keep));
    return static_cast<char*>(base) + t.offset;
  }

 private:
  // One interprocess event per device for the registry's life, recorded
  // again by each replicate: the handle a replica's record names stays
  // valid (a retired event is destroyed after a while, and this process
  // cannot open its own handles). A reader waits on the latest record,
  // which comes after its copy and, chained, after those of calls that
  // ran beside it (a publish's refresh beside a replicate). -> the handle
  std::string record_event(int dev, cudaStream_t s) {
    std::lock_guard lk(events_mu_);  // leaf: no Redis under it
    auto& ev = events_[dev];
    if (!ev) ev = std::make_unique<ExportedEvent>(dev);
    ev->record_after_last(s);
    return ev->handle();
  }

  Broadcaster broadcaster_;
  std::mutex events_mu_;  // leaf
  std::map<int, std::unique_ptr<ExportedEvent>> events_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
#endif  // MEMCUDA_HAS_CUDA()

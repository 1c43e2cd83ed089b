// Interprocess CUDA events: how a producer's stream order reaches consumers
// in other processes without host synchronisation. The producer records an
// event created with cudaEventInterprocess on its stream and publishes the
// event's IPC handle in the tensor's Hash; a consumer opens the handle
// (once per process: EventCache) and makes its stream wait on it.
#pragma once

#include "memcuda/config.hpp"
#if MEMCUDA_HAS_CUDA()

#include <cstring>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>

#include "memcuda/detail/base/log.hpp"
#include "memcuda/detail/cuda/runtime.hpp"
#include "memcuda/detail/process/process.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// Events by IPC handle bytes: our own (a process cannot open its own
// handle) and imported ones, opened once. Imports are kept under an LRU
// bound; the oldest is destroyed when it is exceeded. An own event whose
// exporter went (a released handle's) is kept too: a record may still name
// it, and this process, unlike every other, cannot open that handle. Past
// kMaxRetired the oldest is waited for and destroyed.
class EventCache {
 public:
  static constexpr std::size_t kMaxImports = 4096;
  static constexpr std::size_t kMaxRetired = 4096;

  void add_own(const std::string& handle, cudaEvent_t ev) {
    std::lock_guard lk(mu_);
    own_[handle] = ev;
  }
  // The exporter of an own event goes: the event stays openable here.
  void retire_own(const std::string& handle, cudaEvent_t ev) {
    cudaEvent_t evicted{};
    {
      std::lock_guard lk(mu_);
      own_[handle] = ev;
      retired_.push_back(handle);
      if (retired_.size() > kMaxRetired) {
        auto it = own_.find(retired_.front());
        if (it != own_.end()) {
          evicted = it->second;
          own_.erase(it);
        }
        retired_.pop_front();
      }
    }
    if (evicted) {  // its last record's work is done before the event goes
      MEMCUDA_CUDA_LOG(cudaEventSynchronize(evicted));
      MEMCUDA_CUDA_LOG(cudaEventDestroy(evicted));
    }
  }

  cudaEvent_t open(const std::string& handle) {
    std::lock_guard lk(mu_);
    if (auto it = own_.find(handle); it != own_.end()) return it->second;
    if (auto it = imported_.find(handle); it != imported_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.second);
      return it->second.first;
    }
    if (handle.size() != sizeof(cudaIpcEventHandle_t))
      throw InternalError("event handle of " + std::to_string(handle.size()) + " bytes");
    cudaIpcEventHandle_t h{};
    std::memcpy(&h, handle.data(), sizeof h);
    cudaEvent_t ev{};
    MEMCUDA_CUDA_TRY(cudaIpcOpenEventHandle(&ev, h));
    lru_.push_front(handle);
    imported_[handle] = {ev, lru_.begin()};
    if (imported_.size() > kMaxImports) {
      auto& old = lru_.back();
      MEMCUDA_CUDA_LOG(cudaEventDestroy(imported_[old].first));
      imported_.erase(old);
      lru_.pop_back();
    }
    ++opens_;
    return ev;
  }

  std::uint64_t opens() const {
    std::lock_guard lk(mu_);
    return opens_;
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, cudaEvent_t> own_;
  std::list<std::string> retired_;  // own events whose exporter went, oldest first
  std::list<std::string> lru_;
  std::unordered_map<std::string, std::pair<cudaEvent_t, std::list<std::string>::iterator>> imported_;
  std::uint64_t opens_ = 0;
};

// An interprocess event a producer records; its handle goes into the Hash.
class ExportedEvent {
 public:
  explicit ExportedEvent(int device) : device_(device) {
    DeviceGuard g(device);
    MEMCUDA_CUDA_TRY(cudaEventCreateWithFlags(&ev_, cudaEventInterprocess | cudaEventDisableTiming));
    cudaIpcEventHandle_t h{};
    if (cudaError_t st = cudaIpcGetEventHandle(&h, ev_); st != cudaSuccess) {
      cudaEventDestroy(ev_);
      throw_cuda(st, "cudaIpcGetEventHandle");
    }
    handle_.assign(reinterpret_cast<const char*>(&h), sizeof h);
    Process::get().events().add_own(handle_, ev_);
  }
  // The event outlives this object in the cache (retire_own): a record may
  // still carry its handle, and this process cannot open its own handles.
  ~ExportedEvent() { Process::get().events().retire_own(handle_, ev_); }
  ExportedEvent(const ExportedEvent&) = delete;
  ExportedEvent& operator=(const ExportedEvent&) = delete;

  // Records on `stream`, which must belong to this event's device.
  void record(cudaStream_t stream) {
    DeviceGuard g(device_);
    MEMCUDA_CUDA_TRY(cudaEventRecord(ev_, stream));
  }
  const std::string& handle() const noexcept { return handle_; }

 private:
  int device_;
  cudaEvent_t ev_{};
  std::string handle_;
};

// Makes `stream` wait for the last record of the event behind `handle`.
inline void stream_wait_ipc_event(cudaStream_t stream, const std::string& handle) {
  MEMCUDA_CUDA_TRY(cudaStreamWaitEvent(stream, Process::get().events().open(handle), 0));
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
#endif  // MEMCUDA_HAS_CUDA()

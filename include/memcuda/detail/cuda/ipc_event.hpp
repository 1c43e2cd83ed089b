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
#if CUDART_VERSION < 12080
#include "memcuda/detail/cuda/driver.hpp"
#endif

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// The device a stream belongs to (the current one for the default streams).
inline int stream_device(cudaStream_t stream) {
  int d = 0;
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
    MEMCUDA_CUDA_TRY(cudaGetDevice(&d));
    return d;
  }
#if CUDART_VERSION >= 12080
  MEMCUDA_CUDA_TRY(cudaStreamGetDevice(stream, &d));
#else  // the stream's context, made current for the question (driver entry points: no -lcuda)
  const auto& cu = cu_driver();
  CUcontext ctx{};
  CUdevice dev{};
  if (!cu.StreamGetCtx || !cu.CtxPushCurrent || !cu.CtxPopCurrent || !cu.CtxGetDevice)
    throw Unavailable("the CUDA driver lacks " + cu.missing + ": a stream's device cannot be told");
  if (cu.StreamGetCtx(stream, &ctx) != CUDA_SUCCESS || cu.CtxPushCurrent(ctx) != CUDA_SUCCESS)
    throw InternalError("cuStreamGetCtx: not a stream of this process");
  const CUresult r = cu.CtxGetDevice(&dev);
  cu.CtxPopCurrent(&ctx);
  if (r != CUDA_SUCCESS) throw InternalError("cuCtxGetDevice failed");
  d = static_cast<int>(dev);  // the runtime's ordinal is the driver's
#endif
  return d;
}

// Events by IPC handle bytes: our own (a process cannot open its own
// handle) and imported ones, opened once per device. Imports are kept under
// an LRU bound; the oldest is destroyed when it is exceeded. An own event
// whose exporter went (a released handle's) is kept too: a record may still
// name it, and this process, unlike every other, cannot open that handle.
// Past kMaxRetired the oldest is waited for and destroyed.
//
// A stream waits only on an interprocess event of its own device: the
// driver faults in cudaStreamWaitEvent otherwise (measured on H200 pairs,
// own and imported events alike). So an import is opened in the context of
// the waiting stream's device, and a wait on an own event of another device
// goes through a bridge: a stream of the event's device waits on it and
// records a plain event, which any device's stream may wait on.
class EventCache {
 public:
  static constexpr std::size_t kMaxImports = 4096;
  static constexpr std::size_t kMaxRetired = 4096;

  void add_own(const std::string& handle, cudaEvent_t ev, int device) {
    std::lock_guard lk(mu_);
    own_[handle] = {ev, device};
  }
  // The exporter of an own event goes: the event stays openable here.
  void retire_own(const std::string& handle, cudaEvent_t ev, int device) {
    cudaEvent_t evicted{};
    {
      std::lock_guard lk(mu_);
      own_[handle] = {ev, device};
      retired_.push_back(handle);
      if (retired_.size() > kMaxRetired) {
        auto it = own_.find(retired_.front());
        if (it != own_.end()) {
          evicted = it->second.ev;
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

  // Makes `stream` wait for the last record of the event behind `handle`.
  void wait(cudaStream_t stream, const std::string& handle) {
    const int device = stream_device(stream);
    std::lock_guard lk(mu_);
    if (auto it = own_.find(handle); it != own_.end()) {
      const Own o = it->second;
      if (o.device == device) {
        MEMCUDA_CUDA_TRY(cudaStreamWaitEvent(stream, o.ev, 0));
        return;
      }
      cudaStream_t b = bridge(o.device);
      MEMCUDA_CUDA_TRY(cudaStreamWaitEvent(b, o.ev, 0));
      cudaEvent_t plain{};
      {
        DeviceGuard g(o.device);
        MEMCUDA_CUDA_TRY(cudaEventCreateWithFlags(&plain, cudaEventDisableTiming));
      }
      cudaError_t st = cudaEventRecord(plain, b);
      if (st == cudaSuccess) st = cudaStreamWaitEvent(stream, plain, 0);
      MEMCUDA_CUDA_LOG(cudaEventDestroy(plain));  // freed once its work is done
      if (st != cudaSuccess) throw_cuda(st, "cudaStreamWaitEvent (bridged)");
      return;
    }
    MEMCUDA_CUDA_TRY(cudaStreamWaitEvent(stream, import(handle, device), 0));
  }

  std::uint64_t opens() const {
    std::lock_guard lk(mu_);
    return opens_;
  }

 private:
  struct Own {
    cudaEvent_t ev{};
    int device = 0;
  };

  // Held: mu_.
  cudaEvent_t import(const std::string& handle, int device) {
    const std::string key = handle + static_cast<char>(device);
    if (auto it = imported_.find(key); it != imported_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.second);
      return it->second.first;
    }
    if (handle.size() != sizeof(cudaIpcEventHandle_t))
      throw InternalError("event handle of " + std::to_string(handle.size()) + " bytes");
    cudaIpcEventHandle_t h{};
    std::memcpy(&h, handle.data(), sizeof h);
    cudaEvent_t ev{};
    {
      DeviceGuard g(device);  // opened in the context of the streams that wait on it
      MEMCUDA_CUDA_TRY(cudaIpcOpenEventHandle(&ev, h));
    }
    lru_.push_front(key);
    imported_[key] = {ev, lru_.begin()};
    if (imported_.size() > kMaxImports) {
      auto& old = lru_.back();
      MEMCUDA_CUDA_LOG(cudaEventDestroy(imported_[old].first));
      imported_.erase(old);
      lru_.pop_back();
    }
    ++opens_;
    return ev;
  }
  // Held: mu_. One per device, for the life of the process.
  cudaStream_t bridge(int device) {
    auto& s = bridges_[device];
    if (!s) {
      DeviceGuard g(device);
      MEMCUDA_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    }
    return s;
  }

  mutable std::mutex mu_;
  std::unordered_map<std::string, Own> own_;
  std::list<std::string> retired_;  // own events whose exporter went, oldest first
  std::list<std::string> lru_;
  std::unordered_map<std::string, std::pair<cudaEvent_t, std::list<std::string>::iterator>> imported_;
  std::unordered_map<int, cudaStream_t> bridges_;
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
    Process::get().events().add_own(handle_, ev_, device_);
  }
  // The event outlives this object in the cache (retire_own): a record may
  // still carry its handle, and this process cannot open its own handles.
  ~ExportedEvent() { Process::get().events().retire_own(handle_, ev_, device_); }
  ExportedEvent(const ExportedEvent&) = delete;
  ExportedEvent& operator=(const ExportedEvent&) = delete;

  // Records on `stream`, which must belong to this event's device.
  void record(cudaStream_t stream) {
    DeviceGuard g(device_);
    MEMCUDA_CUDA_TRY(cudaEventRecord(ev_, stream));
  }
  // Records on `stream` after the event's last record too (the stream
  // waits on it first): for an event several callers record, whose
  // waiters must come after every caller's work, not only the latest's.
  void record_after_last(cudaStream_t stream) {
    DeviceGuard g(device_);
    MEMCUDA_CUDA_TRY(cudaStreamWaitEvent(stream, ev_, 0));
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
  Process::get().events().wait(stream, handle);
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
#endif  // MEMCUDA_HAS_CUDA()

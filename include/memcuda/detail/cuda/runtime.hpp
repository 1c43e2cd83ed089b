// CUDA runtime helpers: the two error tiers, a scoped device switch and
// device identity by UUID. Compiles to nothing useful without the toolkit;
// callers guard with MEMCUDA_HAS_CUDA().
//
// Error tiers:
//   MEMCUDA_CUDA_TRY(call)  throws CudaError: for every path that may throw.
//   MEMCUDA_CUDA_LOG(call)  noexcept, logs a warning and goes on: for
//                           destructors and other cleanup. It is silent when
//                           the failure only says the process is exiting:
//                           process-wide caches close their mappings during
//                           static destruction, which can run after the CUDA
//                           runtime has unloaded itself ("driver shutting
//                           down"); nothing is leaked, the driver frees it all.
#pragma once

#include <atomic>
#include <cstdint>

#include "memcuda/config.hpp"
#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// Set by the destructors of process-wide caches (ProcessCache), which only
// run once exit() has begun; read by MEMCUDA_CUDA_LOG. Constant-initialised,
// so it is usable during static destruction too. Outside the CUDA guard:
// those caches exist without CUDA.
inline std::atomic<bool> process_exit_started{false};
inline void note_process_exit() noexcept { process_exit_started.store(true, std::memory_order_relaxed); }
inline bool process_exiting() noexcept { return process_exit_started.load(std::memory_order_relaxed); }

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

#if MEMCUDA_HAS_CUDA()
#include <cuda_runtime_api.h>

#include <array>
#include <cstdio>
#include <mutex>
#include <new>
#include <optional>
#include <source_location>
#include <string>
#include <vector>

#include "memcuda/detail/base/log.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// Throws CudaError with the status, the API name and the call site. The
// failed call's sticky-free error state is cleared first so the next call
// does not report it again.
[[noreturn]] inline void throw_cuda(cudaError_t st, const char* api,
                                    std::source_location where = std::source_location::current()) {
  cudaGetLastError();
  throw CudaError(static_cast<int>(st), api,
                  std::string(api) + " failed: " + cudaGetErrorName(st) + " (" +
                      cudaGetErrorString(st) + ") at " + where.file_name() + ":" +
                      std::to_string(where.line()),
                  where);
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

#define MEMCUDA_CUDA_TRY(call)                                   \
  do {                                                           \
    cudaError_t memcuda_st_ = (call);                            \
    if (memcuda_st_ != cudaSuccess)                              \
      ::memcuda::detail::throw_cuda(memcuda_st_, #call);         \
  } while (0)

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// True for a status that only says the process is exiting: the runtime
// has unloaded (cudaErrorCudartUnloading), or, once exit began, the context
// was already torn down. Anywhere else a destroyed context is a real fault.
inline bool cuda_exit_status(cudaError_t st) noexcept {
  return st == cudaErrorCudartUnloading || (st == cudaErrorContextIsDestroyed && process_exiting());
}

// The logging tier: clears the error state and logs a warning with the API
// name and call site, unless `st` is success or only says we are exiting.
inline void log_cuda(cudaError_t st, const char* api,
                     std::source_location where = std::source_location::current()) noexcept {
  if (st == cudaSuccess) return;
  cudaGetLastError();
  if (cuda_exit_status(st)) return;
  try {
    log(LogLevel::warn, std::string(api) + " failed: " + cudaGetErrorName(st) + " (" + cudaGetErrorString(st) +
                            ") at " + where.file_name() + ":" + std::to_string(where.line()));
  } catch (...) {  // no memory for the message: nothing better to do
  }
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

#define MEMCUDA_CUDA_LOG(call) ::memcuda::detail::log_cuda((call), #call)

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// Makes `device` current for a scope and restores the previous device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    MEMCUDA_CUDA_TRY(cudaGetDevice(&prev_));
    if (prev_ != device) MEMCUDA_CUDA_TRY(cudaSetDevice(device));
    else prev_ = -1;
  }
  // For cleanup: logs instead of throwing; a negative `device` changes nothing.
  DeviceGuard(int device, std::nothrow_t) noexcept {
    if (cudaGetDevice(&prev_) != cudaSuccess) {
      cudaGetLastError();
      prev_ = -1;
    }
    if (prev_ != device && device >= 0) MEMCUDA_CUDA_LOG(cudaSetDevice(device));
    else prev_ = -1;
  }
  ~DeviceGuard() {
    if (prev_ >= 0) MEMCUDA_CUDA_LOG(cudaSetDevice(prev_));
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

// Copies n bytes between device (or host) pointers on a stream of its own
// and returns when the copy is complete: migration copies neither wait for
// nor delay the user's work on the legacy default stream. `device` is the
// destination's ordinal (-1: host, copied from device 0's context).
inline void copy_synchronously(void* dst, const void* src, std::uint64_t n, int device) {
    DeviceGuard g(device < 0 ? 0 : device);
    cudaStream_t s{};
    MEMCUDA_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaError_t st = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s);
    if (st == cudaSuccess) st = cudaStreamSynchronize(s);
    MEMCUDA_CUDA_LOG(cudaStreamDestroy(s));
    if (st != cudaSuccess) throw_cuda(st, "cudaMemcpyAsync (migration copy)");
}

// A non-blocking stream of one device, made on first use and kept for its
// owner's life: making and destroying a stream for each short job (a new
// tensor's memset) cost more than the job. Any thread; CUDA orders the work
// of threads that share it, and a wait for it waits for theirs too.
class KeptStream {
 public:
  explicit KeptStream(int device) noexcept : device_(device < 0 ? 0 : device) {}
  ~KeptStream() {
    if (s_) MEMCUDA_CUDA_LOG(cudaStreamDestroy(s_));  // no context switch needed: a stream knows its device
  }
  KeptStream(const KeptStream&) = delete;
  KeptStream& operator=(const KeptStream&) = delete;

  // Throws CudaError when the stream cannot be made (tried again next time).
  cudaStream_t get() {
    std::call_once(once_, [&] {
      DeviceGuard g(device_);
      MEMCUDA_CUDA_TRY(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
    });
    return s_;
  }
  int device() const noexcept { return device_; }

 private:
  const int device_;
  std::once_flag once_;
  cudaStream_t s_{};
};

// Zeroes the (pointer, bytes) ranges of the stream's device and returns
// when they are done: a new tensor reads as zeros before its record is
// published, whoever maps it and on whatever stream.
inline void zero_synchronously(const std::vector<std::pair<void*, std::uint64_t>>& ranges, KeptStream& stream) {
  if (ranges.empty()) return;
  cudaStream_t s = stream.get();
  DeviceGuard g(stream.device());
  cudaError_t st = cudaSuccess;
  for (const auto& [p, n] : ranges)
    if (n && (st = cudaMemsetAsync(p, 0, n, s)) != cudaSuccess) break;
  const cudaError_t sync = cudaStreamSynchronize(s);
  if (st == cudaSuccess) st = sync;
  if (st != cudaSuccess) throw_cuda(st, "cudaMemsetAsync (zeroing a new tensor)");
}

inline std::string format_uuid(const cudaUUID_t& u) {
  // nvidia-smi's form: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx
  char buf[64];
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  std::snprintf(buf, sizeof buf,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return buf;
}

// UUIDs of the devices visible to this process, by local ordinal. Queried
// once (cudaGetDeviceProperties is slow); the set of visible devices cannot
// change during a process's life.
inline const std::vector<std::string>& device_uuids() {
  static const std::vector<std::string> uuids = [] {
    std::vector<std::string> v;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return v;
    }
    for (int i = 0; i < n; ++i) {
      cudaDeviceProp p{};
      MEMCUDA_CUDA_TRY(cudaGetDeviceProperties(&p, i));
      v.push_back(format_uuid(p.uuid));
    }
    return v;
  }();
  return uuids;
}

inline int device_count() { return static_cast<int>(device_uuids().size()); }

inline const std::string& device_uuid(int ordinal) {
  const auto& u = device_uuids();
  if (ordinal < 0 || ordinal >= static_cast<int>(u.size()))
    throw InvalidArgument("CUDA device " + std::to_string(ordinal) + " does not exist (this process sees " +
                          std::to_string(u.size()) + " device(s); check CUDA_VISIBLE_DEVICES)");
  return u[static_cast<std::size_t>(ordinal)];
}

// Local ordinal of the device with this UUID; Unavailable when this process
// cannot see it (another CUDA_VISIBLE_DEVICES, or another machine).
inline int ordinal_of_uuid(const std::string& uuid, int hint) {
  const auto& u = device_uuids();
  if (hint >= 0 && hint < static_cast<int>(u.size()) && u[static_cast<std::size_t>(hint)] == uuid) return hint;
  for (std::size_t i = 0; i < u.size(); ++i)
    if (u[i] == uuid) return static_cast<int>(i);
  throw Unavailable("device " + uuid + " is not visible to this process (it sees " + std::to_string(u.size()) +
                    " device(s); check CUDA_VISIBLE_DEVICES)");
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
#endif  // MEMCUDA_HAS_CUDA()

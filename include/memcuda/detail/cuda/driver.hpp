// The CUDA driver calls of the cuMem (VMM) backend, resolved at run time
// through the runtime's cudaGetDriverEntryPointByVersion: no -lcuda link
// (programs keep linking only the runtime, header-only users included),
// <cuda.h> for the types only. Resolved once per process; a driver that
// lacks a symbol makes vmm unusable (auto falls back to legacy IPC), never
// a link or load error.
#pragma once

#include "memcuda/config.hpp"
#if MEMCUDA_HAS_CUDA()

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <mutex>
#include <source_location>
#include <string>

#include "memcuda/detail/cuda/runtime.hpp"
#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

struct CuDriver {
  decltype(&::cuGetErrorName) GetErrorName = nullptr;
  decltype(&::cuGetErrorString) GetErrorString = nullptr;
  decltype(&::cuDeviceGet) DeviceGet = nullptr;
  decltype(&::cuDeviceGetAttribute) DeviceGetAttribute = nullptr;
  decltype(&::cuDeviceCanAccessPeer) DeviceCanAccessPeer = nullptr;
  decltype(&::cuMemGetAllocationGranularity) MemGetAllocationGranularity = nullptr;
  decltype(&::cuMemCreate) MemCreate = nullptr;
  decltype(&::cuMemRelease) MemRelease = nullptr;
  decltype(&::cuMemExportToShareableHandle) MemExportToShareableHandle = nullptr;
  decltype(&::cuMemImportFromShareableHandle) MemImportFromShareableHandle = nullptr;
  decltype(&::cuMemAddressReserve) MemAddressReserve = nullptr;
  decltype(&::cuMemAddressFree) MemAddressFree = nullptr;
  decltype(&::cuMemMap) MemMap = nullptr;
  decltype(&::cuMemUnmap) MemUnmap = nullptr;
  decltype(&::cuMemSetAccess) MemSetAccess = nullptr;
  decltype(&::cuMemRetainAllocationHandle) MemRetainAllocationHandle = nullptr;
  decltype(&::cuMemGetAddressRange) MemGetAddressRange = nullptr;
  decltype(&::cuMemGetAccess) MemGetAccess = nullptr;
  // A stream's device where the runtime has no cudaStreamGetDevice (before 12.8).
  decltype(&::cuStreamGetCtx) StreamGetCtx = nullptr;
  decltype(&::cuCtxPushCurrent) CtxPushCurrent = nullptr;
  decltype(&::cuCtxPopCurrent) CtxPopCurrent = nullptr;
  decltype(&::cuCtxGetDevice) CtxGetDevice = nullptr;
  std::string missing;  // the first symbol that did not resolve; "" when all did
  bool ok() const noexcept { return missing.empty(); }
};

// The driver table, resolved on first use (thread-safe). Never throws: a
// failure is reported by ok()/missing. Never destroyed: mappings kept by
// process-wide caches are unmapped during static destruction.
inline const CuDriver& cu_driver() {
  static const CuDriver& d = *new CuDriver([] {
    CuDriver t;
    auto get = [&](const char* name, auto& fn) {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult q{};
      // 12000: the ABI of these symbols as of CUDA 12 (unchanged since 10.2).
      cudaError_t st = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q);
      if (st != cudaSuccess || q != cudaDriverEntryPointSuccess || !p) {
        if (st != cudaSuccess) cudaGetLastError();
        if (t.missing.empty()) t.missing = name;
        return;
      }
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    get("cuGetErrorName", t.GetErrorName);
    get("cuGetErrorString", t.GetErrorString);
    get("cuDeviceGet", t.DeviceGet);
    get("cuDeviceGetAttribute", t.DeviceGetAttribute);
    get("cuDeviceCanAccessPeer", t.DeviceCanAccessPeer);
    get("cuMemGetAllocationGranularity", t.MemGetAllocationGranularity);
    get("cuMemCreate", t.MemCreate);
    get("cuMemRelease", t.MemRelease);
    get("cuMemExportToShareableHandle", t.MemExportToShareableHandle);
    get("cuMemImportFromShareableHandle", t.MemImportFromShareableHandle);
    get("cuMemAddressReserve", t.MemAddressReserve);
    get("cuMemAddressFree", t.MemAddressFree);
    get("cuMemMap", t.MemMap);
    get("cuMemUnmap", t.MemUnmap);
    get("cuMemSetAccess", t.MemSetAccess);
    get("cuMemRetainAllocationHandle", t.MemRetainAllocationHandle);
    get("cuMemGetAddressRange", t.MemGetAddressRange);
    get("cuMemGetAccess", t.MemGetAccess);
    get("cuStreamGetCtx", t.StreamGetCtx);
    get("cuCtxPushCurrent", t.CtxPushCurrent);
    get("cuCtxPopCurrent", t.CtxPopCurrent);
    get("cuCtxGetDevice", t.CtxGetDevice);
    return t;
  }());
  return d;
}

inline std::string cu_error_text(CUresult r) {
  const auto& d = cu_driver();
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.GetErrorName) d.GetErrorName(r, &name);
  if (d.GetErrorString) d.GetErrorString(r, &text);
  return std::string(name ? name : "CUDA_ERROR_?") + " (" + (text ? text : "unknown") + ", CUresult " +
         std::to_string(static_cast<int>(r)) + ")";
}

// Throws CudaError(status = the CUresult) for a failed driver call.
[[noreturn]] inline void throw_cu(CUresult r, const char* api, const std::string& context = {},
                                  std::source_location where = std::source_location::current()) {
  if (r == CUDA_ERROR_OUT_OF_MEMORY)
    throw BudgetExceeded(std::string(api) + " failed: out of device memory" +
                         (context.empty() ? std::string() : " (" + context + ")"));
  throw CudaError(static_cast<int>(r), api,
                  std::string(api) + " failed: " + cu_error_text(r) + (context.empty() ? "" : " (" + context + ")") +
                      " at " + where.file_name() + ":" + std::to_string(where.line()),
                  where);
}

// The logging tier for cleanup paths (noexcept).
inline void log_cu(CUresult r, const char* api, std::source_location where = std::source_location::current()) noexcept {
  if (r == CUDA_SUCCESS) return;
  if (r == CUDA_ERROR_DEINITIALIZED || (r == CUDA_ERROR_CONTEXT_IS_DESTROYED && process_exiting())) return;
  try {
    log(LogLevel::warn, std::string(api) + " failed: " + cu_error_text(r) + " at " + where.file_name() + ":" +
                            std::to_string(where.line()));
  } catch (...) {
  }
}

// The driver, or Unavailable saying which symbol is missing.
inline const CuDriver& cu_driver_or_throw() {
  const auto& d = cu_driver();
  if (!d.ok())
    throw Unavailable("the CUDA driver lacks " + d.missing +
                      " (cuMem virtual memory management needs driver >= 10.2 and a runtime with "
                      "cudaGetDriverEntryPointByVersion); use MEMCUDA_CUDA_ALLOCATION=ipc");
  return d;
}

// Whether `device` (runtime ordinal) supports cuMem allocations exported as
// POSIX fds. False (never a throw) when anything is missing.
inline bool vmm_fd_supported(int device) noexcept {
  const auto& d = cu_driver();
  if (!d.ok()) return false;
  CUdevice dev{};
  if (d.DeviceGet(&dev, device) != CUDA_SUCCESS) return false;
  int vmm = 0, fd = 0;
  if (d.DeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev) != CUDA_SUCCESS) return false;
  if (d.DeviceGetAttribute(&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev) != CUDA_SUCCESS)
    return false;
  return vmm != 0 && fd != 0;
}

// Grants `reader` read-write access to the whole cuMem mapping that holds
// `p`. A mapping grants only the devices that need it when it is made (its
// own and the one current then): setting access for a peer costs
// milliseconds for a large mapping, so other peers get it here, when they
// ask (check_device). Idempotent.
inline void grant_access(const void* p, int reader) {
  const auto& d = cu_driver_or_throw();
  CUdeviceptr base = 0;
  std::size_t size = 0;
  if (CUresult r = d.MemGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(p)); r != CUDA_SUCCESS)
    throw_cu(r, "cuMemGetAddressRange");
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = reader;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (CUresult r = d.MemSetAccess(base, size, &a, 1); r != CUDA_SUCCESS)
    throw_cu(r, "cuMemSetAccess", "device " + std::to_string(reader));
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

#endif  // MEMCUDA_HAS_CUDA()

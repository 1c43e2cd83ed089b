// Whether code on one device can dereference a tensor's pointer in place:
// the check behind SharedTensor::check_device and memcuda_tensor_check_device
// (docs/design.md, "Zero copy or an error"). Device ordinals are this
// process's; -1 is host code (or host memory).
#pragma once

#include "memcuda/config.hpp"

#include <string>

#include "memcuda/error.hpp"
#include "memcuda/tensor_info.hpp"

#if MEMCUDA_HAS_CUDA()
#include "memcuda/detail/cuda/driver.hpp"
#include "memcuda/detail/cuda/runtime.hpp"
#endif

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// Throws NotZeroCopy, naming both sides and what to do instead, when code
// on `reader` cannot use the pointer of tensor `name` (on `backend`,
// `device`, mapped at `data`) in place. A cuda tensor read from another
// device that can reach it as a peer is fine: this grants `reader` access to
// a cuda_vmm_fd mapping (grant_access: a mapping grants only its own device
// and the one current when it was made), and enables peer access from
// `reader` for a legacy cuda_ipc one (cudaDeviceEnablePeerAccess; already
// enabled is fine).
inline void check_reach(const std::string& name, BackendKind backend, std::string_view alloc_kind, int device,
                        int reader, const void* data) {
  const std::string what = "tensor '" + name + "'";
  if (reader < -1) throw InvalidArgument("reader device " + std::to_string(reader) + ": want a CUDA ordinal or -1 (host)");
  if (backend == BackendKind::host) {
    if (reader == -1) return;
    throw NotZeroCopy(what + " is host memory (shared memfd, not registered with CUDA): kernels on CUDA device " +
                      std::to_string(reader) + " cannot read it in place; copy it to the device yourself "
                      "(copy_to_host into pinned memory, then cudaMemcpy), or create it on the cuda backend");
  }
  if (reader == -1)
    throw NotZeroCopy(what + " is device memory on CUDA device " + std::to_string(device) +
                      ": host code cannot dereference it; read it with copy_to_host (a copy), or run the "
                      "reader's code on that device");
  if (reader == device) return;
#if MEMCUDA_HAS_CUDA()
  const int n = device_count();
  if (reader >= n)
    throw InvalidArgument("reader device " + std::to_string(reader) + " does not exist (this process sees " +
                          std::to_string(n) + " device(s))");
  int can = 0;
  if (cudaError_t st = cudaDeviceCanAccessPeer(&can, reader, device); st != cudaSuccess) {
    cudaGetLastError();
    can = 0;
  }
  if (!can)
    throw NotZeroCopy(what + " lives on CUDA device " + std::to_string(device) + ", which device " +
                      std::to_string(reader) + " cannot access as a peer (cudaDeviceCanAccessPeer(" +
                      std::to_string(reader) + ", " + std::to_string(device) +
                      ") is 0: no P2P path between them): its kernels would fault on the pointer; run them on "
                      "device " + std::to_string(device) + ", or copy the tensor (cudaMemcpyPeer, torch "
                      ".to('cuda:" + std::to_string(reader) + "'))");
  if (alloc_kind == "cuda_vmm_fd") {
    DeviceGuard g(device);  // the driver calls need a current context
    if (data) grant_access(data, reader);
  } else {
    DeviceGuard g(reader);
    cudaError_t st = cudaDeviceEnablePeerAccess(device, 0);
    if (st == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
    else if (st != cudaSuccess) throw_cuda(st, "cudaDeviceEnablePeerAccess");
  }
#else
  (void)alloc_kind;
  (void)data;
  throw Unavailable(what + " is a cuda tensor: mem-cuda was built without CUDA");
#endif
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

// DLPack export of shared tensors, for frameworks that import DLPack
// (PyTorch's torch.from_dlpack, CuPy, JAX...). Needs <dlpack/dlpack.h>
// (Debian: libdlpack-dev, DLPack 0.6).
#pragma once

#include "memcuda/config.hpp"

#include <dlpack/dlpack.h>

#include <cstdint>
#include <vector>

#include "memcuda/shared_tensor.hpp"

MEMCUDA_NAMESPACE_BEGIN

namespace detail {

inline DLDataType to_dl_dtype(DType d) {
  DLDataType t{};
  t.lanes = 1;
  t.bits = static_cast<std::uint8_t>(itemsize(d) * 8);
  switch (d) {
    case DType::f16:
    case DType::f32:
    case DType::f64: t.code = kDLFloat; break;
    case DType::bf16: t.code = kDLBfloat; break;
    case DType::i8:
    case DType::i16:
    case DType::i32:
    case DType::i64: t.code = kDLInt; break;
    case DType::bool_:  // DLPack 0.6 has no bool code: one byte, 0 or 1
    case DType::u8:
    case DType::u16:
    case DType::u32:
    case DType::u64: t.code = kDLUInt; break;
  }
  return t;
}

// What a DLManagedTensor owns: a reference to the tensor (keeps it
// registered and mapped) and the shape/stride arrays DLTensor points to.
struct DLPackContext {
  SharedTensor<void> tensor;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  DLManagedTensor managed{};
};

}  // namespace detail

// A DLManagedTensor viewing the tensor's memory (kDLCUDA with this
// process's device ordinal, or kDLCPU for the host backend), with the
// view's shape and element strides (row-major for a whole tensor). `data` is
// the view's first element and byte_offset 0: torch's importer ignores
// byte_offset, so a base pointer plus an offset would read the wrong bytes.
// It holds one share of the handle's reference: the tensor stays
// registered and mapped until the consumer calls the deleter (exactly
// once, from any thread). Ownership of the returned pointer passes to the
// caller (or the framework it is handed to).
template <class T>
DLManagedTensor* to_dlpack(const SharedTensor<T>& t) {
  auto ctx = std::make_unique<detail::DLPackContext>();
  ctx->tensor = SharedTensor<void>(t.handle(), t.view());  // any T, const void included
  if (!ctx->tensor) throw InvalidArgument("to_dlpack of an empty SharedTensor");
  ctx->shape = t.shape();
  ctx->strides = t.strides();
  DLTensor& d = ctx->managed.dl_tensor;
  d.data = ctx->tensor.data();  // void*: DLPack has no const
  d.device.device_type = t.backend() == BackendKind::cuda ? kDLCUDA : kDLCPU;
  d.device.device_id = t.backend() == BackendKind::cuda ? t.device() : 0;
  d.ndim = static_cast<int>(ctx->shape.size());
  d.dtype = detail::to_dl_dtype(t.dtype());
  d.shape = ctx->shape.data();
  d.strides = ctx->strides.data();
  d.byte_offset = 0;
  ctx->managed.manager_ctx = ctx.get();
  // The deleter may run on any framework thread, e.g. inside a CUDA
  // caching allocator's free: dropping the last share only queues the
  // release (no Redis I/O here; TensorRegistry::flush() waits for it).
  ctx->managed.deleter = [](DLManagedTensor* self) {
    delete static_cast<detail::DLPackContext*>(self->manager_ctx);
  };
  return &ctx.release()->managed;
}

MEMCUDA_NAMESPACE_END  // namespace memcuda

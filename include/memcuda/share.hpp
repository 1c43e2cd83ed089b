// Sharing a DLPack tensor this process already has, by name and without a
// copy: the DLPack form of TensorRegistry::share (docs/design.md, "Borrowed
// tensors"). Needs <dlpack/dlpack.h>, like memcuda/dlpack.hpp.
#pragma once

#include "memcuda/config.hpp"

#include <dlpack/dlpack.h>

#include <algorithm>
#include <memory>
#include <string>
#include <string_view>

#include "memcuda/detail/base/checked.hpp"
#include "memcuda/share_options.hpp"
#include "memcuda/tensor_registry.hpp"

MEMCUDA_NAMESPACE_BEGIN

namespace detail {
// The DType of a DLPack element type; InvalidArgument for one mem-cuda has not.
inline DType dtype_of_dl(DLDataType t, std::string_view name) {
  if (t.lanes == 1) {
    if (t.code == kDLFloat && t.bits == 16) return DType::f16;
    if (t.code == kDLFloat && t.bits == 32) return DType::f32;
    if (t.code == kDLFloat && t.bits == 64) return DType::f64;
    if (t.code == kDLBfloat && t.bits == 16) return DType::bf16;
    if (t.code == kDLInt && t.bits == 8) return DType::i8;
    if (t.code == kDLInt && t.bits == 16) return DType::i16;
    if (t.code == kDLInt && t.bits == 32) return DType::i32;
    if (t.code == kDLInt && t.bits == 64) return DType::i64;
    if (t.code == kDLUInt && t.bits == 8) return DType::u8;
    if (t.code == kDLUInt && t.bits == 16) return DType::u16;
    if (t.code == kDLUInt && t.bits == 32) return DType::u32;
    if (t.code == kDLUInt && t.bits == 64) return DType::u64;
  }
  throw InvalidArgument("share '" + std::string(name) + "': DLPack dtype (code " + std::to_string(t.code) +
                        ", bits " + std::to_string(t.bits) + ", lanes " + std::to_string(t.lanes) +
                        ") has no mem-cuda dtype");
}
}  // namespace detail

namespace detail {
// What share() registers of `t`: its first byte, dtype and shape.
// InvalidArgument for another device or a strided tensor.
inline void dl_share_layout(const DLTensor& t, std::string_view name, void*& data, DType& dtype, Shape& shape) {
  if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDA)
    throw InvalidArgument("share '" + std::string(name) + "': DLPack device type " +
                          std::to_string(static_cast<int>(t.device.device_type)) + " is neither CPU nor CUDA");
  if (t.ndim < 0) throw InvalidArgument("share '" + std::string(name) + "': negative ndim");
  if (t.ndim > 0 && !t.shape) throw InvalidArgument("share '" + std::string(name) + "': null shape");
  shape.assign(t.shape, t.shape + t.ndim);
  validate_shape(shape);  // before any product: dims past 2^40 or negative are refused here
  if (t.strides) {
    std::int64_t expect = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      if (t.shape[i] != 1 && t.strides[i] != expect)
        throw InvalidArgument("share '" + std::string(name) + "': the tensor is not C-contiguous (make it "
                              "contiguous first: that is a copy)");
      expect = checked_mul(expect, std::max<std::int64_t>(t.shape[i], 1), "share '" + std::string(name) + "': strides");
    }
  }
  // byte_offset is the producer's: an offset that wraps the address would
  // share memory the tensor does not describe.
  data = t.data ? const_cast<char*>(checked_advance(t.data, t.byte_offset, "share '" + std::string(name) + "': byte_offset"))
                : nullptr;
  dtype = dtype_of_dl(t.dtype, name);
}
}  // namespace detail

// Shares `t` (CPU or CUDA, C-contiguous) under `name`; keep `opts.keep_alive`
// set to what owns its memory. Throws as TensorRegistry::share, and
// InvalidArgument for a strided (non-contiguous) tensor or another device.
inline SharedTensor<void> share(TensorRegistry& reg, std::string_view name, const DLTensor& t, ShareOptions opts = {}) {
  void* data = nullptr;
  DType dtype{};
  Shape shape;
  detail::dl_share_layout(t, name, data, dtype, shape);
  return reg.share(name, data, dtype, std::move(shape), std::move(opts));
}

// The same for a managed tensor: the registry takes it over, and calls its
// deleter once the share's last reference is gone (also on a throw).
inline SharedTensor<void> share(TensorRegistry& reg, std::string_view name, DLManagedTensor* m, ShareOptions opts = {}) {
  if (!m) throw InvalidArgument("share '" + std::string(name) + "': null DLManagedTensor");
  std::shared_ptr<void> owner(m, [](DLManagedTensor* p) {
    if (p->deleter) p->deleter(p);
  });
  if (!opts.keep_alive) opts.keep_alive = owner;
  else opts.keep_alive = std::make_shared<std::pair<std::shared_ptr<void>, std::shared_ptr<void>>>(opts.keep_alive, owner);
  return share(reg, name, m->dl_tensor, std::move(opts));
}

MEMCUDA_NAMESPACE_END  // namespace memcuda

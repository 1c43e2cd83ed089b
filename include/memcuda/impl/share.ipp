// Implementation unit part: TensorRegistry::share (borrowed buffers,
// detail/registry/ops/share.hpp). Included once per program through
// memcuda/implementation.hpp.
#pragma once

#include "memcuda/detail/registry/core.hpp"
#include "memcuda/detail/registry/ops/share.hpp"
#include "memcuda/detail/registry/ops/shared_get.hpp"
#include "memcuda/tensor_registry.hpp"

MEMCUDA_NAMESPACE_BEGIN

SharedTensor<void> TensorRegistry::share(std::string_view name, void* data, DType dtype, Shape shape,
                                         ShareOptions opts) {
  auto& c = core();
  const auto token = c.holdings.begin();  // a later get() of the name shares this handle
  auto o = detail::share_buffer(c, name, data, dtype, std::move(shape), opts);
  return SharedTensor<void>(detail::remember(c, make_handle(std::move(o)), token));
}

MEMCUDA_NAMESPACE_END  // namespace memcuda

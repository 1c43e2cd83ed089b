// TensorRegistry::share (borrowed buffers, detail/registry/ops/share.hpp).
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
  return SharedTensor<void>(detail::remember(c, detail::handle_of(core_, std::move(o)), token));
}

std::map<std::string, SharedTensor<void>> TensorRegistry::share_many(std::vector<ShareRequest> items) {
  auto& c = core();
  const auto token = c.holdings.begin();
  auto results = detail::share_buffers(c, items);
  std::map<std::string, SharedTensor<void>> out;
  std::exception_ptr first;
  for (auto& r : results) {
    if (auto* e = std::get_if<std::exception_ptr>(&r)) {
      if (!first) first = *e;
      continue;
    }
    auto& o = std::get<detail::Opened>(r);
    std::string name = o.info.name;
    out.emplace(std::move(name), SharedTensor<void>(detail::remember(c, detail::handle_of(core_, std::move(o)), token)));
  }
  if (first) {
    out.clear();  // their releases unregister them
    std::rethrow_exception(first);
  }
  return out;
}

MEMCUDA_NAMESPACE_END  // namespace memcuda

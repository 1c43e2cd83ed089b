// What the Arrow export (memcuda/arrow.hpp) asks the registry.
#pragma once

#include <string>

#include "memcuda/arrow.hpp"
#include "memcuda/detail/registry/core.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

std::string arrow_published_event(const TensorHandle& h) {
  return h.core().client.published_event(h.info().name, h.info().generation);
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

// The out-of-line members of detail::TensorHandle (memcuda/shared_tensor.hpp).
#pragma once

#include <mutex>
#include <string>

#include "memcuda/detail/cuda/ipc_event.hpp"
#include "memcuda/detail/registry/core.hpp"
#include "memcuda/shared_tensor.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

TensorHandle::TensorHandle(std::shared_ptr<Core> core, TensorInfo info, void* data, std::shared_ptr<void> keep)
    : core_(std::move(core)), info_(std::move(info)), data_(data), keep_(std::move(keep)) {
#if MEMCUDA_HAS_CUDA()
  local_device_ = info_.backend == BackendKind::cuda ? ordinal_of_uuid(info_.device_uuid, info_.device) : -1;
#endif
}

TensorHandle::TensorHandle(std::shared_ptr<Core> core, TensorInfo info, void* data, std::shared_ptr<void> keep,
                           std::shared_ptr<void> dict)
    : TensorHandle(std::move(core), std::move(info), data, std::move(keep)) {
  dict_ = std::move(dict);
}

TensorHandle::~TensorHandle() {
  if (!dict_) Core::release_later(std::move(core_), info_.name, info_.generation);
}

bool TensorHandle::is_current() const {
  auto g = core_->client.current_generation(info_.name);
  return g && *g == info_.generation;
}

std::uint64_t TensorHandle::publish(StreamHandle stream) {
  std::string handle;
#if MEMCUDA_HAS_CUDA()
  if (info_.backend == BackendKind::cuda) {
    auto& ev = event();
    ev.record(stream);
    handle = ev.handle();
  }
#else
  (void)stream;
#endif
  return core_->client.publish_event(info_.name, info_.generation, handle);
}

void TensorHandle::wait_published(StreamHandle stream) const {
  auto handle = core_->client.published_event(info_.name, info_.generation);
#if MEMCUDA_HAS_CUDA()
  if (info_.backend == BackendKind::cuda && !handle.empty()) stream_wait_ipc_event(stream, handle);
#else
  (void)stream;
#endif
}

#if MEMCUDA_HAS_CUDA()
ExportedEvent& TensorHandle::event() {
  std::lock_guard lk(event_mu_);
  if (!event_) event_ = std::make_unique<ExportedEvent>(local_device_);
  return *event_;
}
#endif

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

// The C ABI's tensor calls: accessors, release, publish/wait on a stream,
// host copies and the DLPack export.
#include <cstring>

#include "c_api_internal.hpp"
#include "memcuda/dlpack.hpp"
#if MEMCUDA_HAS_CUDA()
#include "memcuda/detail/cuda/ipc_event.hpp"
#endif

using memcuda_c::guarded;

namespace {

// Accessors of a NULL handle answer a neutral value instead of crashing.
template <class R, class F>
R get_or(const memcuda_tensor* t, R fallback, F&& f) noexcept {
  if (!t || !t->t) return fallback;
  try {
    return f(t->t);
  } catch (...) {
    return fallback;
  }
}

}  // namespace

extern "C" {

void memcuda_tensor_release(memcuda_tensor* t) { delete t; }

int memcuda_tensor_retain(const memcuda_tensor* t, memcuda_tensor** out) {
  return guarded([&] {
    if (!out) throw memcuda::InvalidArgument("out is NULL");
    *out = new memcuda_tensor(memcuda_c::tensor(t));
  });
}

void* memcuda_tensor_data(const memcuda_tensor* t) { return t ? t->t.data() : nullptr; }
const char* memcuda_tensor_name(const memcuda_tensor* t) {
  return get_or<const char*>(t, "", [](const auto& s) { return s.name().c_str(); });
}
int memcuda_tensor_dtype(const memcuda_tensor* t) {
  return get_or(t, -1, [](const auto& s) { return static_cast<int>(s.dtype()); });
}
int memcuda_tensor_ndim(const memcuda_tensor* t) {
  return get_or(t, 0, [](const auto& s) { return static_cast<int>(s.rank()); });
}
const int64_t* memcuda_tensor_shape(const memcuda_tensor* t) {
  return get_or<const int64_t*>(t, nullptr, [](const auto& s) { return s.shape().data(); });
}
uint64_t memcuda_tensor_bytes(const memcuda_tensor* t) {
  return get_or<uint64_t>(t, 0, [](const auto& s) { return s.bytes(); });
}
int memcuda_tensor_backend(const memcuda_tensor* t) {
  return get_or(t, MEMCUDA_BACKEND_DEFAULT, [](const auto& s) {
    return s.backend() == memcuda::BackendKind::cuda ? MEMCUDA_BACKEND_CUDA : MEMCUDA_BACKEND_HOST;
  });
}
int memcuda_tensor_device(const memcuda_tensor* t) {
  return get_or(t, -1, [](const auto& s) { return s.device(); });
}
uint64_t memcuda_tensor_generation(const memcuda_tensor* t) {
  return get_or<uint64_t>(t, 0, [](const auto& s) { return s.generation(); });
}

int memcuda_tensor_get_info(const memcuda_tensor* t, memcuda_tensor_info* info) {
  return guarded([&] {
    memcuda_c::check_struct(info, "info");
    memcuda_c::fill_info(info, memcuda_c::tensor(t).info());
  });
}

int memcuda_tensor_valid(const memcuda_tensor* t, int* valid) {
  return guarded([&] {
    if (!valid) throw memcuda::InvalidArgument("valid is NULL");
    *valid = memcuda_c::tensor(t).valid() ? 1 : 0;
  });
}

int memcuda_tensor_publish(const memcuda_tensor* t, void* stream, uint64_t* version) {
  return guarded([&] {
    auto v = memcuda_c::tensor(t).publish(static_cast<memcuda::StreamHandle>(stream));
    if (version) *version = v;
  });
}

int memcuda_tensor_wait_published(const memcuda_tensor* t, void* stream) {
  return guarded([&] { memcuda_c::tensor(t).wait_published(static_cast<memcuda::StreamHandle>(stream)); });
}

int memcuda_tensor_wait_opened(const memcuda_tensor* t, void* stream) {
  return guarded([&] {
    // The record this handle was opened with carries the event's IPC handle
    // (what TensorRegistry::get(name, stream) waits on): no Redis round trip,
    // so a batch of 291 tensors orders a stream without 291 of them.
    const auto& info = memcuda_c::tensor(t).info();
#if MEMCUDA_HAS_CUDA()
    if (info.backend == memcuda::BackendKind::cuda && !info.event_handle.empty())
      memcuda::detail::stream_wait_ipc_event(static_cast<cudaStream_t>(stream), info.event_handle);
#else
    (void)info;
    (void)stream;
#endif
  });
}

int memcuda_tensor_copy_from_host(const memcuda_tensor* t, const void* src, uint64_t bytes, uint64_t offset) {
  return guarded([&] {
    if (bytes > 0 && !src) throw memcuda::InvalidArgument("host buffer is NULL");  // the range: SharedTensor checks it
    // SharedTensor's byte view: value_type of SharedTensor<void> is std::byte.
    memcuda_c::tensor(t).copy_from_host({static_cast<const std::byte*>(src), static_cast<std::size_t>(bytes)}, offset);
  });
}

int memcuda_tensor_copy_to_host(const memcuda_tensor* t, void* dst, uint64_t bytes, uint64_t offset) {
  return guarded([&] {
    if (bytes > 0 && !dst) throw memcuda::InvalidArgument("host buffer is NULL");
    memcuda_c::tensor(t).copy_to_host({static_cast<std::byte*>(dst), static_cast<std::size_t>(bytes)}, offset);
  });
}

int memcuda_tensor_to_dlpack(const memcuda_tensor* t, struct DLManagedTensor** out) {
  return guarded([&] {
    if (!out) throw memcuda::InvalidArgument("out is NULL");
    *out = nullptr;
    // memcuda::to_dlpack's deleter drops a share of the handle: the release
    // is queued, never sent on the consumer's thread.
    *out = memcuda::to_dlpack(memcuda_c::tensor(t));
  });
}

}  // extern "C"

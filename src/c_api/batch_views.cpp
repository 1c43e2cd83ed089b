// The C ABI's calls over many handles at once, for bindings whose per-call
// cost dominates a model's open (Python's ctypes: about 1 us a call, ten
// accessors a tensor): the fields of a batch in one call, one stream order
// for a batch, and one DLPack tensor spanning a packed batch's allocation,
// which a framework then cuts into per-tensor views (docs/python.md).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "c_api_internal.hpp"
#include "memcuda/dlpack.hpp"
#if MEMCUDA_HAS_CUDA()
#include "memcuda/detail/cuda/ipc_event.hpp"
#endif

using memcuda_c::guarded;

namespace {

// What a span's DLManagedTensor owns: a share of every tensor it covers.
struct SpanContext {
  std::vector<memcuda::SharedTensor<void>> tensors;
  std::int64_t length = 0;
  std::int64_t stride = 1;
  DLManagedTensor managed{};
};

// The tensor's first byte (a view's data() is past it by byte_offset()).
std::uintptr_t start_of(const memcuda::SharedTensor<void>& t) {
  return reinterpret_cast<std::uintptr_t>(t.data()) - t.byte_offset();
}

std::uintptr_t base_of(const memcuda::SharedTensor<void>& t) { return start_of(t) - t.info().offset; }

}  // namespace

extern "C" {

int memcuda_tensors_fields(const memcuda_tensor* const* ts, size_t count, memcuda_tensor_fields* out,
                           size_t fields_size) {
  return guarded([&] {
    if (count > 0 && (!ts || !out)) throw memcuda::InvalidArgument("tensors or out is NULL");
    if (fields_size != sizeof(memcuda_tensor_fields))
      throw memcuda::InvalidArgument("fields_size is " + std::to_string(fields_size) + ", this library's " +
                                     "memcuda_tensor_fields is " + std::to_string(sizeof(memcuda_tensor_fields)) +
                                     " bytes (header and library differ)");
    for (size_t i = 0; i < count; ++i) (void)memcuda_c::tensor(ts[i]);  // every handle valid before any is read
    for (size_t i = 0; i < count; ++i) {
      const auto& t = ts[i]->t;  // a view: its data, shape, strides and bytes
      const auto& info = t.info();
      memcuda_tensor_fields& f = out[i];
      f = memcuda_tensor_fields{};
      f.struct_size = sizeof(memcuda_tensor_fields);
      f.name = info.name.c_str();
      f.data = t.data();
      f.dtype = static_cast<int>(info.dtype);
      f.ndim = static_cast<int>(t.rank());
      f.shape = t.shape().data();
      f.strides = ts[i]->strides.data();
      f.backend = info.backend == memcuda::BackendKind::cuda ? MEMCUDA_BACKEND_CUDA : MEMCUDA_BACKEND_HOST;
      f.device = t.device();
      f.bytes = t.bytes();
      f.generation = info.generation;
      f.alloc_base = reinterpret_cast<void*>(base_of(t));
      f.offset = info.offset + t.byte_offset();  // data - alloc_base, a view's too
      f.alloc_bytes = info.alloc_bytes;
      f.has_event = info.event_handle.empty() ? 0 : 1;
    }
  });
}

int memcuda_tensors_wait_opened(const memcuda_tensor* const* ts, size_t count, void* stream) {
  return guarded([&] {
    if (count > 0 && !ts) throw memcuda::InvalidArgument("tensors is NULL");
    for (size_t i = 0; i < count; ++i) (void)memcuda_c::tensor(ts[i]);
#if MEMCUDA_HAS_CUDA()
    // One wait per distinct event: a producer that published a batch with
    // one event (one stream) orders the consumer's stream once.
    std::vector<const std::string*> seen;
    for (size_t i = 0; i < count; ++i) {
      const auto& info = ts[i]->t.info();
      if (info.backend != memcuda::BackendKind::cuda || info.event_handle.empty()) continue;
      if (std::any_of(seen.begin(), seen.end(), [&](const std::string* s) { return *s == info.event_handle; }))
        continue;
      seen.push_back(&info.event_handle);
      memcuda::detail::stream_wait_ipc_event(static_cast<cudaStream_t>(stream), info.event_handle);
    }
#else
    (void)stream;
#endif
  });
}

int memcuda_tensors_to_dlpack_span(const memcuda_tensor* const* ts, size_t count, struct DLManagedTensor** out) {
  return guarded([&] {
    if (!out) throw memcuda::InvalidArgument("out is NULL");
    *out = nullptr;
    if (count == 0 || !ts) throw memcuda::InvalidArgument("a span needs at least one tensor");
    auto ctx = std::make_unique<SpanContext>();
    ctx->tensors.reserve(count);
    for (size_t i = 0; i < count; ++i) ctx->tensors.push_back(memcuda_c::tensor(ts[i]));
    const auto& first = ctx->tensors.front();
    std::uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (const auto& t : ctx->tensors) {
      // One allocation of one device: the span's bytes are then one mapping
      // that every covered tensor keeps alive (no hole, no foreign memory).
      if (base_of(t) != base_of(first) || t.backend() != first.backend() || t.device() != first.device())
        throw memcuda::InvalidArgument("tensors '" + first.name() + "' and '" + t.name() +
                                       "' are not in one allocation: a span covers one allocation");
      const auto p = start_of(t);  // whole tensors: a view's rows lie within its tensor
      lo = std::min(lo, p);
      hi = std::max(hi, p + t.info().bytes);
    }
    ctx->length = static_cast<std::int64_t>(hi - lo);
    DLTensor& d = ctx->managed.dl_tensor;
    d.data = reinterpret_cast<void*>(lo);
    d.device.device_type = first.backend() == memcuda::BackendKind::cuda ? kDLCUDA : kDLCPU;
    d.device.device_id = first.backend() == memcuda::BackendKind::cuda ? first.device() : 0;
    d.ndim = 1;
    d.dtype = memcuda::detail::to_dl_dtype(memcuda::DType::u8);
    d.shape = &ctx->length;
    d.strides = &ctx->stride;
    d.byte_offset = 0;
    ctx->managed.manager_ctx = ctx.get();
    // As memcuda::to_dlpack: the deleter only queues the releases.
    ctx->managed.deleter = [](DLManagedTensor* self) { delete static_cast<SpanContext*>(self->manager_ctx); };
    *out = &ctx.release()->managed;
  });
}

}  // extern "C"

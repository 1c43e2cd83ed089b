// Arrow C Device Data Interface export of shared tensors, for data-frame
// libraries (pyarrow, cuDF, Polars) that exchange device buffers as
// ArrowDeviceArray rather than DLPack. Zero copy: the array's data buffer is
// the tensor's memory. docs/interop.md has the lifetime rules and the dtype
// table.
//
// The C structs below are those of the Arrow C Data Interface and C Device
// Data Interface specifications, under the specification's guard macros, so
// this header coexists with Arrow's own <arrow/c/abi.h> (or nanoarrow's) in
// either include order. No Arrow library is needed.
#pragma once

#include "memcuda/config.hpp"

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "memcuda/detail/base/checked.hpp"
#include "memcuda/error.hpp"
#include "memcuda/shared_tensor.hpp"
#include "memcuda/state_dict.hpp"
#if MEMCUDA_HAS_CUDA()
#include <mutex>

#include "memcuda/detail/cuda/ipc_event.hpp"
#endif

#ifdef __cplusplus
extern "C" {
#endif

#ifndef ARROW_C_DATA_INTERFACE
#define ARROW_C_DATA_INTERFACE

#define ARROW_FLAG_DICTIONARY_ORDERED 1
#define ARROW_FLAG_NULLABLE 2
#define ARROW_FLAG_MAP_KEYS_SORTED 4

struct ArrowSchema {
  const char* format;
  const char* name;
  const char* metadata;
  int64_t flags;
  int64_t n_children;
  struct ArrowSchema** children;
  struct ArrowSchema* dictionary;
  void (*release)(struct ArrowSchema*);
  void* private_data;
};

struct ArrowArray {
  int64_t length;
  int64_t null_count;
  int64_t offset;
  int64_t n_buffers;
  int64_t n_children;
  const void** buffers;
  struct ArrowArray** children;
  struct ArrowArray* dictionary;
  void (*release)(struct ArrowArray*);
  void* private_data;
};

#endif  // ARROW_C_DATA_INTERFACE

#ifndef ARROW_C_DEVICE_DATA_INTERFACE
#define ARROW_C_DEVICE_DATA_INTERFACE

typedef int32_t ArrowDeviceType;

#define ARROW_DEVICE_CPU 1
#define ARROW_DEVICE_CUDA 2
#define ARROW_DEVICE_CUDA_HOST 3
#define ARROW_DEVICE_OPENCL 4
#define ARROW_DEVICE_VULKAN 7
#define ARROW_DEVICE_METAL 8
#define ARROW_DEVICE_VPI 9
#define ARROW_DEVICE_ROCM 10
#define ARROW_DEVICE_ROCM_HOST 11
#define ARROW_DEVICE_EXT_DEV 12
#define ARROW_DEVICE_CUDA_MANAGED 13
#define ARROW_DEVICE_ONEAPI 14
#define ARROW_DEVICE_WEBGPU 15
#define ARROW_DEVICE_HEXAGON 16

struct ArrowDeviceArray {
  struct ArrowArray array;
  int64_t device_id;
  ArrowDeviceType device_type;
  void* sync_event;
  int64_t reserved[3];
};

#endif  // ARROW_C_DEVICE_DATA_INTERFACE

#ifdef __cplusplus
}  // extern "C"
#endif

MEMCUDA_NAMESPACE_BEGIN

struct ArrowExportOptions {
  // false: a flat primitive array of every element (length = element
  // count). true: a fixed-size list ("+w:<n>", n = the innermost dimension)
  // of length = the product of the outer dimensions, whose one child is that
  // flat array. InvalidArgument for a scalar (rank 0).
  bool fixed_size_list = false;
  // Arrow has no byte-wide bool ("b" is bit-packed) and no bfloat16. false:
  // bool goes out as uint8 "C" (0 or 1) and bf16 as fixed-size binary "w:2",
  // each with the schema metadata "memcuda.dtype" naming the real dtype.
  // true: TypeMismatch for them instead.
  bool strict_types = false;
  // cuda: which publish sync_event follows. true: the newest (one Redis
  // round trip, what wait_published waits for; StaleHandle when the name no
  // longer means this tensor). false: the one the handle's record carried
  // when it was opened (no I/O; what wait_opened waits for).
  bool newest_event = true;
};

namespace detail {

// The IPC handle of the event last published for the handle's generation,
// "" when none: one Redis round trip; StaleHandle when the name moved on.
// Defined in impl/arrow.ipp (the implementation unit).
std::string arrow_published_event(const TensorHandle& h);

// private_data of every ArrowSchema we make. Each node owns its strings and
// its child, so a consumer may move the child out (bitwise copy) and release
// it on its own, as the specification allows.
struct ArrowSchemaNode {
  std::string format, name, metadata;
  std::unique_ptr<ArrowSchema> child;
  ArrowSchema* children[1] = {nullptr};
};

// private_data of every ArrowArray we make. Each node holds its own share
// of the tensor's reference: a child moved out keeps the memory alive after
// its parent is released.
struct ArrowArrayNode {
  SharedTensor<void> tensor;
  const void* buffers[2] = {nullptr, nullptr};
  std::unique_ptr<ArrowArray> child;
  ArrowArray* children[1] = {nullptr};
#if MEMCUDA_HAS_CUDA()
  cudaEvent_t event = nullptr;  // the root's sync_event points here
#endif
};

inline void release_arrow_schema(ArrowSchema* s) noexcept {
  if (!s || !s->release) return;
  auto* n = static_cast<ArrowSchemaNode*>(s->private_data);
  if (n->child && n->child->release) n->child->release(n->child.get());
  delete n;
  s->release = nullptr;
}

// Dropping the share only queues the release of the reference (no Redis I/O
// on the consumer's thread; TensorRegistry::flush() waits for it), and
// cudaEventDestroy does not block: safe from any thread, e.g. inside a
// consumer's allocator.
inline void release_arrow_array(ArrowArray* a) noexcept {
  if (!a || !a->release) return;
  auto* n = static_cast<ArrowArrayNode*>(a->private_data);
  if (n->child && n->child->release) n->child->release(n->child.get());
#if MEMCUDA_HAS_CUDA()
  if (n->event) cudaEventDestroy(n->event);  // fails only after CUDA's teardown at exit: nothing to do then
#endif
  delete n;
  a->release = nullptr;
}

// The Arrow format string of a dtype (bool as uint8 and bf16 as 2-byte
// binary unless strict).
inline const char* arrow_format(DType d, bool strict) {
  switch (d) {
    case DType::f16: return "e";
    case DType::f32: return "f";
    case DType::f64: return "g";
    case DType::i8: return "c";
    case DType::i16: return "s";
    case DType::i32: return "i";
    case DType::i64: return "l";
    case DType::u8: return "C";
    case DType::u16: return "S";
    case DType::u32: return "I";
    case DType::u64: return "L";
    case DType::bool_:
    case DType::bf16:
      if (strict)
        throw TypeMismatch("dtype " + std::string(to_string(d)) +
                           " has no Arrow primitive type (Arrow's bool is bit-packed and it has no bfloat16); "
                           "export without strict types to get " + (d == DType::bf16 ? "fixed-size binary \"w:2\"" : "uint8 \"C\""));
      return d == DType::bf16 ? "w:2" : "C";
  }
  throw InvalidArgument("dtype " + std::to_string(static_cast<int>(d)) + " is not a memcuda dtype");
}

// Arrow's metadata encoding: int32 count, then per pair int32 length and
// bytes of the key, int32 length and bytes of the value (native endianness).
inline std::string arrow_metadata(const std::vector<std::pair<std::string, std::string>>& kv) {
  std::string out;
  auto put = [&out](std::int32_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(static_cast<std::int32_t>(kv.size()));
  for (const auto& [k, v] : kv) {
    put(static_cast<std::int32_t>(k.size()));
    out += k;
    put(static_cast<std::int32_t>(v.size()));
    out += v;
  }
  return out;
}

inline void fill_schema(ArrowSchema* s, std::unique_ptr<ArrowSchemaNode> n) {
  s->format = n->format.c_str();
  s->name = n->name.c_str();
  s->metadata = n->metadata.empty() ? nullptr : n->metadata.data();
  s->flags = 0;  // no nulls: not nullable
  s->n_children = n->child ? 1 : 0;
  s->children = n->child ? n->children : nullptr;
  s->dictionary = nullptr;
  s->release = &release_arrow_schema;
  s->private_data = n.release();
}

inline void fill_array(ArrowArray* a, std::unique_ptr<ArrowArrayNode> n, std::int64_t length, std::int64_t n_buffers) {
  a->length = length;
  a->null_count = 0;
  a->offset = 0;
  a->n_buffers = n_buffers;
  a->n_children = n->child ? 1 : 0;
  a->buffers = n->buffers;
  a->children = n->child ? n->children : nullptr;
  a->dictionary = nullptr;
  a->release = &release_arrow_array;
  a->private_data = n.release();
}

inline std::int64_t arrow_length(std::uint64_t n, const std::string& name) {
  if (n > static_cast<std::uint64_t>(INT64_MAX))
    throw InvalidArgument("'" + name + "' has more elements than an Arrow array's int64 length");
  return static_cast<std::int64_t>(n);
}

// The item count of a fixed-size list of the innermost dimension: the
// product of the outer dimensions, which an empty tensor's element count
// does not give ([2^40, 2^40, 0] is a valid shape whose product overflows).
inline std::int64_t arrow_list_length(const Shape& shape, const std::string& name) {
  std::int64_t length = 1;
  for (std::size_t i = 0; i + 1 < shape.size(); ++i)
    length = checked_mul(length, shape[i], "'" + name + "' as a fixed-size list: the outer dimensions");
  return length;
}

#if MEMCUDA_HAS_CUDA()
// A private non-blocking stream per device, made once per process: the
// export's own event is recorded on it behind the producer's event.
inline cudaStream_t arrow_side_stream(int device) {
  static std::mutex mu;
  static std::vector<cudaStream_t> streams;
  std::lock_guard lk(mu);
  if (static_cast<std::size_t>(device) >= streams.size()) streams.resize(device + 1, nullptr);
  if (!streams[device]) {
    DeviceGuard g(device);
    MEMCUDA_CUDA_TRY(cudaStreamCreateWithFlags(&streams[device], cudaStreamNonBlocking));
  }
  return streams[device];
}

// An event of the export's own that completes once the producer's published
// work has. Owned by the export, so neither a later publish (a new record of
// the shared interprocess event) nor the event cache's eviction changes what
// the consumer waits for.
inline cudaEvent_t arrow_sync_event(int device, const std::string& ipc_handle) {
  cudaStream_t s = arrow_side_stream(device);
  DeviceGuard g(device);
  cudaEvent_t ev{};
  MEMCUDA_CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  try {
    stream_wait_ipc_event(s, ipc_handle);
    MEMCUDA_CUDA_TRY(cudaEventRecord(ev, s));
  } catch (...) {
    cudaEventDestroy(ev);
    throw;
  }
  return ev;
}
#endif

// The schema of `t` under `opts` (no I/O, no reference taken).
inline void export_arrow_schema(const SharedTensor<void>& t, const ArrowExportOptions& opts, ArrowSchema* out) {
  const char* format = arrow_format(t.dtype(), opts.strict_types);
  if (opts.fixed_size_list && t.rank() == 0)
    throw InvalidArgument("'" + t.name() + "' is a scalar: no innermost dimension for a fixed-size list");
  std::vector<std::pair<std::string, std::string>> md = {{"memcuda.dtype", std::string(to_string(t.dtype()))},
                                                         {"memcuda.shape", shape_to_string(t.shape())}};
  auto leaf = std::make_unique<ArrowSchemaNode>();
  leaf->format = format;
  if (!opts.fixed_size_list) {
    leaf->name = t.name();
    leaf->metadata = arrow_metadata(md);
    fill_schema(out, std::move(leaf));
    return;
  }
  leaf->name = "item";
  auto root = std::make_unique<ArrowSchemaNode>();
  root->format = "+w:" + std::to_string(t.shape().back());
  root->name = t.name();
  root->metadata = arrow_metadata(md);
  root->child = std::make_unique<ArrowSchema>();
  fill_schema(root->child.get(), std::move(leaf));
  root->children[0] = root->child.get();
  fill_schema(out, std::move(root));
}

}  // namespace detail

// Fills *out_schema and *out_array (consumer-allocated, e.g. on the stack)
// with an export of `t`; the caller owns both and calls each release
// callback exactly once (or moves the structs on, marking the source
// released). out_array may be null: then only the schema is filled (no
// reference taken, no I/O). On an exception both read released (release ==
// nullptr).
//
// The array holds its own share of the handle's reference: the tensor stays
// registered and mapped until the array's release runs (from any thread; it
// only queues the release, no Redis I/O). device_type is ARROW_DEVICE_CUDA
// with this process's ordinal of the tensor's GPU, or ARROW_DEVICE_CPU with
// device_id 0 for the host backend. sync_event: for cuda, a cudaEvent_t* that
// completes once the producer's published work has (opts.newest_event says
// which publish); null when nothing was published (nothing to wait for) and
// always for host tensors. Consumers must treat the buffers as read-only.
template <class T>
void export_arrow(const SharedTensor<T>& t, ArrowSchema* out_schema, ArrowDeviceArray* out_array,
                  const ArrowExportOptions& opts = {}) {
  if (!out_schema) throw InvalidArgument("export_arrow: out_schema is null");
  out_schema->release = nullptr;
  if (out_array) out_array->array.release = nullptr;
  const SharedTensor<void> v(t.handle(), t.view());  // any T, const void included
  if (!v) throw InvalidArgument("export_arrow of an empty SharedTensor");
  if (!v.contiguous())
    throw InvalidArgument("export_arrow of a strided view of '" + v.name() + "': an Arrow array is dense");
  detail::export_arrow_schema(v, opts, out_schema);
  if (!out_array) return;
  try {
    const std::int64_t elements = detail::arrow_length(v.size(), v.name());
    auto leaf = std::make_unique<detail::ArrowArrayNode>();
    leaf->tensor = v;
    leaf->buffers[1] = v.data();  // buffers[0], validity: none (no nulls)
    std::unique_ptr<detail::ArrowArrayNode> root;
    std::int64_t length = elements, n_buffers = 2;
    if (opts.fixed_size_list) {
      root = std::make_unique<detail::ArrowArrayNode>();
      root->tensor = v;
      root->child = std::make_unique<ArrowArray>();
      detail::fill_array(root->child.get(), std::move(leaf), elements, 2);
      root->children[0] = root->child.get();
      length = detail::arrow_list_length(v.shape(), v.name());
      n_buffers = 1;  // a fixed-size list has the validity buffer only
    } else {
      root = std::move(leaf);
    }
    ArrowDeviceArray out{};
    out.device_type = v.backend() == BackendKind::cuda ? ARROW_DEVICE_CUDA : ARROW_DEVICE_CPU;
    out.device_id = v.backend() == BackendKind::cuda ? v.device() : 0;
#if MEMCUDA_HAS_CUDA()
    if (v.backend() == BackendKind::cuda) {
      const std::string ev = opts.newest_event ? detail::arrow_published_event(*v.handle()) : v.info().event_handle;
      if (!ev.empty()) {
        root->event = detail::arrow_sync_event(v.device(), ev);
        out.sync_event = &root->event;
      }
    }
#endif
    detail::fill_array(&out.array, std::move(root), length, n_buffers);
    *out_array = out;
  } catch (...) {
    out_schema->release(out_schema);
    throw;
  }
}

// An export that releases what it still owns when destroyed: for C++
// consumers, and for handing both structs on with move_to.
struct ArrowExport {
  ArrowSchema schema{};
  ArrowDeviceArray array{};

  ArrowExport() = default;
  ArrowExport(ArrowExport&& o) noexcept : schema(o.schema), array(o.array) { o.forget(); }
  ArrowExport& operator=(ArrowExport&& o) noexcept {
    if (this != &o) {
      reset();
      schema = o.schema;
      array = o.array;
      o.forget();
    }
    return *this;
  }
  ArrowExport(const ArrowExport&) = delete;
  ArrowExport& operator=(const ArrowExport&) = delete;
  ~ArrowExport() { reset(); }

  // Releases both structs (a no-op for one already released or moved).
  void reset() noexcept {
    if (schema.release) schema.release(&schema);
    if (array.array.release) array.array.release(&array.array);
  }
  // Moves both structs into consumer-owned ones (the specification's move:
  // bitwise copy, then this copy reads released).
  void move_to(ArrowSchema* s, ArrowDeviceArray* a) noexcept {
    *s = schema;
    *a = array;
    forget();
  }

 private:
  void forget() noexcept {
    schema.release = nullptr;
    array.array.release = nullptr;
  }
};

template <class T>
ArrowExport to_arrow(const SharedTensor<T>& t, const ArrowExportOptions& opts = {}) {
  ArrowExport e;
  export_arrow(t, &e.schema, &e.array, opts);
  return e;
}

// Every member of a state dict exported the same way, keyed by its name
// relative to the prefix. All or nothing: when one member cannot be
// exported, those already made are released and its error thrown. With
// newest_event on cuda that is one Redis round trip per member; after
// open_state_dict, newest_event = false orders on the publishes the open saw
// without any.
inline std::map<std::string, ArrowExport> to_arrow(const StateDict& dict, const ArrowExportOptions& opts = {}) {
  std::map<std::string, ArrowExport> out;
  for (const auto& [name, t] : dict) out.emplace(name, to_arrow(t, opts));
  return out;
}

MEMCUDA_NAMESPACE_END  // namespace memcuda

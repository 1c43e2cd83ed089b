// Arrow C Device Data Interface import: an ArrowDeviceArray (or a CPU
// ArrowArray) this process already has, registered by name without a copy
// under the rules of TensorRegistry::share (docs/interop.md, "Importing",
// says what imports; docs/design.md, "Borrowed tensors"). The array's data
// buffer becomes a borrowed tensor: the registry takes the array over and
// calls its release callback when the last reference anywhere goes, when
// the share fails, or when this process's registry ends.
#pragma once

#include "memcuda/config.hpp"

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "memcuda/arrow.hpp"
#include "memcuda/detail/base/checked.hpp"
#include "memcuda/share_options.hpp"
#include "memcuda/tensor_registry.hpp"
#if MEMCUDA_HAS_CUDA()
#include "memcuda/detail/cuda/pointer.hpp"
#endif

MEMCUDA_NAMESPACE_BEGIN

namespace detail {

// What an import shares: the first element's address, dtype and shape.
struct ArrowImportLayout {
  const void* data = nullptr;
  DType dtype = DType::u8;
  Shape shape;
};

// Arrow's metadata (int32 count, then int32-prefixed keys and values), read
// with bounds that a garbled producer cannot push into a huge allocation.
inline std::map<std::string, std::string> arrow_metadata_pairs(const char* md, const std::string& where) {
  std::map<std::string, std::string> out;
  if (!md) return out;
  constexpr std::int32_t kMaxPairs = 1024, kMaxBytes = 1 << 20;
  auto take = [&md]() {
    std::int32_t v = 0;
    std::memcpy(&v, md, sizeof v);
    md += sizeof v;
    return v;
  };
  const std::int32_t n = take();
  if (n < 0 || n > kMaxPairs) throw InvalidArgument(where + ": unreadable schema metadata (" + std::to_string(n) + " pairs)");
  for (std::int32_t i = 0; i < n; ++i) {
    std::string kv[2];
    for (auto& s : kv) {
      const std::int32_t len = take();
      if (len < 0 || len > kMaxBytes)
        throw InvalidArgument(where + ": unreadable schema metadata (a string of " + std::to_string(len) + " bytes)");
      s.assign(md, static_cast<std::size_t>(len));
      md += len;
    }
    out[std::move(kv[0])] = std::move(kv[1]);
  }
  return out;
}

// The dtype of a primitive format; `hint` is memcuda.dtype from the
// metadata (bool travels as "C", bf16 as "w:2").
inline DType arrow_import_dtype(std::string_view f, const std::string& hint, const std::string& where) {
  static constexpr std::pair<std::string_view, DType> kTable[] = {
      {"e", DType::f16}, {"f", DType::f32}, {"g", DType::f64}, {"c", DType::i8},  {"s", DType::i16}, {"i", DType::i32},
      {"l", DType::i64}, {"C", DType::u8},  {"S", DType::u16}, {"I", DType::u32}, {"L", DType::u64}};
  if (f == "w:2" && hint == "bf16") return DType::bf16;
  if (f == "C" && hint == "bool") return DType::bool_;
  for (const auto& [code, d] : kTable)
    if (f == code) return d;
  if (f == "b")
    throw TypeMismatch(where + ": Arrow's boolean is bit-packed (a bit per element) and a tensor's is a byte: cast "
                       "it to uint8 first (that is a copy)");
  throw TypeMismatch(where + ": Arrow format \"" + rules::printable(f) +
                     "\" is not a fixed-width number type; a tensor imports from e f g c s i l C S I L (or a "
                     "fixed-size list \"+w:<n>\" of one)");
}

inline void arrow_check_no_nulls(const ArrowArray& a, const std::string& where) {
  if (a.dictionary) throw InvalidArgument(where + ": a dictionary-encoded array is not a tensor");
  if (a.null_count > 0)
    throw InvalidArgument(where + ": the array has " + std::to_string(a.null_count) + " null(s); a tensor has none");
  if (a.null_count < 0 && a.n_buffers > 0 && a.buffers && a.buffers[0])
    throw InvalidArgument(where + ": the array has a validity buffer and an unknown null count; compute its nulls "
                          "(or drop the validity buffer) first");
  if (a.length < 0 || a.offset < 0) throw InvalidArgument(where + ": negative length or offset");
}

// The address of element `offset` of `buffer`, once elements [offset,
// offset + length) are known to fit the address space: the producer's
// offset and length are untrusted (offset 2^62 of f32 would wrap to 0).
inline const char* arrow_elements(const void* buffer, std::int64_t offset, std::int64_t length, DType dtype,
                                  const std::string& where) {
  if (!buffer) throw InvalidArgument(where + ": the data buffer is null");
  const auto item = static_cast<std::int64_t>(itemsize(dtype));
  const std::int64_t end = checked_mul(checked_add(offset, length, where + ": offset + length"), item,
                                       where + ": (offset + length) * item size");
  (void)checked_advance(buffer, static_cast<std::uint64_t>(end), where);
  return static_cast<const char*>(buffer) + offset * item;
}

// The layout of `a` under `s`; InvalidArgument / TypeMismatch for what is
// not a dense tensor.
inline ArrowImportLayout arrow_import_layout(const ArrowSchema& s, const ArrowArray& a, const std::string& where) {
  if (!s.format) throw InvalidArgument(where + ": the schema has no format");
  if (s.dictionary) throw InvalidArgument(where + ": a dictionary-encoded array is not a tensor");
  const auto md = arrow_metadata_pairs(s.metadata, where);
  const std::string_view f(s.format);
  arrow_check_no_nulls(a, where);
  ArrowImportLayout out;
  std::uint64_t elements = 0;
  if (f.starts_with("+w:")) {
    std::int64_t n = 0;
    for (char ch : f.substr(3)) {
      if (ch < '0' || ch > '9' || n > (INT64_MAX - 9) / 10) throw InvalidArgument(where + ": bad format \"" + rules::printable(f) + "\"");
      n = n * 10 + (ch - '0');
    }
    if (f.size() == 3 || n <= 0) throw InvalidArgument(where + ": a fixed-size list of no elements per item");
    if (s.n_children != 1 || !s.children || !s.children[0] || a.n_children != 1 || !a.children || !a.children[0])
      throw InvalidArgument(where + ": a fixed-size list needs exactly one child");
    const ArrowSchema& cs = *s.children[0];
    const ArrowArray& ca = *a.children[0];
    if (!cs.format) throw InvalidArgument(where + ": the list's child has no format");
    const auto cmd = arrow_metadata_pairs(cs.metadata, where);
    const auto hint = cmd.count("memcuda.dtype") ? cmd.at("memcuda.dtype") : std::string();
    out.dtype = arrow_import_dtype(cs.format, hint, where);
    arrow_check_no_nulls(ca, where + " (the list's child)");
    if (ca.n_buffers != 2 || !ca.buffers || ca.n_children != 0)
      throw InvalidArgument(where + ": the list's child is not a primitive array (2 buffers, no children)");
    const std::int64_t first = checked_mul(a.offset, n, where + ": offset * list size");
    const std::int64_t used = checked_mul(checked_add(a.offset, a.length, where + ": offset + length"), n,
                                          where + ": (offset + length) * list size");
    if (ca.length < used)
      throw InvalidArgument(where + ": the list's child has " + std::to_string(ca.length) + " elements, " +
                            std::to_string(used) + " needed");
    out.data = arrow_elements(ca.buffers[1], ca.offset, used, out.dtype, where + " (the list's child)") +
               first * static_cast<std::int64_t>(itemsize(out.dtype));
    out.shape = {a.length, n};
    elements = static_cast<std::uint64_t>(a.length) * static_cast<std::uint64_t>(n);
  } else {
    const auto hint = md.count("memcuda.dtype") ? md.at("memcuda.dtype") : std::string();
    out.dtype = arrow_import_dtype(f, hint, where);
    if (a.n_buffers != 2 || !a.buffers || a.n_children != 0)
      throw InvalidArgument(where + ": not a primitive array (2 buffers, no children)");
    out.data = arrow_elements(a.buffers[1], a.offset, a.length, out.dtype, where);
    out.shape = {a.length};
    elements = static_cast<std::uint64_t>(a.length);
  }
  // memcuda's own export names the tensor's shape: keep it when it fits.
  if (auto it = md.find("memcuda.shape"); it != md.end()) {
    try {
      Shape sh = shape_from_string(it->second);
      if (element_count(sh) == elements) out.shape = std::move(sh);
    } catch (const Error&) {  // not ours, or garbled: the flat shape stands
    }
  }
  return out;
}

}  // namespace detail

// Shares the data of `*array` (described by `schema`, which is only read)
// under `name` and returns this process's handle. The registry takes the
// array over in every case, failures included (the caller's struct reads
// released afterwards): its release callback runs once the last reference
// anywhere goes, from a registry thread (the specification allows any).
// A sync_event (ARROW_DEVICE_CUDA) is waited for before the tensor is
// registered, so readers never see unfinished writes. Throws as
// TensorRegistry::share, InvalidArgument / TypeMismatch for an array that is
// not a dense tensor, NotShareable for memory that cannot be lent
// (ARROW_DEVICE_CUDA_HOST pinned memory, managed memory, malloc'd host
// memory), Unavailable for CUDA memory in a build without CUDA.
inline SharedTensor<void> share_arrow(TensorRegistry& reg, std::string_view name, const ArrowSchema* schema,
                                      ArrowDeviceArray* array, ShareOptions opts = {}) {
  const std::string where = "share '" + std::string(name) + "' from Arrow";
  if (!array || !array->array.release) throw InvalidArgument(where + ": no live ArrowDeviceArray");
  auto owned = std::shared_ptr<ArrowDeviceArray>(new ArrowDeviceArray(*array), [](ArrowDeviceArray* p) {
    if (p->array.release) p->array.release(&p->array);
    delete p;
  });
  array->array.release = nullptr;  // moved: the specification's bitwise move
  if (!schema || !schema->release) throw InvalidArgument(where + ": no live ArrowSchema");
  const ArrowDeviceArray& a = *owned;
  const auto layout = detail::arrow_import_layout(*schema, a.array, where);
  void* data = const_cast<void*>(layout.data);
  switch (a.device_type) {
    case ARROW_DEVICE_CPU:
#if MEMCUDA_HAS_CUDA()
      if (auto dev = detail::device_of_pointer(data))
        throw InvalidArgument(where + ": the array says CPU but its data is on device " + std::to_string(*dev));
#endif
      break;
    case ARROW_DEVICE_CUDA: {
#if MEMCUDA_HAS_CUDA()
      const auto dev = detail::device_of_pointer(data);
      if (!dev || *dev != a.device_id)
        throw InvalidArgument(where + ": device_id " + std::to_string(a.device_id) + " but the data is " +
                              (dev ? "on device " + std::to_string(*dev) : std::string("not device memory")));
      if (a.sync_event) {
        detail::DeviceGuard g(*dev);
        MEMCUDA_CUDA_TRY(cudaEventSynchronize(*static_cast<cudaEvent_t*>(a.sync_event)));
      }
      break;
#else
      throw Unavailable(where + ": CUDA memory, and this build of memcuda has no CUDA");
#endif
    }
    case ARROW_DEVICE_CUDA_HOST:
    case 13:  // ARROW_DEVICE_CUDA_MANAGED: by value, a caller's own definition of the spec may stop at CUDA_HOST
      throw NotShareable(where + ": " + (a.device_type == ARROW_DEVICE_CUDA_HOST ? "pinned host" : "managed") +
                         " memory has no handle another process can open; copy it into registry memory");
    default:
      throw InvalidArgument(where + ": device type " + std::to_string(a.device_type) + " is neither CPU nor CUDA");
  }
  opts.keep_alive = opts.keep_alive
                        ? std::make_shared<std::pair<std::shared_ptr<void>, std::shared_ptr<void>>>(
                              std::move(opts.keep_alive), owned)
                        : std::shared_ptr<void>(owned);
  owned.reset();
  return reg.share(name, data, layout.dtype, layout.shape, std::move(opts));
}

// The same for a CPU ArrowArray (the C Data Interface without a device).
inline SharedTensor<void> share_arrow(TensorRegistry& reg, std::string_view name, const ArrowSchema* schema,
                                      ArrowArray* array, ShareOptions opts = {}) {
  if (!array || !array->release)
    throw InvalidArgument("share '" + std::string(name) + "' from Arrow: no live ArrowArray");
  ArrowDeviceArray d{};
  d.array = *array;
  array->release = nullptr;
  d.device_type = ARROW_DEVICE_CPU;
  return share_arrow(reg, name, schema, &d, std::move(opts));
}

MEMCUDA_NAMESPACE_END  // namespace memcuda

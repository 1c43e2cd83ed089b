// SharedTensor<T>: a handle to a named tensor of the registry.
#pragma once

#include "memcuda/config.hpp"

#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>

#include "memcuda/detail/cuda/copy_rows.hpp"
#include "memcuda/detail/cuda/reach.hpp"
#include "memcuda/dtype.hpp"
#include "memcuda/error.hpp"
#include "memcuda/local_tensor.hpp"
#include "memcuda/slice.hpp"
#include "memcuda/tensor_info.hpp"

MEMCUDA_NAMESPACE_BEGIN

namespace detail {

class Core;           // detail/registry/core.hpp: only the implementation unit sees it
class ExportedEvent;  // detail/cuda/ipc_event.hpp (CUDA)

// One holder reference of this process to one generation of a tensor, plus
// what keeps its memory mapped. Shared by every copy of a SharedTensor;
// the destructor queues the release of the reference (no Redis round trip
// on the caller's thread: the registry's release thread sends it, see
// detail/registry/release_queue.hpp) and never throws.
// The members that talk to Redis or CUDA are defined in the implementation
// unit, so that this header does not pull in the registry's internals.
class TensorHandle {
 public:
  TensorHandle(std::shared_ptr<Core> core, TensorInfo info, void* data, std::shared_ptr<void> keep);
  // A handle of a state dict opened through its record (state_dicts.hpp):
  // the reference is `dict`'s, shared with the open's other handles, and
  // goes with the last of them (no per-name release).
  TensorHandle(std::shared_ptr<Core> core, TensorInfo info, void* data, std::shared_ptr<void> keep,
               std::shared_ptr<void> dict);
  ~TensorHandle();
  TensorHandle(const TensorHandle&) = delete;
  TensorHandle& operator=(const TensorHandle&) = delete;

  const TensorInfo& info() const noexcept { return info_; }
  void* data() const noexcept { return data_; }
  int local_device() const noexcept { return local_device_; }
  Core& core() const noexcept { return *core_; }

  // Whether the name still means this generation (one Redis round trip).
  bool is_current() const;
  // SharedTensor::publish and wait_published (Redis, and CUDA events on cuda).
  std::uint64_t publish(StreamHandle stream);
  void wait_published(StreamHandle stream) const;

#if MEMCUDA_HAS_CUDA()
  // This process's interprocess event for the tensor, made on first use.
  ExportedEvent& event();
#endif

 private:
  std::shared_ptr<Core> core_;
  TensorInfo info_;
  void* data_;
  std::shared_ptr<void> keep_;
  std::shared_ptr<void> dict_;  // set: the reference is a state-dict record's
  int local_device_ = -1;
#if MEMCUDA_HAS_CUDA()
  std::mutex event_mu_;
  std::unique_ptr<ExportedEvent> event_;
#endif
};

}  // namespace detail

// A reference-counted handle to a named tensor in device (cuda backend) or
// shared host memory (host backend).
//
// Ownership: the handle holds one reference of this process in the
// registry (the tensor's refcount). Copies share it; the reference is
// dropped when the last copy is destroyed or release()d, and the memory is
// freed by the allocator of record when no process holds a reference.
// Moves leave the source empty.
//
// Device rules: data() is a device pointer valid on device() (this
// process's ordinal of the tensor's GPU) for the cuda backend, a host
// pointer for the host backend. get() does not look at the caller's current
// device: the pointer is the same whichever device is current. It is valid
// on another device only where that device reaches device() as a peer
// (cudaDeviceCanAccessPeer), and never in host code. Call
// check_device(reader) before a kernel on another device than the one
// current at the get reads it: it grants that device access, or throws
// NotZeroCopy naming both devices before a kernel faults.
// Nothing is ever copied to make a read work (docs/design.md, "Zero copy or
// an error"). Writes and reads are not ordered across processes by
// mem-cuda; synchronise (stream sync, events) before another process reads
// what you wrote.
//
// A handle may be a view (slice()): shape(), strides(), data(), bytes() and
// size() are then the view's, info() still the whole record's.
//
// T must match the stored dtype (TypeMismatch otherwise); SharedTensor<void>
// accepts any dtype and exposes untyped bytes.
template <class T>
class SharedTensor {
  static_assert(std::is_void_v<T> || TensorElement<std::remove_cv_t<T>>,
                "SharedTensor<T>: T must be void or a type with a memcuda dtype (see dtype.hpp)");

 public:
  using element_type = T;
  using value_type = std::conditional_t<std::is_void_v<T>, std::byte, std::remove_cv_t<T>>;

  SharedTensor() noexcept = default;
  explicit SharedTensor(std::shared_ptr<detail::TensorHandle> h, std::shared_ptr<const detail::View> v = {}) noexcept
      : h_(std::move(h)), v_(std::move(v)) {}

  // Untyped handle from a typed one (shares the reference and the view).
  template <class U>
    requires(std::is_void_v<T> && !std::is_void_v<U>)
  SharedTensor(const SharedTensor<U>& o) noexcept : h_(o.handle()), v_(o.view()) {}  // NOLINT

  explicit operator bool() const noexcept { return static_cast<bool>(h_); }
  bool empty() const noexcept { return !h_; }

  const std::string& name() const { return h().info().name; }
  DType dtype() const { return h().info().dtype; }
  const Shape& shape() const { return v_ ? v_->shape : h().info().shape; }
  // Strides in elements: row-major for a whole tensor, the tensor's for a view.
  Shape strides() const { return v_ ? v_->strides : h().info().strides(); }
  // Bytes from the tensor's first element to the view's (0: a whole tensor).
  std::uint64_t byte_offset() const noexcept { return v_ ? v_->offset : 0; }
  // Whether the elements are dense in row-major order (a slice of dimension 0 is).
  bool contiguous() const { return !v_ || detail::dense(*v_); }
  std::size_t rank() const { return shape().size(); }
  BackendKind backend() const { return h().info().backend; }
  // This process's CUDA ordinal of the tensor's device; -1 for host.
  int device() const { return h().local_device(); }
  const std::string& device_uuid() const { return h().info().device_uuid; }
  // The view's elements and their bytes (not counting the gaps between its rows).
  std::uint64_t bytes() const { return v_ ? size() * itemsize(dtype()) : h().info().bytes; }
  std::uint64_t size() const { return v_ ? element_count(v_->shape) : h().info().elements(); }
  // Unique per tensor ever created under this name or any other.
  std::uint64_t generation() const { return h().info().generation; }
  // The record as it was when this handle was opened.
  const TensorInfo& info() const { return h().info(); }

  // Throws NotZeroCopy unless code on `reader` (a CUDA ordinal of this
  // process; -1: host code) can use data() in place: same device, or a
  // peer that reaches it (access is granted here); host memory only from
  // host code. InvalidArgument for a reader that does not exist. It never copies.
  void check_device(int reader) const {
    const auto& i = h().info();
    detail::check_reach(i.name, i.backend, i.alloc_kind, device(), reader, data());
  }

  // A SharedTensor<const T> (from get<const T>) is a read-only view: data()
  // returns const T* and copy_from_host does not exist for it.
  // A view's first element.
  T* data() const noexcept {
    return h_ ? static_cast<T*>(static_cast<void*>(static_cast<char*>(h_->data()) + byte_offset())) : nullptr;
  }

  // Elements [start, start + length) of dimension spec.dim of this tensor or
  // view: a view sharing this handle's reference (no Redis call, no copy).
  // Slices compose. InvalidArgument naming the tensor, its shape and the
  // dimension for a range that does not fit (SliceSpec::tp: an uneven split).
  SharedTensor slice(const SliceSpec& spec) const {
    const auto& i = h().info();
    auto base = v_ ? *v_ : detail::View{i.shape, i.strides(), 0};
    return SharedTensor(h_, std::make_shared<const detail::View>(
                                detail::slice_view(i.name, base, itemsize(i.dtype), spec)));
  }
  const std::shared_ptr<const detail::View>& view() const noexcept { return v_; }
  // This handle (and its view) as SharedTensor<U>: TypeMismatch unless U is
  // the stored dtype. How an untyped handle (a state dict's) is typed again.
  template <class U>
  SharedTensor<U> as() const {
    if (h_ && dtype() != dtype_of<U>)
      throw TypeMismatch("'" + name() + "' is " + std::string(to_string(dtype())) + ", not " +
                         std::string(to_string(dtype_of<U>)));
    return SharedTensor<U>(h_, v_);
  }
  // The view as rows for one 2D copy; InvalidArgument where it is not one.
  detail::Rows rows() const {
    const auto& i = h().info();
    return v_ ? detail::rows_of(i.name, *v_, itemsize(i.dtype)) : detail::Rows{i.bytes, i.bytes, 1};
  }

  // False once the name was removed (or removed and created again), or its
  // tensor was moved to a new allocator of record after the old one died:
  // this handle still maps valid memory (after a move, a copy taken at the
  // move), but it is no longer what the name means; get() it again.
  // Cost: one Redis round trip per call (it asks Redis for the name's
  // current generation); do not call it per element or in a hot loop.
  // An empty handle answers false without I/O.
  bool valid() const { return h_ && h_->is_current(); }
  // Throws StaleHandle when !valid() (one Redis round trip, like valid()).
  void check_valid() const {
    if (!valid())
      throw StaleHandle("handle to '" + name() + "' (generation " + std::to_string(generation()) +
                        ") is stale: the name was removed, re-created or moved to a new allocator of record");
  }

  // Cross-process stream ordering, producer side: records an interprocess
  // event on `stream` (a stream of this tensor's device) after the work
  // that wrote the tensor, and publishes it in the registry. Consumers that
  // get() with a stream, or call wait_published(), then order their work
  // after it, without any host synchronisation. Returns the event version
  // (incremented per publish). Host backend: records nothing (host writes
  // are visible once done) and only bumps the version. Throws StaleHandle
  // when the name no longer means this tensor.
  std::uint64_t publish(StreamHandle stream = nullptr) const {
    (void)h();  // InvalidArgument when empty
    return h_->publish(stream);
  }

  // Consumer side for a handle already open: makes `stream` wait for the
  // producer's last published event (no-op when none was published or on
  // the host backend). Throws StaleHandle when the name moved on.
  void wait_published(StreamHandle stream) const { h().wait_published(stream); }

  // Drops this copy's share; the process's reference goes with the last copy.
  void release() noexcept {
    h_.reset();
    v_.reset();
  }

  // Bounds-checked copies between host memory and the tensor (or view), from
  // element `offset`; a strided view is copied whole (offset 0, size()
  // elements, dense in host memory: one 2D copy). Synchronous: the bytes are in
  // place (visible to other processes) on return; on cuda ordered on the
  // legacy default stream. InvalidArgument when the range does not fit.
  // Not available on SharedTensor<const T>: a read-only view cannot write.
  void copy_from_host(std::span<const value_type> src, std::uint64_t offset = 0) const
    requires(!std::is_const_v<T>)
  {
    auto [dst, r] = range(offset, src.size());
    copy(dst, src.data(), r, true);
  }
  void copy_to_host(std::span<value_type> dst, std::uint64_t offset = 0) const {
    auto [src, r] = range(offset, dst.size());
    copy(src, dst.data(), r, false);
  }

  std::shared_ptr<detail::TensorHandle> handle() const noexcept { return h_; }

 private:
  const detail::TensorHandle& h() const {
    if (!h_) throw InvalidArgument("use of an empty SharedTensor (default-constructed, moved-from or released)");
    return *h_;
  }

  std::pair<char*, detail::Rows> range(std::uint64_t offset, std::size_t count) const {
    const std::uint64_t unit = sizeof(value_type);
    const std::uint64_t total = bytes() / unit;
    if (offset > total || count > total - offset)
      throw InvalidArgument("copy of " + std::to_string(count) + " element(s) at offset " + std::to_string(offset) +
                            " is out of range for '" + name() + "' (" + std::to_string(total) + " element(s))");
    auto r = rows();
    if (r.height > 1 && (offset != 0 || count != total))
      throw InvalidArgument("copy of " + std::to_string(count) + " element(s) at offset " + std::to_string(offset) +
                            " of a strided view of '" + name() + "': such a view is copied whole (" +
                            std::to_string(total) + " element(s))");
    if (r.height <= 1) r = {count * unit, count * unit, count ? 1u : 0u};
    return {static_cast<char*>(h_->data()) + byte_offset() + offset * unit, r};
  }

  // Synchronous: another process must see the bytes once we return.
  void copy(char* tensor_ptr, const void* host, const detail::Rows& r, bool to_tensor) const {
    const bool on_host = backend() == BackendKind::host;
    if (to_tensor) detail::copy_rows(tensor_ptr, r.pitch, host, r.width, r, on_host, device(), nullptr, true);
    else detail::copy_rows(const_cast<void*>(host), r.width, tensor_ptr, r.pitch, r, on_host, device(), nullptr, true);
  }

  std::shared_ptr<detail::TensorHandle> h_;
  std::shared_ptr<const detail::View> v_;  // null: the whole tensor
};

// A dense copy of tensor or view `t` in a new LocalTensor (opts: the
// reader's device, or host memory): one 2D copy of the view's rows at the
// tensor's pitch, ordered on opts.stream, waited for when either side is
// host memory. InvalidArgument for a view that is not one 2D copy. T is an
// element type: type an untyped handle with as<U>() first.
template <class T>
LocalTensor<std::remove_cv_t<T>> copy_slice(const SharedTensor<T>& t, LocalOptions opts = {}) {
  const auto r = t.rows();
  LocalTensor<std::remove_cv_t<T>> out(t.shape(), opts);
  const bool host = opts.backend == BackendKind::host;
  detail::copy_rows(out.data(), r.width, t.data(), r.pitch, r, host && t.backend() == BackendKind::host,
                    host ? t.device() : opts.device, opts.stream, host || t.backend() == BackendKind::host);
  return out;
}

MEMCUDA_NAMESPACE_END  // namespace memcuda

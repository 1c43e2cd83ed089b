// What the C ABI's opaque handles are, and the one place that turns a C++
// exception into a C status code (errors.cpp). Private to libmemcuda_c.
#pragma once

#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "memcuda/c/memcuda.h"
#include "memcuda/memcuda.hpp"

// The registry behind a memcuda_registry*. The session id is copied so that
// memcuda_registry_session_id can hand out a stable C string.
struct memcuda_registry {
  explicit memcuda_registry(memcuda::RegistryOptions o);  // options.cpp
  memcuda::TensorRegistry reg;
  std::string session;
  std::vector<memcuda_device_budget> budgets;  // reg's pool.device_budgets, for memcuda_registry_get_options
};

// One share of a reference. Copies of `t` (memcuda_tensor_retain, DLPack
// exports) share the process's reference; it goes with the last of them.
struct memcuda_tensor {
  explicit memcuda_tensor(memcuda::SharedTensor<void> s) : t(std::move(s)), strides(t ? t.strides() : memcuda::Shape{}) {}
  memcuda::SharedTensor<void> t;
  memcuda::Shape strides;  // what memcuda_tensor_strides points into
};

namespace memcuda_c {

// Records the exception being handled (call only inside a catch block) as
// this thread's last error and returns its code.
int status_of_current_exception() noexcept;

// Runs f (returning void) and converts whatever it throws into a status.
template <class F>
int guarded(F&& f) noexcept {
  try {
    std::forward<F>(f)();
    return MEMCUDA_OK;
  } catch (...) {
    return status_of_current_exception();
  }
}

inline void copy_cstr(char* dst, std::size_t cap, const std::string& src) {
  std::size_t n = src.size() < cap - 1 ? src.size() : cap - 1;
  std::memcpy(dst, src.data(), n);
  dst[n] = '\0';
}

// Fills a C record from the C++ one (keeps info->struct_size).
inline void fill_info(memcuda_tensor_info* out, const memcuda::TensorInfo& in) {
  const std::uint32_t size = out->struct_size;
  std::memset(out, 0, sizeof *out);
  out->struct_size = size;
  copy_cstr(out->name, sizeof out->name, in.name);
  out->dtype = static_cast<int>(in.dtype);
  out->ndim = static_cast<int>(in.shape.size());
  for (std::size_t i = 0; i < in.shape.size() && i < MEMCUDA_MAX_RANK; ++i) out->shape[i] = in.shape[i];
  out->backend = in.backend == memcuda::BackendKind::cuda ? MEMCUDA_BACKEND_CUDA : MEMCUDA_BACKEND_HOST;
  out->device = in.device;
  copy_cstr(out->device_uuid, sizeof out->device_uuid, in.device_uuid);
  copy_cstr(out->node, sizeof out->node, in.node);
  out->bytes = in.bytes;
  out->refcount = in.refcount;
  out->state = static_cast<int>(in.state);
  out->generation = in.generation;
  out->owner_pid = in.owner_pid;
  out->ctime_ms = in.ctime_ms;
  out->event_version = in.event_version;
  out->holders = static_cast<std::int64_t>(in.holders.size());
}

// A C struct the caller filled: its struct_size must be this library's
// sizeof, so a header and library that differ are refused, not misread.
template <class S>
void check_struct(const S* s, const char* what) {
  if (!s) throw memcuda::InvalidArgument(std::string(what) + " is NULL");
  if (s->struct_size != sizeof(S))
    throw memcuda::InvalidArgument(std::string(what) + "->struct_size is " + std::to_string(s->struct_size) +
                                   ", not this library's " + std::to_string(sizeof(S)) +
                                   " (call the matching *_init first; header and library must match)");
}

inline memcuda::TensorRegistry& registry(memcuda_registry* r) {
  if (!r) throw memcuda::InvalidArgument("registry is NULL");
  return r->reg;
}
inline const memcuda::SharedTensor<void>& tensor(const memcuda_tensor* t) {
  if (!t) throw memcuda::InvalidArgument("tensor is NULL");
  return t->t;
}
inline std::string_view name_arg(const char* name) {
  if (!name) throw memcuda::InvalidArgument("tensor name is NULL");
  return name;
}

// An out pointer the call fills: NULL is refused, and it reads NULL until
// the call succeeds.
template <class T>
void out_arg(T** out) {
  if (!out) throw memcuda::InvalidArgument("out is NULL");
  *out = nullptr;
}

// The dtype a get expects (nullopt: MEMCUDA_DTYPE_ANY, whatever is stored).
inline std::optional<memcuda::DType> want_dtype(int dtype) {
  if (dtype == MEMCUDA_DTYPE_ANY) return std::nullopt;
  if (!memcuda_dtype_name(dtype))
    throw memcuda::InvalidArgument("dtype " + std::to_string(dtype) + " is not a MEMCUDA_DTYPE_* value");
  return static_cast<memcuda::DType>(dtype);
}

// A MEMCUDA_BACKEND_* value; nullopt for MEMCUDA_BACKEND_DEFAULT.
inline std::optional<memcuda::BackendKind> backend_arg(int b, const char* what = "backend") {
  if (b == MEMCUDA_BACKEND_DEFAULT) return std::nullopt;
  if (b == MEMCUDA_BACKEND_CUDA) return memcuda::BackendKind::cuda;
  if (b == MEMCUDA_BACKEND_HOST) return memcuda::BackendKind::host;
  throw memcuda::InvalidArgument(std::string(what) + " " + std::to_string(b) + " is not a MEMCUDA_BACKEND_* value");
}

// What memcuda_create, each entry of memcuda_create_many and memcuda_share ask for, checked
// and in C++ terms. opts may be NULL (the registry's defaults).
inline memcuda::TensorSpec create_spec(const char* name, int dtype, const int64_t* shape, int ndim,
                                       const memcuda_create_options* opts) {
  memcuda::TensorSpec s;
  s.name = std::string(name_arg(name));
  auto d = want_dtype(dtype);
  if (!d) throw memcuda::InvalidArgument("a dtype is needed (MEMCUDA_DTYPE_ANY is for get)");
  s.dtype = *d;
  if (ndim < 0 || ndim > MEMCUDA_MAX_RANK)
    throw memcuda::InvalidArgument("ndim " + std::to_string(ndim) + " is out of range [0, 8]");
  if (ndim > 0 && !shape) throw memcuda::InvalidArgument("shape is NULL but ndim is " + std::to_string(ndim));
  s.shape = memcuda::Shape(shape, shape + ndim);
  if (opts) {
    check_struct(opts, "create options");
    if (opts->device >= 0) s.options.device = opts->device;
    s.options.backend = backend_arg(opts->backend);
    s.options.persistent = opts->persistent != 0;
  }
  return s;
}

// The handles of a name-ordered map as a malloc'd array (so that
// memcuda_free_tensor_array is a plain free of one block); every handle is
// made before any is handed out. Empty: NULL and 0.
template <class Map>
void to_array(Map&& taken, memcuda_tensor*** out, size_t* count) {
  *out = nullptr;
  *count = 0;
  if (taken.empty()) return;
  std::vector<std::unique_ptr<memcuda_tensor>> made;
  made.reserve(taken.size());
  for (auto& [name, t] : taken) made.push_back(std::make_unique<memcuda_tensor>(std::move(t)));
  auto* arr = static_cast<memcuda_tensor**>(std::calloc(made.size(), sizeof(memcuda_tensor*)));
  if (!arr) throw std::bad_alloc();
  for (size_t i = 0; i < made.size(); ++i) arr[i] = made[i].release();
  *out = arr;
  *count = made.size();
}

inline std::string_view prefix_arg(const char* prefix) {
  if (!prefix) throw memcuda::InvalidArgument("prefix is NULL");
  return prefix;
}

// False once memcuda_stop_callbacks ran: the caller's callbacks are then
// leaked, not run (share.cpp).
bool callbacks_allowed() noexcept;

// memcuda_registry_options (NULL: the defaults) over RegistryOptions::from_env() (options.cpp).
memcuda::RegistryOptions to_options(const memcuda_registry_options* c);

}  // namespace memcuda_c

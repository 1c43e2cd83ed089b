// The C ABI's errors (a thread-local last error, one code per class of the
// memcuda::Error tree), version queries and dtype helpers. A light TU: it
// needs only the error and dtype headers.
#include <new>
#include <string>
#include <string_view>

#include "memcuda/c/memcuda.h"
#include "memcuda/config.hpp"
#include "memcuda/dtype.hpp"
#include "memcuda/error.hpp"
#include "memcuda/version.hpp"

namespace {

struct LastError {
  int code = MEMCUDA_OK;
  int cuda_status = 0;
  std::string message;
};
thread_local LastError g_last;

int record(int code, const char* msg, int cuda_status = 0) noexcept {
  try {
    g_last.message = msg ? msg : "";
  } catch (...) {
    g_last.message.clear();  // no memory for the text: keep the code
  }
  g_last.code = code;
  g_last.cuda_status = cuda_status;
  return code;
}

struct CodeInfo {
  const char* name;
  int parent;
};
// Indexed by code. Names are memcuda::Error::code() of each class; parents
// mirror the class tree of include/memcuda/error.hpp.
constexpr CodeInfo kCodes[MEMCUDA_ERR_LAST + 1] = {
    {"ok", MEMCUDA_OK},
    {"error", MEMCUDA_OK},
    {"invalid_argument", MEMCUDA_ERR_ERROR},
    {"not_found", MEMCUDA_ERR_ERROR},
    {"already_exists", MEMCUDA_ERR_ERROR},
    {"type_mismatch", MEMCUDA_ERR_ERROR},
    {"stale_handle", MEMCUDA_ERR_ERROR},
    {"budget_exceeded", MEMCUDA_ERR_ERROR},
    {"lost", MEMCUDA_ERR_ERROR},
    {"not_leader", MEMCUDA_ERR_ERROR},
    {"unavailable", MEMCUDA_ERR_ERROR},
    {"internal", MEMCUDA_ERR_ERROR},
    {"protocol_error", MEMCUDA_ERR_INVALID_ARGUMENT},
    {"cuda_error", MEMCUDA_ERR_ERROR},
    {"redis_error", MEMCUDA_ERR_ERROR},
    {"redis_connection", MEMCUDA_ERR_REDIS},
    {"redis_auth", MEMCUDA_ERR_REDIS_CONNECTION},
    {"timeout", MEMCUDA_ERR_REDIS},
    {"redis_reply", MEMCUDA_ERR_REDIS},
    {"out_of_memory", MEMCUDA_ERR_ERROR},
    {"unknown", MEMCUDA_ERR_ERROR},
    {"not_zero_copy", MEMCUDA_ERR_UNAVAILABLE},
};

}  // namespace

namespace memcuda_c {

// The C code is the one whose name is the exception's code(); a class the
// table lacks (IoError, "redis_io") takes its family's root.
int status_of_current_exception() noexcept {
  try {
    throw;
  } catch (const memcuda::Error& e) {
    const std::string_view code = e.code();
    int c = code.starts_with("redis_") ? MEMCUDA_ERR_REDIS : MEMCUDA_ERR_ERROR;
    for (int i = MEMCUDA_ERR_ERROR; i <= MEMCUDA_ERR_LAST; ++i)
      if (code == kCodes[i].name) c = i;
    const auto* cuda = dynamic_cast<const memcuda::CudaError*>(&e);
    return record(c, e.what(), cuda ? cuda->status() : 0);
  } catch (const std::bad_alloc&) {
    return record(MEMCUDA_ERR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    return record(MEMCUDA_ERR_UNKNOWN, e.what());
  } catch (...) {
    return record(MEMCUDA_ERR_UNKNOWN, "unknown exception");
  }
}

}  // namespace memcuda_c

extern "C" {

int memcuda_last_error_code(void) { return g_last.code; }
const char* memcuda_last_error_message(void) { return g_last.message.c_str(); }
int memcuda_last_error_cuda_status(void) { return g_last.cuda_status; }
void memcuda_clear_error(void) { record(MEMCUDA_OK, ""); }

const char* memcuda_error_name(int code) {
  if (code < 0 || code > MEMCUDA_ERR_LAST) return "unknown";
  return kCodes[code].name;
}
int memcuda_error_parent(int code) {
  if (code < 0 || code > MEMCUDA_ERR_LAST) return MEMCUDA_OK;
  return kCodes[code].parent;
}

int memcuda_version(void) { return MEMCUDA_VERSION; }
const char* memcuda_version_string(void) { return memcuda::kVersionString; }
int memcuda_abi_version(void) { return MEMCUDA_C_ABI_VERSION; }
int memcuda_has_cuda(void) { return MEMCUDA_HAS_CUDA(); }

const char* memcuda_dtype_name(int dtype) {
  if (dtype < 0 || dtype > static_cast<int>(memcuda::DType::f64)) return nullptr;
  // to_string returns views of string literals: NUL-terminated.
  return memcuda::to_string(static_cast<memcuda::DType>(dtype)).data();
}
int memcuda_dtype_from_name(const char* name) {
  if (!name) return -1;
  auto d = memcuda::dtype_from_string(name);
  return d ? static_cast<int>(*d) : -1;
}
size_t memcuda_dtype_itemsize(int dtype) {
  if (dtype < 0 || dtype > static_cast<int>(memcuda::DType::f64)) return 0;
  return memcuda::itemsize(static_cast<memcuda::DType>(dtype));
}

}  // extern "C"

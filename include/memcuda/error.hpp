// The exception tree of mem-cuda.
//
// memcuda::Error is the root; its children are the conditions a caller can act
// on. Each class has a stable wire code (Error::code()) used in JSON replies
// on the control plane, so an error raised in the allocator of record is
// re-thrown with the same type in the process that asked (throw_for_code):
// every code maps back to exactly the class that sends it, and the wire error
// also carries what that class keeps besides its message (a ProtocolError's
// ProtocolErrc, a CudaError's status and API; WireErrorDetail).
#pragma once

#include "memcuda/config.hpp"

#include <cstdint>
#include <optional>
#include <source_location>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

MEMCUDA_NAMESPACE_BEGIN

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
  // Stable, lower_snake_case identifier carried in JSON replies.
  virtual const char* code() const noexcept { return "error"; }
};

#define MEMCUDA_DEFINE_ERROR(Name, Base, wire)                       \
  class Name : public Base {                                         \
   public:                                                           \
    explicit Name(const std::string& what) : Base(what) {}           \
    const char* code() const noexcept override { return wire; }      \
  }

// A caller-supplied value is malformed (bad name, shape, dtype, range...).
MEMCUDA_DEFINE_ERROR(InvalidArgument, Error, "invalid_argument");
// No tensor of that name (or it was removed).
MEMCUDA_DEFINE_ERROR(NotFound, Error, "not_found");
// create() of a name that is already registered.
MEMCUDA_DEFINE_ERROR(AlreadyExists, Error, "already_exists");
// SharedTensor<T> opened with a T that is not the stored dtype.
MEMCUDA_DEFINE_ERROR(TypeMismatch, Error, "type_mismatch");
// A handle whose name was removed (and maybe re-created) since it was opened.
MEMCUDA_DEFINE_ERROR(StaleHandle, Error, "stale_handle");
// An allocation would take a device over its byte budget.
MEMCUDA_DEFINE_ERROR(BudgetExceeded, Error, "budget_exceeded");
// The tensor's memory died with its allocator and nobody held it.
MEMCUDA_DEFINE_ERROR(Lost, Error, "lost");
// No allocator of record answered in time, or this process lost its lease.
MEMCUDA_DEFINE_ERROR(NotLeader, Error, "not_leader");
// The tensor lives on another node, or uses a backend/device absent here.
MEMCUDA_DEFINE_ERROR(Unavailable, Error, "unavailable");
// Zero copy cannot be had for what was asked: the reader's device cannot
// reach the tensor's memory (no peer access), host code asked for device
// memory or a kernel for host memory, or the framework cannot view the
// dtype. The message names both sides and what to do instead (docs/design.md,
// "Zero copy or an error"); nothing is copied unless the caller opts in.
MEMCUDA_DEFINE_ERROR(NotZeroCopy, Unavailable, "not_zero_copy");
// A bug or an impossible state inside mem-cuda; please report it.
MEMCUDA_DEFINE_ERROR(InternalError, Error, "internal");

// Why this process cannot open the allocation kind a record names
// (docs/design.md, "Allocation kinds"). A reader opens every kind, whatever
// it allocates with; these are what it lacks.
enum class KindErrc : std::uint8_t {
  built_without_cuda,  // a cuda kind, and this build has no CUDA backend
  no_cuda_driver,      // a cuda kind, and no usable CUDA driver (or it lacks the cuMem calls)
  no_cuda_device,      // a cuda kind, and this process sees no CUDA device (CUDA_VISIBLE_DEVICES)
  no_fd_support,       // an fd-shared kind, and the system refuses fd transfer here (pidfd_getfd, SCM_RIGHTS)
  unknown_kind,        // a kind this version does not know (written by a newer one)
};

inline const char* to_string(KindErrc e) noexcept {
  switch (e) {
    case KindErrc::built_without_cuda: return "built_without_cuda";
    case KindErrc::no_cuda_driver: return "no_cuda_driver";
    case KindErrc::no_cuda_device: return "no_cuda_device";
    case KindErrc::no_fd_support: return "no_fd_support";
    case KindErrc::unknown_kind: return "unknown_kind";
  }
  return "unknown";
}

// This process cannot open a record's allocation kind: reason() says what
// it lacks, kind() which kind it was. On the wire it is plain Unavailable.
class KindUnavailable : public Unavailable {
 public:
  KindUnavailable(KindErrc reason, std::string kind, const std::string& what)
      : Unavailable(what), reason_(reason), kind_(std::move(kind)) {}
  KindErrc reason() const noexcept { return reason_; }
  const std::string& kind() const noexcept { return kind_; }

 private:
  KindErrc reason_;
  std::string kind_;
};

// A lifecycle command or stored record that does not follow docs/protocol.md.
// Carries the specific reason so callers and tests can tell them apart.
enum class ProtocolErrc : std::uint8_t {
  bad_json,          // not parseable JSON
  trailing_garbage,  // a valid document followed by more bytes
  too_large,         // document over the size limit
  not_object,        // top level is not a JSON object
  unknown_op,        // "op" is not one of the known operations
  missing_field,     // a required field is absent
  wrong_type,        // a field has the wrong JSON type
  unknown_field,     // a field the protocol does not define
  bad_name,          // tensor name empty, too long or with bad characters
  unknown_dtype,     // dtype string not in the table
  bad_shape,         // rank over the limit
  bad_dim,           // negative or too large dimension
  size_overflow,     // element count * itemsize does not fit
  bad_value,         // any other out-of-range value (device, pid, ...)
  bad_record,        // a tensor Hash in Redis is incomplete or corrupt
};

const char* to_string(ProtocolErrc e) noexcept;

class ProtocolError : public InvalidArgument {
 public:
  ProtocolError(ProtocolErrc errc, const std::string& what)
      : InvalidArgument(what), errc_(errc) {}
  ProtocolErrc errc() const noexcept { return errc_; }
  const char* code() const noexcept override { return "protocol_error"; }

 private:
  ProtocolErrc errc_;
};

// A CUDA runtime call failed. Keeps the status code, the API name and where.
class CudaError : public Error {
 public:
  CudaError(int status, std::string api, const std::string& what,
            std::source_location where = std::source_location::current())
      : Error(what), status_(status), api_(std::move(api)), where_(where) {}
  int status() const noexcept { return status_; }
  const std::string& api() const noexcept { return api_; }
  const std::source_location& where() const noexcept { return where_; }
  const char* code() const noexcept override { return "cuda_error"; }

 private:
  int status_;
  std::string api_;
  std::source_location where_;
};

// Anything that went wrong talking to Redis. redis::classify()
// (memcuda/redis/errors.hpp) is the one place that picks the class below
// for a failure; docs/design.md ("The Redis layer") has the table.
MEMCUDA_DEFINE_ERROR(RedisError, Error, "redis_error");

// The outcome of the command is unknown: the link failed or timed out while
// it may have been in flight, so it may or may not have run (redis-plus-plus
// calls this IoError). Code that must not do a write twice, or must not give
// back memory a record may now point at, catches this one class. Every
// ConnectionError (AuthError included, conservatively) and TimeoutError is one.
MEMCUDA_DEFINE_ERROR(IoError, RedisError, "redis_io");

// Could not connect, or the connection broke and could not be
// re-established. Keeps hiredis's error code (REDIS_ERR_IO, REDIS_ERR_EOF,
// REDIS_ERR_PROTOCOL, REDIS_ERR_OOM, ...; 0 where hiredis reported none: an
// interrupt, a moved-from connection, an error reply) and errno of the
// failed call (0 where none applies), so callers can switch on them.
class ConnectionError : public IoError {
 public:
  explicit ConnectionError(const std::string& what, int redis_code = 0, int sys_errno = 0)
      : IoError(what), redis_code_(redis_code), sys_errno_(sys_errno) {}
  int redis_code() const noexcept { return redis_code_; }
  int sys_errno() const noexcept { return sys_errno_; }
  const char* code() const noexcept override { return "redis_connection"; }

 private:
  int redis_code_;
  int sys_errno_;
};

// Redis refused the credentials or what they allow: prefix() is the
// server's error code, "WRONGPASS" (wrong password, unknown ACL user),
// "NOAUTH" (a password is needed) or "NOPERM" (the ACL user may not run that
// command or touch that key; the connection stays usable).
class AuthError : public ConnectionError {
 public:
  explicit AuthError(const std::string& what, std::string prefix = {})
      : ConnectionError(what), prefix_(std::move(prefix)) {}
  const std::string& prefix() const noexcept { return prefix_; }
  const char* code() const noexcept override { return "redis_auth"; }

 private:
  std::string prefix_;
};

// Connect or command did not complete within the configured timeout. Keeps
// hiredis's error code and errno as ConnectionError does (REDIS_ERR_IO with
// EAGAIN for a read, ETIMEDOUT for a connect); both 0 for mem-cuda's own
// timeouts (a control-plane request nobody answered).
class TimeoutError : public IoError {
 public:
  explicit TimeoutError(const std::string& what, int redis_code = 0, int sys_errno = 0)
      : IoError(what), redis_code_(redis_code), sys_errno_(sys_errno) {}
  int redis_code() const noexcept { return redis_code_; }
  int sys_errno() const noexcept { return sys_errno_; }
  const char* code() const noexcept override { return "timeout"; }

 private:
  int redis_code_;
  int sys_errno_;
};

// Redis answered with an error reply, or a reply of the wrong type.
// prefix() is the error code the server put first ("ERR", "WRONGTYPE",
// "NOSCRIPT", "BUSY", "LOADING", "READONLY", "OOM", ...), or empty for a
// reply of the wrong type and an error reply without one.
class ReplyError : public RedisError {
 public:
  explicit ReplyError(const std::string& what, std::string prefix = {})
      : RedisError(what), prefix_(std::move(prefix)) {}
  const std::string& prefix() const noexcept { return prefix_; }
  const char* code() const noexcept override { return "redis_reply"; }

 private:
  std::string prefix_;
};

#undef MEMCUDA_DEFINE_ERROR

inline const char* to_string(ProtocolErrc e) noexcept {
  switch (e) {
    case ProtocolErrc::bad_json: return "bad_json";
    case ProtocolErrc::trailing_garbage: return "trailing_garbage";
    case ProtocolErrc::too_large: return "too_large";
    case ProtocolErrc::not_object: return "not_object";
    case ProtocolErrc::unknown_op: return "unknown_op";
    case ProtocolErrc::missing_field: return "missing_field";
    case ProtocolErrc::wrong_type: return "wrong_type";
    case ProtocolErrc::unknown_field: return "unknown_field";
    case ProtocolErrc::bad_name: return "bad_name";
    case ProtocolErrc::unknown_dtype: return "unknown_dtype";
    case ProtocolErrc::bad_shape: return "bad_shape";
    case ProtocolErrc::bad_dim: return "bad_dim";
    case ProtocolErrc::size_overflow: return "size_overflow";
    case ProtocolErrc::bad_value: return "bad_value";
    case ProtocolErrc::bad_record: return "bad_record";
  }
  return "unknown";
}

// The ProtocolErrc named `s` (as to_string writes it); nullopt for any other text.
inline std::optional<ProtocolErrc> protocol_errc_from_string(std::string_view s) noexcept {
  for (int i = 0; i <= static_cast<int>(ProtocolErrc::bad_record); ++i) {
    auto e = static_cast<ProtocolErrc>(i);
    if (s == to_string(e)) return e;
  }
  return std::nullopt;
}

// What a wire error carries besides its code and message (docs/protocol.md,
// "The error object"): absent members are unknown.
struct WireErrorDetail {
  std::optional<ProtocolErrc> errc = std::nullopt;        // code "protocol_error"
  std::optional<int> cuda_status = std::nullopt;          // code "cuda_error"
  std::optional<std::string> cuda_api = std::nullopt;     // code "cuda_error"
};

// Re-throws an error received on the wire (code + message + detail) as
// exactly the class whose code() it is, so that a command sent to the
// allocator of record fails like a local one (docs/protocol.md, "The error
// object"). A leading "<errc>: " (what make_error_reply writes) is taken off
// a protocol_error's message, so what() reads as it did where it was thrown;
// a CudaError's where() is this call. An unknown "redis_..." code is a
// RedisError, any other unknown code a plain Error.
[[noreturn]] inline void throw_for_code(std::string_view code, const std::string& msg,
                                        const WireErrorDetail& detail = {}) {
  if (code == "protocol_error") {
    std::optional<ProtocolErrc> errc = detail.errc;
    std::string text = msg;
    auto colon = msg.find(": ");
    if (colon != std::string::npos) {
      auto prefix = protocol_errc_from_string(std::string_view(msg).substr(0, colon));
      if (prefix && (!errc || *errc == *prefix)) {
        errc = prefix;
        text = msg.substr(colon + 2);
      }
    }
    throw ProtocolError(errc.value_or(ProtocolErrc::bad_value), text);
  }
  if (code == "cuda_error")
    throw CudaError(detail.cuda_status.value_or(-1), detail.cuda_api.value_or("remote"), msg);
  if (code == "invalid_argument") throw InvalidArgument(msg);
  if (code == "not_found") throw NotFound(msg);
  if (code == "already_exists") throw AlreadyExists(msg);
  if (code == "type_mismatch") throw TypeMismatch(msg);
  if (code == "stale_handle") throw StaleHandle(msg);
  if (code == "budget_exceeded") throw BudgetExceeded(msg);
  if (code == "lost") throw Lost(msg);
  if (code == "not_leader") throw NotLeader(msg);
  if (code == "not_zero_copy") throw NotZeroCopy(msg);
  if (code == "unavailable") throw Unavailable(msg);
  if (code == "internal") throw InternalError(msg);
  if (code == "redis_error") throw RedisError(msg);
  if (code == "redis_io") throw IoError(msg);
  if (code == "redis_connection") throw ConnectionError(msg);
  if (code == "redis_auth") throw AuthError(msg);
  if (code == "redis_reply") throw ReplyError(msg);
  if (code == "timeout") throw TimeoutError(msg);
  if (code.starts_with("redis_")) throw RedisError(msg);
  throw Error(msg);
}

MEMCUDA_NAMESPACE_END  // namespace memcuda

// Precondition check that throws the given memcuda error type.
#define MEMCUDA_EXPECTS(cond, ErrorType, msg) \
  do {                                        \
    if (!(cond)) throw ErrorType(msg);        \
  } while (0)

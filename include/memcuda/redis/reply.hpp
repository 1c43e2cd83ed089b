// Replies as hiredis parses them: Reply owns a reply tree (move-only, freed
// with freeReplyObject), ReplyView is a non-owning view of one node with
// typed accessors that throw ReplyError on a reply of another type.
#pragma once

#include "memcuda/config.hpp"

#include <hiredis/hiredis.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace redis {

namespace detail {
struct ReplyDeleter {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;
}  // namespace detail

// Non-owning view of one node of a reply tree. Valid while the Reply that
// owns the tree lives. A view of no reply (from an empty Reply) is of no
// type: its accessors throw ReplyError.
class ReplyView {
 public:
  explicit ReplyView(const redisReply* r) noexcept : r_(r) {}

  // REDIS_REPLY_* constant; 0 for a view of no reply.
  int type() const noexcept { return r_ ? r_->type : 0; }
  bool is_nil() const noexcept { return type() == REDIS_REPLY_NIL; }
  bool is_error() const noexcept { return type() == REDIS_REPLY_ERROR; }
  bool is_array() const noexcept { return type() == REDIS_REPLY_ARRAY; }
  bool is_integer() const noexcept { return type() == REDIS_REPLY_INTEGER; }
  bool is_string() const noexcept {
    return type() == REDIS_REPLY_STRING || type() == REDIS_REPLY_STATUS;
  }

  // Bulk/status/error string bytes (binary-safe). Throws ReplyError on other types.
  std::string_view str() const {
    if (!is_string() && !is_error()) throw ReplyError("expected a string reply, got " + type_name());
    return {r_->str, r_->len};
  }
  long long integer() const {
    if (!is_integer()) throw ReplyError("expected an integer reply, got " + type_name());
    return r_->integer;
  }
  std::size_t size() const noexcept { return is_array() ? r_->elements : 0; }
  ReplyView operator[](std::size_t i) const {
    if (i >= size())
      throw ReplyError("reply array index " + std::to_string(i) + " out of range (size " +
                       std::to_string(size()) + ", " + type_name() + ")");
    return ReplyView(r_->element[i]);
  }
  // nil -> nullopt; string -> value.
  std::optional<std::string> opt_str() const {
    if (is_nil()) return std::nullopt;
    return std::string(str());
  }

  std::string type_name() const {
    if (!r_) return "no reply";
    switch (r_->type) {
      case REDIS_REPLY_STRING: return "string";
      case REDIS_REPLY_ARRAY: return "array";
      case REDIS_REPLY_INTEGER: return "integer";
      case REDIS_REPLY_NIL: return "nil";
      case REDIS_REPLY_STATUS: return "status";
      case REDIS_REPLY_ERROR: return "error '" + std::string(r_->str, r_->len) + "'";
      default: return "type " + std::to_string(r_->type);
    }
  }

 private:
  const redisReply* r_;
};

// Owning reply (move-only). Connection::command turns error replies into
// ReplyError; only Connection::pipeline hands out error replies (is_error()).
// A default-constructed or moved-from Reply is empty: operator bool is false
// and the accessors throw ReplyError.
class Reply {
 public:
  Reply() = default;
  explicit Reply(redisReply* r) noexcept : p_(r) {}
  explicit operator bool() const noexcept { return p_ != nullptr; }
  ReplyView view() const noexcept { return ReplyView(p_.get()); }

  int type() const noexcept { return view().type(); }
  bool is_nil() const noexcept { return view().is_nil(); }
  bool is_error() const noexcept { return view().is_error(); }
  bool is_array() const noexcept { return view().is_array(); }
  bool is_integer() const noexcept { return view().is_integer(); }
  bool is_string() const noexcept { return view().is_string(); }
  std::string_view str() const { return view().str(); }
  long long integer() const { return view().integer(); }
  std::size_t size() const noexcept { return view().size(); }
  ReplyView operator[](std::size_t i) const { return view()[i]; }
  std::optional<std::string> opt_str() const { return view().opt_str(); }
  std::string type_name() const { return view().type_name(); }

 private:
  detail::ReplyPtr p_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::redis

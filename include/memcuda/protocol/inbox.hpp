// Inbox messages: what the allocator of record LPUSHes on one registry's List
// `memcuda:inbox:<session>` for that registry's control thread, and the
// answer a holder sends back to a migrate request (docs/protocol.md, "Inbox
// messages": forget, unmap, free, migrate).
//
// Any Redis client can push onto an inbox, so decode_inbox is as strict as
// decode_command: every rejection is a ProtocolError with a specific
// ProtocolErrc. Fields it does not know are ignored (a newer leader may add
// some); an op it does not know is unknown_op.
#pragma once

#include "memcuda/config.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "memcuda/error.hpp"
#include "memcuda/protocol/json_util.hpp"
#include "memcuda/protocol/limits.hpp"
#include "memcuda/shape.hpp"
#include "memcuda/tensor_info.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace protocol {

// Largest migrate to_handle, in bytes before hex encoding: a CUDA IPC handle
// is 64 bytes, a host tensor's handle is its shm object name (< 255).
inline constexpr std::size_t kMaxHandleBytes = 255;

// The allocator of record saw session `owner` die: drop idle mappings of it.
struct ForgetMessage {
  std::string owner;
  friend bool operator==(const ForgetMessage&, const ForgetMessage&) = default;
};

// Session `owner` returned these allocations (slabs) to the driver: close
// idle mappings of them, which would keep the memory allocated.
struct UnmapMessage {
  std::string owner;
  std::vector<std::uint64_t> alloc_ids;
  friend bool operator==(const UnmapMessage&, const UnmapMessage&) = default;
};

// The last reference of an unlinked record of this generation went; the
// receiver (an ex-allocator of record that still owns the memory) frees it.
struct FreeMessage {
  std::uint64_t generation = 0;
  friend bool operator==(const FreeMessage&, const FreeMessage&) = default;
};

// Copy a tensor of a dead exporter, through the receiver's existing mapping
// of it (from_*), into its replacement (to_*), then push a MigrateAnswer with
// the same id on reply_to. to_handle holds the raw handle bytes (hex on the
// wire). Bounds (to_offset + bytes <= to_alloc_bytes) are the receiver's to
// check, so that it can answer with the error.
struct MigrateMessage {
  std::uint64_t id = 0;
  std::string reply_to;
  std::string name;
  BackendKind backend = BackendKind::host;
  std::uint64_t bytes = 0;
  std::string from_owner;
  std::uint64_t from_alloc_id = 0;
  std::uint64_t from_offset = 0;
  std::string to_owner;
  std::int64_t to_owner_pid = 0;  // 0: unknown
  std::uint64_t to_alloc_id = 0;
  std::uint64_t to_offset = 0;
  std::uint64_t to_alloc_bytes = 0;
  std::string to_handle;
  int to_device = -1;          // -1 for host
  std::string to_device_uuid;  // "" for host
  friend bool operator==(const MigrateMessage&, const MigrateMessage&) = default;
};

using InboxMessage = std::variant<ForgetMessage, UnmapMessage, FreeMessage, MigrateMessage>;

// A holder's answer to a MigrateMessage. error is set exactly when ok is false.
struct MigrateAnswer {
  std::uint64_t id = 0;
  bool ok = true;
  std::optional<std::string> error;
  friend bool operator==(const MigrateAnswer&, const MigrateAnswer&) = default;
};

namespace detail {

// Owners are session ids ("<pid>-<hex>"), i.e. holders: bounded text.
inline std::string get_owner(const json::object& o, std::string_view field, std::string_view what) {
  return get_bounded_text(require(o, field, what), field, kMaxHolderBytes);
}

inline std::string to_hex(std::string_view b) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * b.size());
  for (unsigned char c : b) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

// Lower-case hex only, as to_hex writes it.
inline std::string from_hex(std::string_view h, std::string_view field, std::size_t max_bytes) {
  if (h.size() % 2)
    fail(ProtocolErrc::bad_value, field_ref(field) + ": odd number of hex digits (" +
                                      std::to_string(h.size()) + ")");
  if (h.size() / 2 > max_bytes)
    fail(ProtocolErrc::bad_value, field_ref(field) + ": " + std::to_string(h.size() / 2) +
                                      " bytes exceeds the maximum of " + std::to_string(max_bytes));
  auto nibble = [&](std::size_t i) -> int {
    char c = h[i];
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    fail(ProtocolErrc::bad_value, field_ref(field) + ": byte at offset " + std::to_string(i) +
                                      " is not a lower-case hex digit");
  };
  std::string out;
  out.reserve(h.size() / 2);
  for (std::size_t i = 0; i < h.size(); i += 2)
    out.push_back(static_cast<char>(nibble(i) * 16 + nibble(i + 1)));
  return out;
}

inline MigrateMessage decode_migrate(const json::object& o) {
  constexpr std::string_view what = "inbox message \"migrate\"";
  auto u64 = [&](std::string_view f) { return get_uint(require(o, f, what), f); };
  MigrateMessage m;
  m.id = u64("id");
  m.reply_to = get_bounded_text(require(o, "reply_to", what), "reply_to", kMaxReplyToBytes);
  std::string_view name = get_string(require(o, "name", what), "name");
  memcuda::detail::rules::validate_name(name, "field \"name\"");
  m.name = std::string(name);
  std::string_view b = get_string(require(o, "backend", what), "backend");
  auto backend = backend_from_string(b);
  if (!backend)
    fail(ProtocolErrc::bad_value, "field \"backend\": \"" + memcuda::detail::rules::printable(b) +
                                      "\" is not a backend; expected \"cuda\" or \"host\"");
  m.backend = *backend;
  m.bytes = u64("bytes");
  m.from_owner = get_owner(o, "from_owner", what);
  m.from_alloc_id = u64("from_alloc_id");
  m.from_offset = u64("from_offset");
  m.to_owner = get_owner(o, "to_owner", what);
  m.to_owner_pid = get_int(require(o, "to_owner_pid", what), "to_owner_pid", 0, kMaxPid);
  m.to_alloc_id = u64("to_alloc_id");
  m.to_offset = u64("to_offset");
  m.to_alloc_bytes = u64("to_alloc_bytes");
  m.to_handle = from_hex(get_string(require(o, "to_handle", what), "to_handle"), "to_handle",
                         kMaxHandleBytes);
  m.to_device = static_cast<int>(get_int(require(o, "to_device", what), "to_device", -1, kMaxDevice));
  m.to_device_uuid =
      get_token_or_empty(require(o, "to_device_uuid", what), "to_device_uuid", kMaxDeviceUuidBytes);
  return m;
}

}  // namespace detail

// Decodes one inbox message. Throws ProtocolError: too_large, bad_json,
// trailing_garbage, not_object; missing_field / wrong_type / bad_value for a
// field of the op (bad_name for the migrate name); unknown_op for an op
// other than forget, unmap, free, migrate.
inline InboxMessage decode_inbox(std::string_view text) {
  namespace json = boost::json;
  using detail::fail;
  json::value doc = detail::parse_object(text, "inbox message");
  const json::object& o = doc.get_object();
  std::string_view op = detail::get_string(detail::require(o, "op", "inbox message"), "op");
  if (op == "forget") return ForgetMessage{detail::get_owner(o, "owner", "inbox message \"forget\"")};
  if (op == "unmap") {
    UnmapMessage m;
    m.owner = detail::get_owner(o, "owner", "inbox message \"unmap\"");
    const json::value& ids = detail::require(o, "alloc_ids", "inbox message \"unmap\"");
    const json::array* a = ids.if_array();
    if (!a) detail::wrong_type("alloc_ids", "an array of non-negative integers", ids);
    m.alloc_ids.reserve(a->size());
    for (std::size_t i = 0; i < a->size(); ++i)
      m.alloc_ids.push_back(detail::get_uint((*a)[i], "alloc_ids[" + std::to_string(i) + "]"));
    return m;
  }
  if (op == "free")
    return FreeMessage{detail::get_uint(detail::require(o, "generation", "inbox message \"free\""),
                                        "generation")};
  if (op == "migrate") return detail::decode_migrate(o);
  fail(ProtocolErrc::unknown_op, "field \"op\": unknown inbox operation \"" +
                                     memcuda::detail::rules::printable(op) +
                                     "\"; expected forget, unmap, free or migrate");
}

// Encodes an inbox message as compact JSON, fields in a fixed order (op
// first). The result is checked with decode_inbox, so a message that would
// not decode (a bad name, an empty owner, a document over kMaxCommandBytes
// such as an unmap of ~3000 ids) throws that ProtocolError instead of being
// sent.
inline std::string encode_inbox(const InboxMessage& msg) {
  namespace json = boost::json;
  using detail::sv;
  json::object o;
  if (const auto* m = std::get_if<ForgetMessage>(&msg)) {
    o["op"] = "forget";
    o["owner"] = sv(m->owner);
  } else if (const auto* m = std::get_if<UnmapMessage>(&msg)) {
    o["op"] = "unmap";
    o["owner"] = sv(m->owner);
    json::array a;
    a.reserve(m->alloc_ids.size());
    for (std::uint64_t id : m->alloc_ids) a.emplace_back(id);
    o["alloc_ids"] = std::move(a);
  } else if (const auto* m = std::get_if<FreeMessage>(&msg)) {
    o["op"] = "free";
    o["generation"] = m->generation;
  } else if (const auto* m = std::get_if<MigrateMessage>(&msg)) {
    o["op"] = "migrate";
    o["id"] = m->id;
    o["reply_to"] = sv(m->reply_to);
    o["name"] = sv(m->name);
    o["backend"] = sv(to_string(m->backend));
    o["bytes"] = m->bytes;
    o["from_owner"] = sv(m->from_owner);
    o["from_alloc_id"] = m->from_alloc_id;
    o["from_offset"] = m->from_offset;
    o["to_owner"] = sv(m->to_owner);
    o["to_owner_pid"] = m->to_owner_pid;
    o["to_alloc_id"] = m->to_alloc_id;
    o["to_offset"] = m->to_offset;
    o["to_alloc_bytes"] = m->to_alloc_bytes;
    o["to_handle"] = sv(detail::to_hex(m->to_handle));
    o["to_device"] = m->to_device;
    o["to_device_uuid"] = sv(m->to_device_uuid);
  }
  std::string out = json::serialize(o);
  (void)decode_inbox(out);
  return out;
}

// Decodes a holder's answer to a migrate message. Strict like decode_reply:
// ok == false without "error" is missing_field, ok == true with one is
// bad_value; unknown fields are ignored.
inline MigrateAnswer decode_migrate_answer(std::string_view text) {
  namespace json = boost::json;
  constexpr std::string_view what = "migrate answer";
  json::value doc = detail::parse_object(text, what);
  const json::object& o = doc.get_object();
  MigrateAnswer a;
  a.id = detail::get_uint(detail::require(o, "id", what), "id");
  a.ok = detail::get_bool(detail::require(o, "ok", what), "ok");
  const json::value* err = detail::find(o, "error");
  if (a.ok && err)
    detail::fail(ProtocolErrc::bad_value, "field \"error\": present in an answer with \"ok\": true");
  if (!a.ok) a.error = std::string(detail::get_string(detail::require(o, "error", what), "error"));
  return a;
}

// Encodes an answer: {"id":n,"ok":true} or {"id":n,"ok":false,"error":"..."}.
// The error text is made valid UTF-8 and cut to kMaxErrorMessageBytes (so any
// exception's what() can be sent); ok == false without an error sends "".
// Throws ProtocolError(bad_value) for ok == true with an error.
inline std::string encode_migrate_answer(const MigrateAnswer& a) {
  namespace json = boost::json;
  if (a.ok && a.error)
    detail::fail(ProtocolErrc::bad_value, "migrate answer: \"error\" set with \"ok\": true");
  json::object o;
  o["id"] = a.id;
  o["ok"] = a.ok;
  if (!a.ok) {
    std::string e = a.error.value_or("");
    if (e.size() > kMaxErrorMessageBytes) e.resize(kMaxErrorMessageBytes);
    e = detail::sanitize_utf8(e);
    o["error"] = detail::sv(e);
  }
  std::string out = json::serialize(o);
  (void)decode_migrate_answer(out);
  return out;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::protocol

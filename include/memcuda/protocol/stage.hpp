// The staging messages of a fleet (docs/protocol.md, "Staging device
// memory"): a node that pulls another node's device tensor asks that node's
// allocator of record, a chunk at a time, to copy it into its pinned staging
// ring, which the byte mover then reads. JSON on the List
// `memcuda:stage@<node scope>`:
//   {"op":"stage","name":N,"generation":G,"at":A,"bytes":B,"reply_to":L}
//     -> on L: {"ok":true,"slot":S,"ticket":T,"offset":O,"lease_ms":M}
//        (bytes [A, A+B) of the tensor at offset O of the ring, held for
//        the asker M ms at most), or a reply with "ok": false and "error"
//        as every command's (reply.hpp).
//   {"op":"unstage","slot":S,"ticket":T}: the asker has read its slot.
#pragma once

#include "memcuda/config.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "memcuda/error.hpp"
#include "memcuda/protocol/json_util.hpp"
#include "memcuda/protocol/limits.hpp"
#include "memcuda/protocol/reply.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace protocol {

// The most bytes one ask may stage: a ring slot's size.
inline constexpr std::uint64_t kStageChunkBytes = std::uint64_t{16} << 20;

struct StageRequest {
  std::string name;
  std::uint64_t generation = 0;
  std::uint64_t at = 0;     // byte offset in the tensor
  std::uint64_t bytes = 0;  // at most the stager's chunk
  std::string reply_to;
};

struct StageRelease {
  std::uint64_t slot = 0;
  std::uint64_t ticket = 0;
};

// A decoded message of the staging list: exactly one of the two.
struct StageMessage {
  std::optional<StageRequest> stage;
  std::optional<StageRelease> unstage;
};

struct StageGrant {
  std::uint64_t slot = 0;
  std::uint64_t ticket = 0;
  std::uint64_t offset = 0;  // in the ring region the node publishes ("stage" field)
  std::uint64_t lease_ms = 0;
};

inline std::string encode_stage(const StageRequest& r) {
  namespace json = boost::json;
  json::object o;
  o["op"] = "stage";
  o["name"] = detail::sv(r.name);
  o["generation"] = r.generation;
  o["at"] = r.at;
  o["bytes"] = r.bytes;
  o["reply_to"] = detail::sv(r.reply_to);
  return json::serialize(o);
}

inline std::string encode_unstage(const StageRelease& r) {
  namespace json = boost::json;
  json::object o;
  o["op"] = "unstage";
  o["slot"] = r.slot;
  o["ticket"] = r.ticket;
  return json::serialize(o);
}

// Strict about JSON and the types of the fields it knows (unknown fields are
// ignored, as decode_reply does): ProtocolError for anything else.
inline StageMessage decode_stage_message(std::string_view text) {
  namespace json = boost::json;
  json::value doc = detail::parse_object(text, "stage message", kMaxCommandBytes);
  const json::object& o = doc.get_object();
  const std::string_view op = detail::get_string(detail::require(o, "op", "stage message"), "op");
  StageMessage m;
  if (op == "unstage") {
    StageRelease r;
    r.slot = detail::get_uint(detail::require(o, "slot", "unstage"), "slot");
    r.ticket = detail::get_uint(detail::require(o, "ticket", "unstage"), "ticket");
    m.unstage = r;
    return m;
  }
  if (op != "stage")
    detail::fail(ProtocolErrc::unknown_op, "stage message: op \"" + std::string(op.substr(0, 64)) +
                                               "\" is neither \"stage\" nor \"unstage\"");
  StageRequest r;
  r.name = std::string(detail::get_string(detail::require(o, "name", "stage"), "name"));
  r.generation = detail::get_uint(detail::require(o, "generation", "stage"), "generation");
  r.at = detail::get_uint(detail::require(o, "at", "stage"), "at");
  r.bytes = detail::get_uint(detail::require(o, "bytes", "stage"), "bytes");
  r.reply_to = detail::get_token(detail::require(o, "reply_to", "stage"), "reply_to", kMaxReplyToBytes);
  m.stage = std::move(r);
  return m;
}

inline std::string encode_grant(const StageGrant& g) {
  namespace json = boost::json;
  json::object o;
  o["ok"] = true;
  o["slot"] = g.slot;
  o["ticket"] = g.ticket;
  o["offset"] = g.offset;
  o["lease_ms"] = g.lease_ms;
  return json::serialize(o);
}

// A grant, or the stager's error thrown as the class it threw
// (throw_reply_error); ProtocolError for a malformed reply.
inline StageGrant decode_grant(std::string_view text) {
  namespace json = boost::json;
  json::value doc = detail::parse_object(text, "stage reply", kMaxReplyBytes);
  const json::object& o = doc.get_object();
  if (!detail::get_bool(detail::require(o, "ok", "stage reply"), "ok")) {
    const Reply r = decode_reply(text);
    throw_reply_error(*r.error);
  }
  StageGrant g;
  g.slot = detail::get_uint(detail::require(o, "slot", "stage reply"), "slot");
  g.ticket = detail::get_uint(detail::require(o, "ticket", "stage reply"), "ticket");
  g.offset = detail::get_uint(detail::require(o, "offset", "stage reply"), "offset");
  g.lease_ms = detail::get_uint(detail::require(o, "lease_ms", "stage reply"), "lease_ms");
  return g;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::protocol

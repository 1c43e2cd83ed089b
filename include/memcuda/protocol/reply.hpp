// Replies: the JSON documents LPUSHed on the List a command named in its
// reply_to (docs/protocol.md, "Replies"), and the error reply made from an
// exception (make_error_reply).
//
// decode_reply is as strict as decode_command about JSON and the fields it
// knows, and ignores fields it does not know (newer allocators may add some).
#pragma once

#include "memcuda/config.hpp"

#include <cstdint>
#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/error.hpp"
#include "memcuda/protocol/command.hpp"
#include "memcuda/protocol/json_util.hpp"
#include "memcuda/protocol/limits.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace protocol {

// The reply's "error" object (docs/protocol.md, "The error object"). The
// optional members default to nullopt so that {code, message} still
// initializes one.
struct ReplyErrorInfo {
  std::string code;     // memcuda::Error::code() of the failure, e.g. "not_found"
  std::string message;  // human-readable; for protocol errors starts with the ProtocolErrc
  std::optional<ProtocolErrc> errc = std::nullopt;     // wire "errc": a ProtocolError's reason
  std::optional<int> cuda_status = std::nullopt;       // a CudaError's status()
  std::optional<std::string> cuda_api = std::nullopt;  // a CudaError's api()

  friend bool operator==(const ReplyErrorInfo&, const ReplyErrorInfo&) = default;
};

// The answer to a command. ok == true: the optional result fields describe
// the tensor; ok == false: error is set.
struct Reply {
  std::optional<std::string> id;
  bool id_is_number = false;
  bool ok = true;
  std::optional<ReplyErrorInfo> error;
  std::optional<std::string> name;
  std::optional<std::uint64_t> generation;
  std::optional<std::int64_t> refcount;
  std::optional<std::string> op;
  // create_many: one entry per tensor created, in the command's order.
  std::optional<std::vector<ReplyTensor>> tensors;

  friend bool operator==(const Reply&, const Reply&) = default;
};

// Decodes a reply. Strict about JSON, types and the fields it knows; fields
// it does not know are ignored so that newer servers can add some. Throws
// ProtocolError; ok == false without "error", or ok == true with one, is
// missing_field / bad_value.
inline Reply decode_reply(std::string_view text) {
  namespace json = boost::json;
  using detail::fail;
  json::value doc = detail::parse_object(text, "reply", kMaxReplyBytes);
  const json::object* o = &doc.get_object();
  Reply r;
  r.ok = detail::get_bool(detail::require(*o, "ok", "reply"), "ok");
  if (const json::value* v = detail::find(*o, "id")) r.id = detail::get_id(*v, r.id_is_number);
  if (const json::value* v = detail::find(*o, "op"))
    r.op = std::string(detail::get_string(*v, "op"));
  if (const json::value* v = detail::find(*o, "name"))
    r.name = std::string(detail::get_string(*v, "name"));
  if (const json::value* v = detail::find(*o, "generation"))
    r.generation = detail::get_uint(*v, "generation");
  if (const json::value* v = detail::find(*o, "refcount"))
    r.refcount = detail::get_int(*v, "refcount", std::numeric_limits<std::int64_t>::min(),
                                 std::numeric_limits<std::int64_t>::max());
  if (const json::value* v = detail::find(*o, "tensors")) r.tensors = detail::decode_reply_tensors(*v);
  const json::value* err = detail::find(*o, "error");
  if (r.ok) {
    if (err) fail(ProtocolErrc::bad_value, "field \"error\": present in a reply with \"ok\": true");
  } else {
    if (!err) fail(ProtocolErrc::missing_field, "reply: missing field \"error\" (\"ok\" is false)");
    const json::object* eo = err->if_object();
    if (!eo) detail::wrong_type("error", "an object", *err);
    ReplyErrorInfo info;
    info.code = std::string(
        detail::get_string(detail::require(*eo, "code", "field \"error\""), "error.code"));
    info.message = std::string(
        detail::get_string(detail::require(*eo, "message", "field \"error\""), "error.message"));
    // An errc this process does not know (a newer sender's) is left out:
    // throw_reply_error then falls back to the message's prefix.
    if (const json::value* v = detail::find(*eo, "errc"))
      info.errc = protocol_errc_from_string(detail::get_string(*v, "error.errc"));
    if (const json::value* v = detail::find(*eo, "cuda_status"))
      info.cuda_status = static_cast<int>(detail::get_int(*v, "error.cuda_status",
                                                          std::numeric_limits<std::int32_t>::min(),
                                                          std::numeric_limits<std::int32_t>::max()));
    if (const json::value* v = detail::find(*eo, "cuda_api"))
      info.cuda_api = detail::get_bounded_text(*v, "error.cuda_api", kMaxCudaApiBytes);
    r.error = std::move(info);
  }
  return r;
}

// Encodes a reply as compact JSON: id, ok, op, name, generation, refcount,
// tensors (create_many), error (absent optionals are left out; a numeric id is written as a JSON
// number). Throws ProtocolError for a reply decode_reply would reject
// (ok == false without error, ok == true with one, a bad numeric id).
inline std::string encode_reply(const Reply& r) {
  namespace json = boost::json;
  using detail::sv;
  json::object o;
  if (r.id) o["id"] = detail::id_to_json(*r.id, r.id_is_number);
  o["ok"] = r.ok;
  if (r.op) o["op"] = sv(*r.op);
  if (r.name) o["name"] = sv(*r.name);
  if (r.generation) o["generation"] = *r.generation;
  if (r.refcount) o["refcount"] = *r.refcount;
  if (r.tensors) o["tensors"] = detail::encode_reply_tensors(*r.tensors);
  if (r.error) {
    json::object e;
    e["code"] = sv(r.error->code);
    e["message"] = sv(r.error->message);
    if (r.error->errc) e["errc"] = json::string_view(memcuda::to_string(*r.error->errc));
    if (r.error->cuda_status) e["cuda_status"] = *r.error->cuda_status;
    if (r.error->cuda_api) e["cuda_api"] = sv(*r.error->cuda_api);
    o["error"] = std::move(e);
  }
  std::string out = json::serialize(o);
  (void)decode_reply(out);
  return out;
}

// The error reply for `cmd` (may be null when the command could not be
// decoded) failing with `e`: code is memcuda::Error::code() ("protocol_error"
// for ProtocolError, whose message then starts with its ProtocolErrc name) or
// "internal" for any other exception; id, op and name are copied from cmd.
// The message is made valid UTF-8 and cut to kMaxErrorMessageBytes, so the
// result always encodes.
inline Reply make_error_reply(const Command* cmd, const std::exception& e) {
  Reply r;
  r.ok = false;
  ReplyErrorInfo info;
  std::string message = e.what();
  if (const auto* me = dynamic_cast<const memcuda::Error*>(&e)) {
    info.code = me->code();
    // The prefix stays for receivers older than the "errc" field.
    if (const auto* pe = dynamic_cast<const ProtocolError*>(&e)) {
      message = std::string(memcuda::to_string(pe->errc())) + ": " + message;
      info.errc = pe->errc();
    }
    if (const auto* ce = dynamic_cast<const CudaError*>(&e)) {
      info.cuda_status = ce->status();
      std::string api = ce->api().substr(0, kMaxCudaApiBytes);
      for (char& c : api)
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
      api = detail::sanitize_utf8(api);
      if (!api.empty()) info.cuda_api = std::move(api);
    }
  } else {
    info.code = "internal";
  }
  if (message.size() > kMaxErrorMessageBytes) message.resize(kMaxErrorMessageBytes);
  info.message = detail::sanitize_utf8(message);
  info.code = detail::sanitize_utf8(info.code);
  r.error = std::move(info);
  if (cmd) {
    r.id = cmd->id;
    r.id_is_number = cmd->id_is_number;
    // A hand-built command may carry an id no reply can hold: echo it as a
    // string when it is not a valid number, drop it when its size is wrong.
    if (r.id && r.id_is_number && !detail::canonical_uint(*r.id)) r.id_is_number = false;
    if (r.id) r.id = detail::sanitize_utf8(*r.id);
    if (r.id && (r.id->empty() || r.id->size() > kMaxIdBytes)) {
      r.id.reset();
      r.id_is_number = false;
    }
    r.op = std::string(to_string(cmd->op));
    if (cmd->op != Op::create_many || !cmd->name.empty()) r.name = detail::sanitize_utf8(cmd->name);
  }
  return r;
}

// Re-throws the error of a failed reply as exactly the memcuda::Error class
// that the allocator of record threw (throw_for_code), with its ProtocolErrc
// or CUDA status and API when the reply carries them. What a process that
// sent a command calls on `ok == false`.
[[noreturn]] inline void throw_reply_error(const ReplyErrorInfo& e) {
  throw_for_code(e.code, e.message, WireErrorDetail{e.errc, e.cuda_status, e.cuda_api});
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::protocol

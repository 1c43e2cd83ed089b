// libFuzzer target: a lifecycle command as any Redis client may LPUSH it on
// tensor_lifecycle (the input is the raw List element).
//
// Checks, for every input, what the consumer (detail::ControlLoop::handle)
// relies on:
//  - decode_command throws nothing but ProtocolError;
//  - a rejected command: peek_reply_route does not throw, and when it finds a
//    reply_to the error reply make_error_reply builds encodes (encode_reply
//    does not throw) and decodes back to the same Reply, so the sender always
//    gets an answer and the consumer is never stopped by a bad command;
//  - the lenient scan (scan_reply_route), used when the strict parser refuses
//    the document, finds only a reply_to and id the decoder would accept,
//    and on any document the strict parser accepts it finds exactly what the
//    strict reading finds;
//  - an accepted command: encode_command round-trips to an equal Command and
//    its text is a fixed point; peek_reply_route agrees with decode_command on
//    reply_to and id; the success and error replies for it encode and decode.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "fuzz_support.hpp"
#include "memcuda/error.hpp"
#include "memcuda/protocol.hpp"

namespace {

namespace p = memcuda::protocol;

// What ControlLoop::reply_malformed does with a command that did not decode.
// The lenient scan's promises: a route it finds is one decode_command would
// accept for those fields, and where the strict parser reads the document,
// the scan reads the same route.
void check_scan(std::string_view text) {
  std::optional<p::ReplyRoute> scanned = p::detail::scan_reply_route(text);  // noexcept
  if (scanned) {
    const std::string& rt = scanned->reply_to;
    MEMCUDA_FUZZ_CHECK(!rt.empty() && rt.size() <= p::kMaxReplyToBytes);
    MEMCUDA_FUZZ_CHECK(p::detail::sanitize_utf8(rt) == rt, "scanned reply_to is not UTF-8");
    for (char ch : rt)
      MEMCUDA_FUZZ_CHECK(static_cast<unsigned char>(ch) >= 0x20 && ch != 0x7f, "control byte in scanned reply_to");
    if (scanned->id) MEMCUDA_FUZZ_CHECK(!scanned->id->empty() && scanned->id->size() <= p::kMaxIdBytes);
  }
  bool strict_ok = true;
  try {
    (void)p::detail::parse_document(text, "command", p::kMaxPeekBytes);
  } catch (const memcuda::ProtocolError&) {
    strict_ok = false;
  } catch (...) {
    MEMCUDA_FUZZ_UNEXPECTED("parse_document");
  }
  if (!strict_ok) return;
  std::optional<p::ReplyRoute> strict = p::peek_reply_route(text);  // the strict reading here
  MEMCUDA_FUZZ_CHECK(strict.has_value() == scanned.has_value(), "lenient scan and strict parse disagree on reply_to");
  if (strict && scanned) {
    MEMCUDA_FUZZ_CHECK(strict->reply_to == scanned->reply_to);
    MEMCUDA_FUZZ_CHECK(strict->id == scanned->id && strict->id_is_number == scanned->id_is_number);
  }
}

void check_rejected(std::string_view text, const memcuda::ProtocolError& e) {
  MEMCUDA_FUZZ_CHECK(std::string_view(memcuda::to_string(e.errc())) != "unknown");
  MEMCUDA_FUZZ_CHECK(*e.what() != '\0', "empty ProtocolError message");
  check_scan(text);
  std::optional<p::ReplyRoute> route = p::peek_reply_route(text);  // noexcept
  if (!route) return;
  MEMCUDA_FUZZ_CHECK(!route->reply_to.empty() && route->reply_to.size() <= p::kMaxReplyToBytes);
  p::Reply rep = p::make_error_reply(nullptr, e);
  rep.id = route->id;
  rep.id_is_number = route->id_is_number;
  MEMCUDA_FUZZ_CHECK(!rep.ok && rep.error && rep.error->code == "protocol_error");
  // encode_reply must accept the reply, and decode_reply must give it back.
  MEMCUDA_FUZZ_ROUND_TRIP(rep, p::encode_reply, p::decode_reply);
}

void check_accepted(std::string_view text, const p::Command& cmd) {
  MEMCUDA_FUZZ_CHECK(memcuda::is_valid_name(cmd.name));
  if (cmd.op == p::Op::create) {
    MEMCUDA_FUZZ_CHECK(cmd.dtype && cmd.shape);
    try {
      (void)memcuda::byte_size(*cmd.dtype, *cmd.shape);
    } catch (...) {
      MEMCUDA_FUZZ_UNEXPECTED("byte_size of an accepted create");
    }
    MEMCUDA_FUZZ_CHECK_STRIDES(*cmd.shape);
  }
  if (cmd.op == p::Op::free) MEMCUDA_FUZZ_CHECK(cmd.generation.has_value());

  MEMCUDA_FUZZ_ROUND_TRIP(cmd, p::encode_command, p::decode_command);

  // The route of a valid command is the command's own reply_to and id.
  check_scan(text);
  std::optional<p::ReplyRoute> route = p::peek_reply_route(text);
  MEMCUDA_FUZZ_CHECK(route.has_value() == cmd.reply_to.has_value());
  if (route) {
    MEMCUDA_FUZZ_CHECK(route->reply_to == *cmd.reply_to);
    MEMCUDA_FUZZ_CHECK(route->id == cmd.id && route->id_is_number == cmd.id_is_number);
  }

  // The two replies ControlLoop::handle may send for it.
  p::Reply ok;
  ok.id = cmd.id;
  ok.id_is_number = cmd.id_is_number;
  ok.op = std::string(p::to_string(cmd.op));
  ok.name = cmd.name;
  ok.generation = cmd.generation.value_or(1);
  ok.refcount = 1;
  MEMCUDA_FUZZ_ROUND_TRIP(ok, p::encode_reply, p::decode_reply);
  const p::Reply err = p::make_error_reply(&cmd, memcuda::NotFound("no tensor '" + cmd.name + "'"));
  MEMCUDA_FUZZ_ROUND_TRIP(err, p::encode_reply, p::decode_reply);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text = memcuda_fuzz::as_text(data, size);
  p::Command cmd;
  try {
    cmd = p::decode_command(text);
  } catch (const memcuda::ProtocolError& e) {
    check_rejected(text, e);
    return 0;
  } catch (...) {
    MEMCUDA_FUZZ_UNEXPECTED("decode_command");
  }
  check_accepted(text, cmd);
  return 0;
}

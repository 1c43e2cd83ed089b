// libFuzzer target: a reply as the requesting process pops it from its
// reply_to List (decode_reply). The allocator of record writes replies, but
// any Redis client can push onto that List too.
//
// Checks: decode_reply throws nothing but ProtocolError; an accepted reply
// keeps ok and error consistent (error present exactly when ok is false), and
// encode_reply of it decodes back to an equal Reply with a text that is a
// fixed point.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_support.hpp"
#include "memcuda/error.hpp"
#include "memcuda/protocol.hpp"

namespace p = memcuda::protocol;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  p::Reply r;
  try {
    r = p::decode_reply(memcuda_fuzz::as_text(data, size));
  } catch (const memcuda::ProtocolError& e) {
    MEMCUDA_FUZZ_CHECK(*e.what() != '\0', "empty ProtocolError message");
    return 0;
  } catch (...) {
    MEMCUDA_FUZZ_UNEXPECTED("decode_reply");
  }
  MEMCUDA_FUZZ_CHECK(r.ok != r.error.has_value());
  if (r.id) MEMCUDA_FUZZ_CHECK(!r.id->empty() && r.id->size() <= p::kMaxIdBytes);

  std::string encoded;
  try {
    encoded = p::encode_reply(r);
  } catch (...) {
    MEMCUDA_FUZZ_UNEXPECTED("encode_reply of a decoded reply");
  }
  p::Reply back;
  try {
    back = p::decode_reply(encoded);
  } catch (...) {
    MEMCUDA_FUZZ_UNEXPECTED("decode_reply of encode_reply's output");
  }
  MEMCUDA_FUZZ_CHECK(back == r, "encoded: " + memcuda_fuzz::shown(encoded));
  MEMCUDA_FUZZ_CHECK(p::encode_reply(back) == encoded);
  return 0;
}

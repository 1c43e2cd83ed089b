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
  const auto r = MEMCUDA_FUZZ_DECODE(p::decode_reply, memcuda_fuzz::as_text(data, size));
  if (!r) return 0;
  MEMCUDA_FUZZ_CHECK(r->ok != r->error.has_value());
  if (r->id) MEMCUDA_FUZZ_CHECK(!r->id->empty() && r->id->size() <= p::kMaxIdBytes);
  MEMCUDA_FUZZ_ROUND_TRIP(*r, p::encode_reply, p::decode_reply);
  return 0;
}

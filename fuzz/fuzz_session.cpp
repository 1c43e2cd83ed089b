// libFuzzer target: the value of `memcuda:session:<session>` (decode_session).
// Each registry writes its own, but any Redis client can SET the key.
//
// Checks: decode_session throws nothing but ProtocolError; an accepted value
// keeps the documented limits (pid 1..2^31-1, node 1..255 bytes without
// control characters, started >= 0); encode_session of it decodes back equal,
// with a text that is a fixed point.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_support.hpp"
#include "memcuda/error.hpp"
#include "memcuda/protocol/session.hpp"

namespace p = memcuda::protocol;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto s = MEMCUDA_FUZZ_DECODE(p::decode_session, memcuda_fuzz::as_text(data, size));
  if (!s) return 0;
  MEMCUDA_FUZZ_CHECK(s->pid >= 1 && s->pid <= p::kMaxPid);
  MEMCUDA_FUZZ_CHECK(!s->node.empty() && s->node.size() <= p::kMaxNodeBytes);
  for (char c : s->node) MEMCUDA_FUZZ_CHECK(static_cast<unsigned char>(c) >= 0x20 && c != 0x7f);
  MEMCUDA_FUZZ_CHECK(s->started_ms >= 0);
  MEMCUDA_FUZZ_ROUND_TRIP(*s, p::encode_session, p::decode_session);
  return 0;
}

// libFuzzer target: a message as a registry's control thread pops it from
// its inbox List (decode_inbox), and a migrate answer as the allocator of
// record pops it (decode_migrate_answer). The leader writes both kinds, but
// any Redis client can push onto those Lists, so every input goes through
// both decoders.
//
// Checks: the decoders throw nothing but ProtocolError; an accepted message
// keeps the documented limits (owners 1..255 bytes, valid migrate name,
// handle <= 255 bytes, device -1..1023); encode_inbox of it decodes back to
// an equal message with a text that is a fixed point; the same for answers,
// whose error is present exactly when ok is false.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "fuzz_support.hpp"
#include "memcuda/error.hpp"
#include "memcuda/protocol/inbox.hpp"

namespace p = memcuda::protocol;

namespace {

void check_message(const p::InboxMessage& m) {
  auto owner_ok = [](const std::string& o) { return !o.empty() && o.size() <= p::kMaxHolderBytes; };
  if (const auto* f = std::get_if<p::ForgetMessage>(&m)) MEMCUDA_FUZZ_CHECK(owner_ok(f->owner));
  if (const auto* u = std::get_if<p::UnmapMessage>(&m)) MEMCUDA_FUZZ_CHECK(owner_ok(u->owner));
  if (const auto* g = std::get_if<p::MigrateMessage>(&m)) {
    MEMCUDA_FUZZ_CHECK(memcuda::is_valid_name(g->name));
    MEMCUDA_FUZZ_CHECK(owner_ok(g->from_owner) && owner_ok(g->to_owner));
    MEMCUDA_FUZZ_CHECK(!g->reply_to.empty() && g->reply_to.size() <= p::kMaxReplyToBytes);
    MEMCUDA_FUZZ_CHECK(g->to_handle.size() <= p::kMaxHandleBytes);
    MEMCUDA_FUZZ_CHECK(g->to_device >= -1 && g->to_device <= p::kMaxDevice);
    MEMCUDA_FUZZ_CHECK(g->to_owner_pid >= 0 && g->to_owner_pid <= p::kMaxPid);
  }
}

void fuzz_message(std::string_view text) {
  const auto m = MEMCUDA_FUZZ_DECODE(p::decode_inbox, text);
  if (!m) return;
  check_message(*m);
  // Re-encoding never grows a document (no whitespace, unknown fields
  // dropped, the same escapes), so not even too_large may happen.
  MEMCUDA_FUZZ_ROUND_TRIP(*m, p::encode_inbox, p::decode_inbox);
}

void fuzz_answer(std::string_view text) {
  const auto decoded = MEMCUDA_FUZZ_DECODE(p::decode_migrate_answer, text);
  if (!decoded) return;
  const p::MigrateAnswer& a = *decoded;
  MEMCUDA_FUZZ_CHECK(a.ok != a.error.has_value());
  std::string encoded;
  try {
    encoded = p::encode_migrate_answer(a);
  } catch (...) {
    MEMCUDA_FUZZ_UNEXPECTED("encode_migrate_answer of a decoded answer");
  }
  p::MigrateAnswer back;
  try {
    back = p::decode_migrate_answer(encoded);
  } catch (...) {
    MEMCUDA_FUZZ_UNEXPECTED("decode_migrate_answer of encode_migrate_answer's output");
  }
  // The encoder cuts and repairs error texts; a decoded one that is valid
  // UTF-8 (JSON strings are) and short enough comes back unchanged.
  if (!a.error || a.error->size() <= p::kMaxErrorMessageBytes)
    MEMCUDA_FUZZ_CHECK(back == a, "encoded: " + memcuda_fuzz::shown(encoded));
  MEMCUDA_FUZZ_CHECK(p::encode_migrate_answer(back) == encoded);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text = memcuda_fuzz::as_text(data, size);
  fuzz_message(text);
  fuzz_answer(text);
  return 0;
}

// libFuzzer target: the batch parts of the wire format, as any Redis client
// may LPUSH a create_many command on tensor_lifecycle, and as the requesting
// process pops a create_many reply (the entries' decoder
// decode_create_entry, and decode_reply_tensors).
//
// Checks, for every input:
//  - decode_command and decode_reply throw nothing but ProtocolError;
//  - an accepted create_many: 1..kMaxBatchEntries entries, unique valid
//    names, sizes within the limits, every entry's device, device_uuid,
//    backend and persistent resolved from the command's defaults (an entry
//    never lacks one the command has); encode_command round-trips it to an
//    equal Command and its text is a fixed point;
//  - an accepted reply with tensors: at most kMaxBatchEntries of them, and
//    encode_reply round-trips it to an equal Reply, text a fixed point.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "fuzz_support.hpp"
#include "memcuda/error.hpp"
#include "memcuda/protocol.hpp"

namespace p = memcuda::protocol;

namespace {

void check_command(std::string_view text) {
  const auto decoded = MEMCUDA_FUZZ_DECODE(p::decode_command, text);
  if (!decoded) return;
  const p::Command& c = *decoded;
  if (c.op != p::Op::create_many) {
    MEMCUDA_FUZZ_CHECK(c.tensors.empty(), "entries on a command that is not create_many");
    return;
  }
  MEMCUDA_FUZZ_CHECK(!c.tensors.empty() && c.tensors.size() <= p::kMaxBatchEntries);
  std::set<std::string> names;
  for (const auto& e : c.tensors) {
    MEMCUDA_FUZZ_CHECK(names.insert(e.name).second, "duplicate name " + memcuda_fuzz::shown(e.name));
    try {
      memcuda::validate_name(e.name);
      (void)memcuda::byte_size(e.dtype, e.shape);
    } catch (...) {
      MEMCUDA_FUZZ_UNEXPECTED("validate_name/byte_size of an accepted entry");
    }
    MEMCUDA_FUZZ_CHECK_STRIDES(e.shape);
    if (c.device) MEMCUDA_FUZZ_CHECK(e.device.has_value(), "entry device not resolved");
    if (c.device_uuid) MEMCUDA_FUZZ_CHECK(e.device_uuid.has_value(), "entry device_uuid not resolved");
    if (c.backend) MEMCUDA_FUZZ_CHECK(e.backend.has_value(), "entry backend not resolved");
    if (c.persistent) MEMCUDA_FUZZ_CHECK(e.persistent.has_value(), "entry persistent not resolved");
  }
  std::string encoded;
  try {
    encoded = p::encode_command(c);
  } catch (const memcuda::ProtocolError& e) {
    // Resolving the defaults into every entry may push a command that was
    // just under the size limit over it: the only refusal allowed.
    MEMCUDA_FUZZ_CHECK(e.errc() == memcuda::ProtocolErrc::too_large, std::string("encode_command: ") + e.what());
    return;
  } catch (...) {
    MEMCUDA_FUZZ_UNEXPECTED("encode_command of a decoded create_many");
  }
  p::Command back;
  try {
    back = p::decode_command(encoded);
  } catch (...) {
    MEMCUDA_FUZZ_UNEXPECTED("decode_command of encode_command's output");
  }
  MEMCUDA_FUZZ_CHECK(back == c, "encoded: " + memcuda_fuzz::shown(encoded));
  MEMCUDA_FUZZ_CHECK(p::encode_command(back) == encoded);
}

void check_reply(std::string_view text) {
  const auto r = MEMCUDA_FUZZ_DECODE(p::decode_reply, text);
  if (!r || !r->tensors) return;
  MEMCUDA_FUZZ_CHECK(r->tensors->size() <= p::kMaxBatchEntries);
  MEMCUDA_FUZZ_ROUND_TRIP(*r, p::encode_reply, p::decode_reply);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text = memcuda_fuzz::as_text(data, size);
  check_command(text);
  check_reply(text);
  return 0;
}

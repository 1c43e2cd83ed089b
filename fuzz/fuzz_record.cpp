// libFuzzer target: a tensor Hash as HGETALL returns it (decode_record).
//
// Input format (every byte string is a valid input, so no execution is
// wasted; docs/fuzzing.md has examples):
//   - one Hash field per line ('\n'); a final empty line is ignored;
//   - "key=value", split at the first '='; a line without '=' is a field
//     with an empty value;
//   - in keys and values "\xNN" (two hex digits) is the byte 0xNN and "\\"
//     is one backslash; any other backslash stays as it is. Binary values
//     (the 64-byte ipc_handle, NULs included) are written with \xNN; raw
//     bytes other than '\n' are taken as they are.
//
// Checks:
//  - decode_record throws nothing but ProtocolError, always bad_record;
//  - an accepted record satisfies what docs/protocol.md promises (a valid
//    name, bytes == byte_size(dtype, shape), device range per backend,
//    64-byte cuda handle once not pending, counts >= 0, offset + bytes <=
//    alloc_bytes);
//  - encode_record of it decodes back to an equal TensorInfo and encoding is
//    a fixed point;
//  - decoding does not depend on the order of the fields (HGETALL gives no
//    order): the reversed Hash is accepted or rejected alike, to the same
//    TensorInfo.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "fuzz_support.hpp"
#include "hash_lines.hpp"
#include "memcuda/error.hpp"
#include "memcuda/protocol.hpp"

namespace {

namespace p = memcuda::protocol;

// nullopt when rejected, with the reason in *why.
std::optional<memcuda::TensorInfo> decode(const p::Fields& fields, const char* what,
                                          std::string* why = nullptr) {
  try {
    return p::decode_record(fields);
  } catch (const memcuda::ProtocolError& e) {
    MEMCUDA_FUZZ_CHECK(e.errc() == memcuda::ProtocolErrc::bad_record, e.what());
    MEMCUDA_FUZZ_CHECK(*e.what() != '\0', "empty ProtocolError message");
    if (why) *why = e.what();
    return std::nullopt;
  } catch (...) {
    MEMCUDA_FUZZ_UNEXPECTED(what);
  }
}

void check_promises(const memcuda::TensorInfo& t) {
  MEMCUDA_FUZZ_CHECK(memcuda::is_valid_name(t.name));
  std::uint64_t bytes = 0;
  try {
    bytes = memcuda::byte_size(t.dtype, t.shape);
  } catch (...) {
    MEMCUDA_FUZZ_UNEXPECTED("byte_size of an accepted record");
  }
  MEMCUDA_FUZZ_CHECK(t.bytes == bytes);
  MEMCUDA_FUZZ_CHECK_STRIDES(t.shape);
  if (t.backend == memcuda::BackendKind::host) MEMCUDA_FUZZ_CHECK(t.device == -1);
  if (t.backend == memcuda::BackendKind::cuda)
    MEMCUDA_FUZZ_CHECK(t.device >= 0 && t.device <= p::kMaxDevice);
  if (t.state != memcuda::TensorState::pending) {
    if (t.backend == memcuda::BackendKind::cuda)
      MEMCUDA_FUZZ_CHECK(t.ipc_handle.size() == memcuda::kIpcHandleBytes);
    else
      MEMCUDA_FUZZ_CHECK(!t.ipc_handle.empty());
  }
  MEMCUDA_FUZZ_CHECK(t.event_handle.empty() || t.event_handle.size() == memcuda::kIpcHandleBytes);
  MEMCUDA_FUZZ_CHECK(t.refcount >= 0);
  for (const auto& [holder, count] : t.holders) MEMCUDA_FUZZ_CHECK(!holder.empty() && count >= 0);
}

std::string dump(const p::Fields& fields) {
  std::string s;
  for (const auto& [k, v] : fields)
    s += memcuda_fuzz::shown(k) + "=" + memcuda_fuzz::shown(v) + "\n  ";
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  p::Fields fields = memcuda_fuzz::parse_fields(memcuda_fuzz::as_text(data, size));
  std::optional<memcuda::TensorInfo> t = decode(fields, "decode_record");

  p::Fields reversed(fields.rbegin(), fields.rend());
  std::optional<memcuda::TensorInfo> r = decode(reversed, "decode_record (fields reversed)");
  MEMCUDA_FUZZ_CHECK(t == r, "the order of the fields changed the outcome:\n  " + dump(fields));
  if (!t) return 0;

  check_promises(*t);
  p::Fields encoded = p::encode_record(*t);
  std::string why;
  std::optional<memcuda::TensorInfo> back =
      decode(encoded, "decode_record of encode_record's output", &why);
  MEMCUDA_FUZZ_CHECK(back.has_value(), "encode_record wrote a Hash that decode_record rejects (" +
                                           why + "):\n  " + dump(encoded));
  MEMCUDA_FUZZ_CHECK(*back == *t, dump(encoded));
  MEMCUDA_FUZZ_CHECK(p::encode_record(*back) == encoded);
  return 0;
}

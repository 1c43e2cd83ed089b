// libFuzzer target: the blob of a state-dict record (protocol/dict_blob.hpp),
// which every process that opens a dict through its record parses, then
// decodes each member's desc as DictClient::open does.
//
// Input format: the bytes are the blob (every byte string is a valid input).
//
// Checks:
//  - parse_dict_blob throws nothing but ProtocolError(bad_record);
//  - an accepted blob is canonical: encode_dict_blob of what it parsed gives
//    the same bytes back;
//  - decode_desc of each member (with the member's own generation, epoch and
//    event fields) throws nothing but ProtocolError(bad_record).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.hpp"
#include "memcuda/error.hpp"
#include "memcuda/protocol/dict_blob.hpp"
#include "memcuda/protocol/record_desc.hpp"

namespace {

namespace p = memcuda::protocol;

template <class F>
bool bad_record_only(F&& f, const char* what) {
  try {
    f();
    return true;
  } catch (const memcuda::ProtocolError& e) {
    MEMCUDA_FUZZ_CHECK(e.errc() == memcuda::ProtocolErrc::bad_record, e.what());
    MEMCUDA_FUZZ_CHECK(*e.what() != '\0', "empty ProtocolError message");
    return false;
  } catch (...) {
    MEMCUDA_FUZZ_UNEXPECTED(what);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view in = memcuda_fuzz::as_text(data, size);
  std::vector<p::DictBlobEntry> members;
  if (!bad_record_only([&] { members = p::parse_dict_blob(in); }, "parse_dict_blob")) return 0;
  MEMCUDA_FUZZ_CHECK(p::encode_dict_blob(members) == in, "an accepted blob is not canonical: " + memcuda_fuzz::shown(in));
  for (const auto& m : members) {
    p::LiveFields live;
    live.generation = m.generation;
    live.epoch = m.epoch;
    if (!m.event_handle.empty()) live.event_handle = m.event_handle;
    if (!m.event_version.empty()) live.event_version = m.event_version;
    (void)bad_record_only([&] { (void)p::decode_desc(m.desc, live); }, "decode_desc of a blob member");
  }
  return 0;
}

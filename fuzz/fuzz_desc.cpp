// libFuzzer target: the desc field of a tensor Hash (protocol/record_desc.hpp)
// against decode_record, the reference, and the record reader both share.
//
// Input format (every byte string is a valid input):
//   - starting with "M1": the bytes are a desc, as the acquire_many script
//     hands it over; the fields that change are taken as a batch get reads
//     them (state ready, refcount 1, no event) with the desc's own epoch and
//     generation;
//   - anything else: Hash fields in fuzz_record's format (one "key=value"
//     per line, \xNN escapes), decoded as an HGETALL is.
//
// Checks:
//  - parse_desc, decode_desc and RecordReader throw nothing but
//    ProtocolError(bad_record);
//  - a parsed desc decodes exactly as decode_record decodes the same fields
//    (accepted alike, to the same TensorInfo; rejected alike);
//  - a desc that names another generation or epoch is refused;
//  - encode_desc of an accepted record parses and decodes back to it.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "fuzz_support.hpp"
#include "hash_lines.hpp"
#include "memcuda/error.hpp"
#include "memcuda/protocol.hpp"
#include "memcuda/protocol/record_desc.hpp"

namespace {

namespace p = memcuda::protocol;

// Runs `f`; nullopt when it threw ProtocolError(bad_record), which is the
// only exception allowed.
template <class F>
auto guarded(F&& f, const char* what) -> std::optional<decltype(f())> {
  try {
    return f();
  } catch (const memcuda::ProtocolError& e) {
    MEMCUDA_FUZZ_CHECK(e.errc() == memcuda::ProtocolErrc::bad_record, e.what());
    MEMCUDA_FUZZ_CHECK(*e.what() != '\0', "empty ProtocolError message");
    return std::nullopt;
  } catch (...) {
    MEMCUDA_FUZZ_UNEXPECTED(what);
  }
}

std::optional<memcuda::TensorInfo> reference(const p::Fields& f) {
  return guarded([&] { return p::decode_record(f); }, "decode_record");
}

void fuzz_desc(std::string_view d) {
  auto view = guarded([&] { return p::parse_desc(d); }, "parse_desc");
  if (!view) return;
  p::LiveFields live;
  live.refcount = 1;
  live.event_handle = std::string_view();
  live.event_version = std::string_view("0");
  live.generation = view->generation;
  live.epoch = view->epoch;
  auto fast = guarded([&] { return p::decode_desc(d, live); }, "decode_desc");

  // The same fields as decode_record takes them.
  p::Fields f;
  for (std::size_t i = 0; i < p::kDescFields.size(); ++i)
    if (!view->fields[i].empty()) f.emplace_back(std::string(p::kDescFields[i]), std::string(view->fields[i]));
  for (const auto& [k, v] : view->extras) f.emplace_back(std::string(k), std::string(v));
  f.emplace_back("epoch", std::string(view->epoch));
  f.emplace_back("generation", std::string(view->generation));
  f.emplace_back("state", "ready");
  f.emplace_back("refcount", "1");
  f.emplace_back("event_handle", "");
  f.emplace_back("event_version", "0");
  auto slow = reference(f);
  MEMCUDA_FUZZ_CHECK(fast == slow, "decode_desc and decode_record disagree on " + memcuda_fuzz::shown(d));

  // Another generation, or epoch: refused.
  const std::string other_gen = std::string(view->generation) + "0";
  p::LiveFields stale = live;
  stale.generation = other_gen;
  MEMCUDA_FUZZ_CHECK(!guarded([&] { return p::decode_desc(d, stale); }, "decode_desc (stale)"));
  stale = live;
  stale.epoch = other_gen;
  MEMCUDA_FUZZ_CHECK(!guarded([&] { return p::decode_desc(d, stale); }, "decode_desc (stale epoch)"));

  if (!fast) return;
  const std::string again = p::encode_desc(*fast);
  std::string gen = std::to_string(fast->generation), epoch = std::to_string(fast->epoch);
  p::LiveFields l2 = live;
  l2.generation = gen;
  l2.epoch = epoch;
  auto back = guarded([&] { return p::decode_desc(again, l2); }, "decode_desc of encode_desc's output");
  MEMCUDA_FUZZ_CHECK(back.has_value(), "encode_desc wrote a desc decode_desc rejects: " + memcuda_fuzz::shown(again));
  MEMCUDA_FUZZ_CHECK(*back == *fast, memcuda_fuzz::shown(again));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view in = memcuda_fuzz::as_text(data, size);
  if (in.starts_with(p::kDescVersion)) {
    fuzz_desc(in);
    return 0;
  }
  const p::Fields fields = memcuda_fuzz::parse_fields(in);
  (void)reference(fields);
  return 0;
}

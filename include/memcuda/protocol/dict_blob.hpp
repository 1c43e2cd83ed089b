// The blob of a state-dict record (docs/protocol.md, "State-dict records"):
// per member, in name order, six elements "<len>:<bytes>" (name, desc,
// generation, epoch, event_handle, event_version; the last two empty when
// none). Written by the dict link script; read by any process that opens
// the dict, so it is untrusted input: parse_dict_blob accepts only the
// canonical form (decimal lengths without leading zeros, within the blob,
// whole members) and throws ProtocolError(bad_record) otherwise.
#pragma once

#include "memcuda/config.hpp"

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace protocol {

struct DictBlobEntry {
  std::string_view name, desc, generation, epoch, event_handle, event_version;
  friend bool operator==(const DictBlobEntry&, const DictBlobEntry&) = default;
};

// Views into `blob`, which must outlive them.
inline std::vector<DictBlobEntry> parse_dict_blob(std::string_view blob) {
  auto bad = [](const std::string& why) {
    throw ProtocolError(ProtocolErrc::bad_record, "state dict record: blob " + why);
  };
  auto next = [&](std::string_view& b) {
    const std::size_t colon = b.find(':');
    if (colon == std::string_view::npos || colon == 0 || colon > 10) bad("has an element without a length");
    if (colon > 1 && b[0] == '0') bad("has a length with a leading zero");
    std::size_t len = 0;
    for (std::size_t i = 0; i < colon; ++i) {
      if (b[i] < '0' || b[i] > '9') bad("has a length that is not decimal");
      len = len * 10 + static_cast<std::size_t>(b[i] - '0');
    }
    if (len > b.size() - colon - 1) bad("has an element longer than the rest of it");
    const std::string_view v = b.substr(colon + 1, len);
    b.remove_prefix(colon + 1 + len);
    return v;
  };
  std::vector<DictBlobEntry> out;
  while (!blob.empty()) {
    DictBlobEntry e;
    e.name = next(blob);
    if (blob.empty()) bad("ends inside a member");
    e.desc = next(blob);
    if (blob.empty()) bad("ends inside a member");
    e.generation = next(blob);
    if (blob.empty()) bad("ends inside a member");
    e.epoch = next(blob);
    if (blob.empty()) bad("ends inside a member");
    e.event_handle = next(blob);
    if (blob.empty()) bad("ends inside a member");
    e.event_version = next(blob);
    out.push_back(e);
  }
  return out;
}

// What the link script writes for these members (tests and tools).
inline std::string encode_dict_blob(const std::vector<DictBlobEntry>& entries) {
  std::string out;
  auto put = [&](std::string_view s) {
    out += std::to_string(s.size());
    out += ':';
    out += s;
  };
  for (const auto& e : entries) {
    put(e.name);
    put(e.desc);
    put(e.generation);
    put(e.epoch);
    put(e.event_handle);
    put(e.event_version);
  }
  return out;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::protocol

// The Hash input format of fuzz_record and fuzz_desc: one field per line
// ('\n'; a final empty line is ignored), "key=value" split at the first
// '=' (a line without '=' is a field with an empty value), and in keys and
// values "\xNN" is the byte 0xNN and "\\" one backslash (any other
// backslash stays). Every byte string is a valid input.
#pragma once

#include <string>
#include <string_view>

#include "memcuda/protocol/record.hpp"

namespace memcuda_fuzz {

inline int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

inline std::string unescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      if (s[i + 1] == '\\') {
        out += '\\';
        ++i;
        continue;
      }
      if (s[i + 1] == 'x' && i + 3 < s.size()) {
        int hi = hex_digit(s[i + 2]);
        int lo = hex_digit(s[i + 3]);
        if (hi >= 0 && lo >= 0) {
          out += static_cast<char>(hi * 16 + lo);
          i += 3;
          continue;
        }
      }
    }
    out += s[i];
  }
  return out;
}

inline memcuda::protocol::Fields parse_fields(std::string_view in) {
  memcuda::protocol::Fields fields;
  while (!in.empty()) {
    std::size_t nl = in.find('\n');
    std::string_view line = in.substr(0, nl);
    in = nl == std::string_view::npos ? std::string_view{} : in.substr(nl + 1);
    std::size_t eq = line.find('=');
    if (eq == std::string_view::npos)
      fields.emplace_back(unescape(line), std::string());
    else
      fields.emplace_back(unescape(line.substr(0, eq)), unescape(line.substr(eq + 1)));
  }
  return fields;
}

}  // namespace memcuda_fuzz

// Small string checks the tests share, and the "key=value" fields of the
// line protocol the helper programs answer in (tests/worker.cpp,
// tests/soak_worker.cpp).
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace memcuda::test {

inline bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
inline bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// The value of the whitespace-separated token "key=value" in `line`; empty
// when there is none.
inline std::string field(const std::string& line, const std::string& key) {
  std::istringstream in(line);
  std::string tok;
  while (in >> tok)
    if (starts_with(tok, key + "=")) return tok.substr(key.size() + 1);
  return {};
}

}  // namespace memcuda::test

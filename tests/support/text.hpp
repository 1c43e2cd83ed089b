// Small string checks the tests share (an InvalidArgument's message too), and the "key=value" fields of the
// line protocol the helper programs answer in (tests/worker.cpp,
// tests/soak_worker.cpp).
#pragma once

#include <sstream>
#include <string>
#include <string_view>

#include "memcuda/error.hpp"

namespace memcuda::test {

inline bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
inline bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// The message of the InvalidArgument `f` throws, or "(no InvalidArgument)".
template <class F>
std::string invalid_argument_of(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument)";
}

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

// Which names a batch call takes: a list, a prefix or a glob, as the
// batch scripts read them.
#pragma once

#include "memcuda/config.hpp"

#include <cctype>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/error.hpp"
#include "memcuda/detail/store/name_index.hpp"
#include "memcuda/shape.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// Which names a batch acts on: the given ones, every name starting with a
// prefix, or every name a glob matches (as fnmatch without flags, what
// list() uses: `*` also matches `/`).
struct Selection {
  std::string mode;  // "names", "prefix" or "pattern" (the scripts' modes)
  std::string arg;   // the prefix, or the glob as an anchored Lua pattern
  std::vector<std::string> names;
  std::string literal;  // "pattern": the glob's literal prefix (only names under it are read)

  static Selection of(const std::vector<std::string>& names) {
    Selection s{"names", "", {}, {}};
    std::set<std::string> seen;
    for (const auto& n : names) {
      ::memcuda::validate_name(n);
      if (seen.insert(n).second) s.names.push_back(n);  // one reference per name, even if named twice
    }
    return s;
  }
  static Selection prefix(std::string_view p) { return {"prefix", std::string(p), {}, {}}; }
  static Selection glob(std::string_view g) {
    return {"pattern", glob_to_lua(g), {}, std::string(glob_literal_prefix(g))};
  }

  // A glob over tensor names (`*`, `?`, `[...]`, `[!...]`) as an anchored
  // Lua pattern. Names use only A-Z a-z 0-9 . _ : / -, so anything else is
  // refused (InvalidArgument) rather than guessed at.
  static std::string glob_to_lua(std::string_view g) {
    auto name_char = [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' || c == '/' ||
             c == '-';
    };
    auto bad = [&](std::size_t i) {
      throw InvalidArgument("glob '" + std::string(g) + "': character '" + std::string(1, g[i]) + "' at offset " +
                            std::to_string(i) + " is not allowed (use * ? [..] [!..] and name characters)");
    };
    std::string out = "^";
    for (std::size_t i = 0; i < g.size(); ++i) {
      const char c = g[i];
      if (c == '*') {
        out += ".*";
      } else if (c == '?') {
        out += '.';
      } else if (c == '[') {
        const std::size_t close = g.find(']', i + 1);
        if (close == std::string_view::npos) throw InvalidArgument("glob '" + std::string(g) + "': '[' is not closed");
        out += '[';
        std::size_t j = i + 1;
        if (j < close && (g[j] == '!' || g[j] == '^')) {
          out += '^';
          ++j;
        }
        if (j == close) throw InvalidArgument("glob '" + std::string(g) + "': empty '[]'");
        for (; j < close; ++j) {
          if (!name_char(g[j])) bad(j);
          if (!std::isalnum(static_cast<unsigned char>(g[j])) && g[j] != '-') out += '%';
          out += g[j];
        }
        out += ']';
        i = close;
      } else if (name_char(c)) {
        if (!std::isalnum(static_cast<unsigned char>(c))) out += '%';
        out += c;
      } else {
        bad(i);
      }
    }
    return out + "$";
  }
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

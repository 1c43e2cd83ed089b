// Command-line parsing for the memcuda tool: global options anywhere on the
// line, one command, then the command's own options and operands.
//
//   memcuda [--url URL] [--namespace NS] [--json] COMMAND [OPTIONS] [ARGS]
//
// Options are GNU-style long options, "--name VALUE" or "--name=VALUE"; "--"
// ends the options. Anything the command does not declare is a UsageError
// (exit code 1), so a typo never passes silently.
#pragma once

#include <charconv>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace memcuda::cli {

// The command line is wrong: unknown command or option, missing or
// malformed value. Exit code 1.
class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& what) : std::runtime_error(what) {}
};

struct OptionSpec {
  std::string_view name;  // with the leading "--"
  bool takes_value = false;
};

// Options every command accepts.
inline constexpr OptionSpec kGlobalOptions[] = {{"--url", true},          {"--namespace", true},
                                                {"--json", false},        {"--help", false},
                                                {"-h", false},            {"--version", false},
                                                {"--runtime-dir", true},  {"--allowed-uids", true},
                                                {"--allowed-gids", true}};

struct ParsedArgs {
  std::string command;  // "" when none was given
  std::vector<std::string> operands;
  std::map<std::string, std::string, std::less<>> options;  // "--name" -> value ("" for flags)

  bool has(std::string_view name) const { return options.find(name) != options.end(); }
  std::optional<std::string> get(std::string_view name) const {
    auto it = options.find(name);
    if (it == options.end()) return std::nullopt;
    return it->second;
  }
};

namespace detail {

inline const OptionSpec* find_spec(std::string_view name, const std::vector<OptionSpec>& specs) {
  for (const auto& s : kGlobalOptions)
    if (s.name == name) return &s;
  for (const auto& s : specs)
    if (s.name == name) return &s;
  return nullptr;
}

}  // namespace detail

// Parses argv[1..]. `command_options` maps each command to the options it
// declares on top of the global ones; a command absent from the map is a
// UsageError. Repeating an option is a UsageError too (which of two --url
// values was meant?).
inline ParsedArgs parse_args(const std::vector<std::string>& argv,
                             const std::map<std::string, std::vector<OptionSpec>, std::less<>>& command_options) {
  ParsedArgs out;
  const std::vector<OptionSpec> none;
  // The command is the first operand. Global options may come before it, so
  // their values must be skipped while looking for it.
  std::size_t i = 0;
  for (; i < argv.size(); ++i) {
    std::string_view a = argv[i];
    if (a == "--") break;
    if (!a.starts_with("-") || a == "-") {
      out.command = std::string(a);
      break;
    }
    auto eq = a.find('=');
    const OptionSpec* s = detail::find_spec(a.substr(0, eq), none);
    if (s && s->takes_value && eq == std::string_view::npos) ++i;
  }
  if (i + 1 < argv.size() && argv[i] == "--") out.command = argv[i + 1];
  const std::vector<OptionSpec>* specs = &none;
  if (!out.command.empty()) {
    auto it = command_options.find(out.command);
    if (it == command_options.end())
      throw UsageError("unknown command '" + out.command + "' (see memcuda --help for the commands)");
    specs = &it->second;
  }

  bool command_seen = false;
  bool options_done = false;
  for (std::size_t k = 0; k < argv.size(); ++k) {
    const std::string& a = argv[k];
    if (!options_done && a == "--") {
      options_done = true;
      continue;
    }
    if (options_done || !a.starts_with("-") || a == "-") {
      if (!command_seen && a == out.command)
        command_seen = true;
      else
        out.operands.push_back(a);
      continue;
    }
    auto eq = a.find('=');
    std::string name = a.substr(0, eq);
    const OptionSpec* s = detail::find_spec(name, *specs);
    if (!s) {
      std::string where = out.command.empty() ? "memcuda" : "'" + out.command + "'";
      std::string help = out.command.empty() ? "memcuda --help" : "memcuda " + out.command + " --help";
      throw UsageError("unknown option '" + name + "' for " + where + " (see " + help + ")");
    }
    std::string value;
    if (s->takes_value) {
      if (eq != std::string::npos) {
        value = a.substr(eq + 1);
      } else if (k + 1 < argv.size()) {
        value = argv[++k];
      } else {
        throw UsageError("option '" + name + "' needs a value");
      }
    } else if (eq != std::string::npos) {
      throw UsageError("option '" + name + "' takes no value");
    }
    if (name == "-h") name = "--help";
    if (!out.options.emplace(name, std::move(value)).second) throw UsageError("option '" + name + "' given twice");
  }
  return out;
}

// An integer option value in [lo, hi]; UsageError naming the option otherwise.
inline std::int64_t parse_int_option(std::string_view option, std::string_view text, std::int64_t lo, std::int64_t hi) {
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec == std::errc::invalid_argument || p != text.data() + text.size())
    throw UsageError("option '" + std::string(option) + "': '" + std::string(text) + "' is not an integer");
  if (ec == std::errc::result_out_of_range || v < lo || v > hi)
    throw UsageError("option '" + std::string(option) + "': " + std::string(text) + " is out of range [" +
                     std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

}  // namespace memcuda::cli

// ProcessOptions: the settings of what mem-cuda keeps once per process
// (Process, process.hpp), and the MEMCUDA_* variables that set them.
#pragma once

#include "memcuda/config.hpp"

#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3 };

struct ProcessOptions {
  // As RegistryOptions' fields of the same names (FdTable, ProcessCache).
  int fd_prefetch = 64;
  std::chrono::milliseconds fd_park_window{1500};
  std::size_t import_cache = 16;
  // Fixed at first use (the first log line, the first fault point).
  LogLevel log = LogLevel::warn;
  std::string faults;  // fault points armed at start (detail/base/fault.hpp)

  // MEMCUDA_FD_PREFETCH, MEMCUDA_FD_PARK_MS, MEMCUDA_IMPORT_CACHE,
  // MEMCUDA_LOG, MEMCUDA_FAULTS. Throws InvalidArgument naming the variable
  // for a bad count or duration; an unknown log level is warn.
  static ProcessOptions from_env();
};

// The variable's value; nullopt when unset or empty (the default stays).
inline std::optional<std::string_view> env_value(const char* name) {
  const char* e = std::getenv(name);
  if (!e || !*e) return std::nullopt;
  return std::string_view(e);
}
[[noreturn]] inline void bad_env(const char* name, std::string_view value, std::string_view expected) {
  throw InvalidArgument(std::string(name) + " is '" + std::string(value) + "'; expected " + std::string(expected) +
                        " (fix or unset the variable)");
}

inline ProcessOptions ProcessOptions::from_env() {
  ProcessOptions o;
  if (const char* e = std::getenv("MEMCUDA_LOG")) {
    const std::string_view v(e);
    o.log = v == "error"   ? LogLevel::error
            : v == "info"  ? LogLevel::info
            : v == "debug" ? LogLevel::debug
                           : LogLevel::warn;
  }
  if (const char* e = std::getenv("MEMCUDA_FAULTS")) o.faults = e;
  auto bounded = [](const char* name, std::string_view v, long long hi, const char* what) {
    long long n = -1;
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (ec != std::errc() || p != v.data() + v.size() || n < 0 || n > hi) bad_env(name, v, what);
    return n;
  };
  if (auto v = env_value("MEMCUDA_FD_PREFETCH"))
    o.fd_prefetch = static_cast<int>(bounded("MEMCUDA_FD_PREFETCH", *v, 253, "a count of fds, 0..253"));
  if (auto v = env_value("MEMCUDA_IMPORT_CACHE"))
    o.import_cache =
        static_cast<std::size_t>(bounded("MEMCUDA_IMPORT_CACHE", *v, 65536, "a count of mappings, 0..65536"));
  if (auto v = env_value("MEMCUDA_FD_PARK_MS"))
    o.fd_park_window = std::chrono::milliseconds(
        bounded("MEMCUDA_FD_PARK_MS", *v, 60000, "an integer number of milliseconds, 0..60000"));
  return o;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

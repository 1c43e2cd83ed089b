// Minimal logging for what cannot throw (destructors, the control thread).
// MEMCUDA_LOG=error|warn|info|debug sets the level (default warn). Lines go
// to stderr, one write each, so processes sharing a terminal do not interleave.
#pragma once

#include "memcuda/config.hpp"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

MEMCUDA_NAMESPACE_BEGIN namespace detail {

enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3 };

inline LogLevel log_level() {
  static const LogLevel level = [] {
    const char* e = std::getenv("MEMCUDA_LOG");
    if (!e) return LogLevel::warn;
    if (!std::strcmp(e, "error")) return LogLevel::error;
    if (!std::strcmp(e, "info")) return LogLevel::info;
    if (!std::strcmp(e, "debug")) return LogLevel::debug;
    return LogLevel::warn;
  }();
  return level;
}

inline void log(LogLevel lvl, std::string_view msg) noexcept {
  if (lvl > log_level()) return;
  static constexpr const char* names[] = {"error", "warn", "info", "debug"};
  try {
    std::string line = "memcuda[" + std::to_string(::getpid()) + "] " +
                       names[static_cast<int>(lvl)] + ": " + std::string(msg) + "\n";
    ssize_t r = ::write(2, line.data(), line.size());
    (void)r;
  } catch (...) {
  }
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

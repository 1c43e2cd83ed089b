// Minimal logging for what cannot throw (destructors, the control thread).
// MEMCUDA_LOG=error|warn|info|debug sets the level (default warn;
// ProcessOptions::log). Lines go
// to stderr, one write each, so processes sharing a terminal do not interleave.
#pragma once

#include "memcuda/config.hpp"

#include <unistd.h>

#include <string>
#include <string_view>

#include "memcuda/detail/process/process_options.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

inline LogLevel log_level() {
  // Its own static, not the process object's: lines are logged while that
  // object is made and destroyed. Read once; a bad MEMCUDA_FD_* or
  // MEMCUDA_IMPORT_CACHE (the first registry throws for it) leaves warn.
  static const LogLevel level = [] {
    try {
      return ProcessOptions::from_env().log;
    } catch (...) {
      return LogLevel::warn;
    }
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

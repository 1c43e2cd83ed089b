// A Lua script run by EVALSHA, loaded when the server answers NOSCRIPT.
#pragma once

#include "memcuda/config.hpp"

#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memcuda/error.hpp"
#include "memcuda/redis/args.hpp"
#include "memcuda/redis/connection.hpp"
#include "memcuda/redis/reply.hpp"
#include "memcuda/redis/sha1.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace redis {

// A Lua script run by EVALSHA; loaded on first NOSCRIPT (a new server, a
// Redis restart or SCRIPT FLUSH empties the script cache). Keys and
// arguments are passed as data, never spliced into the source, so names are
// binary-safe. The SHA-1 is computed at construction, so a const Script may
// be shared between threads (each with its own Connection).
class Script {
 public:
  explicit Script(std::string source) : source_(std::move(source)), sha_(detail::sha1_hex(source_)) {}

  const std::string& source() const noexcept { return source_; }
  // The SHA-1 Redis knows the script by (lowercase hex).
  const std::string& sha() const noexcept { return sha_; }

  // Runs the script; its error replies throw ReplyError, I/O failures as
  // Connection::command. After NOSCRIPT (told by the reply's error code,
  // ReplyError::prefix()) the script is loaded and run once more: NOSCRIPT
  // means it did not run.
  Reply eval(Connection& c, std::span<const Arg> keys, std::span<const Arg> args) const {
    std::vector<Arg> argv;
    argv.reserve(3 + keys.size() + args.size());
    std::string nkeys = std::to_string(keys.size());
    argv.emplace_back("EVALSHA");
    argv.emplace_back(std::string_view(sha_));
    argv.emplace_back(std::string_view(nkeys));
    // Views of the caller's arguments, which outlive this call: copying an
    // Arg copies the string it owns (a create passes some forty).
    for (const auto& k : keys) argv.emplace_back(k.view());
    for (const auto& a : args) argv.emplace_back(a.view());
    try {
      return c.command(std::span<const Arg>(argv));
    } catch (const ReplyError& e) {
      if (e.prefix() != "NOSCRIPT") throw;
    }
    Reply loaded = c.command({"SCRIPT", "LOAD", source_});
    if (loaded.str() != sha_)
      throw InternalError("Redis loaded the script as " + std::string(loaded.str()) + ", expected " + sha_);
    return c.command(std::span<const Arg>(argv));
  }
  Reply eval(Connection& c, std::initializer_list<Arg> keys, std::initializer_list<Arg> args) const {
    return eval(c, std::span<const Arg>(keys.begin(), keys.size()),
                std::span<const Arg>(args.begin(), args.size()));
  }

 private:
  std::string source_;
  std::string sha_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::redis

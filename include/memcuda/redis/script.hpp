// A Lua script run by EVALSHA, loaded when the server answers NOSCRIPT.
#pragma once

#include "memcuda/config.hpp"

#include <exception>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memcuda/error.hpp"
#include "memcuda/redis/args.hpp"
#include "memcuda/redis/connection.hpp"
#include "memcuda/redis/errors.hpp"
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
    return run(c, argv);
  }
  Reply eval(Connection& c, std::initializer_list<Arg> keys, std::initializer_list<Arg> args) const {
    return eval(c, std::span<const Arg>(keys.begin(), keys.size()),
                std::span<const Arg>(args.begin(), args.size()));
  }

  // The script's EVALSHA as a command of a pipeline (eval_each).
  Command command(std::span<const Arg> keys, std::span<const Arg> args) const {
    Command cmd{"EVALSHA", sha_, std::to_string(keys.size())};
    cmd.reserve(3 + keys.size() + args.size());
    for (const auto& k : keys) cmd.emplace_back(k.view());
    for (const auto& a : args) cmd.emplace_back(a.view());
    return cmd;
  }

  // Runs `cmds` (each this script's command()) as one pipeline: one round
  // trip where hundreds paid one each. Those answered NOSCRIPT (a new
  // server, a flushed cache) did not run: the first of them runs by itself,
  // which loads the script, the others as a second pipeline, and any still
  // NOSCRIPT there (another cluster node) by itself. Error replies as
  // Connection::pipeline: in `errors`, index-aligned, when given (check it,
  // not the reply, which is empty for one run by itself), else the first
  // is thrown after every command ran. I/O failures throw.
  std::vector<Reply> eval_each(Connection& c, const std::vector<Command>& cmds,
                               std::vector<std::exception_ptr>* errors = nullptr) const {
    std::vector<std::exception_ptr> errs;
    std::vector<Reply> out = cmds.empty() ? std::vector<Reply>{} : c.pipeline(cmds, &errs);
    errs.resize(out.size());
    auto noscript = [&](std::size_t i) { return errs[i] && error_prefix(out[i].str()) == "NOSCRIPT"; };
    auto alone = [&](std::size_t i) {
      std::vector<Arg> argv(cmds[i].begin(), cmds[i].end());
      errs[i] = nullptr;
      try {
        out[i] = run(c, argv);
      } catch (const ReplyError&) {
        out[i] = Reply{};
        errs[i] = std::current_exception();
      }
    };
    std::vector<std::size_t> again;
    for (std::size_t i = 0; i < out.size(); ++i)
      if (noscript(i)) again.push_back(i);
    if (!again.empty()) {
      alone(again.front());
      std::vector<Command> rest;
      for (std::size_t j = 1; j < again.size(); ++j) rest.push_back(cmds[again[j]]);
      std::vector<std::exception_ptr> rest_errs;
      auto rest_out = rest.empty() ? std::vector<Reply>{} : c.pipeline(rest, &rest_errs);
      for (std::size_t j = 1; j < again.size(); ++j) {
        const std::size_t i = again[j];
        out[i] = std::move(rest_out[j - 1]);
        errs[i] = rest_errs[j - 1];
        if (noscript(i)) alone(i);
      }
    }
    if (errors) {
      *errors = std::move(errs);
    } else {
      for (const auto& e : errs)
        if (e) std::rethrow_exception(e);
    }
    return out;
  }

 private:
  // Runs an EVALSHA, loading the script once on NOSCRIPT.
  Reply run(Connection& c, std::span<const Arg> argv) const {
    try {
      return c.command(argv);
    } catch (const ReplyError& e) {
      if (e.prefix() != "NOSCRIPT") throw;
    }
    Reply loaded = c.command({"SCRIPT", "LOAD", source_});
    if (loaded.str() != sha_)
      throw InternalError("Redis loaded the script as " + std::string(loaded.str()) + ", expected " + sha_);
    return c.command(argv);
  }

  std::string source_;
  std::string sha_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::redis

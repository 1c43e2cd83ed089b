// memcuda: the command-line tool of mem-cuda (docs/cli.md).
//
// Every command but `serve` opens its TensorRegistry with control_thread =
// false: a command-line tool must never become the allocator of record by
// accident, since the memory it allocated would die with it a moment later.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "cli/args.hpp"
#include "cli/exit_codes.hpp"
#include "cli/format.hpp"
#include "cli/prometheus.hpp"
#include "memcuda/detail/base/node.hpp"
#include "memcuda/detail/fd/fd_access.hpp"
#include "memcuda/memcuda.hpp"

namespace memcuda::cli {
namespace {

namespace json = boost::json;

// The commands, one group per file, included here inside this namespace (the
// tool stays one translation unit); later files use what earlier ones define:
//   help.hpp             the command table: synopses, help texts, options
//   command_context.hpp  Context and the helpers every command shares
//   inspect_commands.hpp ls, info, cat
//   create_command.hpp   create, and the options create-many shares
//   batch_commands.hpp   create-many, get-many, rm
//   gc_commands.hpp      gc, quarantine
//   status_commands.hpp  leader, stats
//   serve_command.hpp    serve
// What follows here: dispatch, and run(), which reads the global options and
// turns every failure into a message and an exit code (exit_codes.hpp).
#include "cli/help.hpp"
#include "cli/command_context.hpp"
#include "cli/inspect_commands.hpp"
#include "cli/create_command.hpp"
#include "cli/batch_commands.hpp"
#include "cli/gc_commands.hpp"
#include "cli/status_commands.hpp"
#include "cli/serve_command.hpp"

// ---- main -----------------------------------------------------------------

int dispatch(Context& c) {
  const std::string& cmd = c.args.command;
  if (cmd == "ls") return cmd_ls(c);
  if (cmd == "info") return cmd_info(c);
  if (cmd == "rm") return cmd_rm(c);
  if (cmd == "gc") return cmd_gc(c);
  if (cmd == "quarantine") return cmd_quarantine(c);
  if (cmd == "leader") return cmd_leader(c);
  if (cmd == "stats") return cmd_stats(c);
  if (cmd == "serve") return cmd_serve(c);
  if (cmd == "create") return cmd_create(c);
  if (cmd == "cat") return cmd_cat(c);
  if (cmd == "get-many") return cmd_get_many(c);
  if (cmd == "create-many") return cmd_create_many(c);
  throw UsageError("unknown command '" + cmd + "' (see memcuda --help for the commands)");
}

// What was asked, for error messages: "cat w", "rm a b".
std::string asked(const ParsedArgs& a) {
  std::string s = a.command;
  for (const auto& o : a.operands) s += " " + o;
  return s;
}

int run(const std::vector<std::string>& argv) {
  Context c;
  // Known before parsing, so that even a usage error is reported as JSON.
  c.json = std::find(argv.begin(), argv.end(), "--json") != argv.end();
  try {
    c.args = parse_args(argv, command_options());
    c.json = c.args.has("--json");
    if (c.args.has("--version")) {
      std::cout << "memcuda " << kVersionString << "\n";
      return kOk;
    }
    if (c.args.command == "help" || (c.args.command.empty() && c.args.has("--help"))) {
      const std::string topic = c.args.command == "help" && !c.args.operands.empty() ? c.args.operands[0] : "";
      if (topic.empty() || topic == "help") {
        std::cout << global_help();
      } else if (const CommandDoc* d = doc_of(topic)) {
        std::cout << command_help(*d);
      } else {
        throw UsageError("no command '" + topic + "' (see memcuda --help for the commands)");
      }
      return kOk;
    }
    if (c.args.has("--help")) {
      std::cout << command_help(*doc_of(c.args.command));
      return kOk;
    }
    if (c.args.command.empty()) {
      std::cerr << "memcuda: no command given\n\n" << global_help();
      return kUsage;
    }
    // The address: --url, else MEMCUDA_REDIS_URL, else the default. With
    // --url the variable is dropped, so a malformed one cannot get in the
    // way (RegistryOptions::from_env reads it).
    if (auto url = c.args.get("--url")) {
      ::unsetenv(redis::kUrlEnv);
      c.redis = redis::with_password_from_env(redis::parse_url(*url));
      c.url_origin = "--url";
    } else {
      const char* env = std::getenv(redis::kUrlEnv);
      c.url_origin = env && *env ? std::string(redis::kUrlEnv) : "the default";
      c.redis = redis::options_from_env();
    }
    c.name_space = c.args.get("--namespace").value_or("");
    c.runtime_dir = c.args.get("--runtime-dir");
    c.allowed_uids = c.args.get("--allowed-uids");
    c.allowed_gids = c.args.get("--allowed-gids");
    return dispatch(c);
  } catch (...) {
    Failure f = classify_current_exception();
    std::string what = asked(c.args);
    std::string msg = "memcuda: " + (what.empty() ? std::string() : what + ": ") + f.message;
    if (!f.hint.empty()) msg += "; " + f.hint;
    if (f.exit == kUnreachable && (f.code == "redis_connection" || f.code == "timeout"))
      msg += " (the address came from " + (c.url_origin.empty() ? "the default" : c.url_origin) + ")";
    std::cerr << msg << "\n";
    if (f.exit == kUsage) {
      const CommandDoc* d = doc_of(c.args.command);
      std::cerr << (d ? "usage: " + std::string(d->synopsis) + "\n" : std::string()) << "(memcuda "
                << (d ? c.args.command + " " : std::string()) << "--help for more)\n";
    }
    if (c.json) {
      json::object e{{"code", f.code}, {"message", f.message}, {"exit_code", static_cast<int>(f.exit)}};
      if (!f.hint.empty()) e["hint"] = f.hint;
      print_json(json::object{{"error", e}});
    }
    return f.exit;
  }
}

}  // namespace
}  // namespace memcuda::cli

int main(int argc, char** argv) {
  int rc = memcuda::cli::run(std::vector<std::string>(argv + 1, argv + argc));
  std::cout.flush();
  return rc;
}

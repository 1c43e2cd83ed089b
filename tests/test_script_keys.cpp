// The scripts touch only the keys they are given as KEYS (docs/protocol.md,
// "Keys a script derives"), so that a namespace can live in one Redis Cluster
// hash slot. Checked on a real server with MONITOR, which shows each command a
// script runs ("[0 lua]") right after the EVALSHA that ran it: every key such
// a command names must be one of that EVALSHA's KEYS.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/detail/store/batch_scripts.hpp"
#include "memcuda/detail/store/recovery_scripts.hpp"
#include "memcuda/memcuda.hpp"
#include "support/redis_server.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

RegistryOptions keys_opts(const test::RedisServer& srv, bool control) {
  RegistryOptions o;
  o.redis = srv.options();
  o.control_thread = control;
  o.request_timeout = 5s;
  o.default_backend = BackendKind::host;
  o.name_space = "ks";
  o.share_references = false;  // each get its own reference in Redis: each runs the acquire script
  o.release_linger = {};
  return o;
}

// The quoted arguments of one MONITOR line, still escaped as MONITOR writes
// them (keys compare equal either way), and whether a script sent it.
struct Line {
  bool lua = false;
  std::vector<std::string> args;
};
Line parse(std::string_view s) {
  Line l;
  const auto open = s.find('[');
  const auto close = s.find(']', open);
  if (open == std::string_view::npos || close == std::string_view::npos) return l;
  l.lua = s.substr(open, close - open).ends_with(" lua");
  for (std::size_t i = close; i < s.size(); ++i) {
    if (s[i] != '"') continue;
    std::string a;
    for (++i; i < s.size() && s[i] != '"'; ++i) {
      if (s[i] == '\\' && i + 1 < s.size()) a += s[i++];
      a += s[i];
    }
    l.args.push_back(std::move(a));
  }
  return l;
}

std::string upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return s;
}

template <class F>
bool eventually(F&& f, std::chrono::milliseconds limit = 10s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return f();
}

// What the scripts MONITOR showed did until `done` (called at each end
// marker the watcher sends) holds: the scripts run (SHA), the commands they
// ran, and each key one of them named outside its EVALSHA's KEYS.
struct Seen {
  std::set<std::string> shas;
  std::size_t commands = 0;
  std::vector<std::string> outside;
};
template <class Done>
Seen watch(redis::Connection& mon, redis::Connection& admin, Done&& done) {
  Seen seen;
  admin.command({"ECHO", "memcuda-script-keys-end"});
  std::vector<std::string> keys;  // the KEYS of the EVALSHA being run
  bool in_script = false;
  const auto give_up = std::chrono::steady_clock::now() + 15s;
  for (;;) {
    auto r = mon.receive(5s);
    const std::string text(r.str());
    if (text.find("memcuda-script-keys-end") != std::string::npos) {
      if (done(seen) || std::chrono::steady_clock::now() > give_up) break;
      std::this_thread::sleep_for(50ms);
      admin.command({"ECHO", "memcuda-script-keys-end"});
      continue;
    }
    Line l = parse(text);
    if (l.args.empty()) continue;
    const std::string cmd = upper(l.args[0]);
    if (!l.lua) {
      in_script = cmd == "EVALSHA" || cmd == "EVAL";
      keys.clear();
      if (in_script && l.args.size() >= 3) {
        const std::size_t n = std::stoul(l.args[2]);
        for (std::size_t i = 0; i < n && 3 + i < l.args.size(); ++i) keys.push_back(l.args[3 + i]);
        seen.shas.insert(l.args[1]);
      }
      continue;
    }
    REQUIRE(in_script);
    ++seen.commands;
    if (cmd == "PUBLISH" || cmd == "TIME" || l.args.size() < 2) continue;  // a channel, or no key
    std::vector<std::string> named{l.args[1]};
    if ((cmd == "RENAME" || cmd == "LMOVE") && l.args.size() >= 3) named.push_back(l.args[2]);
    for (const auto& k : named)
      if (std::find(keys.begin(), keys.end(), k) == keys.end()) seen.outside.push_back(cmd + " " + k);
  }
  return seen;
}

std::string lines(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& o : v) out += o + "\n";
  return out;
}

}  // namespace

TEST_CASE("create, get, batch get and release scripts touch only their KEYS", "[redis][registry][scripts]") {
  test::RedisServer srv;
  TensorRegistry leader(keys_opts(srv, true));
  TensorRegistry follower(keys_opts(srv, false));
  REQUIRE(leader.is_leader());
  auto admin = srv.connect();
  auto mon = srv.connect();
  REQUIRE(std::string(mon.command({"MONITOR"}).str()) == "OK");

  const std::string key = "ks:memcuda:tensor:k/a";
  auto refcount = [&] {
    auto r = admin.command({"HGET", key, "refcount"});
    return r.is_nil() ? std::string("gone") : std::string(r.str());
  };
  {
    auto t = leader.create<float>("k/a", {4});  // the create script, run by the allocator of record
    {
      auto g = follower.get<float>("k/a");  // acquire: the follower's first reference indexes it
      auto many = follower.get_many({"k/a"}).take_all();  // acquire many, names given
      CHECK(refcount() == "3");
    }
    // The follower's releases (its release queue's pipeline) before the
    // leader's: the last release is then the owner's, which deletes the record.
    REQUIRE(eventually([&] { return refcount() == "1"; }));
    {
      auto again = leader.get<float>("k/a");  // a reference taken and given back by the owner (release)
      CHECK(refcount() == "2");
    }
  }
  REQUIRE(eventually([&] { return refcount() == "gone"; }));
  const Seen seen = watch(mon, admin, [](const Seen&) { return true; });
  INFO("scripts run: " << seen.shas.size() << ", commands they ran: " << seen.commands);
  CHECK(seen.commands > 0);
  CHECK(seen.shas.size() >= 3);  // create, acquire, acquire many, release (and the lease renewal)
  INFO("keys touched outside KEYS:\n" << lines(seen.outside));
  CHECK(seen.outside.empty());
}

TEST_CASE("create many and reregister touch only their KEYS", "[redis][registry][scripts]") {
  test::RedisServer srv;
  TensorRegistry leader(keys_opts(srv, true));
  TensorRegistry follower(keys_opts(srv, false));
  REQUIRE(leader.is_leader());
  auto admin = srv.connect();
  auto held = leader.create<float>("k/held", {4});
  auto g = follower.get<float>("k/held");
  auto mon = srv.connect();
  REQUIRE(std::string(mon.command({"MONITOR"}).str()) == "OK");

  auto made = leader.create_many({{"k/m1", DType::f32, {4}, {}}, {"k/m2", DType::u8, {2, 3}, {}}});
  REQUIRE(made.size() == 2);
  // The follower's session key gone (as after a long stop): its thread
  // re-registers the reference it holds.
  const std::string session_key = "ks:memcuda:session:" + follower.session_id();
  REQUIRE(admin.command({"DEL", session_key}).integer() == 1);

  using namespace memcuda::detail;
  const std::string create_many = store::script<lua::kCreateMany>().sha();
  const std::string reregister = store::script<lua::kReregister>().sha();
  const Seen seen = watch(mon, admin, [&](const Seen& s) { return s.shas.count(reregister) > 0; });
  CHECK(seen.shas.count(create_many) == 1);
  CHECK(seen.shas.count(reregister) == 1);
  CHECK(admin.command({"HGET", "ks:memcuda:tensor:k/held", "holder:" + follower.session_id()}).str() == "1");
  INFO("keys touched outside KEYS:\n" << lines(seen.outside));
  CHECK(seen.outside.empty());
}

// What the registry must refuse or carry through untouched, against a real
// redis-server (host backend):
//  * a record whose `node` names another machine is never opened, and the
//    refused get takes no reference;
//  * tensor names are used verbatim in keys: every name validate_name
//    allows round-trips through the API and raw JSON commands with exactly
//    the key prefix + "memcuda:tensor:" + name, and every name it rejects
//    (spaces, quotes, '%', control bytes, UTF-8, Lua-ish text, braces,
//    backslashes, glob characters, 256 bytes) is an InvalidArgument that
//    leaves Redis as it was;
//  * free text that the protocol does allow (holder, reply_to) reaches the
//    Lua scripts as data, never as code.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <boost/json.hpp>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "memcuda/redis/connection.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/text.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

RegistryOptions host_opts(const test::RedisServer& srv, bool control = true, std::string ns = {}) {
  auto o = test::host_options(srv, control);
  o.lease_ttl = 300ms;
  o.request_timeout = 3s;
  o.name_space = std::move(ns);
  return o;
}

using test::contains;

// Every key with its type and, for strings/hashes/sets/lists, its contents:
// enough to tell that nothing was written.
std::map<std::string, std::string> snapshot(redis::Connection& c, const std::set<std::string>& skip = {}) {
  std::map<std::string, std::string> out;
  std::string cursor = "0";
  std::vector<std::string> keys;
  do {
    auto r = c.command({"SCAN", cursor, "COUNT", "1000"});
    cursor = std::string(r[0].str());
    for (std::size_t i = 0; i < r[1].size(); ++i) keys.emplace_back(r[1][i].str());
  } while (cursor != "0");
  for (const auto& k : keys) {
    if (skip.count(k)) continue;
    std::string type(c.command({"TYPE", k}).str());
    std::string v = type + ":";
    auto add_all = [&](const redis::Reply& r) {
      std::vector<std::string> items;
      for (std::size_t i = 0; i < r.size(); ++i) items.emplace_back(r[i].str());
      if (type != "list") std::sort(items.begin(), items.end());
      for (const auto& it : items) v += it + "\x1f";
    };
    if (type == "string") v += std::string(c.command({"GET", k}).str());
    else if (type == "hash") add_all(c.command({"HGETALL", k}));
    else if (type == "set") add_all(c.command({"SMEMBERS", k}));
    else if (type == "list") add_all(c.command({"LRANGE", k, "0", "-1"}));
    out.emplace(k, std::move(v));
  }
  return out;
}

// A raw JSON lifecycle command, as any Redis client would push it; returns
// the reply object popped from `reply_to`.
boost::json::object ask(redis::Connection& c, const boost::json::object& cmd, const std::string& lifecycle = "tensor_lifecycle") {
  const std::string reply_to(cmd.at("reply_to").as_string());
  c.command({"LPUSH", lifecycle, boost::json::serialize(cmd)});
  auto r = c.blocking(5s, {"BLPOP", reply_to, "5"});
  REQUIRE_FALSE(r.is_nil());
  return boost::json::parse(r[1].str()).as_object();
}

// Frees queued by other processes' last releases are run by the leader's
// thread: wait for them (up to 3 s).
void wait_frees(TensorRegistry& leader) {
  for (int i = 0; i < 300 && leader.stats().process.owned_allocations != 0; ++i) std::this_thread::sleep_for(10ms);
  CHECK(leader.stats().process.owned_allocations == 0);
}

}  // namespace

TEST_CASE("a tensor whose record names another node is never opened, and the refused get takes no reference",
          "[redis][registry]") {
  test::RedisServer srv;
  auto lo = host_opts(srv);
  lo.share_references = false;  // its get must run the script (a held name's get reads no record)
  TensorRegistry reg(lo);
  TensorRegistry reader(host_opts(srv, false));  // a second registry of this node
  REQUIRE(reg.is_leader());
  auto t = reg.create<float>("foreign", {16});
  std::vector<float> ones(16, 1.f);
  t.copy_from_host(ones);
  // Opened once before the change, so the reader has the record cached (the
  // acquire script's fast path must not skip the node check).
  { CHECK(reader.get<float>("foreign").size() == 16); }
  REQUIRE(reg.info("foreign").refcount == 1);

  auto c = srv.connect();
  const std::string fake = "another-host/0badc0de";
  CHECK(c.command({"HSET", "memcuda:tensor:foreign", "node", fake}).integer() == 0);  // overwritten, not added
  const auto before = reg.info("foreign");
  CHECK(before.node == fake);

  for (TensorRegistry* r : {&reader, &reg}) {
    INFO("registry " << r->session_id());
    try {
      auto g = r->get<float>("foreign");
      FAIL("get() opened a tensor of node " << fake);
    } catch (const Unavailable& e) {
      const std::string msg = e.what();
      INFO(msg);
      CHECK(std::string(e.code()) == "unavailable");
      CHECK(contains(msg, "'foreign'"));
      CHECK(contains(msg, fake));          // where it lives
      CHECK(contains(msg, r->node_id()));  // and where we are
    }
    CHECK_THROWS_AS(r->get<void>("foreign"), Unavailable);
    CHECK_THROWS_AS(r->get<double>("foreign"), Error);  // wrong dtype too: refused either way
  }
  // The JSON get of a plain Redis client is refused by the allocator of
  // record the same way.
  auto rep = ask(c, {{"op", "get"}, {"name", "foreign"}, {"pid", ::getpid()}, {"reply_to", "sec:r"}});
  CHECK_FALSE(rep.at("ok").as_bool());
  CHECK(rep.at("error").at("code").as_string() == "unavailable");
  CHECK(contains(std::string(rep.at("error").at("message").as_string()), fake));

  // No reference was taken by any of the refused gets.
  const auto after = reg.info("foreign");
  CHECK(after.refcount == 1);
  CHECK(after.holders == before.holders);
  CHECK(after.holders == std::map<std::string, std::int64_t>{{reg.session_id(), 1}});

  // The creator's own reference still goes the normal way: its release frees it.
  t.release();
  CHECK_THROWS_AS(reg.info("foreign"), NotFound);
  CHECK(c.command({"KEYS", "memcuda:*foreign*"}).size() == 0);
  CHECK(reg.stats().process.owned_allocations == 0);
}

namespace {

// Names at the edges of what validate_name allows: [A-Za-z0-9._:/-], 1..255 bytes.
std::vector<std::string> edge_names() {
  std::string longest;
  const std::string alphabet = "Az09._:/-";
  while (longest.size() < kMaxNameBytes) longest += alphabet[longest.size() % alphabet.size()];
  return {
      "a",
      "0",
      "-",
      ".",
      "..",
      "/",
      ":",
      "_",
      "--force",
      "../../etc/passwd",
      "a//b::c..d--e__f",
      "memcuda:tensor:x",      // looks like a key of the registry
      "memcuda:leader",
      "memcuda:removed:1",
      "tensor_lifecycle",
      "ns1:memcuda:tensor:y",
      std::string(kMaxNameBytes, 'z'),
      longest,
  };
}

// Names validate_name rejects.
std::vector<std::string> rejected_names() {
  return {
      "",
      "a b",
      " a",
      "a\tb",
      "a\nb",
      "a\r\n",
      std::string("a\0b", 3),
      "a'b",
      "a\"b",
      "a%b",
      "%s%n",
      "x') redis.call('FLUSHALL') --",
      "\"]]..redis.call('FLUSHALL')--[[",
      "{a}",
      "a\\b",
      "*",
      "a?",
      "[ab]",
      "caf\xc3\xa9",            // UTF-8 e-acute
      "\xe5\xbc\xa0\xe9\x87\x8f",  // UTF-8 CJK
      "\xf0\x9f\x98\x80",          // UTF-8 emoji
      "\xff\xfe",                 // not UTF-8 at all
      "a;b",
      "a|b",
      "$(id)",
      std::string(kMaxNameBytes + 1, 'z'),
  };
}

}  // namespace

TEST_CASE("binary-safe names: every name validate_name allows round-trips through the API and raw JSON with exactly its key",
          "[redis][registry]") {
  test::RedisServer srv;
  auto c = srv.connect();
  c.command({"SET", "user:sentinel", "still here"});

  for (const std::string ns : {"", "ns1"}) {
    const std::string prefix = ns.empty() ? "" : ns + ":";
    INFO("namespace '" << ns << "'");
    TensorRegistry reg(host_opts(srv, true, ns));
    TensorRegistry other(host_opts(srv, false, ns));
    REQUIRE(reg.is_leader());

    const auto names = edge_names();
    std::vector<SharedTensor<std::int32_t>> ts;
    for (std::size_t i = 0; i < names.size(); ++i) {
      const auto& n = names[i];
      INFO("name '" << n << "' (" << n.size() << " bytes)");
      // a follower's create goes through the lifecycle list as JSON; the
      // leader's is direct: both paths for every name
      auto t = (i % 2 ? other : reg).create<std::int32_t>(n, {3});
      std::vector<std::int32_t> v{static_cast<std::int32_t>(i), 7, -1};
      t.copy_from_host(v);
      CHECK(t.name() == n);
      CHECK(c.command({"TYPE", prefix + "memcuda:tensor:" + n}).str() == "hash");
      CHECK(c.command({"HGET", prefix + "memcuda:tensor:" + n, "name"}).str() == n);
      CHECK(!c.command({"ZSCORE", prefix + "memcuda:names", n}).is_nil());
      auto g = (i % 2 ? reg : other).get<std::int32_t>(n);
      std::vector<std::int32_t> back(3);
      g.copy_to_host(back);
      CHECK(back == v);
      CHECK(reg.info(n).name == n);
      CHECK(reg.info(n).refcount == 2);
      auto l = reg.list(n);  // no glob characters in a valid name: matches itself only
      REQUIRE(l.size() == 1);
      CHECK(l[0].name == n);
      CHECK(other.wait(n, 1ms));
      ts.push_back(std::move(t));
    }
    // The registry's keys are exactly prefix + "memcuda:tensor:" + name.
    {
      std::set<std::string> want, got;
      for (const auto& n : names) want.insert(prefix + "memcuda:tensor:" + n);
      auto r = c.command({"KEYS", prefix + "memcuda:tensor:*"});
      for (std::size_t i = 0; i < r.size(); ++i) got.emplace(r[i].str());
      CHECK(got == want);
      auto m = c.command({"ZRANGE", prefix + "memcuda:names", "0", "-1"});
      std::set<std::string> members;
      for (std::size_t i = 0; i < m.size(); ++i) members.emplace(m[i].str());
      CHECK(members == std::set<std::string>(names.begin(), names.end()));
      CHECK(reg.list().size() == names.size());
    }
    for (const auto& n : names) {
      INFO("name '" << n << "'");
      reg.remove(n);
      CHECK(c.command({"EXISTS", prefix + "memcuda:tensor:" + n}).integer() == 0);
      CHECK_THROWS_AS(other.get<std::int32_t>(n), NotFound);
    }
    ts.clear();  // the follower's last releases queue frees for the leader
    wait_frees(reg);
    CHECK(c.command({"KEYS", prefix + "memcuda:tensor:*"}).size() == 0);
    CHECK(c.command({"KEYS", prefix + "memcuda:removed:*"}).size() == 0);

    // The same names through raw JSON commands of a plain Redis client.
    const std::string lifecycle = prefix + "tensor_lifecycle";
    const std::string pid = std::to_string(::getpid());
    for (const auto& n : names) {
      INFO("JSON name '" << n << "'");
      auto rep = ask(c,
                     {{"op", "create"}, {"name", n}, {"dtype", "u8"}, {"shape", {2}}, {"backend", "host"},
                      {"pid", ::getpid()}, {"id", "c"}, {"reply_to", "sec:json"}},
                     lifecycle);
      CHECK(rep.at("ok").as_bool());
      CHECK(rep.at("name").as_string() == n);
      CHECK(c.command({"HGET", prefix + "memcuda:tensor:" + n, "holder:pid:" + pid}).str() == "1");
      rep = ask(c, {{"op", "get"}, {"name", n}, {"pid", ::getpid()}, {"reply_to", "sec:json"}}, lifecycle);
      CHECK(rep.at("ok").as_bool());
      CHECK(rep.at("refcount").as_int64() == 2);
      CHECK(other.info(n).holders.at("pid:" + pid) == 2);
      for (int k = 0; k < 2; ++k) {
        rep = ask(c, {{"op", "delete"}, {"name", n}, {"pid", ::getpid()}, {"reply_to", "sec:json"}}, lifecycle);
        CHECK(rep.at("ok").as_bool());
      }
      CHECK(c.command({"EXISTS", prefix + "memcuda:tensor:" + n}).integer() == 0);
    }
    wait_frees(reg);
    CHECK(c.command({"KEYS", prefix + "memcuda:removed:*"}).size() == 0);
  }
  CHECK(c.command({"GET", "user:sentinel"}).str() == "still here");
}

TEST_CASE("rejected tensor names give InvalidArgument through the API and protocol errors as JSON, and leave Redis as it was",
          "[redis][registry]") {
  test::RedisServer srv;
  auto c = srv.connect();
  c.command({"SET", "user:sentinel", "still here"});
  TensorRegistry reg(host_opts(srv));
  TensorRegistry other(host_opts(srv, false));
  REQUIRE(reg.is_leader());
  auto keep = reg.create<float>("keep", {4});
  // Let the leader publish its pool statistics once, then leave out what
  // changes on its own (the lease, the sessions' expiry refreshes, the pool
  // statistics): everything else must stay byte for byte.
  std::this_thread::sleep_for(300ms);
  // And one GC round now, whose sweep writes the holders of 'keep' back to
  // the indexes (memcuda:holders): a round that first ran after the
  // snapshot would show that as a change.
  (void)reg.collect_garbage();
  // (the leader's processing list exists only while it runs a command)
  const std::set<std::string> moving = {"memcuda:pool_stats", "memcuda:processing:1"};
  const auto before = snapshot(c, moving);

  for (const auto& n : rejected_names()) {
    INFO("name '" << n << "' (" << n.size() << " bytes)");
    REQUIRE_FALSE(is_valid_name(n));
    for (TensorRegistry* r : {&reg, &other}) {
      CHECK_THROWS_AS(r->create<float>(n, {1}), InvalidArgument);
      CHECK_THROWS_AS(r->create_any(n, DType::u8, {1}), InvalidArgument);
      CHECK_THROWS_AS(r->get<float>(n), InvalidArgument);
      CHECK_THROWS_AS(r->get<void>(n), InvalidArgument);
      CHECK_THROWS_AS(r->remove(n), InvalidArgument);
      CHECK_THROWS_AS(r->wait(n, 1ms), InvalidArgument);
      CHECK_THROWS_AS(r->info(n), InvalidArgument);
    }
    try {
      (void)reg.create<float>(n, {1});
    } catch (const ProtocolError& e) {
      CHECK(e.errc() == ProtocolErrc::bad_name);
    }
    // The same names as raw JSON: a protocol error reply (bad_name, or for
    // bytes that are not UTF-8 and so not JSON, bad_json naming the invalid
    // UTF-8), nothing executed. A valid command behind each shows that the
    // leader consumed it.
    const bool utf8 = n.find('\xff') == std::string::npos;
    for (const char* op : {"create", "get", "delete"}) {
      std::string raw;
      if (utf8) {
        boost::json::object cmd{{"op", op}, {"name", n}, {"reply_to", "sec:bad"}, {"id", 1}};
        if (std::string(op) == "create") {
          cmd["dtype"] = "f32";
          cmd["shape"] = boost::json::array{1};
          cmd["backend"] = "host";
        }
        raw = boost::json::serialize(cmd);
      } else {
        raw = R"({"op":")" + std::string(op) + R"(","name":")" + n + R"(","reply_to":"sec:bad","id":1})";
      }
      c.command({"LPUSH", "tensor_lifecycle", raw});
      c.command({"LPUSH", "tensor_lifecycle", R"({"op":"get","name":"absent","reply_to":"sec:bad","id":2})"});
      bool bad_answered = false;
      for (;;) {
        auto r = c.blocking(5s, {"BRPOP", "sec:bad", "5"});  // replies are LPUSHed: oldest first
        REQUIRE_FALSE(r.is_nil());
        auto rep = boost::json::parse(r[1].str()).as_object();
        INFO(boost::json::serialize(rep));
        CHECK_FALSE(rep.at("ok").as_bool());
        if (rep.at("id").as_int64() == 2) {
          CHECK(rep.at("error").at("code").as_string() == "not_found");
          break;
        }
        bad_answered = true;
        CHECK(rep.at("error").at("code").as_string() == "protocol_error");
        CHECK(contains(std::string(rep.at("error").at("message").as_string()), utf8 ? "bad_name" : "invalid UTF-8"));
      }
      CHECK(bad_answered);
    }
  }
  CHECK(c.command({"LLEN", "tensor_lifecycle"}).integer() == 0);
  const auto after = snapshot(c, moving);
  // the leader's lease and every session key were rewritten (same value,
  // new expiry): compare the key set, and the contents of everything else
  for (const auto& [k, v] : after)
    if (!before.count(k)) UNSCOPED_INFO("new key " << k << " = " << v);
  CHECK(after.size() == before.size());
  for (const auto& [k, v] : before) {
    INFO("key " << k);
    REQUIRE(after.count(k) == 1);
    CHECK(after.at(k) == v);
  }
  CHECK(c.command({"GET", "user:sentinel"}).str() == "still here");
  CHECK(reg.list().size() == 1);
  CHECK(reg.info("keep").refcount == 1);
}

TEST_CASE("hostile holder and reply_to text reaches the scripts as data", "[redis][registry]") {
  test::RedisServer srv;
  auto c = srv.connect();
  c.command({"SET", "user:sentinel", "still here"});
  TensorRegistry reg(host_opts(srv));
  auto t = reg.create<float>("target", {4});
  // Allowed by docs/protocol.md: 1..255 bytes, no control characters, valid UTF-8.
  const std::vector<std::string> texts = {
      "x') redis.call('FLUSHALL') --",
      "\"]]..redis.call('FLUSHALL')--[[",
      "' .. redis.call('DEL', KEYS[1]) .. '",
      "caf\xc3\xa9 \xe5\xbc\xa0 \xf0\x9f\x98\x80 {braces} \\back\\slash %s%n",
      "holder:evil",
      std::string(255, 'q'),
  };
  for (const auto& h : texts) {
    INFO("text '" << h << "'");
    const std::string reply_to = "sec " + h.substr(0, 200);  // reply_to: 1..255 bytes as well
    auto rep = ask(c, {{"op", "get"}, {"name", "target"}, {"holder", h}, {"id", h.substr(0, 128)}, {"reply_to", reply_to}});
    CHECK(rep.at("ok").as_bool());
    CHECK(rep.at("id").as_string() == h.substr(0, 128));
    CHECK(c.command({"HGET", "memcuda:tensor:target", "holder:" + h}).str() == "1");
    CHECK(reg.info("target").refcount == 2);
    CHECK(reg.info("target").holders.at(h) == 1);
    rep = ask(c, {{"op", "delete"}, {"name", "target"}, {"holder", h}, {"reply_to", reply_to}});
    CHECK(rep.at("ok").as_bool());
    CHECK(rep.at("refcount").as_int64() == 1);
    CHECK(c.command({"HEXISTS", "memcuda:tensor:target", "holder:" + h}).integer() == 0);
    CHECK(c.command({"EXISTS", reply_to}).integer() == 0);  // popped: nothing else was written there
  }
  CHECK(c.command({"GET", "user:sentinel"}).str() == "still here");
  auto info = reg.info("target");
  CHECK(info.refcount == 1);
  CHECK(info.holders == std::map<std::string, std::int64_t>{{reg.session_id(), 1}});
}

// Index keys of the wrong Redis type, written by another Redis client over
// the keys the scripts keep beside the records (memcuda:usage,
// memcuda:holders, memcuda:refs:<holder>, memcuda:names, memcuda:owners;
// also memcuda:sessions and memcuda:quarantined), against a real
// redis-server and real processes (memcuda_test_worker, host backend):
//  * while such a key is there, create, get, release, remove, stats() and
//    list() keep working (a listing while the name index is not a sorted
//    set gives a clear ReplyError instead), and nothing is written half way;
//  * the allocator of record moves the key aside (`memcuda quarantine`
//    lists it), rebuilds it, and collects a killed holder's references;
//  * a new allocator of record does the same when it takes the lease.
// Each case ends with an audit of every record against the indexes.
#include <catch2/catch.hpp>

#include <signal.h>

#include <boost/json.hpp>
#include <algorithm>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "memcuda/redis/connection.hpp"
#include "support/standby_sync.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/timing.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

RegistryOptions idx_opts(const test::RedisServer& srv, bool control) {
  auto o = test::host_options(srv, control);
  o.lease_ttl = 400ms;
  o.session_ttl = 1000ms;
  o.gc_interval = 1h;  // GC runs when the test says (collect_garbage), unless a case sets it
  o.request_timeout = 5s;
  o.share_references = false;
  o.release_linger = 0ms;
  return o;
}

std::unique_ptr<test::Child> idx_worker(const test::RedisServer& srv, bool control) {
  std::vector<std::string> argv{test::sibling_program("memcuda_test_worker"), "--url", srv.unix_url(), "--ttl", "400",
                                "--session-ttl", "1000", "--backend", "host"};
  if (!control) argv.push_back("--no-control");
  return std::make_unique<test::Child>(argv);
}

CreateOptions kept() {
  CreateOptions o;
  o.persistent = true;
  return o;
}

bool begins(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

using test::eventually;

std::string type_of(redis::Connection& c, const std::string& key) { return std::string(c.command({"TYPE", key}).str()); }

std::set<std::string> names_of(const std::vector<TensorInfo>& ts) {
  std::set<std::string> out;
  for (const auto& t : ts) out.insert(t.name);
  return out;
}

std::set<std::string> quarantined_ids(TensorRegistry& reg) {
  std::set<std::string> out;
  for (const auto& q : reg.quarantined()) out.insert(q.id);
  return out;
}

// A JSON client's get under its own pid; true when answered ok.
bool json_get(redis::Connection& c, const std::string& name, pid_t pid) {
  static int seq = 0;
  const std::string reply_to = "client:idx:" + std::to_string(++seq);
  c.command({"LPUSH", "tensor_lifecycle",
             R"({"op":"get","name":")" + name + R"(","pid":)" + std::to_string(pid) + R"(,"reply_to":")" + reply_to +
                 R"("})"});
  auto r = c.blocking(5s, {"BLPOP", reply_to, "5"});
  if (r.is_nil()) return false;
  auto rep = boost::json::parse(r[1].str()).as_object();
  INFO(boost::json::serialize(rep));
  return rep.at("ok").as_bool();
}

// One atomic look at every record against the indexes: refcount == sum of
// holder:* fields; a named record is in memcuda:names under its name and
// every name there has its record; each holder's reference (but the
// name's own) is in its memcuda:refs:<holder>; memcuda:usage counts the
// named records and their bytes. Returns the violations.
constexpr const char* kAudit = R"lua(
local bad = {}
local function audit(key, named)
  local h = redis.call('HGETALL', key)
  local rc, sum, name, gen, bytes = nil, 0, nil, nil, 0
  local holders = {}
  for i = 1, #h, 2 do
    local f, v = h[i], h[i + 1]
    if f == 'refcount' then rc = tonumber(v)
    elseif f == 'name' then name = v
    elseif f == 'generation' then gen = v
    elseif f == 'bytes' then bytes = tonumber(v)
    elseif string.sub(f, 1, 7) == 'holder:' then
      sum = sum + (tonumber(v) or 0)
      if f ~= 'holder:@name' then holders[#holders + 1] = string.sub(f, 8) end
    end
  end
  if rc ~= sum then table.insert(bad, key .. ': refcount ' .. tostring(rc) .. ' but holders sum to ' .. sum) end
  for _, hd in ipairs(holders) do
    if redis.call('SISMEMBER', 'memcuda:refs:' .. hd, gen .. ':' .. name) ~= 1 then
      table.insert(bad, key .. ': ' .. hd .. "'s reference is not in its index")
    end
  end
  if named then
    if not redis.call('ZSCORE', 'memcuda:names', name) then table.insert(bad, key .. ': not in memcuda:names') end
    return 1, bytes
  end
  return 0, 0
end
local count, total = 0, 0
for _, k in ipairs(redis.call('KEYS', 'memcuda:tensor:*')) do
  local n, b = audit(k, true)
  count = count + n
  total = total + b
end
for _, k in ipairs(redis.call('KEYS', 'memcuda:removed:*')) do audit(k, false) end
for _, n in ipairs(redis.call('ZRANGE', 'memcuda:names', 0, -1)) do
  if redis.call('EXISTS', 'memcuda:tensor:' .. n) == 0 then table.insert(bad, 'memcuda:names has ' .. n .. ' without a record') end
end
local ut, ub = 0, 0
local u = redis.call('HGETALL', 'memcuda:usage')
for i = 1, #u, 2 do
  if string.sub(u[i], 1, 8) == 'tensors:' then ut = ut + tonumber(u[i + 1]) end
  if string.sub(u[i], 1, 6) == 'bytes:' then ub = ub + tonumber(u[i + 1]) end
end
if ut ~= count then table.insert(bad, 'memcuda:usage counts ' .. ut .. ' tensors, the records ' .. count) end
if ub ~= total then table.insert(bad, 'memcuda:usage counts ' .. ub .. ' bytes, the records ' .. total) end
return bad
)lua";

std::vector<std::string> audit(redis::Connection& c) {
  auto r = c.command({"EVAL", kAudit, "0"});
  std::vector<std::string> out;
  for (std::size_t i = 0; i < r.size(); ++i) out.emplace_back(r[i].str());
  return out;
}

enum class Which { usage, holders, refs, names, owners };

// One index key broken while three processes use the registry: the leader
// (this process), a client registry (this process) and a worker (a
// process killed later), plus a JSON client (a sleeping process's pid).
// `kill_first`: the holders die before the leader's GC has run once, so
// that GC meets the broken key; else the GC repairs it while they live.
void wrong_type_index(Which which, bool kill_first) {
  test::RedisServer srv;
  TensorRegistry leader(idx_opts(srv, true));
  REQUIRE(leader.is_leader());
  TensorRegistry client(idx_opts(srv, false));
  auto admin = srv.connect();
  auto w = idx_worker(srv, false);
  auto ready = w->read_line(10s);
  REQUIRE(ready);
  REQUIRE(begins(*ready, "READY"));
  std::string wsid;
  for (std::size_t i = 0, m = 0; i < 500 && wsid.empty(); ++i, std::this_thread::sleep_for(10ms)) {
    auto s = admin.command({"SMEMBERS", "memcuda:sessions"});
    for (m = 0; m < s.size(); ++m)
      if (s[m].str() != leader.session_id() && s[m].str() != client.session_id()) wsid = std::string(s[m].str());
  }
  REQUIRE(!wsid.empty());
  test::Child sleeper({"/bin/sh", "-c", "exec sleep 60"});

  { auto k = leader.create<float>("keep", {4}, kept()); }
  { auto h = client.create<float>("held", {8}, kept()); }
  auto pin = client.get<float>("keep");  // a live session's reference, through the end
  REQUIRE(begins(w->ask("get keep"), "OK"));

  std::string key, seen, right;
  switch (which) {
    case Which::usage: key = "memcuda:usage", seen = "string", right = "hash"; break;
    case Which::holders: key = "memcuda:holders", seen = "list", right = "set"; break;
    case Which::refs: key = "memcuda:refs:" + wsid, seen = "string", right = "set"; break;
    case Which::names: key = "memcuda:names", seen = "string", right = "zset"; break;
    case Which::owners: key = "memcuda:owners", seen = "string", right = "set"; break;
  }
  INFO("the key: " << key << (kill_first ? ", holders killed before GC" : ", GC before the holders die"));
  if (seen == "list") admin.command({"DEL", key}), admin.command({"LPUSH", key, "x"});
  else admin.command({"SET", key, "x"});
  REQUIRE(type_of(admin, key) == seen);

  // Everyone is served while it is there.
  {
    std::optional<SharedTensor<float>> c1, c2, g;
    CHECK_NOTHROW(c1.emplace(client.create<float>("c1", {4}, kept())));
    CHECK_NOTHROW(c2.emplace(client.create<float>("c2", {16}, kept())));
    CHECK_NOTHROW(g.emplace(client.get<float>("held")));
    if (g) CHECK(g->size() == 8);
  }  // released
  CHECK_NOTHROW(client.flush());
  CHECK(leader.info("held").refcount == 1);
  CHECK_NOTHROW(client.remove("c1"));
  CHECK_THROWS_AS(client.info("c1"), NotFound);
  CHECK(begins(w->ask("get held"), "OK"));
  CHECK(begins(w->ask("create wonly 64 1"), "OK"));
  CHECK(json_get(admin, "held", sleeper.pid()));
  CHECK(leader.info("held").refcount == 3);  // its name, the worker, the JSON client
  RegistryStats s;
  CHECK_NOTHROW(s = client.stats());
  CHECK(s.tensors == 4);  // keep, held, c2, wonly
  const std::set<std::string> live{"c2", "held", "keep", "wonly"};
  if (which == Which::names) {
    try {
      (void)client.list();
      FAIL("listed through a name index that is a string");
    } catch (const ReplyError& e) {
      CHECK(e.prefix() == "WRONGTYPE");
      CHECK(has(e.what(), "'memcuda:names' is a string, not a sorted set"));
      CHECK(has(e.what(), "moves it aside and rebuilds it"));
    }
    try {  // a script that reads the index fails before it writes, saying why
      (void)client.get_prefix("k");
      FAIL("took a prefix through a name index that is a string");
    } catch (const ReplyError& e) {
      CHECK(e.prefix() == "WRONGTYPE");
      CHECK(has(e.what(), "the name index memcuda:names is a string, not a sorted set"));
    }
    CHECK(leader.info("keep").refcount == 3);  // its name, the pin, the worker: nothing taken
  } else {
    CHECK(names_of(client.list()) == live);
  }

  const std::string id = key.substr(std::string("memcuda:").size());
  if (!kill_first) {
    // The allocator of record's GC round: the key is moved aside and rebuilt.
    CHECK_NOTHROW(leader.collect_garbage());
    CHECK_NOTHROW(leader.collect_garbage());  // the sweep's second half (unlinked records)
    CHECK(type_of(admin, key) == right);
    CHECK(quarantined_ids(client).count(id) == 1);
    CHECK(names_of(client.list()) == live);
    auto now = client.stats();
    CHECK(now.tensors == 4);
    std::uint64_t counted = 0;
    for (const auto& d : now.per_device) counted += d.tensors;
    CHECK(counted == 4);
    if (which == Which::refs) {  // the worker's references, indexed again from the records
      for (const char* n : {"keep", "held"}) {
        const auto gen = std::to_string(leader.info(n).generation);
        CHECK(admin.command({"SISMEMBER", key, gen + ":" + n}).integer() == 1);
      }
    }
    if (which == Which::holders)
      CHECK(admin.command({"SISMEMBER", key, "pid:" + std::to_string(sleeper.pid())}).integer() == 1);
    if (which == Which::owners) CHECK(admin.command({"SISMEMBER", key, leader.session_id()}).integer() == 1);
  }

  // The killed holders' references are collected.
  const pid_t jpid = sleeper.pid();
  w->kill(SIGKILL);
  w->wait();
  sleeper.kill(SIGKILL);
  sleeper.wait();
  CHECK(eventually([&] {
    (void)leader.collect_garbage();
    auto h = leader.info("held");
    return leader.info("keep").refcount == 2 && h.refcount == 1 && client.list("wonly").empty();
  }));
  auto held = leader.info("held");
  CHECK(held.holders.count("pid:" + std::to_string(jpid)) == 0);
  CHECK(held.holders.count(wsid) == 0);

  // Repaired and consistent: the key of its type again (or gone with its
  // last member), noted as moved aside with its value, and every record
  // agrees with the indexes and counters.
  const auto t = type_of(admin, key);
  CHECK((t == right || (t == "none" && which == Which::refs)));
  auto q = client.quarantined();
  auto it = std::find_if(q.begin(), q.end(), [&](const auto& r) { return r.id == id; });
  REQUIRE(it != q.end());
  CHECK(has(it->reason, seen));
  CHECK(it->key == "memcuda:quarantine:" + id);
  CHECK(type_of(admin, it->key) == seen);
  CHECK(audit(admin) == std::vector<std::string>{});
  auto end = client.stats();
  CHECK(end.tensors == 3);  // keep, held, c2
  CHECK(end.bytes == (4 + 8 + 16) * sizeof(float));
  CHECK(names_of(client.list()) == std::set<std::string>{"c2", "held", "keep"});
  // and serving goes on
  auto again = client.create<float>("after", {2});
  CHECK(leader.info("after").refcount == 1);
}

}  // namespace

TEST_CASE("memcuda:usage of the wrong type: everyone is served, the leader counts it again", "[redis][index][gc]") {
  wrong_type_index(Which::usage, false);
}

TEST_CASE("memcuda:holders of the wrong type: a dead JSON client's references are still collected",
          "[redis][index][gc]") {
  wrong_type_index(Which::holders, true);
}

TEST_CASE("memcuda:holders of the wrong type: the leader rebuilds it from the records", "[redis][index][gc]") {
  wrong_type_index(Which::holders, false);
}

TEST_CASE("memcuda:refs of a live session of the wrong type: its references are indexed again while it lives",
          "[redis][index][gc]") {
  wrong_type_index(Which::refs, false);
}

TEST_CASE("memcuda:refs of a session of the wrong type: its references are collected after it is killed",
          "[redis][index][gc]") {
  wrong_type_index(Which::refs, true);
}

TEST_CASE("memcuda:names of the wrong type: creates and removes go on, the leader rebuilds it from the records",
          "[redis][index][gc]") {
  wrong_type_index(Which::names, false);
}

TEST_CASE("memcuda:names of the wrong type: GC of killed holders rebuilds it first", "[redis][index][gc]") {
  wrong_type_index(Which::names, true);
}

TEST_CASE("memcuda:owners of the wrong type: GC and migration rounds go on, the leader writes it again",
          "[redis][index][gc]") {
  wrong_type_index(Which::owners, true);
}

TEST_CASE("the allocator of record's periodic GC round repairs a wrong-type index key on its own", "[redis][index][gc]") {
  test::RedisServer srv;
  auto o = idx_opts(srv, true);
  o.gc_interval = 100ms;
  TensorRegistry leader(o);
  REQUIRE(leader.is_leader());
  auto admin = srv.connect();
  { auto a = leader.create<float>("a", {4}, kept()); }
  admin.command({"SET", "memcuda:usage", "x"});
  admin.command({"SET", "memcuda:holders", "x"});
  CHECK(eventually([&] {
    return type_of(admin, "memcuda:usage") == "hash" && type_of(admin, "memcuda:holders") != "string";
  }));
  CHECK(leader.stats().tensors == 1);
  CHECK(leader.stats().bytes == 16);
  CHECK(quarantined_ids(leader) == std::set<std::string>{"holders", "usage"});
  CHECK(audit(admin) == std::vector<std::string>{});
}

// A leader stopped while another client breaks every index key, then
// killed: the standby takes the lease with the keys as they are. Before,
// its campaign failed on memcuda:owners at every try: nobody served.
TEST_CASE("a new allocator of record repairs wrong-type index keys when it takes the lease, and adopts the tensors",
          "[redis][index][gc][takeover]") {
  test::RedisServer srv;
  auto old = idx_worker(srv, true);
  auto ready = old->read_line(10s);
  REQUIRE(ready);
  REQUIRE(has(*ready, "leader=1"));
  auto o = idx_opts(srv, true);
  o.gc_interval = 200ms;
  TensorRegistry standby(o);
  REQUIRE_FALSE(standby.is_leader());
  REQUIRE(begins(old->ask("createp pa 16 3"), "OK"));
  REQUIRE(begins(old->ask("createp pb 8 5"), "OK"));
  auto admin = srv.connect();
  // their memory outlives the old leader only in the fd the standby holds
  REQUIRE(eventually([&] { return test::standby_synced(admin, ::getpid(), {"pa", "pb"}); }));

  old->kill(SIGSTOP);  // its GC cannot repair anything now
  const std::vector<std::pair<std::string, std::string>> broken{
      {"memcuda:usage", "hash"},   {"memcuda:holders", "set"},  {"memcuda:owners", "set"},
      {"memcuda:names", "zset"},   {"memcuda:sessions", "set"}, {"memcuda:quarantined", "hash"}};
  for (const auto& [k, right] : broken) admin.command({"SET", k, "x"});
  old->kill(SIGKILL);
  old->wait();

  REQUIRE(eventually([&] { return standby.is_leader(); }));
  for (const auto& [k, right] : broken) {
    INFO(k);
    const auto t = type_of(admin, k);
    CHECK((t == right || t == "none"));
  }
  CHECK(quarantined_ids(standby) ==
        std::set<std::string>{"holders", "names", "owners", "quarantined", "sessions", "usage"});
  // The dead leader's tensors: listed (the name index rebuilt from the
  // records), counted, adopted with their bytes.
  CHECK(names_of(standby.list()) == std::set<std::string>{"pa", "pb"});
  CHECK(eventually([&] {
    auto a = standby.info("pa");
    return a.owner == standby.session_id() && a.refcount == 1 && standby.info("pb").owner == standby.session_id();
  }));
  auto pa = standby.get<float>("pa");
  std::vector<float> host(pa.size());
  pa.copy_to_host(host);
  CHECK(std::all_of(host.begin(), host.end(), [](float v) { return v == 3; }));
  auto s = standby.stats();
  CHECK(s.tensors == 2);
  CHECK(s.bytes == (16 + 8) * sizeof(float));
  CHECK(s.sessions >= 1);
  CHECK(admin.command({"SISMEMBER", "memcuda:owners", standby.session_id()}).integer() == 1);
  CHECK(eventually([&] {  // its heartbeat adds its session back
    return admin.command({"SISMEMBER", "memcuda:sessions", standby.session_id()}).integer() == 1;
  }));
  CHECK(audit(admin) == std::vector<std::string>{});
}

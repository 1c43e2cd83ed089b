// What one client, one bad record or one operator action must not break,
// against a real redis-server and real `memcuda serve` processes (host
// backend):
//  * a create for a device the allocator of record cannot use is refused,
//    and the allocator serves on (no pool is made for that device);
//  * a key of the wrong type, or a record whose fields do not parse, under
//    a listed name is quarantined by GC: listings, statistics, GC and
//    creates keep working for everyone, and the CLI lists and clears it;
//  * SIGTERM of the allocator of record with a standby hands every tensor
//    over: nothing lost, bytes unchanged;
//  * a password rotation (the password file rewritten, connections
//    dropped) loses nothing, and the processes lead and take over again;
//  * a JSON command cannot drop a registry session's reference, nor free a
//    live tensor's memory;
//  * a get of a corrupt record takes no reference, or gives it back.
#include <catch2/catch.hpp>

#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/detail/base/fault.hpp"
#include "memcuda/memcuda.hpp"
#include "memcuda/redis/connection.hpp"
#include "support/gpu.hpp"
#include "support/process.hpp"
#include "support/registry_options.hpp"
#include "support/skip.hpp"
#include "support/redis_server.hpp"
#include "support/text.hpp"
#include "support/timing.hpp"
#include "support/worker.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

RegistryOptions opts_for(const test::RedisServer& srv, bool control) {
  auto o = test::host_options(srv, control);
  o.lease_ttl = 400ms;
  o.request_timeout = 5s;
  o.share_references = false;
  o.release_linger = 0ms;
  return o;
}

using test::cli_path;
using test::contains;

// A `memcuda serve` child (host backend) on `url`.
std::unique_ptr<test::Child> serve(const std::string& url) {
  return std::make_unique<test::Child>(
      std::vector<std::string>{cli_path(), "--url", url, "serve", "--backend", "host", "--lease-ttl", "400"});
}

using test::read_until;

// A raw JSON lifecycle command; the reply popped from its reply_to.
boost::json::object ask(redis::Connection& c, boost::json::object cmd, std::chrono::seconds wait = 5s) {
  static int seq = 0;
  const std::string reply_to = "client:reply:" + std::to_string(::getpid()) + ":" + std::to_string(++seq);
  cmd["reply_to"] = reply_to;
  c.command({"LPUSH", "tensor_lifecycle", boost::json::serialize(cmd)});
  auto r = c.blocking(wait, {"BLPOP", reply_to, std::to_string(wait.count())});
  REQUIRE_FALSE(r.is_nil());
  return boost::json::parse(r[1].str()).as_object();
}

std::string status_of(const boost::json::object& rep) { return rep.at("ok").as_bool() ? "ok" : "error"; }

using test::eventually;

std::vector<std::int32_t> pattern(int seed, std::size_t n) {
  std::vector<std::int32_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::int32_t>(seed * 1000003 + i * 7919);
  return v;
}

}  // namespace

TEST_CASE("a create for a device the allocator of record cannot use is refused, and it serves on",
          "[redis][resilience]") {
  test::RedisServer srv;
  TensorRegistry leader(opts_for(srv, true));
  REQUIRE(leader.is_leader());
  auto c = srv.connect();
  // Device 99 exists nowhere: on a GPU host, on a CPU-only build and here.
  auto rep = ask(c, {{"op", "create"}, {"name", "g"}, {"dtype", "float32"}, {"shape", boost::json::array{4}}, {"backend", "cuda"},
                     {"device", 99}});
  CHECK(status_of(rep) == "error");
  // The next commands, and the ticks between them (pool statistics), are
  // served: before, the pool made for device 99 failed every tick first.
  for (int i = 0; i < 3; ++i) {
    std::this_thread::sleep_for(200ms);  // a few ticks of the control thread
    auto ok = ask(c, {{"op", "create"}, {"name", "h" + std::to_string(i)}, {"dtype", "float32"}, {"shape", boost::json::array{4}},
                      {"backend", "host"}, {"pid", ::getpid()}});
    CHECK(status_of(ok) == "ok");
  }
  TensorRegistry client(opts_for(srv, false));
  auto s = client.stats();
  CHECK(s.tensors == 3);
  for (const auto& p : s.pools) CHECK(p.backend == BackendKind::host);
}

TEST_CASE("a malformed record under a listed name is quarantined and breaks nobody", "[redis][resilience]") {
  test::RedisServer srv;
  TensorRegistry leader(opts_for(srv, true));
  REQUIRE(leader.is_leader());
  TensorRegistry client(opts_for(srv, false));
  auto c = srv.connect();
  auto good = client.create<float>("good", {4}, {.persistent = true});
  // A key of the wrong Redis type, and a Hash whose generation is text.
  c.command({"SET", "memcuda:tensor:bad", "not a hash"});
  c.command({"ZADD", "memcuda:names", "0", "bad"});
  c.command({"HSET", "memcuda:tensor:garbled", "name", "garbled", "generation", "abc", "refcount", "1"});
  c.command({"ZADD", "memcuda:names", "0", "garbled"});

  // Listings skip them (and log it), statistics never read them: neither
  // fails for all.
  CHECK_NOTHROW(client.stats());
  CHECK(client.list().size() >= 1);

  // GC (the leader's, every gc_interval) moves both aside.
  REQUIRE(eventually([&] { return client.quarantined().size() == 2; }));
  auto q = client.quarantined();
  std::sort(q.begin(), q.end(), [](auto& a, auto& b) { return a.id < b.id; });
  CHECK(q[0].id == "tensor:bad");
  CHECK(contains(q[0].reason, "string"));
  CHECK(q[1].id == "tensor:garbled");
  CHECK(contains(q[1].reason, "unreadable"));
  // The data is kept, unchanged, under the quarantine key; the names are free.
  CHECK(c.command({"GET", q[0].key}).str() == "not a hash");
  CHECK(c.command({"ZSCORE", "memcuda:names", "bad"}).is_nil());
  CHECK(client.stats().quarantined == 2);

  // Everyone is served: GC, a create of the freed name, the good tensor.
  CHECK_NOTHROW(client.collect_garbage());
  auto again = client.create<float>("bad", {2});
  CHECK(again.info().generation > 0);
  CHECK(client.get<float>("good").size() == 4);

  CHECK(client.clear_quarantined("tensor:bad"));
  CHECK_FALSE(client.clear_quarantined("tensor:bad"));
  CHECK(c.command({"EXISTS", q[0].key}).integer() == 0);
  CHECK(client.quarantined().size() == 1);
}

TEST_CASE("a corrupt refcount takes no reference, and a record that does not decode gives its reference back",
          "[redis][resilience]") {
  test::RedisServer srv;
  TensorRegistry leader(opts_for(srv, true));
  TensorRegistry client(opts_for(srv, false));
  auto c = srv.connect();
  {
    auto t = leader.create<float>("neg", {4}, {.persistent = true});
    auto u = leader.create<float>("shape", {4}, {.persistent = true});
  }
  leader.flush();
  c.command({"HSET", "memcuda:tensor:neg", "refcount", "-5"});
  try {
    (void)client.get<float>("neg");
    FAIL("a get of a negative refcount succeeded");
  } catch (const ProtocolError& e) {
    CHECK(e.errc() == ProtocolErrc::bad_record);
    CHECK(contains(e.what(), "corrupt"));
  }
  CHECK(c.command({"HGET", "memcuda:tensor:neg", "refcount"}).str() == "-5");  // not incremented

  const std::string before(c.command({"HGET", "memcuda:tensor:shape", "refcount"}).str());
  c.command({"HSET", "memcuda:tensor:shape", "shape", "[not, json"});
  CHECK_THROWS_AS(client.get<void>("shape"), ProtocolError);
  client.flush();
  CHECK(c.command({"HGET", "memcuda:tensor:shape", "refcount"}).str() == before);
  CHECK(c.command({"HEXISTS", "memcuda:tensor:shape", "holder:" + client.session_id()}).integer() == 0);
}

TEST_CASE("a JSON command cannot drop a registry session's reference nor free a live tensor",
          "[redis][resilience][security]") {
  test::RedisServer srv;
  TensorRegistry leader(opts_for(srv, true));
  TensorRegistry holder(opts_for(srv, false));
  auto c = srv.connect();
  auto t = holder.create<float>("victim", {8});
  const auto gen = t.info().generation;
  const std::string rc_before(c.command({"HGET", "memcuda:tensor:victim", "refcount"}).str());

  auto del = ask(c, {{"op", "delete"}, {"name", "victim"}, {"holder", holder.session_id()}});
  CHECK(status_of(del) == "error");
  CHECK(contains(std::string(del.at("error").as_object().at("message").as_string()), "registry session"));
  auto get = ask(c, {{"op", "get"}, {"name", "victim"}, {"holder", holder.session_id()}});
  CHECK(status_of(get) == "error");
  auto fr = ask(c, {{"op", "free"}, {"name", "victim"}, {"generation", gen}});
  CHECK(status_of(fr) == "error");
  CHECK(c.command({"HGET", "memcuda:tensor:victim", "refcount"}).str() == rc_before);
  CHECK(leader.stats().process.owned_allocations >= 1);

  // A JSON client's own holder still works both ways.
  auto mine = ask(c, {{"op", "get"}, {"name", "victim"}, {"holder", "tool-7"}});
  CHECK(status_of(mine) == "ok");
  auto rel = ask(c, {{"op", "delete"}, {"name", "victim"}, {"holder", "tool-7"}});
  CHECK(status_of(rel) == "ok");
}

TEST_CASE("SIGTERM of the allocator of record with a standby hands every tensor over",
          "[redis][resilience][cli]") {
  test::RedisServer srv;
  auto a = serve(srv.unix_url());
  read_until(*a, "allocator of record");
  auto b = serve(srv.unix_url());
  read_until(*b, "follower");

  constexpr int kTensors = 40;
  constexpr std::size_t kElems = 1000;
  {
    TensorRegistry client(opts_for(srv, false));
    for (int i = 0; i < kTensors; ++i) {
      auto t = client.create<std::int32_t>("m/" + std::to_string(i), {kElems}, {.persistent = true});
      CHECK(t.info().owner_pid == a->pid());
      t.copy_from_host(pattern(i, kElems));
    }
    client.flush();
  }
  a->kill(SIGTERM);
  CHECK(a->wait() == 0);
  read_until(*b, "allocator of record", 10s);

  TensorRegistry client(opts_for(srv, false));
  int intact = 0;
  for (int i = 0; i < kTensors; ++i) {
    try {
      auto t = client.get<std::int32_t>("m/" + std::to_string(i));
      std::vector<std::int32_t> got(kElems);
      t.copy_to_host(got);
      intact += got == pattern(i, kElems);
    } catch (const std::exception& e) {
      UNSCOPED_INFO("m/" << i << ": " << e.what());
    }
  }
  CHECK(intact == kTensors);
  // Adopted by the standby, which owns them now (its first GC round after
  // the stopped process is gone).
  CHECK(eventually([&] { return client.info("m/0").owner_pid == b->pid(); }));

  // Without a standby, a stop says what goes with it.
  b->kill(SIGTERM);
  CHECK(b->wait() == 0);
}

TEST_CASE("a password rotation through the password file loses nothing, and leading and takeover go on",
          "[redis][resilience][cli]") {
  test::RedisServer srv({.requirepass = "first-secret"});
  const auto file = std::filesystem::temp_directory_path() / ("memcuda-pw-" + std::to_string(::getpid()));
  auto write_pw = [&](const std::string& pw) {
    std::ofstream f(file, std::ios::trunc);
    f << pw << "\n";
  };
  write_pw("first-secret");
  ::setenv(redis::kPasswordFileEnv, file.c_str(), 1);
  struct Unset {
    std::filesystem::path f;
    ~Unset() {
      ::unsetenv(redis::kPasswordFileEnv);
      std::error_code ec;
      std::filesystem::remove(f, ec);
    }
  } unset{file};
  const std::string url = "unix://" + srv.socket_path();  // no password in the URL, nor in `ps`

  auto a = serve(url);
  read_until(*a, "allocator of record");
  auto b = serve(url);
  read_until(*b, "follower");
  auto client_opts = [&] {
    auto o = opts_for(srv, false);
    o.redis = redis::parse_url(url);
    o.redis.password_file = file.string();
    return o;
  };
  {
    TensorRegistry client(client_opts());
    auto t = client.create<std::int32_t>("keep", {64}, {.persistent = true});
    t.copy_from_host(pattern(3, 64));
    client.flush();
  }

  // Rotate: the new password goes into Redis, every connection is dropped,
  // and the file is rewritten a moment later (the window a real rotation has).
  auto admin = srv.connect();
  admin.command({"CONFIG", "SET", "requirepass", "second-secret"});
  admin.command({"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"});
  std::this_thread::sleep_for(1500ms);  // both serves fail AUTH meanwhile
  write_pw("second-secret");

  // Both processes are still there, and one leads again.
  CHECK(::kill(a->pid(), 0) == 0);
  CHECK(::kill(b->pid(), 0) == 0);
  REQUIRE(eventually([&] { return !admin.command({"GET", "memcuda:leader"}).is_nil(); }, 15s));
  {
    TensorRegistry client(client_opts());
    auto t = client.get<std::int32_t>("keep");
    std::vector<std::int32_t> got(64);
    t.copy_to_host(got);
    CHECK(got == pattern(3, 64));
  }
  // kill -9 of whoever leads: the other campaigns and takes over.
  const std::string tok(admin.command({"GET", "memcuda:leader"}).str());
  const bool a_leads = contains(tok, " " + std::to_string(a->pid()) + "-");
  auto& dead = a_leads ? a : b;
  auto& other = a_leads ? b : a;
  dead->kill(SIGKILL);
  dead->wait();
  REQUIRE(eventually(
      [&] {
        auto l = admin.command({"GET", "memcuda:leader"});
        return !l.is_nil() && contains(std::string(l.str()), " " + std::to_string(other->pid()) + "-");
      },
      10s));
  TensorRegistry client(client_opts());
  REQUIRE(eventually([&] {
    try {
      auto t = client.get<std::int32_t>("keep");
      std::vector<std::int32_t> got(64);
      t.copy_to_host(got);
      return got == pattern(3, 64);
    } catch (const std::exception&) {
      return false;
    }
  }));
}

TEST_CASE("a leader whose control loop stalls gives its lease up and a standby serves", "[redis][resilience]") {
  test::RedisServer srv;
  auto ao = opts_for(srv, true);
  ao.serve_stall_timeout = 300ms;
  TensorRegistry a(ao);
  REQUIRE(a.is_leader());
  TensorRegistry b(opts_for(srv, true));
  REQUIRE_FALSE(b.is_leader());
  struct Disarm {
    ~Disarm() { detail::fault::disarm("control.stall"); }
  } disarm;
  detail::fault::arm("control.stall", 1);  // a's next pass sleeps 1 s: no pass completes for 3x the bound
  REQUIRE(eventually([&] { return b.is_leader(); }, 5s));
  CHECK_FALSE(a.is_leader());
  TensorRegistry client(opts_for(srv, false));
  auto t = client.create<float>("served", {4});
  CHECK(t.info().owner == b.session_id());
}

TEST_CASE("cuda: a create for a device the allocator of record cannot use is refused, and cuda creates go on",
          "[gpu][resilience]") {
  MEMCUDA_REQUIRE_GPU();
  test::RedisServer srv;
  auto o = opts_for(srv, true);
  o.default_backend = BackendKind::cuda;
  TensorRegistry leader(o);
  REQUIRE(leader.is_leader());
  auto c = srv.connect();
  auto bad = ask(c, {{"op", "create"}, {"name", "g"}, {"dtype", "float32"}, {"shape", boost::json::array{4}},
                     {"backend", "cuda"}, {"device", 99}});
  CHECK(status_of(bad) == "error");
  for (int i = 0; i < 3; ++i) {
    std::this_thread::sleep_for(200ms);
    auto ok = ask(c, {{"op", "create"}, {"name", "d" + std::to_string(i)}, {"dtype", "float32"},
                      {"shape", boost::json::array{4}}, {"backend", "cuda"}, {"device", 0}, {"pid", ::getpid()}},
                  30s);
    CHECK(status_of(ok) == "ok");
  }
  auto s = leader.stats();
  CHECK(s.tensors == 3);
  for (const auto& p : s.pools) CHECK(p.device == 0);
}

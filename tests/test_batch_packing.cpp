// Fewer opens (docs/design.md, "Fewer opens"): a create_many large enough
// is packed into one allocation of its own (PoolOptions::
// pack_batches_min_bytes), falls back to per-tensor placement when that
// allocation cannot be had, and gives its space back like any dedicated
// allocation; a batch get across many allocations maps each once and
// reports a failed open per name. Host backend against a real
// redis-server and real worker processes; the [gpu] case at the end runs
// the cuda paths.
#include <catch2/catch.hpp>

#include <sys/mman.h>

#include <filesystem>
#include <set>
#include <thread>

#include "memcuda/memcuda.hpp"
#include "memcuda/state_dict.hpp"
#include "support/gpu.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/timing.hpp"
#include "support/worker.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

constexpr std::uint64_t kMiB = 1 << 20;

// 1 MiB host slabs (dedicated from 512 KiB), batches packed from 1 MiB.
// Long lease and session: the registry's tick (which trims empty
// allocations) stays out of the cases that watch an empty one.
RegistryOptions pack_opts(const test::RedisServer& srv, bool control = true) {
  auto o = test::host_options(srv, control);
  o.lease_ttl = control ? 60s : 300ms;
  o.session_ttl = 60s;
  o.request_timeout = 10s;
  o.pool.host_slab_bytes = kMiB;
  o.pool.pack_batches_min_bytes = kMiB;
  return o;
}

// Twelve f32 tensors: every third one large enough for a dedicated
// allocation (600 KiB), the others 4000 bytes (a 4096-byte block).
std::vector<TensorSpec> mixed_batch(const std::string& prefix) {
  std::vector<TensorSpec> v;
  for (int i = 0; i < 12; ++i)
    v.push_back({prefix + std::to_string(i), DType::f32, {i % 3 == 0 ? 153600 : 1000}, {}});
  return v;
}
std::uint64_t aligned_bytes(const TensorSpec& s) {
  const std::uint64_t n = static_cast<std::uint64_t>(s.shape[0]) * 4;
  return (n + 255) / 256 * 256;
}
constexpr std::uint64_t kMixedBatchBytes = 4 * 614400 + 8 * 4096;  // 2490368, a multiple of the page size

void fill(const SharedTensor<void>& t, float v) {
  std::vector<float> host(t.bytes() / sizeof(float), v);
  SharedTensor<float>(t.handle()).copy_from_host(host);
}
bool all_equal(const SharedTensor<void>& t, float v) {
  std::vector<float> host(t.bytes() / sizeof(float));
  SharedTensor<float>(t.handle()).copy_to_host(host);
  for (float x : host)
    if (x != v) return false;
  return true;
}

PoolStats host_pool(TensorRegistry& reg) {
  for (const auto& p : reg.stats().pools)
    if (p.backend == BackendKind::host) return p;
  return {};
}

using test::eventually;

}  // namespace

TEST_CASE("a large create_many lands in one allocation sized to the batch", "[redis][batch][packing]") {
  test::RedisServer srv;
  TensorRegistry leader(pack_opts(srv));
  REQUIRE(leader.is_leader());
  auto specs = mixed_batch("m/");
  auto made = leader.create_many(specs);
  REQUIRE(made.size() == specs.size());

  // One allocation, carved front to back in the command's order.
  const TensorInfo first = leader.info(specs[0].name);
  std::uint64_t off = 0;
  for (const auto& s : specs) {
    const TensorInfo t = leader.info(s.name);
    INFO(s.name);
    CHECK(t.alloc_id == first.alloc_id);
    CHECK(t.ipc_handle == first.ipc_handle);
    CHECK(t.alloc_bytes == kMixedBatchBytes);
    CHECK(t.offset == off);
    off += aligned_bytes(s);
  }
  CHECK(off == kMixedBatchBytes);
  auto st = host_pool(leader);
  CHECK(st.slabs == 1);
  CHECK(st.reserved == kMixedBatchBytes);
  CHECK(st.in_use == kMixedBatchBytes);

  // Distinct memory: every tensor keeps its own value.
  for (std::size_t i = 0; i < specs.size(); ++i) fill(made.at(specs[i].name), static_cast<float>(i + 1));
  for (std::size_t i = 0; i < specs.size(); ++i) CHECK(all_equal(made.at(specs[i].name), static_cast<float>(i + 1)));

  // Another process maps the whole batch with one open.
  test::Child w({test::sibling_program("memcuda_test_worker"), "--url", srv.unix_url(), "--no-control", "--backend",
                 "host", "--timeout", "10000"});
  REQUIRE(w.read_line(10s));
  for (int i : {0, 1, 5, 9, 11}) {
    auto r = w.ask("get m/" + std::to_string(i));
    INFO(r);
    const double expect = (i % 3 == 0 ? 153600.0 : 1000.0) * (i + 1);
    CHECK(r.find("sum=" + std::to_string(static_cast<long long>(expect))) != std::string::npos);
  }
  auto ws = w.ask("stats");
  INFO(ws);
  CHECK(ws.find("import_opens=1 ") != std::string::npos);

  SECTION("the same batch unpacked (the knob at 0) spreads over slabs and dedicated allocations") {
    test::RedisServer srv2;
    auto o = pack_opts(srv2);
    o.pool.pack_batches_min_bytes = 0;
    TensorRegistry plain(o);
    auto m2 = plain.create_many(mixed_batch("u/"));
    std::set<std::uint64_t> ids;
    for (const auto& [n, t] : m2) ids.insert(plain.info(n).alloc_id);
    CHECK(ids.size() == 5);  // four dedicated, one slab for the eight small ones
  }
  SECTION("a batch under the threshold is placed tensor by tensor") {
    std::vector<TensorSpec> small;
    for (int i = 0; i < 4; ++i) small.push_back({"s/" + std::to_string(i), DType::f32, {1000}, {}});
    auto m3 = leader.create_many(small);
    CHECK(host_pool(leader).slabs == 2);  // one 1 MiB slab for the four
    CHECK(leader.info("s/0").alloc_bytes == kMiB);
  }
  SECTION("a create_many from a follower is packed by the leader") {
    TensorRegistry follower(pack_opts(srv, false));
    REQUIRE_FALSE(follower.is_leader());
    auto fm = follower.create_many(mixed_batch("f/"));
    REQUIRE(fm.size() == 12);
    const TensorInfo f0 = leader.info("f/0");
    CHECK(f0.owner == leader.session_id());
    CHECK(f0.alloc_id != first.alloc_id);
    for (const auto& [n, t] : fm) {
      CHECK(t.info().alloc_id == f0.alloc_id);
      CHECK(t.info().alloc_bytes == kMixedBatchBytes);
    }
    CHECK(host_pool(leader).slabs == 2);
    fill(fm.at("f/3"), 3.5f);
    CHECK(all_equal(leader.get<void>("f/3"), 3.5f));
  }
  w.ask("exit");
}

TEST_CASE("removing a packed batch returns its space: reused while empty, freed by trim", "[redis][batch][packing]") {
  test::RedisServer srv;
  TensorRegistry leader(pack_opts(srv));
  REQUIRE(leader.is_leader());
  const auto base = host_pool(leader);  // no pool yet: all zero
  auto made = leader.create_many(mixed_batch("r/"));
  const TensorInfo first = leader.info("r/0");
  CHECK(host_pool(leader).slabs == base.slabs + 1);
  CHECK(host_pool(leader).in_use == base.in_use + kMixedBatchBytes);

  // Not persistent: dropping the handles frees every tensor.
  made.clear();
  leader.flush();
  CHECK(eventually([&] { return host_pool(leader).in_use == base.in_use; }));
  CHECK(leader.list("r/*").empty());
  // The empty allocation stays until a trim and serves the next batch.
  auto again = leader.create_many(mixed_batch("r/"));
  CHECK(leader.info("r/5").alloc_id == first.alloc_id);
  CHECK(host_pool(leader).slabs == base.slabs + 1);
  CHECK(host_pool(leader).reserved == base.reserved + kMixedBatchBytes);
  // Part of it freed: that space serves a plain create.
  REQUIRE(leader.remove_many({"r/1", "r/2"}).ok());
  again.erase("r/1");
  again.erase("r/2");
  leader.flush();
  CHECK(eventually([&] { return host_pool(leader).in_use == base.in_use + kMixedBatchBytes - 2 * 4096; }));
  auto plain = leader.create<float>("plain", {1000});
  CHECK(plain.info().alloc_id == first.alloc_id);
  plain = {};

  again.clear();
  leader.flush();
  CHECK(eventually([&] { return host_pool(leader).in_use == base.in_use; }));
  CHECK(leader.trim() >= kMixedBatchBytes);
  auto st = host_pool(leader);
  CHECK(st.slabs == base.slabs);
  CHECK(st.reserved == base.reserved);
  CHECK(st.in_use == base.in_use);
  // trimmed: the memfd is gone (the leader served it: nobody else held it)
  CHECK(test::memfds_of({::getpid()}).count("memcuda." + first.owner + "." + std::to_string(first.alloc_id)) == 0);
}

TEST_CASE("a packed batch over the budget falls back to per-tensor placement and succeeds", "[redis][batch][packing]") {
  test::RedisServer srv;
  auto o = pack_opts(srv);
  o.pool.pack_batches_min_bytes = 512 << 10;
  o.pool.budget_bytes = 3 * kMiB / 2;  // a 1 MiB slab plus 512 KiB
  TensorRegistry leader(o);
  auto seed = leader.create<float>("seed", {256});  // one slab: 1 MiB reserved, almost all free
  // 3 x 300 KiB: one allocation of 900 KiB would exceed the budget; the
  // seed's slab holds them.
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 3; ++i) specs.push_back({"b/" + std::to_string(i), DType::f32, {76800}, {}});
  auto made = leader.create_many(specs);
  REQUIRE(made.size() == 3);
  for (const auto& s : specs) CHECK(leader.info(s.name).alloc_id == seed.info().alloc_id);
  auto st = host_pool(leader);
  CHECK(st.slabs == 1);
  CHECK(st.reserved == kMiB);
  CHECK(st.in_use == 256 * 4 + 3 * 307200);
  for (int i = 0; i < 3; ++i) fill(made.at(specs[i].name), static_cast<float>(i + 7));
  for (int i = 0; i < 3; ++i) CHECK(all_equal(made.at(specs[i].name), static_cast<float>(i + 7)));

  // Neither a single allocation nor the tensors fit: the batch fails as
  // before, all or nothing.
  std::vector<TensorSpec> big;
  for (int i = 0; i < 3; ++i) big.push_back({"x/" + std::to_string(i), DType::f32, {76800}, {}});
  CHECK_THROWS_AS(leader.create_many(big), BudgetExceeded);
  CHECK(leader.list("x/*").empty());
  CHECK(host_pool(leader).in_use == 256 * 4 + 3 * 307200);
}

TEST_CASE("a batch get across a worker's many allocations opens each once and reads the right bytes",
          "[redis][batch][packing][multiprocess]") {
  test::RedisServer srv;
  // The worker is the allocator of record with the default pool: host
  // tensors of 16 MiB get an allocation each.
  test::Child w({test::sibling_program("memcuda_test_worker"), "--url", srv.unix_url(), "--ttl", "2000", "--backend",
                 "host"});
  auto l = w.read_line(10s);
  REQUIRE(l);
  REQUIRE(l->find("leader=1") != std::string::npos);
  constexpr int kN = 10;
  for (int i = 0; i < kN; ++i) {
    auto r = w.ask("create t/" + std::to_string(i) + " 4194304 " + std::to_string(i + 1), 30s);
    REQUIRE(r.rfind("OK", 0) == 0);
  }
  TensorRegistry reader(pack_opts(srv, false));
  std::set<std::uint64_t> ids;
  for (int i = 0; i < kN; ++i) ids.insert(reader.info("t/" + std::to_string(i)).alloc_id);
  REQUIRE(ids.size() == kN);

  // One allocation cannot be opened any more (its record names an fd its
  // owner does not serve, and no fd number for the fast path; the worker
  // keeps its own memory): that name alone fails, and gives its reference
  // back.
  const TensorInfo lost = reader.info("t/3");
  {
    auto c = srv.connect();
    const std::string src = lost.fd_source;  // "v1;<id>;<pid>;<fd>;<dev>;<ino>;<address>"
    auto p1 = src.find(';'), p2 = src.find(';', p1 + 1), p3 = src.find(';', p2 + 1), p4 = src.find(';', p3 + 1);
    REQUIRE(p4 != std::string::npos);
    const std::string stale = "v1;999999;" + src.substr(p2 + 1, p3 - p2 - 1) + ";-1;" + src.substr(p4 + 1);
    c.command({"HSET", "memcuda:tensor:t/3", "fd_source", stale});
  }

  const auto opens0 = reader.stats().process.import_opens;
  auto got = reader.get_prefix("t/");
  CHECK(reader.stats().process.import_opens - opens0 == kN - 1);  // one open per allocation, none twice
  REQUIRE(got.tensors.size() == kN - 1);
  REQUIRE(got.errors.size() == 1);
  CHECK(got.errors.at("t/3").code == "unavailable");
  CHECK(got.errors.at("t/3").message.find("999999") != std::string::npos);
  for (int i = 0; i < kN; ++i) {
    if (i == 3) continue;
    const std::string n = "t/" + std::to_string(i);
    INFO(n);
    REQUIRE(got.tensors.count(n) == 1);
    CHECK(all_equal(got.tensors.at(n), static_cast<float>(i + 1)));
    CHECK(reader.info(n).refcount == 2);
  }
  CHECK(reader.info("t/3").refcount == 1);  // the worker's only

  // Mapped now: a second batch get opens nothing.
  const auto opens1 = reader.stats().process.import_opens;
  auto again = reader.get_many({"t/0", "t/9", "t/3"});
  CHECK(reader.stats().process.import_opens == opens1);
  CHECK(again.tensors.size() == 2);
  CHECK(again.errors.count("t/3") == 1);

  got = {};
  again = {};
  reader.flush();
  for (int i = 0; i < kN; ++i) CHECK(reader.info("t/" + std::to_string(i)).refcount == 1);
  w.ask("exit", 30s);
}

TEST_CASE("concurrent first opens of one allocation share one mapping", "[redis][batch][packing]") {
  test::RedisServer srv;
  test::Child w({test::sibling_program("memcuda_test_worker"), "--url", srv.unix_url(), "--ttl", "2000", "--backend",
                 "host"});
  REQUIRE(w.read_line(10s));
  for (int i = 0; i < 4; ++i) REQUIRE(w.ask("create c/" + std::to_string(i) + " 4194304 2", 30s).rfind("OK", 0) == 0);
  TensorRegistry reader(pack_opts(srv, false));
  const auto opens0 = reader.stats().process.import_opens;
  std::vector<BatchGetResult> rs(6);
  {
    std::vector<std::jthread> ts;
    for (auto& r : rs) ts.emplace_back([&] { r = reader.get_prefix("c/"); });
  }
  CHECK(reader.stats().process.import_opens - opens0 == 4);
  for (auto& r : rs) {
    REQUIRE(r.ok());
    REQUIRE(r.tensors.size() == 4);
    for (auto& [n, t] : r.tensors) CHECK(t.data() == rs[0].tensors.at(n).data());
  }
  CHECK(all_equal(rs[5].tensors.at("c/2"), 2.0f));
  w.ask("exit", 30s);
}

#if MEMCUDA_HAS_CUDA()

TEST_CASE("cuda: a packed batch is one IPC open for another process, and a batch get across allocations",
          "[gpu][batch][packing]") {
  MEMCUDA_REQUIRE_GPU();
  test::RedisServer srv;
  RegistryOptions o;
  o.redis = srv.options();
  o.lease_ttl = 30s;
  o.request_timeout = 30s;
  o.default_backend = BackendKind::cuda;  // pack_batches_min_bytes: the default, 64 MiB
  TensorRegistry leader(o);
  REQUIRE(leader.is_leader());
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 8; ++i) specs.push_back({"g/" + std::to_string(i), DType::f32, {2 << 20}, {}});  // 8 MiB each
  auto made = leader.create_many(specs);
  REQUIRE(made.size() == 8);
  for (int i = 0; i < 8; ++i) {
    const auto t = leader.info(specs[i].name);
    CHECK(t.alloc_id == leader.info("g/0").alloc_id);
    CHECK(t.offset == static_cast<std::uint64_t>(i) * (8 << 20));
    CHECK(t.alloc_bytes == std::uint64_t{64} << 20);
    fill(made.at(specs[i].name), static_cast<float>(i + 1));
  }
  test::Child w({test::sibling_program("memcuda_test_worker"), "--url", srv.unix_url(), "--ttl", "2000", "--backend",
                 "cuda", "--no-control", "--timeout", "30000"});
  REQUIRE(w.read_line(30s));
  for (int i = 0; i < 8; ++i) {
    auto r = w.ask("get g/" + std::to_string(i), 30s);
    INFO(r);
    CHECK(r.find("sum=" + std::to_string((2LL << 20) * (i + 1))) != std::string::npos);
  }
  auto ws = w.ask("stats", 30s);
  INFO(ws);
  CHECK(ws.find("import_opens=1 ") != std::string::npos);
  w.ask("exit", 30s);

  // Three dedicated 128 MiB allocations of another process, mapped by one
  // batch get in this one.
  test::RedisServer srv2;
  test::Child w2({test::sibling_program("memcuda_test_worker"), "--url", srv2.unix_url(), "--ttl", "2000",
                  "--backend", "cuda", "--timeout", "30000"});
  auto l = w2.read_line(30s);
  REQUIRE(l);
  REQUIRE(l->find("leader=1") != std::string::npos);
  for (int i = 0; i < 3; ++i)
    REQUIRE(w2.ask("create d/" + std::to_string(i) + " 33554432 " + std::to_string(i + 1), 60s).rfind("OK", 0) == 0);
  RegistryOptions ro;
  ro.redis = srv2.options();
  ro.control_thread = false;
  ro.default_backend = BackendKind::cuda;
  TensorRegistry reader(ro);
  const auto opens0 = reader.stats().process.import_opens;
  auto got = reader.get_prefix("d/");
  REQUIRE(got.ok());
  CHECK(reader.stats().process.import_opens - opens0 == 3);
  for (int i = 0; i < 3; ++i) {
    auto t = SharedTensor<float>(got.tensors.at("d/" + std::to_string(i)).handle());
    std::vector<float> ends(1);
    t.copy_to_host(ends, 0);
    CHECK(ends[0] == static_cast<float>(i + 1));
    t.copy_to_host(ends, t.size() - 1);
    CHECK(ends[0] == static_cast<float>(i + 1));
  }
  got = {};
  w2.ask("exit", 30s);
}

#endif

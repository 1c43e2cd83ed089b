// In-place model updates (memcuda/model.hpp): a producer overwrites a
// model's tensors where they are and publishes a new version; consumer
// processes (memcuda_test_worker) that already hold the tensors wait for the
// version and read the new bytes, without re-opening anything. Real
// redis-server, real processes; the cuda case checks stream ordering with a
// slow kernel and a negative control that skips the wait.
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "memcuda/model.hpp"
#include "memcuda/redis/connection.hpp"
#include "support/gpu.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/skip.hpp"
#include "support/timing.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

RegistryOptions model_opts(const test::RedisServer& srv, BackendKind backend = BackendKind::host) {
  RegistryOptions o;
  o.redis = srv.options();
  o.control_thread = true;
  o.lease_ttl = backend == BackendKind::cuda ? 2000ms : 400ms;
  o.default_backend = backend;
  return o;
}

std::unique_ptr<test::Child> consumer(const test::RedisServer& srv, const std::string& backend = "host") {
  auto w = std::make_unique<test::Child>(std::vector<std::string>{test::sibling_program("memcuda_test_worker"),
                                                                  "--url", srv.unix_url(), "--backend", backend,
                                                                  "--no-control", "--timeout", "30000"});
  auto l = w->read_line(30s);
  REQUIRE(l);
  REQUIRE(l->rfind("READY", 0) == 0);
  return w;
}

// "import_opens=N" of a worker's stats line: how many mappings it opened.
std::string opens_of(const std::string& stats) {
  auto b = stats.find("import_opens=");
  REQUIRE(b != std::string::npos);
  return stats.substr(b, stats.find(' ', b) - b);
}

std::string sum_of(std::size_t n, float v) { return std::to_string(static_cast<long long>(n * v)); }

void fill(const SharedTensor<float>& t, float v) {
  std::vector<float> host(t.size(), v);
  t.copy_from_host(host);
}

}  // namespace

TEST_CASE("model version: a consumer holding the tensors sees version N+1 and the new bytes", "[redis][model]") {
  test::RedisServer srv;
  TensorRegistry reg(model_opts(srv));
  const std::size_t n = 1024;
  auto a = reg.create<float>("m/a", {static_cast<std::int64_t>(n)});
  auto b = reg.create<float>("m/b", {static_cast<std::int64_t>(n)});
  fill(a, 1.f);
  fill(b, 1.f);
  CHECK(current_version(reg, "m/") == 0);  // tensors, no version yet

  auto w = consumer(srv);
  REQUIRE(w->ask("get m/a").rfind("OK", 0) == 0);
  REQUIRE(w->ask("get m/b").rfind("OK", 0) == 0);
  const auto opens = opens_of(w->ask("stats"));

  fill(a, 2.f);  // in place: the consumer's mapping sees it, the version says when
  fill(b, 2.f);
  CHECK(publish_version(reg, "m/") == 1);
  CHECK(w->ask("waitver m/ 0 10000 m/a") == "OK version=1 sum=" + sum_of(n, 2.f));
  CHECK(w->ask("version m/") == "OK version=1");

  fill(a, 3.f);
  CHECK(publish_version(reg, "m/") == 2);
  CHECK(w->ask("waitver m/ 1 10000 m/a") == "OK version=2 sum=" + sum_of(n, 3.f));
  // An `after` the model is already past returns at once with the current version.
  CHECK(w->ask("waitver m/ 0 10000") == "OK version=2");
  // Nothing was opened again.
  CHECK(opens_of(w->ask("stats")) == opens);
  CHECK(w->ask("exit") == "OK");
}

TEST_CASE("model version: waiting consumers are woken by the publish, not by polling", "[redis][model]") {
  test::RedisServer srv;
  TensorRegistry reg(model_opts(srv));
  const std::size_t n = 4096;
  auto t = reg.create<float>("llm/w", {static_cast<std::int64_t>(n)});
  fill(t, 1.f);
  CHECK(publish_version(reg, "llm/") == 1);

  std::vector<std::unique_ptr<test::Child>> ws;
  for (int i = 0; i < 3; ++i) {
    ws.push_back(consumer(srv));
    REQUIRE(ws.back()->ask("get llm/w").rfind("OK", 0) == 0);
  }
  // Each waits up to 60 s for a version after 1.
  for (auto& w : ws) w->send("waitver llm/ 1 60000 llm/w");
  // None answers before the publish...
  std::this_thread::sleep_for(300ms);
  for (auto& w : ws) CHECK_FALSE(w->read_line(50ms));

  fill(t, 5.f);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(publish_version(reg, "llm/") == 2);
  // ... and every one answers after it, woken with the new version and
  // bytes (a wait that ran out its 60 s would answer otherwise, and later
  // than this read waits).
  for (auto& w : ws) {
    auto l = w->read_line(30s);
    REQUIRE(l);
    CHECK(*l == "OK version=2 sum=" + sum_of(n, 5.f));
  }
  test::print_ms(__FILE__, __LINE__, "publish to every waiter's answer", test::ms_since(t0));
  // The waiters cleaned up after themselves.
  redis::Connection raw(srv.options());
  CHECK(raw.command({"EXISTS", "memcuda:model_waiters:llm/"}).integer() == 0);
}

TEST_CASE("model version: a waiter in another thread of the same process is woken", "[redis][model]") {
  test::RedisServer srv;
  TensorRegistry reg(model_opts(srv));
  auto t = reg.create<float>("th/x", {16});
  std::optional<std::uint64_t> got;
  std::string error;
  std::jthread waiter([&] {
    try {
      got = wait_version(reg, "th/", 0, 30s);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(200ms);
  // Short calls on the same registry go on while it waits (its own connection).
  CHECK(current_version(reg, "th/") == 0);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(publish_version(reg, "th/") == 1);
  waiter.join();
  test::print_ms(__FILE__, __LINE__, "publish to the waiter's return", test::ms_since(t0));
  CHECK(error.empty());
  REQUIRE(got);  // woken with a version: a wait that ran out returns nullopt
  CHECK(*got == 1);
}

namespace {
// Calls of one command so far, from INFO commandstats (0 when never called).
long long calls_of(redis::Connection& raw, const std::string& cmd) {
  const std::string info(raw.command({"INFO", "commandstats"}).str());
  const auto at = info.find("cmdstat_" + cmd + ":calls=");
  if (at == std::string::npos) return 0;
  return std::stoll(info.substr(at + cmd.size() + 15));
}

// The private list a waiter of `prefix` registered (waits up to 5 s for it).
std::string waiter_list(redis::Connection& raw, const std::string& prefix) {
  for (int i = 0; i < 500; ++i) {
    auto m = raw.command({"SMEMBERS", "memcuda:model_waiters:" + prefix});
    if (m.size() == 1) return std::string(m[0].str());
    std::this_thread::sleep_for(10ms);
  }
  FAIL("no waiter registered for " << prefix);
  return {};
}
}  // namespace

TEST_CASE("model version: a woken waiter takes the version from the push, with no further round trip",
          "[redis][model]") {
  test::RedisServer srv;
  TensorRegistry reg(model_opts(srv));
  auto t = reg.create<float>("push/x", {16});
  CHECK(publish_version(reg, "push/") == 1);
  redis::Connection raw(srv.options());
  // The counts are the server's, for every client: the allocator of
  // record's standby thread reads and writes other keys now and then
  // (HGETALL of the allocations Hash). A round it disturbs proves nothing
  // either way and is run again; a waiter that reads the record after the
  // push adds an HGETALL in every round, so it still fails.
  int disturbed = 0;
  bool clean = false;
  for (std::uint64_t v = 1; v <= 8 && !clean; ++v) {
    std::optional<std::uint64_t> got;
    std::string error;
    std::jthread waiter([&] {
      try {
        got = wait_version(reg, "push/", v, 30s);
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
    (void)waiter_list(raw, "push/");  // registered, its first read done: now blocked
    std::this_thread::sleep_for(100ms);
    const long long hgetall = calls_of(raw, "hgetall"), srem = calls_of(raw, "srem"), del = calls_of(raw, "del");
    REQUIRE(publish_version(reg, "push/") == v + 1);
    waiter.join();
    CHECK(error.empty());
    REQUIRE(got);
    CHECK(*got == v + 1);
    // Woken by the push: no read of the record, no clean-up (the publish
    // dropped the set, BLPOP emptied the list).
    clean = calls_of(raw, "hgetall") == hgetall && calls_of(raw, "srem") == srem &&
            calls_of(raw, "del") <= del + 1;  // at most the publish script's DEL of the waiters set
    disturbed += !clean;
  }
  INFO("rounds with other commands counted: " << disturbed);
  CHECK(clean);
  CHECK(raw.command({"EXISTS", "memcuda:model_waiters:push/"}).integer() == 0);
}

TEST_CASE("model version: what a waiter is pushed decides its outcome, and a bare version is read from the record",
          "[redis][model]") {
  test::RedisServer srv;
  TensorRegistry reg(model_opts(srv));
  auto t = reg.create<float>("bare/x", {16});
  CHECK(publish_version(reg, "bare/") == 1);
  redis::Connection raw(srv.options());
  auto wait_in_thread = [&](std::uint64_t after, std::optional<std::uint64_t>& got, std::string& error) {
    return std::jthread([&reg, after, &got, &error] {
      try {
        got = wait_version(reg, "bare/", after, 30s);
      } catch (const Unavailable& e) {
        error = std::string("Unavailable: ") + e.what();
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
  };
  {
    // An older publisher pushes the bare version: the waiter reads the record.
    std::optional<std::uint64_t> got;
    std::string error;
    auto w = wait_in_thread(1, got, error);
    const std::string list = waiter_list(raw, "bare/");
    raw.command({"HSET", "memcuda:model:bare/", "version", "7"});
    raw.command({"DEL", "memcuda:model_waiters:bare/"});
    raw.command({"LPUSH", list, "7"});
    w.join();
    CHECK(error.empty());
    REQUIRE(got);
    CHECK(*got == 7);
  }
  {
    // The push names another node and a CUDA event: the record is not read
    // (it says this node), the push decides: Unavailable.
    std::optional<std::uint64_t> got;
    std::string error;
    auto w = wait_in_thread(7, got, error);
    const std::string list = waiter_list(raw, "bare/");
    raw.command({"DEL", "memcuda:model_waiters:bare/"});
    raw.command({"LPUSH", list, "8\ncuda\n0\nGPU-x\nelsewhere\nsess\n" + std::string(64, '\n')});
    w.join();
    CHECK_FALSE(got);
    CHECK(error.rfind("Unavailable: ", 0) == 0);
    CHECK(error.find("elsewhere") != std::string::npos);
  }
}

TEST_CASE("model version: errors are typed", "[redis][model]") {
  test::RedisServer srv;
  TensorRegistry reg(model_opts(srv));
  auto t = reg.create<float>("known/x", {16});

  // Unknown prefix: no version and no tensor under it.
  CHECK_THROWS_AS(publish_version(reg, "unknown/"), NotFound);
  CHECK_THROWS_AS(current_version(reg, "unknown/"), NotFound);
  CHECK_THROWS_AS(wait_version(reg, "unknown/", 0, 100ms), NotFound);
  // A bad prefix follows the name rules.
  CHECK_THROWS_AS(publish_version(reg, ""), ProtocolError);
  CHECK_THROWS_AS(wait_version(reg, "known/", 0, -1ms), InvalidArgument);

  // Timeout: nullopt, after about the timeout.
  CHECK(publish_version(reg, "known/") == 1);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(wait_version(reg, "known/", 1, 200ms));
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(took >= 190ms);
  MEMCUDA_CHECK_MS_BELOW(std::chrono::duration_cast<std::chrono::milliseconds>(took).count(), 20000);

  // A version published from another node cannot order this process's stream.
  redis::Connection raw(srv.options());
  raw.command({"HSET", "memcuda:model:known/", "node", "elsewhere", "event_handle", std::string(64, 'x'), "backend",
               "cuda"});
  CHECK_THROWS_AS(wait_version(reg, "known/", 0, 100ms), Unavailable);
  // A model record survives its tensors' removal: the version stays known.
  reg.remove("known/x");
  t.release();
  raw.command({"HSET", "memcuda:model:known/", "node", reg.node_id(), "event_handle", ""});
  CHECK(current_version(reg, "known/") == 1);
}

#if MEMCUDA_HAS_CUDA() && defined(MEMCUDA_TEST_KERNELS)
extern "C" cudaError_t memcuda_test_slow_fill(float* p, std::size_t n, float v, unsigned spin_ms, cudaStream_t s);

TEST_CASE("model version (cuda): a consumer stream ordered on the version reads the new weights", "[gpu][model]") {
  MEMCUDA_REQUIRE_GPU();
  test::RedisServer srv;
  TensorRegistry reg(model_opts(srv, BackendKind::cuda));
  const std::size_t n = 1 << 20;
  auto t = reg.create<float>("gm/w", {static_cast<std::int64_t>(n)});
  fill(t, 1.f);
  auto w = consumer(srv, "cuda");
  const auto got = w->ask("get gm/w", 30s);
  INFO(got);
  REQUIRE(got.rfind("OK gen=" + std::to_string(t.generation()) + " ", 0) == 0);
  REQUIRE(got.ends_with(" sum=" + sum_of(n, 1.f)));
  REQUIRE(w->ask("sumheld-nowait gm/w", 30s) == "OK sum=" + sum_of(n, 1.f));  // warm: context, kernel

  cudaStream_t s{};
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  // The trainer's update: a slow kernel (2 s, then writes 2.0), the version
  // published right after the launch, no synchronisation.
  REQUIRE(memcuda_test_slow_fill(t.data(), n, 2.f, 2000, s) == cudaSuccess);
  CHECK(publish_version(reg, "gm/", s) == 1);
  // Negative control: a consumer that skips the stream wait reads the old
  // weights while the producer still runs (so the check below can fail).
  CHECK(w->ask("sumheld-nowait gm/w", 30s) == "OK sum=" + sum_of(n, 1.f));
  // A consumer that waits for the version on its stream reads the new ones.
  CHECK(w->ask("waitver-gpu gm/ 0 30000 gm/w", 30s) == "OK version=1 sum=" + sum_of(n, 2.f));
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  cudaStreamDestroy(s);
  CHECK(w->ask("exit", 30s) == "OK");
}
#else
TEST_CASE("model version (cuda): a consumer stream ordered on the version reads the new weights", "[gpu][model]") {
  MEMCUDA_SKIP("needs the test kernels (tests/kernels.cu): this build had no CUDA compiler");
}
#endif

// A registry of tens of thousands of tensors serves as an empty one does:
// the allocator of record's periodic work reads no record per round, a
// listing pages, statistics read counters, and the garbage collector finds
// a killed holder's references through its own index. The figures are
// printed (benchmark style: no timed assertion); what is asserted is what
// must hold whatever the machine: counts, order, and how many record reads
// Redis served (INFO commandstats), which a full scan per round exceeds.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

RegistryOptions scale_opts(const test::RedisServer& srv, bool control) {
  auto o = test::host_options(srv, control);
  o.lease_ttl = 2s;  // a busy 2-core machine must not lose the lease to a slow tick
  o.gc_interval = 100ms;
  o.request_timeout = 30s;
  o.share_references = false;
  o.release_linger = 0ms;
  return o;
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::string name_of(int i) {
  char b[32];
  std::snprintf(b, sizeof b, "t/%05d", i);
  return b;
}

// Calls served by Redis per command since CONFIG RESETSTAT.
std::map<std::string, long long> command_calls(redis::Connection& c) {
  std::map<std::string, long long> out;
  std::string info(c.command({"INFO", "commandstats"}).str());
  std::size_t at = 0;
  while ((at = info.find("cmdstat_", at)) != std::string::npos) {
    auto colon = info.find(':', at), calls = info.find("calls=", at);
    if (colon == std::string::npos || calls == std::string::npos) break;
    out[info.substr(at + 8, colon - at - 8)] = std::stoll(info.substr(calls + 6));
    at = colon;
  }
  return out;
}

struct Figures {
  double create_ms, get_us, page_ms, stats_ms;
};

Figures measure(TensorRegistry& client) {
  std::vector<double> create, get, page, stats;
  for (int i = 0; i < 20; ++i) {
    auto t0 = Clock::now();
    { auto t = client.create<float>("probe/" + std::to_string(i), {4}); }
    create.push_back(ms_since(t0));
  }
  for (int i = 0; i < 200; ++i) {
    auto t0 = Clock::now();
    { auto t = client.get<float>("probe/fixed"); }
    get.push_back(ms_since(t0) * 1000);
  }
  for (int i = 0; i < 10; ++i) {
    auto t0 = Clock::now();
    (void)client.list_page("t/*", "", 1000);
    page.push_back(ms_since(t0));
    t0 = Clock::now();
    (void)client.stats();
    stats.push_back(ms_since(t0));
  }
  return {median(create), median(get), median(page), median(stats)};
}

}  // namespace

TEST_CASE("a registry of 30k tensors serves as an empty one and collects a killed holder of 10k references",
          "[scale][multiprocess]") {
  constexpr int kTensors = 30000, kHeld = 10000;
  test::RedisServer srv;
  TensorRegistry leader(scale_opts(srv, true));
  REQUIRE(leader.is_leader());
  TensorRegistry client(scale_opts(srv, false));
  auto admin = srv.connect();
  auto fixed = leader.create<float>("probe/fixed", {4}, {.persistent = true});
  const Figures empty = measure(client);

  auto t0 = Clock::now();
  for (int b = 0; b < kTensors; b += 1000) {
    std::vector<TensorSpec> specs;
    for (int i = b; i < b + 1000; ++i) specs.push_back({name_of(i), DType::f32, {4}, {.persistent = true}});
    (void)leader.create_many(specs);  // the handles go; the names keep the tensors
  }
  const double fill_ms = ms_since(t0);

  // Counters, not a scan: the statistics know every tensor and byte.
  auto s = client.stats();
  CHECK(s.tensors == static_cast<std::uint64_t>(kTensors) + 1);
  CHECK(s.bytes == (static_cast<std::uint64_t>(kTensors) + 1) * 16);

  // A listing pages in name order and reads only the glob's prefix.
  std::size_t listed = 0;
  std::string after, last;
  do {
    auto page = client.list_page("t/*", after, 1000);
    REQUIRE(page.tensors.size() <= 1000);
    for (const auto& t : page.tensors) {
      CHECK(t.name > last);
      last = t.name;
    }
    listed += page.tensors.size();
    after = page.next;
  } while (!after.empty());
  CHECK(listed == static_cast<std::size_t>(kTensors));
  CHECK(last == name_of(kTensors - 1));

  // The allocator of record's rounds read a bounded slice of records, not
  // all 30k each: count the record reads Redis serves over 10 rounds.
  admin.command({"CONFIG", "RESETSTAT"});
  std::this_thread::sleep_for(1s);  // gc_interval 100 ms: about 10 rounds
  auto calls = command_calls(admin);
  std::cout << "scale: record reads in 1 s of rounds at " << kTensors << " tensors: HKEYS " << calls["hkeys"]
            << ", HMGET " << calls["hmget"] << ", HGETALL " << calls["hgetall"] << "\n";
  CHECK(calls["hkeys"] < kTensors);
  CHECK(calls["hgetall"] < kTensors);

  const Figures full = measure(client);
  std::cout << "scale: fill of " << kTensors << " tensors (create_many of 1000) " << fill_ms << " ms\n"
            << "scale: median at 1 / " << kTensors << " tensors: create " << empty.create_ms << " / "
            << full.create_ms << " ms (" << full.create_ms / empty.create_ms << "x), get " << empty.get_us << " / "
            << full.get_us << " us (" << full.get_us / empty.get_us << "x), first page of ls " << empty.page_ms
            << " / " << full.page_ms << " ms, stats " << empty.stats_ms << " / " << full.stats_ms << " ms\n";

  // A holder of 10k references killed: its index leads the collector to them.
  test::Child w({test::sibling_program("memcuda_test_worker"), "--url", srv.unix_url(), "--no-control", "--backend",
                 "host"});
  REQUIRE(w.read_line(30s).value_or("").rfind("READY", 0) == 0);
  auto got = w.ask("getprefix t/0", 120s);
  INFO(got);
  REQUIRE(got.rfind("OK n=" + std::to_string(kHeld) + " errors=0", 0) == 0);
  auto refcounts = [&] {
    std::vector<redis::Command> cmds;
    for (int i = 0; i < kHeld; ++i) cmds.push_back({"HGET", "memcuda:tensor:" + name_of(i), "refcount"});
    std::map<std::string, int> n;
    for (auto& r : admin.pipeline(cmds)) ++n[std::string(r.str())];
    return n;
  };
  CHECK(refcounts()["2"] == kHeld);  // the name's and the worker's
  t0 = Clock::now();
  w.kill();
  w.wait();
  bool done = false;
  while (!done && ms_since(t0) < 120000) {
    done = refcounts()["1"] == kHeld;
    if (!done) std::this_thread::sleep_for(20ms);
  }
  const double gc_ms = ms_since(t0);
  std::cout << "scale: GC of a killed holder of " << kHeld << " references: " << gc_ms << " ms after kill -9\n";
  CHECK(done);
  CHECK(admin.command({"SCARD", "memcuda:holders"}).integer() <= 2);  // the two live registries at most
  auto again = client.get<float>(name_of(kHeld - 1));
  CHECK(again.size() == 4);
}

TEST_CASE("a prefix removed by a process that does not own it is freed through batched frees",
          "[scale][multiprocess]") {
  constexpr int kTensors = 2500;
  test::RedisServer srv;
  TensorRegistry leader(scale_opts(srv, true));
  REQUIRE(leader.is_leader());
  TensorRegistry client(scale_opts(srv, false));  // another session: it owns none of them
  auto admin = srv.connect();
  auto in_use = [&] {
    std::uint64_t n = 0;
    for (const auto& p : leader.stats().pools) n += p.in_use;
    return n;
  };
  const std::uint64_t before = in_use();
  for (int b = 0; b < kTensors; b += 500) {
    std::vector<TensorSpec> specs;
    for (int i = b; i < b + 500; ++i) specs.push_back({"rm/" + std::to_string(i), DType::f32, {64}, {.persistent = true}});
    (void)leader.create_many(specs);
  }
  REQUIRE(in_use() > before);
  admin.command({"CONFIG", "RESETSTAT"});
  auto r = client.remove_prefix("rm/");
  CHECK(r.removed.size() == static_cast<std::size_t>(kTensors));
  CHECK(r.errors.empty());
  bool freed = false;
  for (int i = 0; i < 600 && !freed; ++i) {
    freed = in_use() == before && admin.command({"LLEN", "tensor_lifecycle"}).integer() == 0;
    if (!freed) std::this_thread::sleep_for(50ms);
  }
  CHECK(freed);
  CHECK(admin.command({"ZCARD", "memcuda:names"}).integer() == 0);
  // One free command per 1000 tensors, not one per tensor.
  auto calls = command_calls(admin);
  std::cout << "scale: " << kTensors << " tensors removed by a non-owner: " << calls["lpush"]
            << " LPUSH to the lifecycle list and replies\n";
  CHECK(calls["lpush"] <= 10);
  CHECK(leader.stats().tensors == 0);
}

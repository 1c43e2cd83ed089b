// Client calls of every kind racing the allocator of record's own work, in
// one process: threads of one follower registry run batch creates and gets,
// state-dict publishes and opens, wait_version, and gets whose handles
// linger, while the garbage collector drops the references of killed
// processes and the lease changes hands twice: the leading process is
// killed and a standby registry of this process takes over (adopting its
// tensors, then serving and collecting), then that registry shuts down and
// hands everything to a standby process. Every tensor read back holds what
// was written and no call throws at all: the follower's requests wait for
// the next leader. Public API only; built into memcuda_tsan_tests too, so a
// data race in this process fails the run.
#include <signal.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "memcuda/model.hpp"
#include "memcuda/state_dict.hpp"
#include "support/standby_sync.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/thread_tally.hpp"
#include "support/timing.hpp"
#include "support/worker.hpp"

using namespace memcuda;
using namespace std::chrono_literals;
using test::outcome;

namespace {

constexpr int kHot = 3;           // persistent tensors every lingering get reads
constexpr std::size_t kElems = 64;

// Rounds per thread after the last leader change, at the least; bounded so
// a 2-core machine under TSan stays well inside the CTest timeout.
int min_rounds() {
  if (const char* e = std::getenv("MEMCUDA_TEST_THREAD_OPS"); e && *e) return std::max(2, std::atoi(e) / 20);
  return 8;
}

RegistryOptions mixed_opts(const test::RedisServer& srv, bool control) {
  auto o = test::host_options(srv, control);
  // A handover is what moves the lease here; a 3 s lease lost by a starved
  // control thread (TSan, two busy cores) is one more change and as welcome.
  o.lease_ttl = 3s;
  o.gc_interval = 100ms;     // the collector runs all along
  o.request_timeout = 60s;   // a request waits out a handover, never times out
  o.share_references = true;
  o.release_linger = 30ms;   // dropped handles linger; some windows pass, some are revived
  return o;
}

std::vector<float> pattern(int a, int b, int c) {
  std::vector<float> v(kElems);
  for (std::size_t i = 0; i < kElems; ++i) v[i] = static_cast<float>(a * 1000000 + b * 1000 + c) + static_cast<float>(i) / 128.f;
  return v;
}

std::vector<float> read_back(const SharedTensor<void>& t) {
  std::vector<float> v(kElems);
  SharedTensor<float>(t.handle()).copy_to_host(v);
  return v;
}

std::string hot_name(int k) { return "mx/hot" + std::to_string(k); }
std::string sd_prefix(std::uint64_t v) { return "mx/sd/v" + std::to_string(v) + "/"; }

struct Run {
  std::atomic<bool> stop{false};   // set after the last leader change
  std::atomic<int> busy_rounds{0}; // rounds the threads completed, all kinds together
  std::atomic<std::uint64_t> published{0};
  test::Tally tally;
};

// create_many of four tensors, written, read back by get_many, removed
// while held, dropped.
void batch_thread(TensorRegistry& reg, int idx, Run& run) {
  std::map<std::string, int> counts;
  std::vector<std::string> fails;
  for (int round = 0; !run.stop || round < min_rounds(); ++round) {
    std::vector<TensorSpec> specs;
    std::vector<std::string> names;
    for (int k = 0; k < 4; ++k) {
      names.push_back("mx/b" + std::to_string(idx) + "/" + std::to_string(round) + "/" + std::to_string(k));
      specs.push_back({names.back(), DType::f32, {static_cast<std::int64_t>(kElems)}, {}});
    }
    std::map<std::string, SharedTensor<void>> made;
    auto out = outcome<>("create_many", names[0], fails, [&] { made = reg.create_many(specs); });
    ++counts["create_many:" + out];
    if (out != "ok") continue;
    for (int k = 0; k < 4; ++k) SharedTensor<float>(made.at(names[k]).handle()).copy_from_host(pattern(idx, round, k));
    BatchGetResult got;
    out = outcome<>("get_many", names[0], fails, [&] { got = reg.get_many(names); });
    ++counts["get_many:" + out];
    if (out == "ok") {
      if (!got.ok()) fails.push_back("get_many " + names[0] + ": " + std::to_string(got.errors.size()) + " names refused");
      for (int k = 0; k < 4; ++k)
        if (got.tensors.count(names[k]) && read_back(got.tensors.at(names[k])) != pattern(idx, round, k))
          fails.push_back("get_many " + names[k] + ": other data");
    }
    // Removed while held (a non-persistent tensor goes with its last handle).
    BatchRemoveResult rm;
    out = outcome<>("remove_many", names[0], fails, [&] { rm = reg.remove_many(names); });
    ++counts["remove_many:" + out];
    if (out == "ok" && rm.removed.size() != names.size()) {
      std::string why;
      for (const auto& [n, e] : rm.errors) why += " " + n + ": " + e.message;
      fails.push_back("remove_many " + names[0] + ": " + std::to_string(rm.removed.size()) + " removed;" + why);
    }
    got = {};
    made.clear();
    ++run.busy_rounds;
  }
  run.tally.add(counts, fails);
}

// Publishes state dict v (three tensors holding v's pattern) under its own
// prefix, then version v of the model mx/sd/. Nothing is overwritten, so
// readers never race the writes.
void publisher_thread(TensorRegistry& reg, Run& run) {
  std::map<std::string, int> counts;
  std::vector<std::string> fails;
  for (std::uint64_t v = 1; !run.stop || v <= static_cast<std::uint64_t>(min_rounds()); ++v) {
    std::vector<std::vector<float>> data;
    std::vector<StateDictEntry> sd;
    for (int k = 0; k < 3; ++k) data.push_back(pattern(7, static_cast<int>(v), k));
    for (int k = 0; k < 3; ++k) sd.push_back({"w" + std::to_string(k), DType::f32, {static_cast<std::int64_t>(kElems)}, data[k].data()});
    PublishOptions po;
    po.create.persistent = true;
    auto out = outcome<>("publish_state_dict", sd_prefix(v), fails, [&] { (void)publish_state_dict(reg, sd_prefix(v), sd, po); });
    ++counts["publish:" + out];
    if (out != "ok") break;
    std::uint64_t got = 0;
    out = outcome<>("publish_version", "mx/sd/", fails, [&] { got = publish_version(reg, "mx/sd/"); });
    ++counts["version:" + out];
    if (out != "ok") break;
    if (got != v) fails.push_back("publish_version: version " + std::to_string(got) + " for dict " + std::to_string(v));
    run.published = v;
    ++run.busy_rounds;
    std::this_thread::sleep_for(10ms);
  }
  run.tally.add(counts, fails);
}

// Waits for each next version and opens that version's dict.
void waiter_thread(TensorRegistry& reg, Run& run) {
  std::map<std::string, int> counts;
  std::vector<std::string> fails;
  std::uint64_t seen = 0;
  for (;;) {
    std::optional<std::uint64_t> v;
    auto out = outcome<NotFound>("wait_version", "mx/sd/", fails, [&] { v = wait_version(reg, "mx/sd/", seen, 500ms); });
    ++counts["wait:" + out];
    if (out == "NotFound") {  // nothing published yet
      std::this_thread::sleep_for(10ms);
      continue;
    }
    if (out != "ok") break;
    if (!v) {
      if (run.stop && seen >= run.published) break;
      continue;
    }
    if (*v <= seen) fails.push_back("wait_version: " + std::to_string(*v) + " after " + std::to_string(seen));
    seen = *v;
    StateDict d;
    out = outcome<>("open_state_dict", sd_prefix(seen), fails, [&] { d = open_state_dict(reg, sd_prefix(seen)); });
    ++counts["open:" + out];
    if (out != "ok") continue;
    if (d.size() != 3) fails.push_back("open_state_dict " + sd_prefix(seen) + ": " + std::to_string(d.size()) + " tensors");
    for (int k = 0; k < 3; ++k) {
      auto it = d.find("w" + std::to_string(k));
      if (it == d.end() || read_back(it->second) != pattern(7, static_cast<int>(seen), k))
        fails.push_back("open_state_dict " + sd_prefix(seen) + "w" + std::to_string(k) + ": missing or other data");
    }
    ++run.busy_rounds;
  }
  run.tally.add(counts, fails);
}

// Gets of the hot tensors, dropped at once: each drop lingers; a get within
// the window takes the handle back, a later one goes to Redis again.
void linger_thread(TensorRegistry& reg, int idx, Run& run) {
  std::map<std::string, int> counts;
  std::vector<std::string> fails;
  std::mt19937 rng(99u + static_cast<unsigned>(idx));
  for (int round = 0; !run.stop || round < 4 * min_rounds(); ++round) {
    const int k = static_cast<int>(rng() % kHot);
    SharedTensor<float> t;
    auto out = outcome<>("get", hot_name(k), fails, [&] { t = reg.get<float>(hot_name(k)); });
    ++counts["get:" + out];
    if (out == "ok") {
      std::vector<float> v(kElems);
      t.copy_to_host(v);
      if (v != pattern(0, 0, k)) fails.push_back("get " + hot_name(k) + ": other data");
    }
    t.release();
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 50));
    ++run.busy_rounds;
  }
  run.tally.add(counts, fails);
}

// Processes that take a reference and die without a word: the allocator of
// record's collector drops it (their pid is gone) whoever leads by then.
void gc_thread(const test::RedisServer& srv, Run& run) {
  std::map<std::string, int> counts;
  std::vector<std::string> fails;
  for (int round = 0; !run.stop || round < 2; ++round) {
    auto child = test::start_worker(srv.unix_url(), {"--no-control", "--backend", "host", "--timeout", "60000"});
    test::Child& w = *child;
    auto ready = w.read_line(60s);
    if (!ready || ready->rfind("READY", 0) != 0) {
      fails.push_back("worker did not start: " + ready.value_or("(nothing)"));
      break;
    }
    auto r = w.ask("get " + hot_name(round % kHot), 60s);
    // Between the first leader's death and its standby's adoption, nobody
    // serves the fd of its memory: such a get raises Lost and says to get
    // again after the takeover (docs/design.md, "What is lost when").
    for (int again = 0; again < 100 && r.rfind("ERR lost ", 0) == 0 &&
                        r.find("unless a standby adopts it at the takeover") != std::string::npos;
         ++again) {
      ++counts["worker_get:takeover_gap"];
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      r = w.ask("get " + hot_name(round % kHot), 60s);
    }
    ++counts[std::string("worker_get:") + (r.rfind("OK", 0) == 0 ? "ok" : "error")];
    if (r.rfind("OK", 0) != 0) fails.push_back("worker get " + hot_name(round % kHot) + ": " + r);
    w.kill(SIGKILL);
    w.wait();
    ++run.busy_rounds;
  }
  run.tally.add(counts, fails);
}

}  // namespace

TEST_CASE("threads: batch, state-dict, wait_version and lingering calls race GC and two leader changes",
          "[redis][threads][takeover]") {
  test::RedisServer srv;
  // The first leader is another process (a registry does not hand its
  // tensors to a standby of its own process: that one would outlive them).
  auto worker = [&] {
    return test::start_worker(srv.unix_url(), {"--backend", "host", "--ttl", "3000", "--timeout", "60000"});
  };
  auto first = worker();
  auto line = first->read_line(60s);
  REQUIRE(line);
  REQUIRE(line->rfind("READY leader=1", 0) == 0);
  // This process's standby takes over when the first is killed, serves
  // (creates, GC, adoption of the dead leader's tensors) while the threads
  // run, then shuts down and hands everything to a third process.
  std::optional<TensorRegistry> standby(std::in_place, mixed_opts(srv, true));
  REQUIRE_FALSE(standby->is_leader());
  TensorRegistry client(mixed_opts(srv, false));

  for (int k = 0; k < kHot; ++k) {
    CreateOptions pin;
    pin.persistent = true;
    auto t = client.create<float>(hot_name(k), {static_cast<std::int64_t>(kElems)}, pin);
    t.copy_from_host(pattern(0, 0, k));
  }
  client.flush();
  const auto hot_ref = client.info(hot_name(0)).refcount;  // the pin alone: no handle, nothing lingering
  const auto epoch0 = client.leader().epoch;
  std::unique_ptr<test::Child> third;
  std::string third_pid;

  Run run;
  {
    std::vector<std::jthread> threads;
    for (int i = 0; i < 2; ++i) threads.emplace_back([&, i] { batch_thread(client, i, run); });
    threads.emplace_back([&] { publisher_thread(client, run); });
    for (int i = 0; i < 2; ++i) threads.emplace_back([&] { waiter_thread(client, run); });
    for (int i = 0; i < 2; ++i) threads.emplace_back([&, i] { linger_thread(client, i, run); });
    threads.emplace_back([&] { gc_thread(srv, run); });
    auto busy_for = [&](int rounds) {
      const int at = run.busy_rounds + rounds;
      CHECK(test::eventually([&] { return run.busy_rounds >= at; }, 120s));
    };

    // Change 1: the leader dies without a word; this process's standby
    // proves it dead, takes over and adopts its tensors.
    busy_for(10);
    {
      // the hot tensors' memory outlives the first leader only in the fds this process's standby holds
      auto c = srv.connect();
      std::vector<std::string> hot;
      for (int k = 0; k < kHot; ++k) hot.push_back(hot_name(k));
      CHECK(test::eventually([&] { return test::standby_synced(c, ::getpid(), hot); }, 60s));
    }
    first->kill(SIGKILL);
    first->wait();
    CHECK(test::eventually([&] { return standby->is_leader(); }, 60s));
    busy_for(30);
    // Change 2: a graceful stop of this process's leader with a standby of
    // another process, which is handed every tensor.
    third = worker();
    line = third->read_line(60s);
    REQUIRE(line);
    REQUIRE(line->rfind("READY leader=0", 0) == 0);
    third_pid = std::to_string(third->pid());
    standby.reset();
    CHECK(test::eventually([&] { return client.leader().session.rfind(third_pid + "-", 0) == 0; }, 60s));
    busy_for(10);
    run.stop = true;
  }

  std::printf("mixed threads:");
  for (const auto& [k, v] : run.tally.counts) std::printf(" %s=%d", k.c_str(), v);
  std::printf("\n");
  for (const auto& f : run.tally.failures) FAIL_CHECK(f);
  CHECK(run.tally.failures.empty());
  // Every kind of call ran, and kept running across the changes.
  CHECK(run.tally.count("create_many:ok") >= 2 * min_rounds());
  CHECK(run.tally.count("get_many:ok") == run.tally.count("create_many:ok"));
  CHECK(run.tally.count("remove_many:ok") == run.tally.count("create_many:ok"));
  CHECK(run.tally.count("publish:ok") >= min_rounds());
  CHECK(run.tally.count("version:ok") == run.tally.count("publish:ok"));
  CHECK(run.tally.count("open:ok") > 0);
  CHECK(run.tally.count("get:ok") >= 8 * min_rounds());
  CHECK(run.tally.count("worker_get:ok") >= 2);
  CHECK(current_version(client, "mx/sd/") == run.published.load());
  // The lease went from the first process to this one, then to the third.
  const auto now = client.leader();
  CHECK(now.session.rfind(third_pid + "-", 0) == 0);
  CHECK(now.epoch >= epoch0 + 2);

  // The killed workers' references are collected, the lingering ones end:
  // the hot tensors are back to their pin, readable with their data.
  client.flush();
  for (int k = 0; k < kHot; ++k) {
    CHECK(test::eventually([&] { return client.info(hot_name(k)).refcount == hot_ref; }, 30s));
    std::vector<float> v(kElems);
    client.get<float>(hot_name(k)).copy_to_host(v);
    CHECK(v == pattern(0, 0, k));
  }
  CHECK(client.list("mx/b*").empty());
  (void)client.remove_prefix("mx/");
  client.flush();
  CHECK(test::eventually([&] { return client.list("mx/*").empty(); }, 30s));
}

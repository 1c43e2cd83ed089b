// Test harness: load from real processes while a Redis fault is injected
// (tests/test_sentinel.cpp, tests/test_cluster.cpp). RedisLoad starts, on a
// registry URL, one reader (memcuda_soak_worker --reader: persistent
// tensors checked byte for byte all the time) and 8 workers
// (memcuda_soak_worker --ops -1 --faults: creating, getting, releasing,
// removing, publishing in place and bumping a model version, with their
// own data checks and reference audit), none hosting the control thread:
// the test's own registry is the allocator of record. stop() ends them
// with SIGTERM; check_after_fault() then checks what the fault must not
// have broken. Workers' counted errors during the fault are fine; a FAIL
// line (corrupt data, an audit mismatch) or an unclean exit is not.
#pragma once

#include <signal.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "memcuda/redis/connection.hpp"
#include "support/process.hpp"
#include "support/text.hpp"
#include "support/timing.hpp"

namespace memcuda::test {

class RedisLoad {
 public:
  static constexpr int kWorkers = 8;
  static constexpr int kPersistent = 16;

  explicit RedisLoad(const std::string& url, int replica_wait_ms = 1000) {
    const std::vector<std::string> common{"--url", url, "--backend", "host", "--no-control", "--replica-wait",
                                          std::to_string(replica_wait_ms), "--reconnect", "5000"};
    auto start = [&](std::vector<std::string> args) {
      std::vector<std::string> argv{sibling_program("memcuda_soak_worker")};
      argv.insert(argv.end(), common.begin(), common.end());
      argv.insert(argv.end(), args.begin(), args.end());
      procs_.emplace_back().child = std::make_unique<Child>(argv);
    };
    start({"--reader", std::to_string(kPersistent)});
    expect_line(procs_[0], "READY");
    for (int i = 0; i < kWorkers; ++i)
      start({"--ops", "-1", "--faults", "--names", "12", "--seed", std::to_string(1000 + i)});
    for (int i = 1; i <= kWorkers; ++i) expect_line(procs_[static_cast<std::size_t>(i)], "START");
    drain_ = std::thread([this] { drain(); });
  }
  ~RedisLoad() {
    if (!stopping_)
      for (auto& p : procs_) p.child->kill(SIGKILL);  // a failed REQUIRE: end them, then the reader thread
    stopping_ = true;
    if (drain_.joinable()) drain_.join();
  }
  RedisLoad(const RedisLoad&) = delete;
  RedisLoad& operator=(const RedisLoad&) = delete;

  // True once every worker has done `ops` more operations than now (or
  // ended with a FAIL line, which stop() reports).
  bool progresses(long ops = 200, std::chrono::milliseconds limit = std::chrono::seconds(30)) {
    std::vector<long> from;
    {
      std::lock_guard<std::mutex> g(m_);
      for (auto& p : procs_) from.push_back(p.at);
    }
    const bool ok = eventually([&] {
      std::lock_guard<std::mutex> g(m_);
      for (std::size_t i = 1; i < procs_.size(); ++i)
        if (procs_[i].at < from[i] + ops && procs_[i].fails.empty()) return false;  // stop() reports a FAIL
      return true;
    }, limit);
    if (!ok) {
      std::lock_guard<std::mutex> g(m_);
      for (std::size_t i = 1; i < procs_.size(); ++i)
        UNSCOPED_INFO("worker " << i << ": " << procs_[i].at - from[i] << " ops in " << limit.count()
                                << " ms, last line: " << procs_[i].last);
    }
    return ok;
  }

  // SIGTERM to all; each must exit 0 with its DONE line and no FAIL line
  // (a worker that read another tensor's bytes in a block freed on Redis
  // state a failover rolled back prints one). The DONE lines (error counts)
  // go to the log.
  void stop() {
    for (auto& p : procs_) p.child->kill(SIGTERM);
    stopping_ = true;
    drain_.join();
    for (auto& p : procs_) {
      const pid_t pid = p.child->pid();
      const int rc = p.child->wait();
      INFO("process " << pid << ": " << p.done << " last line: " << p.last);
      for (const auto& f : p.fails) FAIL_CHECK(f);
      CHECK(rc == 0);
      CHECK(starts_with(p.done, "DONE"));
      std::printf("load: %s\n", p.done.c_str());
    }
    std::fflush(stdout);
  }

 private:
  struct Proc {
    std::unique_ptr<Child> child;
    long at = 0;
    std::string done, last;
    std::vector<std::string> fails;
  };

  static void expect_line(Proc& p, const std::string& prefix) {
    for (;;) {
      auto l = p.child->read_line(std::chrono::seconds(60));
      INFO("a line starting with " << prefix << ", got: " << l.value_or("(nothing)"));
      REQUIRE(l);
      if (starts_with(*l, prefix)) return;
      REQUIRE(!starts_with(*l, "FAIL"));
    }
  }

  void take(Proc& p, const std::string& l) {
    std::lock_guard<std::mutex> g(m_);
    p.last = l;
    if (starts_with(l, "AT ")) p.at += 100;
    else if (starts_with(l, "DONE")) p.done = l;
    else if (starts_with(l, "FAIL")) p.fails.push_back(l);
  }

  // Reads every process's lines (a full pipe would stop it); once stopping,
  // each one's until its DONE or FAIL line or its end.
  void drain() {
    while (!stopping_) {
      for (auto& p : procs_)
        for (int burst = 0; burst < 16; ++burst) {
          auto l = p.child->read_line(std::chrono::milliseconds(5));  // 1 ms would round down to no wait
          if (!l) break;
          take(p, *l);
        }
    }
    for (auto& p : procs_)
      while (p.done.empty() && p.fails.empty()) {
        auto l = p.child->read_line(std::chrono::seconds(20));
        if (!l) break;
        take(p, *l);
      }
  }

  std::vector<Proc> procs_;
  std::mutex m_;
  std::atomic<bool> stopping_{false};
  std::thread drain_;
};

// Retries a create (and a get of a persistent tensor) until both work; the
// milliseconds from `t0` until then.
inline long long until_creates_work(TensorRegistry& reg, Clock::time_point t0) {
  for (int i = 0;; ++i) {
    try {
      reg.create<float>("after" + std::to_string(i), {4});
      (void)reg.get<std::uint32_t>("load.p1");
      return ms_since(t0);
    } catch (const Error&) {  // a RedisError, or a create request nobody served in time
      if (ms_since(t0) > 60000) throw;
    }
  }
}

// After the load stopped: a fresh process reads every persistent tensor back
// byte for byte; every record's refcount equals the sum of its holders'
// counts; once the workers' sessions have ended no holder but the test's
// own registry (`own`) and the names' own references is left; the
// allocator of record (`leader`) serves a create.
inline void check_after_fault(const std::string& url, TensorRegistry& leader, TensorRegistry& own) {
  {
    Child verify({sibling_program("memcuda_soak_worker"), "--url", url, "--backend", "host", "--no-control",
                  "--reader", std::to_string(RedisLoad::kPersistent), "--verify"});
    std::string line = "(nothing)";
    while (auto l = verify.read_line(std::chrono::seconds(60))) {
      line = *l;
      if (!starts_with(line, "START")) break;
    }
    INFO("the verifying reader said: " << line);
    CHECK(line == "VERIFIED " + std::to_string(RedisLoad::kPersistent));
    CHECK(verify.wait() == 0);
  }
  own.flush();
  redis::Connection c(redis::parse_url(url));  // the namespace's primary
  static constexpr const char* kRefs = R"lua(
local bad, holders = {}, {}
for _, pat in ipairs({'*memcuda:tensor:*', '*memcuda:removed:*'}) do
  for _, k in ipairs(redis.call('KEYS', pat)) do
    if redis.call('TYPE', k)['ok'] == 'hash' then
      local h = redis.call('HGETALL', k)
      local rc, sum = 0, 0
      for i = 1, #h, 2 do
        if h[i] == 'refcount' then rc = tonumber(h[i + 1])
        elseif string.sub(h[i], 1, 7) == 'holder:' then
          sum = sum + tonumber(h[i + 1])
          local who = string.sub(h[i], 8)
          if string.sub(who, 1, 1) ~= '@' then holders[who] = true end
        end
      end
      if rc ~= sum then table.insert(bad, k .. ': refcount ' .. rc .. ' but its holders sum to ' .. sum) end
    end
  end
end
local hl = {}
for k, _ in pairs(holders) do table.insert(hl, k) end
return {bad, hl}
)lua";
  std::set<std::string> others, bad;
  auto settled = [&] {
    auto r = c.command({"EVAL", kRefs, "0"});
    for (std::size_t i = 0; i < r[0].size(); ++i) bad.emplace(r[0][i].str());
    others.clear();
    for (std::size_t i = 0; i < r[1].size(); ++i)
      if (r[1][i].str() != own.session_id() && r[1][i].str() != leader.session_id()) others.emplace(r[1][i].str());
    return others.empty();
  };
  const bool gone = eventually(settled, std::chrono::seconds(30), std::chrono::milliseconds(250));
  INFO("holders left of ended sessions: " << others.size() << (others.empty() ? "" : ", one: " + *others.begin()));
  CHECK(gone);
  for (const auto& b : bad) FAIL_CHECK(b);
  CHECK(eventually([&] { return leader.is_leader(); }, std::chrono::seconds(20)));
  // Creates work: retried, since sentinels that fail over once more (a
  // starved promoted primary) cut the calls of that switch short, as any
  // switch does (docs/operations.md); an error past 60 s fails here.
  CHECK_NOTHROW(until_creates_work(own, Clock::now()));
  // Freed blocks held while a failover could undo their free all settle
  // (an unacknowledged one within HeldFrees::kUnackedHold).
  CHECK(eventually([&] { return leader.stats().process.frees_held == 0; }, std::chrono::seconds(40)));
  std::printf("frees a failover undid (kept allocated): %llu\n",
              static_cast<unsigned long long>(leader.stats().process.frees_undone));
  std::fflush(stdout);
}

}  // namespace memcuda::test

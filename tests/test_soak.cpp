// Soak: 16 real processes (memcuda_soak_worker) create, get, release and
// remove tensors over a small pool of shared names at random, with data
// checks, while the test SIGKILLs some of them at random points and starts
// replacements. The test process hosts the allocator of record, audits the
// registry atomically during the run, and at the end checks that nothing
// leaked: refcounts, holders, pool bytes, Redis keys and /dev/shm objects.
//
// Reproduce a run with MEMCUDA_SOAK_SEED=<seed> (printed at the start and
// in every failure message).
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "memcuda/memcuda.hpp"
#include "memcuda/protocol.hpp"
#include "memcuda/redis/connection.hpp"
#include "support/gpu.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/text.hpp"
#include "support/timing.hpp"
#include "support/worker.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

struct SoakConfig {
  std::string backend = "host";
  int workers = 16;          // running at once (replacements keep the count)
  long ops = 10000;          // per worker
  int kills = 6;             // SIGKILLs at random points, each followed by a replacement
  int with_control_every = 4;  // every 4th worker also hosts a control thread (a standby candidate)
  int worker_ttl_ms = 1500;
  // request_timeout of the workers: far beyond what a loaded machine takes
  // to answer, so that a NotLeader (no reply in time) means a lost command.
  int worker_timeout_ms = 30000;
  std::chrono::seconds deadline{150};  // for the whole run
};

std::uint64_t soak_seed() {
  if (const char* e = std::getenv("MEMCUDA_SOAK_SEED"); e && *e) return std::stoull(e);
  std::random_device rd;
  return (std::uint64_t{rd()} << 32 | rd()) % 1000000000ULL;
}

using test::field;
using test::starts_with;

// True once the process has exited (a zombie waiting for waitpid).
bool exited(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  if (!std::getline(f, s)) return true;
  auto rp = s.rfind(')');
  return rp == std::string::npos || rp + 2 >= s.size() || s[rp + 2] == 'Z' || s[rp + 2] == 'X';
}

struct Worker {
  std::unique_ptr<test::Child> child;
  std::uint64_t seed = 0;
  std::string session;  // from its START line
  long progress = 0;    // from its "AT <n>" lines
  bool killed = false, finished = false;
  int status = -1;
  std::string done;  // its DONE line
  std::string last;  // its last line
};

// One atomic look at every tensor record (a Lua script runs alone in
// Redis, so no half-done operation is seen): refcount == sum of holder:*
// fields, every holder count >= 1, a named record has refcount >= 1, its
// key matches its name and the name is in memcuda:names, every name in
// memcuda:names has its Hash, and a removed record's refcount is >= 0.
// Returns {violations, holder ids present, named tensors, removed records}.
constexpr const char* kAudit = R"lua(
local bad, holders = {}, {}
local function audit(key, named)
  local h = redis.call('HGETALL', key)
  local rc, sum, name = nil, 0, nil
  for i = 1, #h, 2 do
    local f, v = h[i], h[i + 1]
    if f == 'refcount' then rc = tonumber(v)
    elseif f == 'name' then name = v
    elseif string.sub(f, 1, 7) == 'holder:' then
      local n = tonumber(v)
      if n == nil or n < 1 then table.insert(bad, key .. ': ' .. f .. ' = ' .. v) end
      sum = sum + (n or 0)
      holders[string.sub(f, 8)] = true
    end
  end
  if rc == nil then table.insert(bad, key .. ': no refcount field'); return end
  if rc ~= sum then table.insert(bad, key .. ': refcount ' .. rc .. ' but holders sum to ' .. sum) end
  if rc < 0 then table.insert(bad, key .. ': negative refcount ' .. rc) end
  if named then
    if rc < 1 then table.insert(bad, key .. ': named with refcount ' .. rc) end
    if name == nil or key ~= 'memcuda:tensor:' .. name then table.insert(bad, key .. ': name field ' .. tostring(name)) end
    if name and not redis.call('ZSCORE', 'memcuda:names', name) then
      table.insert(bad, key .. ': not in memcuda:names')
    end
  end
end
local named = redis.call('KEYS', 'memcuda:tensor:*')
local removed = redis.call('KEYS', 'memcuda:removed:*')
for _, k in ipairs(named) do audit(k, true) end
for _, k in ipairs(removed) do audit(k, false) end
for _, n in ipairs(redis.call('ZRANGE', 'memcuda:names', 0, -1)) do
  if redis.call('EXISTS', 'memcuda:tensor:' .. n) == 0 then table.insert(bad, 'memcuda:names has ' .. n .. ' without a Hash') end
end
local hl = {}
for k, _ in pairs(holders) do table.insert(hl, k) end
return {bad, hl, #named, #removed}
)lua";

struct Audit {
  std::vector<std::string> violations;
  std::set<std::string> holders;
  long long named = 0, removed = 0;
};

Audit audit(redis::Connection& c) {
  auto r = c.command({"EVAL", kAudit, "0"});
  Audit a;
  for (std::size_t i = 0; i < r[0].size(); ++i) a.violations.emplace_back(r[0][i].str());
  for (std::size_t i = 0; i < r[1].size(); ++i) a.holders.emplace(r[1][i].str());
  a.named = r[2].integer();
  a.removed = r[3].integer();
  return a;
}

std::vector<std::string> all_keys(redis::Connection& c) {
  std::vector<std::string> keys;
  std::string cursor = "0";
  do {
    auto r = c.command({"SCAN", cursor, "COUNT", "1000"});
    cursor = std::string(r[0].str());
    for (std::size_t i = 0; i < r[1].size(); ++i) keys.emplace_back(r[1][i].str());
  } while (cursor != "0");
  return keys;
}

std::set<std::string> smembers(redis::Connection& c, const std::string& key) {
  auto r = c.command({"SMEMBERS", key});
  std::set<std::string> s;
  for (std::size_t i = 0; i < r.size(); ++i) s.emplace(r[i].str());
  return s;
}

// /dev/shm objects of older versions' host backend: "/memcuda.<session>.<alloc id>".
std::vector<std::string> shm_objects_of(const std::set<std::string>& sessions) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    std::string n = e.path().filename().string();
    if (!starts_with(n, "memcuda.")) continue;
    auto rest = n.substr(8);
    auto dot = rest.rfind('.');
    if (dot != std::string::npos && sessions.count(rest.substr(0, dot))) out.push_back(n);
  }
  return out;
}

void soak(const SoakConfig& cfg) {
  const std::uint64_t seed = soak_seed();
  const auto t_start = Clock::now();
  std::cerr << "soak(" << cfg.backend << "): seed " << seed << " (MEMCUDA_SOAK_SEED=" << seed
            << " reproduces the schedule)" << std::endl;
  INFO("soak seed " << seed << " (rerun with MEMCUDA_SOAK_SEED=" << seed << ")");
  std::mt19937_64 rng(seed);

  test::RedisServer srv;
  auto c = srv.connect();

  // The test process is the allocator of record: it owns the pools, so its
  // stats() show their bytes. A long lease keeps it leader on a loaded
  // machine; sessions and GC keep their default timings.
  RegistryOptions o;
  o.redis = srv.options();
  o.control_thread = true;
  o.lease_ttl = 4000ms;
  o.request_timeout = std::chrono::milliseconds(cfg.worker_timeout_ms);
  o.default_backend = *backend_from_string(cfg.backend);
  TensorRegistry reg(o);
  REQUIRE(reg.is_leader());

  const std::string exe = test::sibling_program("memcuda_soak_worker");
  std::vector<Worker> ws;
  std::uint64_t next_seed = seed * 1000;
  auto spawn = [&] {
    Worker w;
    w.seed = next_seed++;
    std::vector<std::string> argv{exe,       "--url",  srv.unix_url(),           "--seed",
                                  std::to_string(w.seed), "--ops", std::to_string(cfg.ops), "--backend",
                                  cfg.backend, "--ttl", std::to_string(cfg.worker_ttl_ms), "--timeout",
                                  std::to_string(cfg.worker_timeout_ms)};
    if (ws.size() % static_cast<std::size_t>(cfg.with_control_every) != 0) argv.push_back("--no-control");
    w.child = std::make_unique<test::Child>(argv);
    ws.push_back(std::move(w));
  };
  for (int i = 0; i < cfg.workers; ++i) spawn();

  // The kill schedule, by progress rather than by the clock (so it means the
  // same on a fast and a slow machine): one victim at a time, a random
  // running worker, killed once it reports having done a random number of
  // its operations (between 10% and 80% of them).
  int kills_done = 0;
  std::optional<std::size_t> victim;
  long victim_at = 0;
  auto plan_kill = [&] {
    victim.reset();
    if (kills_done >= cfg.kills) return;
    std::vector<std::size_t> cand;
    for (std::size_t i = 0; i < ws.size(); ++i)
      if (!ws[i].killed && !ws[i].finished && !ws[i].session.empty() && ws[i].progress < cfg.ops * 8 / 10)
        cand.push_back(i);
    if (cand.empty()) {
      // Every running worker is past the window (fast machines finish 1,000
      // operations between two polls): start one more to be the victim,
      // unless one is starting already.
      bool starting = false;
      for (auto& w : ws) starting |= !w.killed && !w.finished && w.session.empty();
      if (!starting) spawn();
      return;
    }
    victim = cand[std::uniform_int_distribution<std::size_t>(0, cand.size() - 1)(rng)];
    const long lo = std::max(ws[*victim].progress, cfg.ops / 10);
    victim_at = std::uniform_int_distribution<long>(lo, std::max(lo, cfg.ops * 8 / 10))(rng);
  };
  std::map<std::string, Clock::time_point> killed_at;  // session -> when
  std::map<std::string, std::chrono::milliseconds> collected_after;  // session -> GC latency
  std::vector<std::string> violations, failures;
  std::size_t audits = 0;
  auto next_audit = Clock::now();

  auto running = [&] {
    std::size_t n = 0;
    for (auto& w : ws) n += !w.killed && !w.finished;
    return n;
  };
  auto take = [&](Worker& w, const std::string& l) {
    w.last = l;
    if (starts_with(l, "START")) w.session = field(l, "session");
    else if (starts_with(l, "AT ")) w.progress = std::stol(l.substr(3));
    else if (starts_with(l, "DONE")) w.done = l;
    else if (starts_with(l, "FAIL")) failures.push_back("worker seed " + std::to_string(w.seed) + ": " + l);
  };
  while (running() > 0 && Clock::now() - t_start < cfg.deadline) {
    for (auto& w : ws) {
      if (w.killed || w.finished) continue;
      // (read_line rounds its wait down to whole ms: 1 ms would never poll)
      while (auto l = w.child->read_line(3ms)) {
        take(w, *l);
        if (victim && &ws[*victim] == &w && w.progress >= victim_at) break;  // kill it before it goes on
      }
      if (exited(w.child->pid())) {
        while (auto l = w.child->read_line(200ms)) take(w, *l);  // what it wrote before exiting
        w.status = w.child->wait();
        w.finished = true;
        if (w.status != 0 || w.done.empty())
          failures.push_back("worker seed " + std::to_string(w.seed) + " exited with status " +
                             std::to_string(w.status) + ", last line: " + w.last);
      }
    }
    if (victim && (ws[*victim].finished || ws[*victim].killed)) victim.reset();  // finished first: plan again
    if (!victim) plan_kill();
    if (victim && ws[*victim].progress >= victim_at) {
      auto& v = ws[*victim];
      v.child->kill(SIGKILL);
      v.child->wait();
      v.killed = true;
      killed_at[v.session] = Clock::now();
      ++kills_done;
      spawn();  // a replacement keeps the load up
      victim.reset();
    }
    if (Clock::now() >= next_audit) {
      auto a = audit(c);
      ++audits;
      for (auto& v : a.violations) violations.push_back("during the run: " + v);
      for (auto& [s, t] : killed_at)
        if (!collected_after.count(s) && !a.holders.count(s))
          collected_after[s] = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t);
      next_audit = Clock::now() + 500ms;
    }
  }
  const auto run_time = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t_start);
  INFO("workers ran for " << run_time.count() << " ms");
  for (auto& w : ws)
    if (!w.killed && !w.finished) {
      failures.push_back("worker seed " + std::to_string(w.seed) + " did not finish in time; last line: " + w.last);
      w.child->kill(SIGKILL);
      w.child->wait();
    }
  for (const auto& f : failures) FAIL_CHECK(f);
  for (const auto& v : violations) FAIL_CHECK(v);
  CHECK(kills_done == cfg.kills);
  CHECK(audits > 0);

  // What the finished workers did, all together.
  std::map<std::string, long> total;
  for (const auto& w : ws) {
    std::istringstream in(w.done);
    std::string tok;
    while (in >> tok)
      if (auto eq = tok.find('='); eq != std::string::npos) total[tok.substr(0, eq)] += std::stol(tok.substr(eq + 1));
  }
  std::ostringstream summary;
  for (const auto& [k, v] : total) summary << " " << k << "=" << v;
  std::cout << "soak(" << cfg.backend << ") workers' totals:" << summary.str() << std::endl;
  INFO("workers' totals:" << summary.str());
  CHECK(total["creates"] > 0);
  CHECK(total["gets"] > 0);
  CHECK(total["verified"] > 0);
  CHECK(total["audits"] > 0);
  // The test process is the allocator of record all along (epoch 1, checked
  // below) and only workers die. So no request goes unanswered (NotLeader,
  // and with it a create of unknown outcome), no Redis call times out, and
  // no tensor's memory is lost: it belongs to the allocator of record, not
  // to the killed workers. Races make only not_found, already_exists and
  // stale_handle normal.
  CHECK(total["not_leader"] == 0);
  CHECK(total["timeout"] == 0);
  CHECK(total["lost"] == 0);
  CHECK(total["uncertain_creates"] == 0);
  CHECK(total["leaked_refs"] == 0);
  CHECK(total["errors"] == total["not_found"] + total["already_exists"] + total["stale_handle"]);

  // Garbage collection: the killed sessions expire (session_ttl) and the
  // allocator of record drops their references every gc_interval; the
  // finished workers ended their sessions. Ask for a collection too, until
  // no record names a holder other than "@name" (the test holds nothing).
  std::set<std::string> sessions_seen{reg.session_id()};
  for (const auto& w : ws)
    if (!w.session.empty()) sessions_seen.insert(w.session);
  const auto t_gc = Clock::now();
  Audit a;
  for (;;) {
    reg.collect_garbage();
    a = audit(c);
    bool clean = a.removed == 0 && reg.stats().sessions == 1;
    for (const auto& h : a.holders) clean = clean && h == "@name";
    if (clean || Clock::now() - t_gc > 15s) break;
    std::this_thread::sleep_for(100ms);
  }
  INFO("garbage collected " << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t_gc).count()
                            << " ms after the last worker finished");
  // How long each killed worker's references took to go, as the audits of
  // the run saw it: printed, not asserted (the loop above bounds the rest).
  for (const auto& [s, t] : collected_after)
    std::cout << "timing: killed session " << s << ": references collected after " << t.count() << " ms\n";
  for (const auto& v : a.violations) FAIL_CHECK("after the run: " << v);
  // Every holder left is a live session or a name's own reference; the
  // only live session is the test's, and it holds nothing.
  {
    auto live = smembers(c, "memcuda:sessions");
    CHECK(live == std::set<std::string>{reg.session_id()});
    for (const auto& h : a.holders) {
      INFO("holder " << h);
      CHECK(h == "@name");
    }
  }
  CHECK(a.removed == 0);  // every unlinked record was freed
  // So what is still named is persistent and held by its name alone.
  for (const auto& t : reg.list()) {
    INFO("tensor " << t.name << " generation " << t.generation);
    CHECK(t.refcount == 1);
    CHECK(t.holders == std::map<std::string, std::int64_t>{{"@name", 1}});
    CHECK(t.owner == reg.session_id());
  }

  // Removing every remaining name brings the pools back to zero bytes in use.
  for (const auto& t : reg.list()) {
    try {
      reg.remove(t.name);
    } catch (const NotFound&) {
    }
  }
  const auto t_free = Clock::now();
  auto pools_idle = [&] {
    auto st = reg.stats();
    bool idle = !st.pools.empty() && st.tensors == 0 && st.queue_length == 0;
    for (const auto& p : st.pools) idle = idle && p.in_use == 0;
    return idle;
  };
  while (!pools_idle() && Clock::now() - t_free < 5s) std::this_thread::sleep_for(20ms);
  {
    auto st = reg.stats();
    REQUIRE_FALSE(st.pools.empty());
    for (const auto& p : st.pools) {
      INFO("pool " << to_string(p.backend) << " device " << p.device << ": in_use " << p.in_use << ", allocations "
                   << p.allocations << ", frees " << p.frees);
      CHECK(p.in_use == 0);
      CHECK(p.allocations == p.frees);
    }
    CHECK(st.tensors == 0);
    CHECK(st.process.owned_allocations == 0);
    CHECK(st.process.owned_bytes == 0);
    CHECK(st.queue_length == 0);
  }
  CHECK(reg.is_leader());
  CHECK(c.command({"GET", "memcuda:epoch"}).str() == "1");  // nobody took over from the test

  // Empty slabs go back to the OS on trim(): then no memfd of any process
  // of this run is left anywhere, the killed ones' included (their fds
  // and mappings went with them), and nothing was ever named in /dev/shm.
  reg.trim();
  if (cfg.backend == "host") {
    for (const auto& n : shm_objects_of(sessions_seen)) FAIL_CHECK("left in /dev/shm: " << n);
    std::vector<pid_t> pids;
    for (const auto& sid : sessions_seen) pids.push_back(static_cast<pid_t>(std::stol(sid)));
    std::set<std::string> left;
    test::eventually([&] {
      left.clear();
      for (const auto& label : test::memfds_of(pids)) {
        auto rest = label.substr(8);  // "memcuda.<session>.<alloc id>"
        if (sessions_seen.count(rest.substr(0, rest.rfind('.')))) left.insert(label);
      }
      return left.empty();
    });
    for (const auto& n : left) FAIL_CHECK("memfd left: " << n);
  }

  // No orphan keys. What may legitimately remain once every tensor is gone
  // (docs/protocol.md, "Redis keys and scripts"):
  //   memcuda:leader              the test process's lease ("<epoch> <session>", PX ttl)
  //   memcuda:epoch               the takeover counter; never deleted, epochs only grow
  //   memcuda:generation          the generation counter; never deleted, so a
  //                               re-created name never reuses a generation
  //   memcuda:session:<test>      the test's own live session (PX session_ttl)
  //   memcuda:sessions            the session index: exactly the test's session
  //                               (GC pruned the killed ones, finished ones left)
  //   memcuda:pool_stats          the leader's published pool statistics (PX 3 x ttl)
  //   memcuda:processing_lists    the Set naming the leader's processing list,
  //                               kept for the next takeover's re-queue
  //   memcuda:owner_uid           the leader's uid (never expires)
  //   memcuda:owners              the allocators of record (the test process)
  //   memcuda:usage               the statistics' counters, all 0 at the end
  // (no memcuda:refs:* nor memcuda:holders: every reference was released,
  // the killed workers' by the collector through their indexes)
  //   memcuda:reply:<worker>:<n> only with an expiry (<= 60 s): a reply that
  //                               arrived after its requester died or gave up
  //   memcuda:inbox:<session>     only with an expiry (<= 60 s): messages to a
  //                               registry's thread ("forget" notices sent to
  //                               every live registry when a session ends);
  //                               those of workers that exited since stay
  //                               until they expire
  // And what must not: tensor_lifecycle and memcuda:processing:<epoch> (Redis
  // deletes empty lists, so either key existing means a command nobody
  // finished), memcuda:names (deleted when empty), memcuda:tensor:* and
  // memcuda:removed:* (every tensor was removed and freed), memcuda:moved:*,
  // memcuda:lost:* and memcuda:reply:*:migrate (only written when an
  // allocator of record dies, and the test process stayed the allocator),
  // memcuda:waiters:* (the soak never waits), any other session.
  const std::set<std::string> fixed = {"memcuda:leader",      "memcuda:epoch",      "memcuda:generation",
                                       "memcuda:sessions",    "memcuda:pool_stats", "memcuda:processing_lists",
                                       "memcuda:owner_uid",   "memcuda:owners",
                                       "memcuda:session:" + reg.session_id()};
  for (const auto& k : all_keys(c)) {
    INFO("key " << k);
    if (fixed.count(k)) continue;
    if (k == "memcuda:usage") {  // the statistics' counters: every tensor went, so every count is 0
      auto u = c.command({"HGETALL", k});
      for (std::size_t i = 0; i + 1 < u.size(); i += 2) {
        INFO("field " << u[i].str());
        CHECK(u[i + 1].str() == "0");
      }
      continue;
    }
    if (starts_with(k, "memcuda:reply:") || starts_with(k, "memcuda:inbox:")) {
      std::string owner = k.substr(14);
      owner = owner.substr(0, owner.find(':'));  // reply lists are per request: memcuda:reply:<session>:<seq>
      CHECK(sessions_seen.count(owner) == 1);
      auto ttl = c.command({"PTTL", k}).integer();
      CHECK(ttl > 0);
      CHECK(ttl <= 60000);
      continue;
    }
    FAIL_CHECK("orphan key " << k << " (" << c.command({"TYPE", k}).str() << ")");
  }
  CHECK(c.command({"EXISTS", "memcuda:leader"}).integer() == 1);
  CHECK(smembers(c, "memcuda:processing_lists") == std::set<std::string>{"memcuda:processing:1"});

  const auto wall = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t_start);
  std::cerr << "soak(" << cfg.backend << "): seed " << seed << ", " << ws.size() << " workers (" << kills_done
            << " killed), run " << run_time.count() << " ms, wall " << wall.count() << " ms;" << summary.str();
  for (const auto& [s, t] : collected_after) std::cerr << " gc(" << s << ")=" << t.count() << "ms";
  std::cerr << std::endl;
}

}  // namespace

TEST_CASE("soak: 16 processes create, get, release and remove at random while some are killed",
          "[redis][multiprocess][soak]") {
  SoakConfig cfg;
  cfg.backend = "host";
  soak(cfg);
}

// The same on the cuda backend with fewer operations: the [gpu] group also
// runs under compute-sanitizer, which slows every CUDA call of every process
// (on an H100 host: about 7 s plain, 32 s under memcheck).
TEST_CASE("cuda soak: 16 processes create, get, release and remove at random while some are killed",
          "[gpu][soak]") {
  MEMCUDA_REQUIRE_GPU();
  SoakConfig cfg;
  cfg.backend = "cuda";
  cfg.ops = 1000;
  cfg.kills = 3;
  cfg.worker_ttl_ms = 2000;
  cfg.worker_timeout_ms = 30000;  // compute-sanitizer slows a leader's first CUDA calls
  cfg.deadline = 240s;
  soak(cfg);
}

// What the soak found, made deterministic: a create sent to the allocator of
// record takes a reference for its creator; when another process removes
// (or removes and re-creates) the name before the creator reads the record
// back, create() throws NotFound ("vanished right after its creation") or
// StaleHandle ("replaced right after its creation"). It knows the
// generation it was given, so it must drop that reference; otherwise the
// unlinked record (memcuda:removed:<gen>) and its memory stay held until
// the creating process exits. Here the test plays the allocator of record,
// so it decides what happens between the create and the read-back.
TEST_CASE("a create whose tensor is removed or replaced before its creator reads it back leaves no reference behind",
          "[redis][registry]") {
  for (const bool replaced : {false, true}) {
    DYNAMIC_SECTION((replaced ? "removed and re-created" : "removed")) {
      test::RedisServer srv;
      auto c = srv.connect();
      const std::string leader_session = "1-00000000000000aa";
      c.command({"SET", "memcuda:epoch", "1"});
      c.command({"SET", "memcuda:leader", "1 " + leader_session, "PX", "60000"});
      RegistryOptions o;
      o.redis = srv.options();
      o.control_thread = false;
      o.request_timeout = 5s;
      o.default_backend = BackendKind::host;
      TensorRegistry reg(o);

      std::thread leader([&] {
        auto l = srv.connect();
        auto r = l.blocking(5s, {"BRPOP", "tensor_lifecycle", "5"});
        if (r.is_nil()) return;
        auto cmd = protocol::decode_command(r[1].str());
        // The create executed for its holder (generation 7, refcount 1),
        // then another process removed the name: the record now lives at
        // memcuda:removed:7, still held by the creator.
        l.command({"HSET", "memcuda:removed:7", "name", cmd.name, "generation", "7", "refcount", "1",
                   "holder:" + cmd.holder.value_or("?"), "1", "owner", leader_session});
        if (replaced) {  // ... and created it again: generation 8, somebody else's
          TensorInfo t;
          t.name = cmd.name;
          t.dtype = DType::f32;
          t.shape = {4};
          t.node = reg.node_id();
          t.bytes = 16;
          t.backend = BackendKind::host;
          t.ipc_handle = "/memcuda." + leader_session + ".1";
          t.alloc_bytes = 256;
          t.alloc_id = 1;
          t.refcount = 1;
          t.state = TensorState::ready;
          t.generation = 8;
          t.epoch = 1;
          t.owner = leader_session;
          t.owner_pid = 1;
          t.holders["someone-else"] = 1;
          redis::Command hset{"HSET", "memcuda:tensor:" + cmd.name};
          for (auto& [k, v] : protocol::encode_record(t)) {
            hset.push_back(k);
            hset.push_back(v);
          }
          l.command(hset);
          l.command({"ZADD", "memcuda:names", "0", cmd.name});
        }
        protocol::Reply rep;
        rep.id = cmd.id;
        rep.id_is_number = cmd.id_is_number;
        rep.op = "create";
        rep.name = cmd.name;
        rep.generation = 7;
        rep.refcount = 1;
        l.command({"LPUSH", cmd.reply_to.value_or("?"), protocol::encode_reply(rep)});
      });
      if (replaced) CHECK_THROWS_AS(reg.create<float>("raced", {4}), StaleHandle);
      else CHECK_THROWS_AS(reg.create<float>("raced", {4}), NotFound);
      leader.join();
      INFO("memcuda:removed:7 = " << [&] {
        std::string s;
        auto h = c.command({"HGETALL", "memcuda:removed:7"});
        for (std::size_t i = 0; i + 1 < h.size(); i += 2)
          s += std::string(h[i].str()) + "=" + std::string(h[i + 1].str()) + " ";
        return s;
      }());
      // The reference the create took for this process was given back.
      CHECK(c.command({"HEXISTS", "memcuda:removed:7", "holder:" + reg.session_id()}).integer() == 0);
    }
  }
}

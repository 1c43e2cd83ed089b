// The worker processes of memcuda_bench_scale: the program re-executed with
// --child ROLE. Each is a client registry (control_thread off, no reference
// sharing: every get is a Redis acquire) on the namespace --ns, Redis from
// MEMCUDA_REDIS_URL. They talk to the parent in lines: READY when set up,
// then GO from the parent, then one result line.
//   hold    takes a reference to each of the first --count names (get_many,
//           10k names a call), says READY <taken>, and waits to be killed
//   list    on GO: list("*"); says DONE <ns> <records>
//   rm      on GO: remove_prefix(--prefix); says DONE <now_ns> <removed>
//   tput    on GO <start_ns> <end_ns>: get+release of random names among the
//           first --count (each release in Redis before the next get), from
//           start to end; says OPS <pairs done by end>
//   ping    the same with a Redis PING per op
// The parent's side of the lines (expect, rate) is here too: the Python
// workers (bench_scale_python.hpp) speak the same lines.
#pragma once

#include <random>

#include "bench_scale_support.hpp"
#include "memcuda/memcuda.hpp"

namespace memcuda::bench::scale {

// Calls that may meet a Redis busy with an older tree's long scripts wait
// this long before a TimeoutError (the library's default is 2 s).
inline constexpr milliseconds kCommandTimeout{60000};

inline RegistryOptions client_options(redis::Options redis, const std::string& ns) {
  RegistryOptions o = RegistryOptions::from_env();
  redis.command_timeout = kCommandTimeout;
  o.redis = std::move(redis);
  o.name_space = ns;
  o.control_thread = false;  // a client: `memcuda serve` is the allocator of record
  o.share_references = false;
  o.default_backend = BackendKind::host;
  o.request_timeout = kCommandTimeout;
  return o;
}

inline void say(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

inline std::string next_line() {
  std::string l;
  if (!std::getline(std::cin, l)) throw std::runtime_error("the parent closed stdin");
  return l;
}

inline int worker_hold(TensorRegistry& reg, std::size_t count) {
  std::vector<BatchGetResult> held;
  std::size_t taken = 0;
  for (std::size_t from = 0; from < count; from += 10000) {
    auto r = reg.get_many(tensor_names("t/", from, std::min(count, from + 10000)));
    if (!r.ok())
      throw std::runtime_error("get_many: " + r.errors.begin()->first + ": " + r.errors.begin()->second.message);
    taken += r.tensors.size();
    held.push_back(std::move(r));
  }
  say("READY " + std::to_string(taken));
  std::string l;
  while (std::getline(std::cin, l)) {
  }
  return 0;
}

inline int worker_once(TensorRegistry& reg, const std::string& role, const std::string& prefix) {
  reg.leader();  // untimed: a connection up
  say("READY");
  if (next_line() != "GO") return 3;
  if (role == "list") {
    const auto t0 = now_ns();
    const auto v = reg.list("*");
    say("DONE " + std::to_string(now_ns() - t0) + " " + std::to_string(v.size()));
  } else {
    const auto r = reg.remove_prefix(prefix);
    say("DONE " + std::to_string(now_ns()) + " " + std::to_string(r.removed.size()));
  }
  return 0;
}

inline int worker_rate(const std::string& role, const std::string& ns, std::size_t count, std::uint64_t seed) {
  const bool ping = role == "ping";
  const redis::Options ro = redis::options_from_env();
  std::optional<TensorRegistry> reg;
  std::optional<redis::Connection> conn;
  if (ping) conn.emplace(ro);
  else reg.emplace(client_options(ro, ns));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::size_t> pick(0, count - 1);
  auto op = [&] {
    if (ping) {
      conn->command({"PING"});
    } else {
      reg->get<void>(tensor_name("t/", pick(rng))).release();
      reg->flush();  // a pair is done when its release is in Redis
    }
  };
  for (int i = 0; i < 20; ++i) op();
  say("READY");
  std::istringstream go(next_line());
  std::string word;
  std::int64_t start = 0, end = 0;
  go >> word >> start >> end;
  if (word != "GO") return 3;
  while (now_ns() < start) std::this_thread::sleep_for(std::chrono::microseconds(100));
  std::uint64_t ops = 0;
  while (now_ns() < end) {
    op();
    if (now_ns() <= end) ++ops;
  }
  say("OPS " + std::to_string(ops));
  return 0;
}

// ---- the parent's side ---------------------------------------------------------

inline milliseconds until(Clock::time_point t) {
  return std::max(milliseconds(1), std::chrono::duration_cast<milliseconds>(t - Clock::now()));
}

// The rest of the worker's next line, which must start with `prefix`;
// nullopt at `end`. A worker that exited instead is an error.
inline std::optional<std::string> expect(ChildProcess& c, const std::string& prefix, Clock::time_point end) {
  auto l = c.read_line(until(end));
  if (!l && c.eof()) throw std::runtime_error("a worker exited before it said " + prefix + "(its stderr above)");
  if (!l) return std::nullopt;
  if (l->rfind(prefix, 0) != 0) throw std::runtime_error("worker said '" + *l + "', not " + prefix);
  return l->substr(prefix.size());
}

// Worker i of a rate (tput or ping, C++ or Python).
using Spawn = std::function<std::unique_ptr<ChildProcess>(std::uint64_t i)>;

// P workers, all READY by `end`, then one shared window of `window_s` from
// 300 ms on; total ops / window. nullopt when a worker was not READY in time.
inline std::optional<double> rate(const Spawn& spawn, std::uint64_t p, double window_s, Clock::time_point end) {
  std::vector<std::unique_ptr<ChildProcess>> ws;
  for (std::uint64_t i = 0; i < p; ++i) ws.push_back(spawn(i));
  for (auto& w : ws)
    if (!expect(*w, "READY", end)) return std::nullopt;
  const auto start = now_ns() + 300'000'000;
  const auto stop = start + static_cast<std::int64_t>(window_s * 1e9);
  for (auto& w : ws) w->write("GO " + std::to_string(start) + " " + std::to_string(stop) + "\n");
  std::uint64_t ops = 0;
  const auto collect = Clock::now() + std::chrono::seconds(30) + milliseconds(static_cast<int>(window_s * 1000));
  for (auto& w : ws) {
    auto l = expect(*w, "OPS ", collect);
    if (!l) return std::nullopt;
    ops += std::stoull(*l);
  }
  return static_cast<double>(ops) / window_s;
}

// ---- the worker's side -----------------------------------------------------------

inline int run_worker(const Args& a) {
  const std::string role = a.get_or("--child", "");
  const std::string ns = a.get_or("--ns", "");
  const std::size_t count = std::stoull(a.get_or("--count", "1"));
  if (role == "tput" || role == "ping") return worker_rate(role, ns, count, std::stoull(a.get_or("--seed", "1")));
  TensorRegistry reg(client_options(redis::options_from_env(), ns));
  if (role == "hold") return worker_hold(reg, count);
  if (role == "list" || role == "rm") return worker_once(reg, role, a.get_or("--prefix", ""));
  std::cerr << "unknown child role '" << role << "'\n";
  return 2;
}

}  // namespace memcuda::bench::scale

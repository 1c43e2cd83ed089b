// What memcuda_bench_scale needs beside bench_common.hpp: tensor names and
// their Redis keys, a program run with a time limit and its peak RSS, the
// pools' bytes in use and Redis's memory as Redis reports them, and a poll
// of many keys until each reads as wanted. Only the public headers and the
// documented key layout (docs/protocol.md), so that the program builds
// against older trees too.
#pragma once

#include <sys/resource.h>
#include <sys/wait.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <utility>

#include "bench_common.hpp"

namespace memcuda::bench::scale {

namespace json = boost::json;
using std::chrono::milliseconds;

// ---- names and keys ----------------------------------------------------------

// "t/0000042": zero padded, so name order is index order (seven digits: 10M).
inline std::string tensor_name(std::string_view prefix, std::size_t i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%07zu", i);
  return std::string(prefix) + buf;
}

inline std::vector<std::string> tensor_names(std::string_view prefix, std::size_t from, std::size_t to) {
  std::vector<std::string> v;
  v.reserve(to > from ? to - from : 0);
  for (std::size_t i = from; i < to; ++i) v.push_back(tensor_name(prefix, i));
  return v;
}

// A linked name's Hash and the leader's pool statistics (docs/protocol.md).
inline std::string key_prefix(const std::string& ns) { return ns.empty() ? std::string() : ns + ":"; }
inline std::string tensor_key(const std::string& ns, std::string_view name) {
  return key_prefix(ns) + "memcuda:tensor:" + std::string(name);
}
inline std::string pool_stats_key(const std::string& ns) { return key_prefix(ns) + "memcuda:pool_stats"; }

// ---- Redis-side figures --------------------------------------------------------

// INFO memory's used_memory: what Redis's allocator holds for data and buffers.
inline std::uint64_t used_memory(redis::Connection& c) {
  const std::string info(c.command({"INFO", "memory"}).str());
  const auto p = info.find("used_memory:");
  if (p == std::string::npos) throw std::runtime_error("INFO memory has no used_memory");
  return std::stoull(info.substr(p + 12, info.find_first_of("\r\n", p) - p - 12));
}

// INFO commandstats: one command's calls and microseconds since the last
// CONFIG RESETSTAT (0, 0 when it has not run).
inline std::pair<std::uint64_t, std::uint64_t> command_usec(redis::Connection& c, std::string_view cmd) {
  const std::string info(c.command({"INFO", "commandstats"}).str());
  const auto p = info.find("cmdstat_" + std::string(cmd) + ":calls=");
  if (p == std::string::npos) return {0, 0};
  const auto u = info.find(",usec=", p);
  return {std::stoull(info.substr(p + 15 + cmd.size())), std::stoull(info.substr(u + 6))};
}

// The leader's pools' bytes in use, summed, as it last published them (at
// each lease renewal); nullopt while the key is absent. Read directly rather
// than through TensorRegistry::stats(), which also lists every record.
inline std::optional<std::uint64_t> pool_in_use(redis::Connection& c, const std::string& ns) {
  auto r = c.command({"GET", pool_stats_key(ns)});
  if (r.is_nil()) return std::nullopt;
  std::uint64_t sum = 0;
  const json::value v = json::parse(r.str());
  for (const auto& p : v.as_array()) sum += p.as_object().at("in_use").to_number<std::uint64_t>();
  return sum;
}

// The pools' bytes in use once two readings 700 ms apart agree (the leader
// publishes them at each lease renewal); the last reading after 5 s.
inline std::uint64_t settled_in_use(redis::Connection& c, const std::string& ns) {
  std::optional<std::uint64_t> last;
  for (int i = 0; i < 8; ++i) {
    auto v = pool_in_use(c, ns);
    if (v && last && *v == *last) return *v;
    last = v;
    std::this_thread::sleep_for(milliseconds(700));
  }
  if (!last) throw std::runtime_error("no pool statistics in Redis (" + pool_stats_key(ns) + ")");
  return *last;
}

// Sends cmds[i] for every i not yet done, in pipelines of `chunk`, every
// `period`, until done(reply, i) held for each (an i that is done is not
// asked again) and `also()` holds, or until `deadline`. Returns the time
// (now_ns) of the poll that saw it all, or nullopt at the deadline; the time
// every key was done (before `also()` held) in *keys_done. Until
// 64 evenly spread probes (the last one among them) are done, only they are
// asked: 100k commands every 20 ms would load the Redis whose work is timed.
inline std::optional<std::int64_t> poll_until(redis::Connection& c, const std::vector<redis::Command>& cmds,
                                              const std::function<bool(const redis::Reply&, std::size_t)>& done,
                                              const std::function<bool()>& also, Clock::time_point deadline,
                                              std::int64_t* keys_done = nullptr, milliseconds period = milliseconds(20),
                                              std::size_t chunk = 10000) {
  const std::size_t n = cmds.size();
  std::vector<std::size_t> pending;
  std::vector<bool> probe(n, false);
  for (std::size_t j = 1; n && j <= 64; ++j) probe[(n - 1) * j / 64] = true;
  for (std::size_t i = 0; i < n; ++i)
    if (probe[i]) pending.push_back(i);
  bool probing = true;
  std::vector<redis::Command> batch;
  for (;;) {
    if (probing && pending.empty()) {  // the probes are done: now every other key
      probing = false;
      for (std::size_t i = 0; i < n; ++i)
        if (!probe[i]) pending.push_back(i);
    }
    std::vector<std::size_t> still;
    for (std::size_t from = 0; from < pending.size(); from += chunk) {
      const std::size_t to = std::min(pending.size(), from + chunk);
      batch.clear();
      for (std::size_t j = from; j < to; ++j) batch.push_back(cmds[pending[j]]);
      auto replies = c.pipeline(batch);
      for (std::size_t j = from; j < to; ++j)
        if (!done(replies[j - from], pending[j])) still.push_back(pending[j]);
    }
    pending.swap(still);
    if (probing && pending.empty()) continue;  // the rest at once, without the pause
    if (pending.empty() && keys_done && !*keys_done) *keys_done = now_ns();
    if (pending.empty() && (!also || also())) return now_ns();
    if (Clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(period);
  }
}

// ---- a program run with a limit ----------------------------------------------------

struct RunResult {
  bool timed_out = false;
  int exit_code = -1;  // or 128 + signal
  std::int64_t wall_ns = 0;
  std::uint64_t max_rss_bytes = 0;  // ru_maxrss of the child (wait4)
};

// Runs argv (stdin and stdout on /dev/null, stderr inherited) and waits for it; killed
// at `timeout`. Wall time from just before fork to its exit. The child is
// reaped only after the killer thread is done with its pid, so a kill can
// never hit a recycled pid.
inline RunResult run_program(const std::vector<std::string>& argv, milliseconds timeout) {
  std::vector<std::string> args = argv;
  std::vector<char*> av;
  for (auto& a : args) av.push_back(a.data());
  av.push_back(nullptr);
  const int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd < 0) throw std::runtime_error("cannot open /dev/null");
  const pid_t parent = ::getpid();
  RunResult r;
  const auto t0 = now_ns();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(null_fd);
    throw std::runtime_error("fork failed");
  }
  if (pid == 0) {  // only async-signal-safe calls: the parent has threads
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(126);
    ::dup2(null_fd, 0);
    ::dup2(null_fd, 1);
    ::execv(av[0], av.data());
    ::_exit(127);
  }
  ::close(null_fd);
  std::mutex m;
  std::condition_variable cv;
  bool exited = false;
  std::thread killer([&] {
    std::unique_lock l(m);
    if (!cv.wait_for(l, timeout, [&] { return exited; })) {
      ::kill(pid, SIGKILL);
      r.timed_out = true;
    }
  });
  siginfo_t si{};
  while (::waitid(P_PID, static_cast<id_t>(pid), &si, WEXITED | WNOWAIT) < 0 && errno == EINTR) {
  }
  r.wall_ns = now_ns() - t0;
  {
    std::lock_guard l(m);
    exited = true;
  }
  cv.notify_all();
  killer.join();
  int st = 0;
  rusage ru{};
  while (::wait4(pid, &st, 0, &ru) < 0 && errno == EINTR) {
  }
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.max_rss_bytes = static_cast<std::uint64_t>(ru.ru_maxrss) * 1024;  // KiB on Linux
  return r;
}

// ---- cells -------------------------------------------------------------------------

// A step's outcome in the JSON: {"status": "ok"|"timeout"|"skipped"|"error"|"n/a", ...}.
inline json::object status(std::string_view s, std::string_view why = {}) {
  json::object o{{"status", s}};
  if (!why.empty()) o["why"] = why;
  return o;
}

inline double p_ms(const Samples& s, double q) {
  Samples v = s;
  std::sort(v.begin(), v.end());
  return percentile_us(v, q) / 1e3;
}

}  // namespace memcuda::bench::scale

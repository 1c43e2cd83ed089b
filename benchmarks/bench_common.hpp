// What memcuda_bench and bench_bandwidth share: the clock and percentiles,
// size flags, the Redis to measure against (a URL, or a private
// redis-server on a unix socket), child processes re-executed from this
// binary, and the aligned Markdown tables both print.
#pragma once

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "memcuda/redis/connection.hpp"
#include "memcuda/redis/options.hpp"

extern char** environ;

namespace memcuda::bench {

namespace json = boost::json;

// ---- time and statistics ---------------------------------------------------

// steady_clock is CLOCK_MONOTONIC on Linux (vDSO, ~20 ns a read, 1 ns
// resolution), and the same clock in every process of the machine.
using Clock = std::chrono::steady_clock;
static_assert(Clock::is_steady);

inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// Latency samples of one measurement, in nanoseconds.
using Samples = std::vector<std::int64_t>;

struct Summary {
  std::size_t n = 0;
  double p50_us = 0, p99_us = 0, p999_us = 0, mean_us = 0, min_us = 0, max_us = 0;
  // Back-to-back operations per second of one process: n / sum of latencies.
  double ops_per_s = 0;
};

// Nearest-rank percentile of sorted samples (q in [0, 1]).
inline double percentile_us(const Samples& sorted, double q) {
  if (sorted.empty()) return 0;
  auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  rank = std::clamp<std::size_t>(rank, 1, sorted.size());
  return static_cast<double>(sorted[rank - 1]) / 1e3;
}

inline Summary summarize(Samples s) {
  Summary r;
  r.n = s.size();
  if (s.empty()) return r;
  std::sort(s.begin(), s.end());
  long double sum = 0;
  for (auto v : s) sum += static_cast<long double>(v);
  r.p50_us = percentile_us(s, 0.50);
  r.p99_us = percentile_us(s, 0.99);
  r.p999_us = percentile_us(s, 0.999);
  r.mean_us = static_cast<double>(sum / static_cast<long double>(s.size())) / 1e3;
  r.min_us = static_cast<double>(s.front()) / 1e3;
  r.max_us = static_cast<double>(s.back()) / 1e3;
  r.ops_per_s = sum > 0 ? static_cast<double>(static_cast<long double>(s.size()) * 1e9L / sum) : 0;
  return r;
}

inline json::array samples_to_json(const Samples& s) {
  json::array a;
  a.reserve(s.size());
  for (auto v : s) a.emplace_back(v);
  return a;
}

inline Samples samples_from_json(const json::value& v) {
  Samples s;
  for (const auto& x : v.as_array()) s.push_back(x.to_number<std::int64_t>());
  return s;
}

// ---- sizes -------------------------------------------------------------------

// "4KiB", "4K", "1MiB", "64M", "1GiB", "4096" -> bytes.
inline std::uint64_t parse_size(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  if (i == 0) throw std::invalid_argument("bad size '" + std::string(s) + "' (e.g. 4KiB, 64MiB, 1GiB)");
  std::uint64_t n = std::stoull(std::string(s.substr(0, i)));
  std::string unit(s.substr(i));
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::uint64_t mul = 1;
  if (unit.empty() || unit == "b") mul = 1;
  else if (unit == "k" || unit == "kib" || unit == "kb") mul = 1ull << 10;
  else if (unit == "m" || unit == "mib" || unit == "mb") mul = 1ull << 20;
  else if (unit == "g" || unit == "gib" || unit == "gb") mul = 1ull << 30;
  else throw std::invalid_argument("bad size unit in '" + std::string(s) + "' (B, KiB, MiB, GiB)");
  return n * mul;
}

inline std::vector<std::uint64_t> parse_size_list(std::string_view s) {
  std::vector<std::uint64_t> out;
  std::size_t pos = 0;
  while (pos <= s.size()) {
    auto end = s.find(',', pos);
    auto item = s.substr(pos, end == std::string_view::npos ? std::string_view::npos : end - pos);
    if (!item.empty()) out.push_back(parse_size(item));
    if (end == std::string_view::npos) break;
    pos = end + 1;
  }
  if (out.empty()) throw std::invalid_argument("empty size list");
  return out;
}

inline std::vector<int> parse_int_list(std::string_view s) {
  std::vector<int> out;
  std::size_t pos = 0;
  while (pos <= s.size()) {
    auto end = s.find(',', pos);
    auto item = s.substr(pos, end == std::string_view::npos ? std::string_view::npos : end - pos);
    if (!item.empty()) out.push_back(std::stoi(std::string(item)));
    if (end == std::string_view::npos) break;
    pos = end + 1;
  }
  return out;
}

inline std::string format_size(std::uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (u < 4 && b >= 1024 && b % 1024 == 0) {
    b /= 1024;
    ++u;
  }
  return std::to_string(b) + " " + units[u];
}

inline std::string fmt(double v, int prec = 1) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", prec, v);
  return buf;
}

// Latency in microseconds with about three significant digits.
inline std::string fmt_us(double us) {
  if (us >= 1000) return fmt(us, 0);
  if (us >= 100) return fmt(us, 1);
  return fmt(us, 2);
}

inline std::string fmt_rate(double per_s) {
  if (per_s >= 1e6) return fmt(per_s / 1e6, 2) + " M";
  if (per_s >= 1e3) return fmt(per_s / 1e3, 1) + " k";
  return fmt(per_s, 0);
}

inline std::string utc_now_iso() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// ---- command line ------------------------------------------------------------

// --flag value / --flag=value / --switch, in any order.
class Args {
 public:
  Args(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) items_.emplace_back(argv[i]);
  }
  bool has(std::string_view flag) const {
    for (const auto& a : items_)
      if (a == flag) return true;
    return false;
  }
  // The value of the last occurrence, so flags appended to a script's
  // defaults override them.
  std::optional<std::string> get(std::string_view flag) const {
    std::optional<std::string> v;
    for (std::size_t i = 0; i < items_.size(); ++i) {
      if (items_[i] == flag) {
        if (i + 1 >= items_.size()) throw std::invalid_argument(std::string(flag) + " needs a value");
        v = items_[++i];
      } else if (items_[i].size() > flag.size() && items_[i].compare(0, flag.size(), flag) == 0 &&
                 items_[i][flag.size()] == '=') {
        v = items_[i].substr(flag.size() + 1);
      }
    }
    return v;
  }
  std::string get_or(std::string_view flag, std::string def) const { return get(flag).value_or(std::move(def)); }

 private:
  std::vector<std::string> items_;
};

// main() of a benchmark that starts copies of itself with --child: runs
// the part asked for; an exception is its message and exit status 1.
template <class Child, class Parent>
int parent_or_child(int argc, char** argv, const char* tool, const char* child_role, Child child, Parent parent) {
  Args args(argc, argv);
  try {
    return args.has("--child") ? child(args) : parent(args);
  } catch (const std::exception& e) {
    std::cerr << tool << (args.has("--child") ? std::string(" (") + child_role + ")" : std::string()) << ": "
              << e.what() << "\n";
    return 1;
  }
}

// ---- files and programs ------------------------------------------------------

// Deletes every key of a namespace (SCAN + DEL): what a run leaves in a
// shared Redis. Errors are printed, not thrown (a cleanup must not fail a run).
inline void delete_namespace(redis::Connection& c, const std::string& ns) {
  try {
    std::string cursor = "0";
    do {
      auto r = c.command({"SCAN", cursor, "MATCH", ns + ":*", "COUNT", "1000"});
      cursor = std::string(r[0].str());
      for (std::size_t i = 0; i < r[1].size(); ++i) c.command({"DEL", r[1][i].str()});
    } while (cursor != "0");
  } catch (const std::exception& e) {
    std::cerr << "cleanup of " << ns << ": " << e.what() << "\n";
  }
}

inline std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (!path) return {};
  std::string p = path;
  std::size_t pos = 0;
  while (pos <= p.size()) {
    auto end = p.find(':', pos);
    std::string dir = p.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    auto cand = std::filesystem::path(dir.empty() ? "." : dir) / name;
    if (::access(cand.c_str(), X_OK) == 0 && std::filesystem::is_regular_file(cand)) return cand.string();
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return {};
}

inline std::filesystem::path self_exe() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw std::runtime_error("readlink /proc/self/exe failed");
  buf[n] = 0;
  return buf;
}

inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot write " + path);
  f << text;
  if (!f) throw std::runtime_error("write to " + path + " failed");
}

// ---- child processes -----------------------------------------------------------

// A program started with its stdin and stdout on pipes (stderr inherited,
// for progress and errors). Killed with the parent (PR_SET_PDEATHSIG), so a
// benchmark stopped by a timeout leaves no process behind.
class ChildProcess {
 public:
  // argv[0] is the program to exec; `env` entries ("K=V") replace or add to
  // this process's environment.
  ChildProcess(std::vector<std::string> argv, const std::vector<std::string>& env = {}) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    // Everything exec needs is built before fork: the parent has threads.
    std::vector<std::string> envs;
    for (char** e = environ; *e; ++e) {
      std::string_view kv(*e);
      bool replaced = false;
      for (const auto& x : env)
        if (kv.substr(0, kv.find('=') + 1) == std::string_view(x).substr(0, x.find('=') + 1)) replaced = true;
      if (!replaced) envs.emplace_back(kv);
    }
    for (const auto& x : env) envs.push_back(x);
    std::vector<char*> av, ev;
    for (auto& a : argv) av.push_back(a.data());
    av.push_back(nullptr);
    for (auto& e : envs) ev.push_back(e.data());
    ev.push_back(nullptr);
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(126);
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::execve(av[0], av.data(), ev.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    to_ = in[1];
    from_ = out[0];
  }
  ~ChildProcess() {
    close_stdin();
    if (from_ >= 0) ::close(from_);
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const noexcept { return pid_; }
  // True once the child closed its stdout.
  bool eof() const noexcept { return eof_; }

  void write(std::string_view data) {
    while (!data.empty()) {
      ssize_t n = ::write(to_, data.data(), data.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw std::runtime_error("write to child " + std::to_string(pid_) + " failed (it exited?)");
      data.remove_prefix(static_cast<std::size_t>(n));
    }
  }
  void close_stdin() {
    if (to_ >= 0) ::close(to_);
    to_ = -1;
  }

  // The next line of the child's stdout; nullopt at EOF or after `timeout`.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    for (;;) {
      if (auto nl = buf_.find('\n'); nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      if (!fill(deadline)) return std::nullopt;
    }
  }

  // Everything the child writes until it closes stdout (or the timeout).
  std::string read_all(std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    while (fill(deadline)) {
    }
    return std::exchange(buf_, {});
  }

  // Waits for the exit; returns the exit code, or 128 + signal.
  int wait() {
    if (pid_ <= 0) return status_;
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return status_;
  }
  void kill(int sig = SIGKILL) {
    if (pid_ > 0) ::kill(pid_, sig);
  }

 private:
  bool fill(Clock::time_point deadline) {
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return false;
      pollfd p{from_, POLLIN, 0};
      int r = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 1000)));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) continue;
      char tmp[65536];
      ssize_t n = ::read(from_, tmp, sizeof tmp);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        eof_ = true;
        return false;
      }
      buf_.append(tmp, static_cast<std::size_t>(n));
      return true;
    }
  }

  pid_t pid_ = -1;
  int to_ = -1;
  int from_ = -1;
  int status_ = -1;
  bool eof_ = false;
  std::string buf_;
};

// Runs a command to completion; its stdout, or nullopt when it could not
// run or failed. stderr is inherited.
inline std::optional<std::string> capture(std::vector<std::string> argv, std::chrono::milliseconds timeout,
                                          int* exit_code = nullptr) {
  ChildProcess c(std::move(argv));
  c.close_stdin();
  std::string out = c.read_all(timeout);
  if (!c.eof()) c.kill();  // still writing at the deadline: it overran its time
  int rc = c.wait();
  if (exit_code) *exit_code = rc;
  if (rc != 0) return std::nullopt;
  return out;
}

// ---- Redis ----------------------------------------------------------------------

// A redis-server of our own on a unix socket in a fresh temporary folder,
// without persistence and without TCP; stopped (and the folder removed) by
// the destructor, and killed with this process if it dies first.
class PrivateRedis {
 public:
  explicit PrivateRedis(std::string exe) {
    char tmpl[] = "/tmp/memcuda-bench-XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    {
      std::ofstream f(dir_ / "redis.conf");
      f << "port 0\nunixsocket " << socket_path() << "\nunixsocketperm 700\nsave \"\"\nappendonly no\n"
        << "daemonize no\ndir " << dir_.string() << "\nlogfile " << (dir_ / "redis.log").string() << "\n";
    }
    std::string conf = (dir_ / "redis.conf").string();
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(126);
      ::setpgid(0, 0);
      int null_fd = ::open("/dev/null", O_RDWR);
      if (null_fd >= 0) {
        ::dup2(null_fd, 0);
        ::dup2(null_fd, 1);
      }
      if (::syscall(SYS_close_range, 3u, ~0u, 0u) != 0)
        for (int fd = 3; fd < 4096; ++fd) ::close(fd);
      ::execl(exe.c_str(), exe.c_str(), conf.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    auto deadline = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < deadline) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("redis-server (" + exe + ") exited at start; see " +
                                 (dir_ / "redis.log").string());
      }
      struct stat sb {};
      if (::stat(socket_path().c_str(), &sb) == 0) {
        try {
          redis::Connection c(redis::parse_url(url()));
          c.command({"PING"});
          return;
        } catch (const std::exception&) {
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    throw std::runtime_error("redis-server did not answer within 10 s");
  }
  ~PrivateRedis() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      for (int i = 0; i < 200; ++i) {
        if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
          pid_ = -1;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (pid_ > 0) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
      }
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  PrivateRedis(const PrivateRedis&) = delete;
  PrivateRedis& operator=(const PrivateRedis&) = delete;

  std::string socket_path() const { return (dir_ / "redis.sock").string(); }
  std::string url() const { return "unix://" + socket_path(); }

 private:
  std::filesystem::path dir_;
  pid_t pid_ = -1;
};

// Where to measure: --url, else MEMCUDA_REDIS_URL, else a private server
// (redis-server found on PATH, or --redis-server).
class RedisTarget {
 public:
  explicit RedisTarget(const Args& args) {
    if (auto u = args.get("--url")) {
      url_ = *u;
      origin_ = "--url";
    } else if (const char* e = std::getenv(redis::kUrlEnv); e && *e) {
      url_ = e;
      origin_ = redis::kUrlEnv;
    } else {
      std::string exe = args.get_or("--redis-server", find_on_path("redis-server"));
      if (exe.empty())
        throw std::runtime_error(
            "no Redis: pass --url, set MEMCUDA_REDIS_URL, or put redis-server on PATH (source .gpu/env.sh)");
      std::cerr << "starting a private redis-server (" << exe << ")\n";
      server_ = std::make_unique<PrivateRedis>(exe);
      url_ = server_->url();
      origin_ = "private redis-server";
    }
    options_ = redis::parse_url(url_);
  }
  const std::string& url() const noexcept { return url_; }
  std::string redacted() const { return redis::detail::redact_url(url_); }
  const std::string& origin() const noexcept { return origin_; }
  const redis::Options& options() const noexcept { return options_; }
  bool is_private() const noexcept { return server_ != nullptr; }
  std::string transport() const {
    return options_.transport == redis::Options::Transport::unix_socket ? "unix socket" : "tcp";
  }
  std::string server_version() const {
    try {
      redis::Connection c(options_);
      auto r = c.command({"INFO", "server"});
      std::string info(r.str());
      auto p = info.find("redis_version:");
      if (p == std::string::npos) return "?";
      auto e = info.find_first_of("\r\n", p);
      return info.substr(p + 14, e - p - 14);
    } catch (const std::exception&) {
      return "?";
    }
  }

 private:
  std::unique_ptr<PrivateRedis> server_;
  std::string url_;
  std::string origin_;
  redis::Options options_;
};

// ---- tables ------------------------------------------------------------------------

// A Markdown table whose columns are padded, so it reads aligned in a
// terminal and renders in docs/benchmarks.md. `align` has one letter per
// column: 'l' left, 'r' right (numbers); missing letters are 'r'.
class Table {
 public:
  Table(std::vector<std::string> header, std::string align) : header_(std::move(header)), align_(std::move(align)) {
    align_.resize(header_.size(), 'r');
  }
  void add(std::vector<std::string> row) {
    row.resize(header_.size());
    rows_.push_back(std::move(row));
  }
  bool empty() const noexcept { return rows_.empty(); }
  std::string str() const {
    std::vector<std::size_t> w(header_.size(), 3);
    auto upd = [&](const std::vector<std::string>& r) {
      for (std::size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
    };
    upd(header_);
    for (const auto& r : rows_) upd(r);
    std::ostringstream o;
    auto line = [&](const std::vector<std::string>& r) {
      o << "|";
      for (std::size_t i = 0; i < r.size(); ++i) {
        std::string pad(w[i] - r[i].size(), ' ');
        o << " " << (align_[i] == 'l' ? r[i] + pad : pad + r[i]) << " |";
      }
      o << "\n";
    };
    line(header_);
    o << "|";
    for (std::size_t i = 0; i < w.size(); ++i)
      o << (align_[i] == 'l' ? " " + std::string(w[i], '-') + " |" : " " + std::string(w[i] - 1, '-') + ": |");
    o << "\n";
    for (const auto& r : rows_) line(r);
    return o.str();
  }

 private:
  std::vector<std::string> header_;
  std::string align_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace memcuda::bench

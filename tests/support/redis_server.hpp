// Test harness: a private redis-server per fixture, on a temporary unix
// socket and a free TCP port, with no persistence. Found on PATH or through
// MEMCUDA_TEST_REDIS_SERVER. Real server, no mocks.
//
// kill(SIGKILL) and start() simulate a crash and a restart on the same
// socket and port; pause()/resume() (SIGSTOP/SIGCONT) a server that is alive
// but does not answer.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/redis/connection.hpp"

namespace memcuda::test {

struct RedisServerOptions {
  std::string requirepass;                // password of the default user
  std::vector<std::string> config_lines;  // extra redis.conf lines (ACL users...)
  bool sentinel = false;                  // run as a Redis Sentinel (redis-server --sentinel)
};

inline std::string find_redis_server() {
  if (const char* e = std::getenv("MEMCUDA_TEST_REDIS_SERVER"); e && *e) return e;
  if (const char* path = std::getenv("PATH")) {
    std::string p = path;
    std::size_t pos = 0;
    while (pos <= p.size()) {
      auto end = p.find(':', pos);
      std::string dir = p.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
      auto cand = std::filesystem::path(dir.empty() ? "." : dir) / "redis-server";
      if (::access(cand.c_str(), X_OK) == 0) return cand.string();
      if (end == std::string::npos) break;
      pos = end + 1;
    }
  }
  throw std::runtime_error(
      "redis-server not found: install it (apt-get install redis-server) or set "
      "MEMCUDA_TEST_REDIS_SERVER");
}

// A TCP port that was free a moment ago (bind to 0, read it back).
inline int free_tcp_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

class RedisServer {
 public:
  explicit RedisServer(RedisServerOptions opts = {}) : opts_(std::move(opts)) {
    char tmpl[] = "/tmp/memcuda-redis-XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    port_ = free_tcp_port();
    start();
  }
  ~RedisServer() {
    kill(SIGKILL);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // Starts (or restarts) the server on the same socket and port.
  void start() {
    if (pid_ > 0) return;
    stopped_ = false;
    auto conf = dir_ / "redis.conf";
    {
      std::ofstream f(conf);
      f << "port " << port_ << "\nbind 127.0.0.1\nunixsocket " << socket_path()
        << "\nunixsocketperm 700\n" << (opts_.sentinel ? "" : "save \"\"\nappendonly no\n") << "daemonize no\n"
        << "dir " << dir_.string() << "\nlogfile " << (dir_ / "redis.log").string() << "\n";
      if (!opts_.requirepass.empty()) f << "requirepass " << opts_.requirepass << "\n";
      for (const auto& l : opts_.config_lines) f << l << "\n";
    }
    std::string exe = find_redis_server();
    const std::string out = (dir_ / "stdout.log").string();
    pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::setpgid(0, 0);
      // Its own stdout/stderr (config errors go there, not to the log): a
      // server orphaned by a crashed test must not hold the test's pipes
      // open, or whatever reads them (ctest, `| tail`) waits forever.
      int null_in = ::open("/dev/null", O_RDONLY);
      int log = ::open(out.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
      if (null_in >= 0) ::dup2(null_in, 0);
      if (log >= 0) {
        ::dup2(log, 1);
        ::dup2(log, 2);
      }
      // The server must not inherit the test's sockets (its Redis
      // connections, listeners): a dup held by the server would keep them
      // open after the test closed them.
      if (::syscall(SYS_close_range, 3u, ~0u, 0u) != 0)
        for (int fd = 3; fd < 4096; ++fd) ::close(fd);
      if (opts_.sentinel) ::execl(exe.c_str(), exe.c_str(), conf.c_str(), "--sentinel", static_cast<char*>(nullptr));
      else ::execl(exe.c_str(), exe.c_str(), conf.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    pid_ = pid;
    wait_ready();
  }

  // SIGKILL: the server vanishes mid-session, as in a crash. Stop/continue
  // signals (SIGSTOP, SIGCONT) only pause or resume it; any other signal
  // ends it and waits for it.
  void kill(int sig = SIGKILL) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    if (sig == SIGSTOP || sig == SIGTSTP) {
      stopped_ = true;
      return;
    }
    if (sig == SIGCONT) {
      stopped_ = false;
      return;
    }
    if (stopped_ && sig != SIGKILL) ::kill(pid_, SIGCONT);  // let it act on `sig`
    stopped_ = false;
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
    std::error_code ec;
    std::filesystem::remove(socket_path(), ec);
  }

  // The server keeps its sockets but answers nothing until resume().
  void pause() { kill(SIGSTOP); }
  void resume() { kill(SIGCONT); }

  bool running() const { return pid_ > 0; }
  bool paused() const { return stopped_; }
  pid_t pid() const { return pid_; }
  int port() const { return port_; }
  // The server's own directory (mode 0700): its socket, config and logs.
  const std::filesystem::path& dir() const { return dir_; }
  std::string socket_path() const { return (dir_ / "redis.sock").string(); }
  std::string unix_url() const { return "unix://" + socket_path(); }
  std::string tcp_url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

  // Options for the unix socket, with the password if one is set.
  redis::Options options() const {
    redis::Options o;
    o.transport = redis::Options::Transport::unix_socket;
    o.path = socket_path();
    o.password = opts_.requirepass;
    return o;
  }
  redis::Connection connect() const { return redis::Connection(options()); }

  // Options for the TCP port, with the password if one is set.
  redis::Options tcp_options() const {
    redis::Options o;
    o.host = "127.0.0.1";
    o.port = port_;
    o.password = opts_.requirepass;
    return o;
  }

 private:
  void wait_ready() {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("redis-server exited at start; see " + (dir_ / "redis.log").string() +
                                 " and " + (dir_ / "stdout.log").string());
      }
      struct stat sb {};
      if (::stat(socket_path().c_str(), &sb) == 0) {
        try {
          auto c = connect();
          c.command({"PING"});
          return;
        } catch (const std::exception&) {
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    throw std::runtime_error("redis-server did not answer within 10 s");
  }

  RedisServerOptions opts_;
  std::filesystem::path dir_;
  int port_ = 0;
  pid_t pid_ = -1;
  bool stopped_ = false;
};

// A Hash field's value, or "" when the key or field does not exist.
inline std::string hget(redis::Connection& c, const std::string& key, const std::string& f) {
  auto r = c.command({"HGET", key, f});
  return r.is_nil() ? std::string() : std::string(r.str());
}

// Waits until the server reports `n` clients blocked (BLPOP and the like),
// polling every 2 ms for at most `limit`; false if it never did.
inline bool wait_blocked_clients(redis::Connection& admin, int n,
                                 std::chrono::milliseconds limit = std::chrono::seconds(30)) {
  const std::string want = "blocked_clients:" + std::to_string(n) + "\r";
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    if (std::string(admin.command({"INFO", "clients"}).str()).find(want) != std::string::npos) return true;
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace memcuda::test

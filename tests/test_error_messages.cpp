// Errors say what is actually wrong: an allocator of record that holds the
// lease but does not serve is not "no allocator of record"; a unix socket
// this user may not open is not "no Redis"; the password hint does not put
// the password on a command line. Real processes and a real redis-server.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "memcuda/redis/connection.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/text.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

using test::contains;

template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "nothing thrown";
}

// The registry error a process connecting to `url` as uid/gid 65534 gets:
// the test worker, run under that identity, prints it ("ERR <code> <message>").
std::string worker_error_as_nobody(const std::string& url) {
  const std::string prog = test::sibling_program("memcuda_test_worker");
  std::vector<std::string> argv_s{prog, "--url", url, "--no-control"};
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  int out[2];
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {  // only async-signal-safe calls before exec: this process has threads
    ::dup2(out[1], 1);
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(126);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(n));
  ::close(out[0]);
  int st = 0;
  ::waitpid(pid, &st, 0);
  INFO("worker output: " << text);
  REQUIRE(WIFEXITED(st));
  REQUIRE(WEXITSTATUS(st) == 1);  // it could not open its registry
  return text;
}

}  // namespace

// Defect: a wedged leader was reported as "no process hosts the control
// thread (start one)".
TEST_CASE("a client names the allocator of record that holds the lease but does not answer",
          "[redis][multiprocess]") {
  test::RedisServer srv;
  // Long lease and session: the stopped leader keeps both for the whole test.
  test::Child leader({test::sibling_program("memcuda_test_worker"), "--url", srv.unix_url(), "--ttl", "60000",
                      "--session-ttl", "60000", "--backend", "host"});
  auto ready = leader.read_line(10s);
  REQUIRE(ready);
  REQUIRE(ready->find("leader=1") != std::string::npos);
  leader.kill(SIGSTOP);

  RegistryOptions o;
  o.redis = srv.options();
  o.control_thread = false;
  o.request_timeout = 300ms;
  o.default_backend = BackendKind::host;
  TensorRegistry client(o);
  const std::string pid = "pid " + std::to_string(leader.pid());
  std::string m = message_of([&] { (void)client.create<float>("w", {4}); });
  INFO(m);
  CHECK(contains(m, "the allocator of record (session " + std::to_string(leader.pid()) + "-"));
  CHECK(contains(m, pid));
  CHECK(contains(m, "its session is alive"));
  CHECK(contains(m, "did not serve the lifecycle list"));
  CHECK_FALSE(contains(m, "start one"));
  CHECK_THROWS_AS(client.create<float>("w", {4}), NotLeader);
  m = message_of([&] { (void)client.create_many({{"m", DType::f32, {4}, {}}}); });
  INFO(m);
  CHECK(contains(m, pid));
  CHECK(contains(m, "did not serve the lifecycle list"));
  CHECK(srv.connect().command({"LLEN", "tensor_lifecycle"}).integer() == 0);  // taken back

  // With nobody holding the lease, the message says so (and what to start).
  leader.kill(SIGKILL);
  leader.wait();
  srv.connect().command({"DEL", "memcuda:leader"});
  m = message_of([&] { (void)client.create<float>("w", {4}); });
  INFO(m);
  CHECK(contains(m, "nobody holds the allocator-of-record lease"));
  CHECK(contains(m, "memcuda serve"));
}

TEST_CASE("a unix socket this user may not open is reported as a permission error, with its path",
          "[redis][redis_errors]") {
  // The message builder, for each case a connect can meet.
  const std::string deny = redis::detail::unix_connect_failure("/run/redis/redis.sock", EACCES, "Permission denied");
  CHECK(contains(deny, "permission denied connecting to the Redis socket /run/redis/redis.sock"));
  CHECK(contains(deny, "unixsocketperm"));
  CHECK_FALSE(contains(deny, "start redis-server"));

  test::RedisServer srv;
  const std::string dir = std::filesystem::path(srv.socket_path()).parent_path().string();
  // A path in a directory that does not exist.
  redis::Options o = srv.options();
  o.path = dir + "/no-such-dir/redis.sock";
  std::string m = message_of([&] { redis::Connection c(o); });
  INFO(m);
  CHECK(contains(m, "the directory " + dir + "/no-such-dir does not exist"));
  // A path that exists and is not a socket.
  o.path = dir + "/plain-file";
  std::ofstream(o.path) << "x";
  m = message_of([&] { redis::Connection c(o); });
  INFO(m);
  CHECK(contains(m, o.path + " exists but is not a socket"));

  // A real EACCES: the socket's directory (0700, ours) searched by another
  // user. Root passes every permission check, so as root the connecting
  // process drops to uid 65534; otherwise the directory loses its permission.
  if (::geteuid() == 0) {
    m = worker_error_as_nobody(srv.unix_url());
  } else {
    REQUIRE(::chmod(dir.c_str(), 0) == 0);
    m = message_of([&] { redis::Connection c(srv.options()); });
    ::chmod(dir.c_str(), 0700);
  }
  INFO(m);
  CHECK(contains(m, "permission denied connecting to the Redis socket " + srv.socket_path()));
  CHECK_FALSE(contains(m, "start redis-server"));
}

TEST_CASE("the password hint names MEMCUDA_REDIS_PASSWORD, which fills a URL without a password",
          "[redis][redis_errors]") {
  test::RedisServerOptions so;
  so.requirepass = "s3cret";
  test::RedisServer srv(so);
  redis::Options o = srv.options();
  o.password.clear();
  std::string m = message_of([&] { redis::Connection c(o); c.command({"PING"}); });
  INFO(m);
  CHECK(contains(m, "requires a password"));
  CHECK(contains(m, "MEMCUDA_REDIS_PASSWORD"));

  ::setenv(redis::kPasswordEnv, "s3cret", 1);
  ::setenv(redis::kUrlEnv, srv.unix_url().c_str(), 1);
  redis::Options from_env = redis::options_from_env();
  redis::Options given = redis::with_password_from_env(redis::parse_url(srv.unix_url()));
  redis::Options url_wins = redis::with_password_from_env(redis::parse_url("redis://:other@127.0.0.1:1"));
  ::unsetenv(redis::kUrlEnv);
  ::unsetenv(redis::kPasswordEnv);
  CHECK(from_env.password == "s3cret");
  CHECK(given.password == "s3cret");
  CHECK(url_wins.password == "other");
  redis::Connection c(from_env);
  CHECK(c.command({"PING"}).str() == "PONG");
}

// redis::classify() against a real redis-server: every failure lands in the
// memcuda::Error tree by the server's error code or hiredis's error code,
// which the exceptions keep (ReplyError::prefix(), ConnectionError::
// redis_code()), never by matching message text.
#include <catch2/catch.hpp>

#include <hiredis/hiredis.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/redis/connection.hpp"
#include "memcuda/redis/connection_pool.hpp"
#include "support/redis_server.hpp"
#include "support/text.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

using test::contains;

// Runs `fn` and returns the ReplyError it throws (fails the test otherwise).
template <class F>
ReplyError reply_error_of(F fn) {
  try {
    fn();
  } catch (const ReplyError& e) {
    return e;
  }
  FAIL("no ReplyError thrown");
  return ReplyError("unreachable");
}

template <class F>
AuthError auth_error_of(F fn) {
  try {
    fn();
  } catch (const AuthError& e) {
    return e;
  }
  FAIL("no AuthError thrown");
  return AuthError("unreachable");
}


}  // namespace

TEST_CASE("error_prefix takes the server's upper-case error code only", "[redis_errors]") {
  CHECK(redis::error_prefix("ERR unknown command") == "ERR");
  CHECK(redis::error_prefix("WRONGTYPE Operation against a key") == "WRONGTYPE");
  CHECK(redis::error_prefix("NOSCRIPT No matching script.") == "NOSCRIPT");
  CHECK(redis::error_prefix("MASTERDOWN") == "MASTERDOWN");
  CHECK(redis::error_prefix("my failure") == "");
  CHECK(redis::error_prefix("Err lower") == "");
  CHECK(redis::error_prefix("") == "");
  CHECK(redis::error_prefix(" ERR leading space") == "");
}

TEST_CASE("error replies become ReplyError carrying the server's prefix", "[redis][redis_errors]") {
  test::RedisServer srv;
  auto c = srv.connect();

  SECTION("NOSCRIPT for an unknown sha is recognised by its prefix") {
    auto e = reply_error_of(
        [&] { c.command({"EVALSHA", "0123456789abcdef0123456789abcdef01234567", "0"}); });
    CHECK(e.prefix() == "NOSCRIPT");
    CHECK(std::string(e.code()) == "redis_reply");
    CHECK(contains(e.what(), srv.options().describe()));
    CHECK(c.reusable());  // an error reply leaves the connection as it was
  }
  SECTION("WRONGTYPE") {
    c.command({"SET", "str", "v"});
    auto e = reply_error_of([&] { c.command({"LPUSH", "str", "x"}); });
    CHECK(e.prefix() == "WRONGTYPE");
    CHECK(contains(e.what(), "refused LPUSH"));
    CHECK(c.command({"GET", "str"}).str() == "v");
  }
  SECTION("ERR, and a script's own error codes") {
    CHECK(reply_error_of([&] { c.command({"NO-SUCH-COMMAND"}); }).prefix() == "ERR");
    CHECK(reply_error_of([&] { redis::Script("return (").eval(c, {}, {}); }).prefix() == "ERR");
    CHECK(reply_error_of([&] { redis::Script("return redis.error_reply('MYCODE boom')").eval(c, {}, {}); })
              .prefix() == "MYCODE");
    auto plain = reply_error_of([&] { redis::Script("return redis.error_reply('my failure')").eval(c, {}, {}); });
    CHECK(plain.prefix().empty());
    CHECK(contains(plain.what(), "my failure"));
  }
  SECTION("OOM, with advice") {
    c.command({"CONFIG", "SET", "maxmemory", "1"});
    auto e = reply_error_of([&] { c.command({"SET", "k", std::string(1000, 'x')}); });
    c.command({"CONFIG", "SET", "maxmemory", "0"});
    CHECK(e.prefix() == "OOM");
    CHECK(contains(e.what(), "maxmemory"));
  }
  SECTION("pipelines hand out one classified error per failing command") {
    c.command({"SET", "str", "v"});
    std::vector<std::exception_ptr> errors;
    auto replies = c.pipeline({{"PING"}, {"LPUSH", "str", "x"}, {"EVALSHA", std::string(40, 'f'), "0"}}, &errors);
    REQUIRE(errors.size() == 3);
    CHECK(!errors[0]);
    auto prefix_of = [](const std::exception_ptr& p) {
      try {
        std::rethrow_exception(p);
      } catch (const ReplyError& e) {
        CHECK(contains(e.what(), "of a pipeline of 3 commands"));
        return e.prefix();
      }
      return std::string("(not a ReplyError)");
    };
    CHECK(prefix_of(errors[1]) == "WRONGTYPE");
    CHECK(prefix_of(errors[2]) == "NOSCRIPT");
  }
}

TEST_CASE("BUSY from a script that runs long, READONLY from a replica", "[redis][redis_errors]") {
  SECTION("BUSY") {
    test::RedisServerOptions so;
    so.config_lines = {"busy-reply-threshold 50"};
    test::RedisServer srv(so);
    auto o = srv.options();
    o.command_timeout = 30000ms;  // the runner waits out the script
    redis::Connection runner(o), other(o);
    // Spins on the server's clock for 2 s (TIME is allowed in scripts
    // since Redis 5's effect replication): PINGs sent meanwhile get BUSY.
    redis::Script spin(
        "local t = redis.call('TIME') "
        "while true do local n = redis.call('TIME') "
        "if (n[1] - t[1]) * 1000000 + (n[2] - t[2]) > 2000000 then return 1 end end");
    std::atomic<bool> spun{false};
    std::thread t([&] {
      spin.eval(runner, {}, {});
      spun = true;
    });
    ReplyError e("none");
    // Until the script has ended: however late its thread starts, the PINGs
    // overlap it (and each then waits out no more than one busy reply).
    while (!spun) {
      try {
        other.command({"PING"});
      } catch (const ReplyError& got) {
        e = got;
        break;
      }
      std::this_thread::sleep_for(10ms);
    }
    t.join();
    CHECK(e.prefix() == "BUSY");
    CHECK(contains(e.what(), "SCRIPT KILL"));
  }
  SECTION("READONLY") {
    test::RedisServer master;
    test::RedisServerOptions so;
    so.config_lines = {"replicaof 127.0.0.1 " + std::to_string(master.port())};
    test::RedisServer replica(so);
    auto c = replica.connect();
    auto e = reply_error_of([&] { c.command({"SET", "k", "v"}); });
    CHECK(e.prefix() == "READONLY");
    CHECK(contains(e.what(), "master"));
  }
}

TEST_CASE("credentials: wrong password, missing password, missing permission", "[redis][redis_errors]") {
  test::RedisServerOptions so;
  so.requirepass = "right";
  so.config_lines = {"user limited on >pw ~allowed:* &* +@all -flushall"};
  test::RedisServer srv(so);

  SECTION("a wrong password is AuthError WRONGPASS") {
    auto o = srv.options();
    o.password = "s3cr3t-guess";
    auto e = auth_error_of([&] { redis::Connection c(o); });
    CHECK(e.prefix() == "WRONGPASS");
    CHECK(std::string(e.code()) == "redis_auth");
    CHECK(!contains(e.what(), "s3cr3t-guess"));
  }
  SECTION("no password is AuthError NOAUTH on the first command") {
    auto o = srv.options();
    o.password.clear();
    redis::Connection c(o);
    auto e = auth_error_of([&] { c.command({"GET", "k"}); });
    CHECK(e.prefix() == "NOAUTH");
  }
  SECTION("an ACL user lacking a permission gets AuthError NOPERM; the connection stays usable") {
    auto o = srv.options();
    o.user = "limited";
    o.password = "pw";
    redis::Connection c(o);
    auto cmd = auth_error_of([&] { c.command({"FLUSHALL"}); });
    CHECK(cmd.prefix() == "NOPERM");
    CHECK(contains(cmd.what(), "user 'limited'"));
    CHECK(contains(cmd.what(), "ACL SETUSER"));
    auto key = auth_error_of([&] { c.command({"SET", "other:k", "v"}); });
    CHECK(key.prefix() == "NOPERM");
    CHECK(c.reusable());
    CHECK(c.command({"SET", "allowed:k", "v"}).str() == "OK");
    CHECK(c.reconnects() == 0);
  }
}

TEST_CASE("I/O failures keep hiredis's error code", "[redis][redis_errors]") {
  test::RedisServer srv;
  auto o = srv.options();
  o.connect_timeout = 500ms;
  o.command_timeout = 300ms;
  o.reconnect_timeout = 200ms;

  SECTION("a connection killed by CLIENT KILL mid-command: ConnectionError REDIS_ERR_EOF") {
    redis::Connection c(o), admin(o);
    const auto id = c.command({"CLIENT", "ID"}).integer();
    std::thread killer([&] {
      REQUIRE(test::wait_blocked_clients(admin, 1));
      admin.command({"CLIENT", "KILL", "ID", id});
    });
    try {
      c.blocking(10s, {"BLPOP", "q", "10"});
      FAIL("BLPOP survived CLIENT KILL");
    } catch (const TimeoutError& e) {
      FAIL(std::string("TimeoutError for a killed connection: ") + e.what());
    } catch (const ConnectionError& e) {
      CHECK(e.redis_code() == REDIS_ERR_EOF);
      CHECK(std::string(e.code()) == "redis_connection");
      CHECK(contains(e.what(), "closed the connection"));
    }
    killer.join();
    CHECK_FALSE(c.reusable());
    CHECK(c.command({"PING"}).str() == "PONG");  // and the next command reconnects
  }
  SECTION("no answer: TimeoutError REDIS_ERR_IO with EAGAIN") {
    redis::Connection c(o);
    srv.pause();
    try {
      c.command({"PING"});
      FAIL("PING answered by a stopped server");
    } catch (const TimeoutError& e) {
      CHECK(e.redis_code() == REDIS_ERR_IO);
      CHECK((e.sys_errno() == EAGAIN || e.sys_errno() == EWOULDBLOCK));
    }
    srv.resume();
  }
  SECTION("nobody listening: ConnectionError REDIS_ERR_IO at connect") {
    auto gone = o;
    gone.path += ".absent";
    try {
      redis::Connection c(gone);
      FAIL("connected to nothing");
    } catch (const ConnectionError& e) {
      CHECK(e.redis_code() == REDIS_ERR_IO);
      CHECK(contains(e.what(), "start redis-server"));
    }
  }
  SECTION("an interrupt: ConnectionError with no hiredis code") {
    redis::Connection c(o);
    c.interrupt();
    try {
      c.command({"PING"});
      FAIL("interrupted PING ran");
    } catch (const redis::Interrupted& e) {
      CHECK(e.redis_code() == 0);
      CHECK(contains(e.what(), "'PING'"));
      CHECK(contains(e.what(), "interrupted"));
    }
  }
}

TEST_CASE("bytes that are not RESP: ConnectionError REDIS_ERR_PROTOCOL", "[redis_errors]") {
  // Not a Redis: a unix socket that answers the first command with bytes no
  // RESP reply starts with, to see what hiredis's parser makes of them.
  char dir[] = "/tmp/memcuda-garbage-XXXXXX";
  REQUIRE(::mkdtemp(dir));
  const std::string path = std::string(dir) + "/garbage.sock";
  int lfd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  REQUIRE(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(lfd, 1) == 0);
  std::thread peer([lfd] {
    int fd = ::accept(lfd, nullptr, nullptr);
    if (fd < 0) return;
    char buf[256];
    (void)::read(fd, buf, sizeof buf);  // the PING
    const char junk[] = "?this is not RESP\r\n";
    (void)::send(fd, junk, sizeof junk - 1, MSG_NOSIGNAL);
    (void)::read(fd, buf, sizeof buf);  // until the client hangs up
    ::close(fd);
  });
  redis::Options o;
  o.transport = redis::Options::Transport::unix_socket;
  o.path = path;
  o.command_timeout = 2000ms;
  {
    redis::Connection c(o);
    try {
      c.command({"PING"});
      FAIL("garbage accepted as a reply");
    } catch (const ConnectionError& e) {
      CHECK(e.redis_code() == REDIS_ERR_PROTOCOL);
      CHECK(contains(e.what(), "protocol error"));
    }
    CHECK_FALSE(c.reusable());
  }
  peer.join();
  ::close(lfd);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a Script still works after SCRIPT FLUSH from another connection", "[redis][redis_errors]") {
  test::RedisServer srv;
  redis::ConnectionPool pool(srv.options(), {.size = 2});
  redis::Script incr("return redis.call('INCR', KEYS[1])");
  auto a = pool.acquire();
  auto b = pool.acquire();
  CHECK(incr.eval(*a, {"n"}, {}).integer() == 1);
  CHECK(b->command({"SCRIPT", "FLUSH"}).str() == "OK");
  CHECK(b->command({"SCRIPT", "EXISTS", incr.sha()})[0].integer() == 0);
  CHECK(incr.eval(*a, {"n"}, {}).integer() == 2);  // reloaded after NOSCRIPT, ran once
  CHECK(incr.eval(*b, {"n"}, {}).integer() == 3);
  CHECK(b->command({"GET", "n"}).str() == "3");
}

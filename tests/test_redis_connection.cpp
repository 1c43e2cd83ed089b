// redis::Connection, Reply and Script against a private redis-server per
// test (tests/support/redis_server.hpp): commands, pipelines, blocking
// commands, scripts, AUTH/ACL, SELECT, refused and timed-out connects,
// a server that dies, stops or restarts, interrupt(), moves.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "memcuda/redis/connection.hpp"
#include "support/redis_server.hpp"
#include "support/text.hpp"
#include "support/timing.hpp"

using namespace memcuda;
using namespace std::chrono_literals;
using test::Clock;
using test::ms_since;

namespace {

using test::contains;

// Runs `fn` on another thread after `delay`; joins on destruction.
class After {
 public:
  template <class F>
  After(std::chrono::milliseconds delay, F fn)
      : t_([delay, fn = std::move(fn)] {
          std::this_thread::sleep_for(delay);
          fn();
        }) {}
  ~After() { t_.join(); }

 private:
  std::thread t_;
};

// Options for either transport of `srv`, with short timeouts so that
// failures are quick.
redis::Options opts_for(const test::RedisServer& srv, bool tcp) {
  redis::Options o = tcp ? srv.tcp_options() : srv.options();
  o.connect_timeout = 500ms;
  o.command_timeout = 1000ms;
  o.reconnect_timeout = 300ms;
  return o;
}

}  // namespace

TEST_CASE("commands: binary-safe strings, integers, nil, arrays, error replies", "[redis]") {
  test::RedisServer srv;
  auto c = srv.connect();

  const std::string bin("a\0b\r\n$3\xff", 9);
  CHECK(c.command({"SET", "k", bin}).str() == "OK");
  CHECK(c.command({"GET", "k"}).str() == bin);
  CHECK(c.command({"SET", bin, "value-under-binary-key"}).str() == "OK");
  CHECK(c.command(redis::Command{"GET", bin}).str() == "value-under-binary-key");
  CHECK(c.command({"STRLEN", "k"}).integer() == 9);

  CHECK(c.command({"INCRBY", "n", 41}).integer() == 41);
  CHECK(c.command({"INCRBY", "n", -42}).integer() == -1);
  CHECK(c.command({"SET", "big", std::int64_t{9223372036854775807}}).str() == "OK");
  CHECK(c.command({"GET", "big"}).str() == "9223372036854775807");
  CHECK(c.command({"INCRBY", "u", std::uint32_t{7}}).integer() == 7);

  auto nil = c.command({"GET", "missing"});
  CHECK(nil.is_nil());
  CHECK(nil.opt_str() == std::nullopt);
  CHECK_THROWS_AS(nil.str(), ReplyError);
  CHECK(c.command({"GET", "k"}).opt_str() == bin);

  CHECK(c.command({"RPUSH", "l", "a", bin, "c"}).integer() == 3);
  auto arr = c.command({"LRANGE", "l", 0, -1});
  REQUIRE(arr.is_array());
  REQUIRE(arr.size() == 3);
  CHECK(arr[0].str() == "a");
  CHECK(arr[1].str() == bin);
  CHECK(arr[2].str() == "c");
  CHECK_THROWS_AS(arr[3], ReplyError);
  CHECK_THROWS_AS(arr.integer(), ReplyError);
  auto empty = c.command({"LRANGE", "nolist", 0, -1});
  CHECK(empty.is_array());
  CHECK(empty.size() == 0);

  try {
    c.command({"NOSUCHCMD", "x"});
    FAIL("unknown command accepted");
  } catch (const ReplyError& e) {
    CHECK(contains(e.what(), "unknown command"));
    CHECK(contains(e.what(), "NOSUCHCMD"));
  }
  try {
    c.command({"LPUSH", "k", "x"});
    FAIL("LPUSH on a string accepted");
  } catch (const ReplyError& e) {
    CHECK(contains(e.what(), "WRONGTYPE"));
  }
  CHECK_THROWS_AS(c.command(std::span<const redis::Arg>{}), InvalidArgument);
  CHECK_THROWS_AS(c.command(redis::Command{}), InvalidArgument);

  // Error replies leave the connection in step.
  CHECK(c.command({"PING"}).str() == "PONG");
  CHECK(c.reconnects() == 0);
}

TEST_CASE("Arg owns temporary strings, so a stored argument list does not dangle", "[redis]") {
  test::RedisServer srv;
  auto c = srv.connect();
  auto make = [](char ch) { return std::string(200, ch); };  // beyond small-string storage
  std::vector<redis::Arg> args{"SET", make('k'), make('v')};
  std::vector<std::string> scribble(64, std::string(200, 'z'));  // reuse any freed memory
  CHECK(c.command(std::span<const redis::Arg>(args)).str() == "OK");
  CHECK(c.command({"GET", make('k')}).str() == make('v'));
  redis::Arg copy = args[1];
  args.clear();
  CHECK(copy.view() == make('k'));
}

// The create path grows a vector of Args (owned numbers, views of the
// record's text) and relies on moves: a moved owned string, short ones held
// in the string object itself included, must be re-pointed, and a view must
// stay a view of the caller's bytes.
TEST_CASE("Arg moves keep owned bytes and views intact while a vector grows", "[args]") {
  static_assert(std::is_nothrow_move_constructible_v<redis::Arg>);
  const std::string held(300, 'h');  // viewed, never copied
  std::vector<redis::Arg> args;      // no reserve: every growth moves all elements
  for (int i = 0; i < 200; ++i) {
    args.emplace_back(i);                           // owned, small (in-object storage)
    args.emplace_back(std::string(100 + i, 'o'));   // owned, on the heap
    args.emplace_back(std::string_view(held));      // a view
  }
  std::vector<std::string> scribble(64, std::string(200, 'z'));  // reuse any freed memory
  for (int i = 0; i < 200; ++i) {
    INFO(i);
    CHECK(args[3 * i].view() == std::to_string(i));
    CHECK(args[3 * i + 1].view() == std::string(100 + i, 'o'));
    CHECK(args[3 * i + 2].view().data() == held.data());
  }
  redis::Arg moved(std::move(args[1]));
  CHECK(moved.view() == std::string(100, 'o'));
  redis::Arg small(std::move(args[3]));
  CHECK(small.view() == "1");
}

TEST_CASE("pipeline of 1000 commands returns the replies in order", "[redis]") {
  test::RedisServer srv;
  auto c = srv.connect();
  std::vector<redis::Command> push, get;
  for (int i = 0; i < 1000; ++i) {
    push.push_back({"RPUSH", "order", std::to_string(i)});
    get.push_back({"SET", "k" + std::to_string(i), std::string(i % 50, 'v') + std::to_string(i)});
  }
  auto replies = c.pipeline(push);
  REQUIRE(replies.size() == 1000);
  for (int i = 0; i < 1000; ++i) REQUIRE(replies[i].integer() == i + 1);

  c.pipeline(get);
  get.clear();
  for (int i = 0; i < 1000; ++i) get.push_back({"GET", "k" + std::to_string(i)});
  replies = c.pipeline(get);
  REQUIRE(replies.size() == 1000);
  for (int i = 0; i < 1000; ++i) REQUIRE(replies[i].str() == std::string(i % 50, 'v') + std::to_string(i));

  CHECK(c.pipeline({}).empty());
  CHECK(c.command({"LLEN", "order"}).integer() == 1000);
}

TEST_CASE("pipeline with one failing command", "[redis]") {
  test::RedisServer srv;
  auto c = srv.connect();
  const std::vector<redis::Command> cmds = {
      {"SET", "a", "1"}, {"INCR", "a"}, {"LPUSH", "a", "x"}, {"GET", "a"}};

  SECTION("errors vector: one exception per failed command, the rest run") {
    std::vector<std::exception_ptr> errors;
    auto r = c.pipeline(cmds, &errors);
    REQUIRE(r.size() == 4);
    REQUIRE(errors.size() == 4);
    CHECK(r[0].str() == "OK");
    CHECK(r[1].integer() == 2);
    CHECK(r[2].is_error());
    CHECK(r[3].str() == "2");
    CHECK(!errors[0]);
    CHECK(!errors[1]);
    CHECK(!errors[3]);
    REQUIRE(errors[2]);
    try {
      std::rethrow_exception(errors[2]);
    } catch (const ReplyError& e) {
      CHECK(contains(e.what(), "WRONGTYPE"));
    }
  }
  SECTION("no errors vector: the first error is thrown after all replies") {
    CHECK_THROWS_AS(c.pipeline(cmds), ReplyError);
    CHECK(c.command({"GET", "a"}).str() == "2");  // GET after the failure ran, replies in step
    CHECK(c.command({"PING"}).str() == "PONG");
  }
  SECTION("an empty command is refused before anything is sent") {
    CHECK_THROWS_AS(c.pipeline({{"SET", "z", "1"}, {}}), InvalidArgument);
    CHECK(c.command({"EXISTS", "z"}).integer() == 0);
  }
}

TEST_CASE("blocking commands: BLPOP times out with nil or is woken by a push", "[redis]") {
  test::RedisServer srv;
  auto c = srv.connect();

  auto t0 = Clock::now();
  auto r = c.blocking(100ms, {"BLPOP", "q", "0.1"});
  auto took = ms_since(t0);
  CHECK(r.is_nil());
  CHECK(took >= 90);
  MEMCUDA_CHECK_MS_BELOW(took, 10000);

  {
    After push(50ms, [&] {
      auto other = srv.connect();
      other.command({"RPUSH", "q", "hello"});
    });
    t0 = Clock::now();
    r = c.blocking(5000ms, {"BLPOP", "q", "5"});
    // Woken by the push: a BLPOP that ran out its 5 s would be nil.
    test::print_ms(__FILE__, __LINE__, "BLPOP woken by a push 50 ms on", ms_since(t0));
  }
  REQUIRE(r.size() == 2);
  CHECK(r[0].str() == "q");
  CHECK(r[1].str() == "hello");

  SECTION("kWaitForever outlasts the command timeout") {
    auto o = srv.options();
    o.command_timeout = 100ms;
    redis::Connection w(o);
    After push(300ms, [&] { srv.connect().command({"RPUSH", "q2", "late"}); });
    auto got = w.blocking(redis::kWaitForever, {"BLPOP", "q2", "0"});
    REQUIRE(got.size() == 2);
    CHECK(got[1].str() == "late");
  }
}

TEST_CASE("the socket timeout is restored after a blocking command, even one that throws", "[redis]") {
  test::RedisServer srv;
  auto o = srv.options();
  o.command_timeout = 200ms;
  o.reconnect_timeout = 0ms;
  redis::Connection c(o);
  c.command({"SET", "str", "v"});

  SECTION("after an error reply") {
    CHECK_THROWS_AS(c.blocking(60000ms, {"BLPOP", "str", "60"}), ReplyError);  // WRONGTYPE
  }
  SECTION("after a nil reply") {
    CHECK(c.blocking(60000ms, {"BLPOP", "nothing", "0.05"}).is_nil());
  }
  srv.pause();
  auto t0 = Clock::now();
  CHECK_THROWS_AS(c.command({"PING"}), TimeoutError);
  MEMCUDA_CHECK_MS_BELOW(ms_since(t0), 20000);  // 60 s if the blocking timeout had stayed
  srv.resume();
  CHECK(c.command({"PING"}).str() == "PONG");
}

TEST_CASE("scripts run by EVALSHA with a transparent NOSCRIPT fallback", "[redis]") {
  test::RedisServer srv;
  auto c = srv.connect();

  SECTION("the SHA-1 is the one Redis computes") {
    CHECK(redis::detail::sha1_hex("") == "da39a3ee5e6b4b0d3255bfef95601890afd80709");
    CHECK(redis::detail::sha1_hex("abc") == "a9993e364706816aba3e25717850c26c9cd0d89d");
    for (std::size_t n : {1, 55, 56, 57, 63, 64, 65, 119, 120, 1000}) {
      redis::Script s("return '" + std::string(n, 'x') + "'");
      CAPTURE(n);
      CHECK(c.command({"SCRIPT", "LOAD", s.source()}).str() == s.sha());
    }
  }
  SECTION("values come back; after SCRIPT FLUSH the script is reloaded, and run once") {
    redis::Script s("return {KEYS[1], ARGV[1], tonumber(ARGV[2]) + 1, redis.call('INCR', KEYS[2])}");
    CHECK(c.command({"SCRIPT", "EXISTS", s.sha()})[0].integer() == 0);
    auto r = s.eval(c, {"k1", "cnt"}, {"a1", 41});
    REQUIRE(r.size() == 4);
    CHECK(r[0].str() == "k1");
    CHECK(r[1].str() == "a1");
    CHECK(r[2].integer() == 42);
    CHECK(r[3].integer() == 1);
    CHECK(c.command({"SCRIPT", "EXISTS", s.sha()})[0].integer() == 1);
    CHECK(s.eval(c, {"k1", "cnt"}, {"a1", 1})[3].integer() == 2);

    c.command({"SCRIPT", "FLUSH"});
    CHECK(c.command({"SCRIPT", "EXISTS", s.sha()})[0].integer() == 0);
    CHECK(s.eval(c, {"k1", "cnt"}, {"a1", 1})[3].integer() == 3);  // not 4: ran once
    CHECK(c.command({"GET", "cnt"}).str() == "3");
  }
  SECTION("binary keys and arguments are passed intact, never spliced into the source") {
    redis::Script s("redis.call('SET', KEYS[1], ARGV[1]); return {KEYS[1], ARGV[1], redis.call('GET', KEYS[1])}");
    const std::string key("k\0']] --\r\n", 10);
    const std::string val("'); return 666 --\0\xff]]", 22);
    auto r = s.eval(c, {key}, {val});
    REQUIRE(r.size() == 3);
    CHECK(r[0].str() == key);
    CHECK(r[1].str() == val);
    CHECK(r[2].str() == val);
    CHECK(c.command({"GET", key}).str() == val);
  }
  SECTION("script errors are ReplyError; span overload") {
    redis::Script fails("return redis.error_reply('my failure')");
    try {
      fails.eval(c, {}, {});
      FAIL("error_reply not thrown");
    } catch (const ReplyError& e) {
      CHECK(contains(e.what(), "my failure"));
    }
    redis::Script syntax("return (");
    CHECK_THROWS_AS(syntax.eval(c, {}, {}), ReplyError);
    redis::Script sum("return #KEYS + #ARGV");
    std::vector<redis::Arg> keys{"a", "b"}, args{1, 2, 3};
    CHECK(sum.eval(c, std::span<const redis::Arg>(keys), std::span<const redis::Arg>(args)).integer() == 5);
  }
  SECTION("eval_each: one pipeline, each reply in order, errors index-aligned; NOSCRIPT ones run once more") {
    // Fails for ARGV[1] == 'bad'; counts every run in KEYS[1].
    redis::Script s("redis.call('INCR', KEYS[1]); if ARGV[1] == 'bad' then return redis.error_reply('bad one') "
                    "end; return ARGV[1]");
    auto cmds = [&](int n) {
      std::vector<redis::Command> v;
      for (int i = 0; i < n; ++i) {
        const redis::Arg keys[] = {"runs"};
        const redis::Arg args[] = {i == 3 ? std::string("bad") : std::to_string(i)};
        v.push_back(s.command(keys, args));
      }
      return v;
    };
    for (int round = 0; round < 2; ++round) {  // an empty script cache, then the script loaded
      CAPTURE(round);
      if (round == 0) c.command({"SCRIPT", "FLUSH"});
      c.command({"DEL", "runs"});
      std::vector<std::exception_ptr> errs;
      auto replies = s.eval_each(c, cmds(6), &errs);
      REQUIRE(replies.size() == 6);
      REQUIRE(errs.size() == 6);
      for (int i = 0; i < 6; ++i) {
        CAPTURE(i);
        if (i == 3) {
          REQUIRE(errs[i]);
          CHECK_THROWS_WITH(std::rethrow_exception(errs[i]), Catch::Contains("bad one"));
        } else {
          CHECK_FALSE(errs[i]);
          CHECK(replies[i].str() == std::to_string(i));
        }
      }
      CHECK(c.command({"GET", "runs"}).str() == "6");  // each ran once: NOSCRIPT means not run
    }
    CHECK_THROWS_WITH(s.eval_each(c, cmds(5)), Catch::Contains("bad one"));  // without `errors`: thrown after all ran
    CHECK(c.command({"GET", "runs"}).str() == "11");
    CHECK(s.eval_each(c, {}).empty());
  }
}

TEST_CASE("AUTH with requirepass", "[redis]") {
  test::RedisServerOptions so;
  so.requirepass = "pw-1:@";
  test::RedisServer srv(so);

  SECTION("right password over unix and TCP") {
    CHECK(redis::Connection(srv.options()).command({"PING"}).str() == "PONG");
    CHECK(redis::Connection(srv.tcp_options()).command({"PING"}).str() == "PONG");
  }
  SECTION("wrong password: AuthError at connect, with a clear message") {
    for (bool tcp : {false, true}) {
      auto o = tcp ? srv.tcp_options() : srv.options();
      o.password = "not-the-password";
      try {
        redis::Connection c(o);
        FAIL("wrong password accepted");
      } catch (const AuthError& e) {
        std::string m = e.what();
        CAPTURE(m);
        CHECK(contains(m, "rejected the credentials"));
        CHECK(contains(m, o.describe()));
        CHECK(contains(m, "WRONGPASS"));
        CHECK(!contains(m, "not-the-password"));
      }
    }
  }
  SECTION("missing password: AuthError on the first command (NOAUTH), or at connect with a db") {
    auto o = srv.options();
    o.password.clear();
    redis::Connection c(o);
    try {
      c.command({"GET", "k"});
      FAIL("NOAUTH not raised");
    } catch (const AuthError& e) {
      CHECK(contains(e.what(), "requires a password"));
      CHECK(contains(e.what(), "NOAUTH"));
    }
    o.db = 1;
    CHECK_THROWS_AS(redis::Connection(o), AuthError);
  }
  SECTION("credentials from the URL through parse_url") {
    auto tcp = redis::parse_url("redis://:pw-1%3A%40@127.0.0.1:" + std::to_string(srv.port()));
    CHECK(redis::Connection(tcp).command({"PING"}).str() == "PONG");
    auto lone = redis::parse_url("redis://pw-1%3A%40@127.0.0.1:" + std::to_string(srv.port()) + "/3");
    redis::Connection l(lone);
    l.command({"SET", "in3", "x"});
    CHECK(srv.connect().command({"EXISTS", "in3"}).integer() == 0);
    auto unix_url = redis::parse_url("unix://:pw-1%3A%40@" + srv.socket_path());
    CHECK(redis::Connection(unix_url).command({"PING"}).str() == "PONG");
    auto wrong = redis::parse_url("redis://:nope@127.0.0.1:" + std::to_string(srv.port()));
    CHECK_THROWS_AS(redis::Connection(wrong), AuthError);
  }
  SECTION("a password given to a server without one is refused") {
    test::RedisServer nopass;
    auto o = nopass.options();
    o.password = "unneeded";
    CHECK_THROWS_AS(redis::Connection(o), AuthError);
  }
}

TEST_CASE("AUTH as an ACL user", "[redis]") {
  test::RedisServerOptions so;
  so.config_lines = {"user alice on >secret ~* &* +@all"};
  test::RedisServer srv(so);

  auto o = srv.options();
  o.user = "alice";
  o.password = "secret";
  CHECK(redis::Connection(o).command({"ACL", "WHOAMI"}).str() == "alice");
  auto t = srv.tcp_options();
  t.user = "alice";
  t.password = "secret";
  CHECK(redis::Connection(t).command({"ACL", "WHOAMI"}).str() == "alice");

  o.password = "wr0ng-pw";
  try {
    redis::Connection c(o);
    FAIL("wrong ACL password accepted");
  } catch (const AuthError& e) {
    CHECK(contains(e.what(), "of user 'alice'"));
    CHECK(!contains(e.what(), "wr0ng-pw"));
  }
  o.user = "bob";
  o.password = "secret";
  CHECK_THROWS_AS(redis::Connection(o), AuthError);

  auto url = redis::parse_url("redis://alice:secret@127.0.0.1:" + std::to_string(srv.port()) + "/0");
  CHECK(redis::Connection(url).command({"ACL", "WHOAMI"}).str() == "alice");
  auto unix_url = redis::parse_url("unix://alice:secret@" + srv.socket_path() + "?db=1");
  CHECK(redis::Connection(unix_url).command({"ACL", "WHOAMI"}).str() == "alice");
  CHECK_THROWS_AS(redis::Connection(redis::parse_url("redis://alice:nope@127.0.0.1:" + std::to_string(srv.port()))),
                  AuthError);
}

TEST_CASE("SELECT: db 2 is isolated from db 0", "[redis]") {
  test::RedisServer srv;
  auto o = srv.options();
  o.db = 2;
  redis::Connection db2(o);
  auto db0 = srv.connect();
  db2.command({"SET", "k", "in-2"});
  db0.command({"SET", "k", "in-0"});
  CHECK(db2.command({"GET", "k"}).str() == "in-2");
  CHECK(db0.command({"GET", "k"}).str() == "in-0");
  db2.command({"SET", "only2", "x"});
  CHECK(db0.command({"EXISTS", "only2"}).integer() == 0);
  CHECK(redis::Connection(redis::parse_url(srv.unix_url() + "?db=2")).command({"GET", "only2"}).str() == "x");

  SECTION("the db survives a reconnect") {
    srv.kill();
    srv.start();
    db2.command({"SET", "after", "restart"});
    CHECK(db0.command({"EXISTS", "after"}).integer() == 0);
    CHECK(db2.reconnects() == 1);
  }
  SECTION("a db the server does not have is a ReplyError at connect") {
    o.db = 100;
    try {
      redis::Connection bad(o);
      FAIL("SELECT 100 accepted");
    } catch (const ReplyError& e) {
      CHECK(contains(e.what(), "refused SELECT 100"));
    }
  }
}

TEST_CASE("a refused connection says the URL and what to do", "[redis]") {
  auto check_refused = [](const redis::Options& o) {
    auto t0 = Clock::now();
    try {
      redis::Connection c(o);
      FAIL("connected to " << o.describe());
    } catch (const AuthError&) {
      FAIL("AuthError for a refused connection");
    } catch (const ConnectionError& e) {
      std::string m = e.what();
      CAPTURE(m);
      CHECK(contains(m, o.describe()));
      CHECK(contains(m, "redis-server"));
      CHECK(contains(m, "MEMCUDA_REDIS_URL"));
    }
    MEMCUDA_CHECK_MS_BELOW(ms_since(t0), 10000);
  };
  redis::Options tcp;
  tcp.port = test::free_tcp_port();
  check_refused(tcp);
  check_refused(redis::parse_url("unix:///tmp/memcuda-no-such-dir/redis.sock"));

  // A socket file nobody listens on (a server that died without cleaning up).
  char dir[] = "/tmp/memcuda-stale-XXXXXX";
  REQUIRE(::mkdtemp(dir));
  std::string path = std::string(dir) + "/redis.sock";
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  ::close(fd);
  check_refused(redis::parse_url("unix://" + path));
  ::unlink(path.c_str());
  ::rmdir(dir);
}

TEST_CASE("a connect that gets no answer is bounded by connect_timeout", "[redis]") {
  // A listener whose accept queue is full drops new SYNs: connect(2) hangs.
  int l = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(l, 0) == 0);
  socklen_t len = sizeof a;
  ::getsockname(l, reinterpret_cast<sockaddr*>(&a), &len);
  std::vector<int> fillers;
  for (int i = 0; i < 3; ++i) {
    int f = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ::connect(f, reinterpret_cast<sockaddr*>(&a), sizeof a);
    fillers.push_back(f);
  }
  redis::Options o;
  o.port = ntohs(a.sin_port);
  o.connect_timeout = 200ms;
  o.command_timeout = 200ms;
  o.password = "x";  // were the connect accepted, AUTH would time out instead
  auto t0 = Clock::now();
  try {
    redis::Connection c(o);
    FAIL("connected to a listener that never accepts");
  } catch (const TimeoutError& e) {
    CHECK(contains(e.what(), o.describe()));
    CHECK(contains(e.what(), "200 ms"));
  }
  auto took = ms_since(t0);
  CHECK(took >= 150);
  MEMCUDA_CHECK_MS_BELOW(took, 10000);
  for (int f : fillers) ::close(f);
  ::close(l);
}

TEST_CASE("a server killed mid-session: typed error, then recovery after restart", "[redis]") {
  const bool tcp = GENERATE(false, true);
  CAPTURE(tcp);
  test::RedisServer srv;
  auto o = opts_for(srv, tcp);
  redis::Connection c(o);
  c.command({"SET", "k", "v"});

  srv.kill(SIGKILL);
  auto t0 = Clock::now();
  try {
    c.command({"GET", "k"});
    FAIL("command on a dead server succeeded");
  } catch (const TimeoutError& e) {
    CHECK(contains(e.what(), o.describe()));
  } catch (const ConnectionError& e) {
    CHECK(contains(e.what(), o.describe()));
    CHECK(contains(e.what(), "gave up reconnecting"));
  }
  MEMCUDA_CHECK_MS_BELOW(ms_since(t0), o.reconnect_timeout.count() + 10000);
  CHECK(!c.connected());
  CHECK(c.reconnects() == 0);

  srv.start();
  CHECK(c.command({"PING"}).str() == "PONG");
  CHECK(c.reconnects() == 1);
  CHECK(c.command({"GET", "k"}).is_nil());  // no persistence: a fresh server

  SECTION("a restart while idle is noticed before sending: no error at all") {
    c.command({"SET", "k2", "v"});
    srv.kill(SIGKILL);
    srv.start();
    CHECK(c.command({"INCR", "n"}).integer() == 1);  // sent once, on the new socket
    CHECK(c.reconnects() == 2);
  }
  SECTION("a restart within reconnect_timeout is waited for") {
    auto o2 = o;
    o2.reconnect_timeout = 5000ms;
    redis::Connection patient(o2);
    srv.kill(SIGKILL);
    {
      After restart(150ms, [&] { srv.start(); });
      CHECK(patient.command({"PING"}).str() == "PONG");
    }
    CHECK(patient.reconnects() == 1);
  }
}

TEST_CASE("the server going away under a command in flight", "[redis]") {
  test::RedisServer srv;
  auto c = srv.connect();
  auto t0 = Clock::now();
  {
    After kill(100ms, [&] { srv.kill(SIGKILL); });
    CHECK_THROWS_AS(c.blocking(60s, {"BLPOP", "q", "60"}), ConnectionError);
  }
  MEMCUDA_CHECK_MS_BELOW(ms_since(t0), 20000);  // not the BLPOP's 60 s
  srv.start();
  CHECK(c.command({"PING"}).str() == "PONG");
}

TEST_CASE("a server killed by CLIENT KILL is reconnected transparently", "[redis]") {
  test::RedisServer srv;
  auto c = srv.connect();
  auto admin = srv.connect();
  c.command({"CLIENT", "SETNAME", "victim"});
  auto id = c.command({"CLIENT", "ID"}).integer();
  CHECK(admin.command({"CLIENT", "KILL", "ID", id}).integer() == 1);
  CHECK(c.command({"INCR", "n"}).integer() == 1);
  CHECK(c.reconnects() == 1);
}

TEST_CASE("command timeouts: a stopped or busy server gives TimeoutError, not a hang", "[redis]") {
  SECTION("SIGSTOP, then SIGCONT") {
    const bool tcp = GENERATE(false, true);
    CAPTURE(tcp);
    test::RedisServer srv;
    auto o = opts_for(srv, tcp);
    o.command_timeout = 200ms;
    redis::Connection c(o);
    CHECK(c.command({"PING"}).str() == "PONG");
    srv.pause();
    auto t0 = Clock::now();
    try {
      c.command({"PING"});
      FAIL("PING answered by a stopped server");
    } catch (const TimeoutError& e) {
      CHECK(contains(e.what(), "did not answer 'PING' within 200 ms"));
      CHECK(contains(e.what(), o.describe()));
    }
    auto took = ms_since(t0);
    CHECK(took >= 150);
    MEMCUDA_CHECK_MS_BELOW(took, 10000);
    CHECK(!c.connected());
    // Still stopped: the reconnect succeeds (the kernel accepts) but the
    // command times out again.
    CHECK_THROWS_AS(c.command({"PING"}), TimeoutError);
    srv.resume();
    CHECK(c.command({"PING"}).str() == "PONG");
    CHECK(c.command({"SET", "k", "v"}).str() == "OK");
  }
  SECTION("DEBUG SLEEP longer than the command timeout") {
    test::RedisServerOptions so;
    so.config_lines = {"enable-debug-command local"};
    test::RedisServer srv(so);
    auto o = srv.options();
    o.command_timeout = 100ms;
    redis::Connection c(o);
    auto t0 = Clock::now();
    CHECK_THROWS_AS(c.command({"DEBUG", "SLEEP", "0.3"}), TimeoutError);  // it did not wait for the reply
    test::print_ms(__FILE__, __LINE__, "100 ms command timeout beside DEBUG SLEEP 0.3", ms_since(t0));
    // Usable again once the server is done sleeping.
    bool ok = false;
    while (!ok && ms_since(t0) < 15000) {
      try {
        ok = c.command({"PING"}).str() == "PONG";
      } catch (const TimeoutError&) {
      }
    }
    CHECK(ok);
  }
  SECTION("a password handshake to a stopped server times out too") {
    test::RedisServerOptions so;
    so.requirepass = "pw";
    test::RedisServer srv(so);
    auto o = srv.options();
    o.command_timeout = 150ms;
    srv.pause();
    auto t0 = Clock::now();
    CHECK_THROWS_AS(redis::Connection(o), TimeoutError);
    MEMCUDA_CHECK_MS_BELOW(ms_since(t0), 10000);
    srv.resume();
    CHECK(redis::Connection(o).command({"PING"}).str() == "PONG");
  }
}

TEST_CASE("interrupt() from another thread", "[redis]") {
  test::RedisServer srv;
  auto o = srv.options();
  o.reconnect_timeout = 300ms;
  redis::Connection c(o);

  SECTION("unblocks a BLPOP promptly with ConnectionError; the next command reconnects") {
    auto t0 = Clock::now();
    {
      After stop(100ms, [&] { c.interrupt(); });
      try {
        c.blocking(60s, {"BLPOP", "q", "60"});
        FAIL("BLPOP returned");
      } catch (const ConnectionError& e) {
        CHECK(contains(e.what(), "interrupted"));
      }
    }
    MEMCUDA_CHECK_MS_BELOW(ms_since(t0), 20000);  // not the BLPOP's 60 s
    CHECK(c.command({"PING"}).str() == "PONG");
    CHECK(c.reconnects() == 1);
  }
  SECTION("ends a kWaitForever wait") {
    After stop(100ms, [&] { c.interrupt(); });
    CHECK_THROWS_AS(c.blocking(redis::kWaitForever, {"BLPOP", "q", "0"}), ConnectionError);
  }
  SECTION("while idle: the next command fails, the one after works") {
    c.interrupt();
    CHECK_THROWS_AS(c.command({"PING"}), ConnectionError);
    CHECK(c.command({"PING"}).str() == "PONG");
    CHECK(c.command({"PING"}).str() == "PONG");
  }
  SECTION("ends a reconnect backoff") {
    auto slow = o;
    slow.reconnect_timeout = 60s;
    redis::Connection w(slow);
    srv.kill(SIGKILL);
    auto t0 = Clock::now();
    {
      After stop(200ms, [&] { w.interrupt(); });
      CHECK_THROWS_AS(w.command({"PING"}), ConnectionError);
    }
    MEMCUDA_CHECK_MS_BELOW(ms_since(t0), 20000);  // not the 60 s backoff
  }
  SECTION("unblocks a send stuck on a stopped server, without SIGPIPE") {
    auto big = o;
    big.command_timeout = 60s;
    redis::Connection w(big);
    srv.pause();
    const std::string payload(16 << 20, 'x');  // far more than the socket buffers
    auto t0 = Clock::now();
    {
      After stop(200ms, [&] { w.interrupt(); });
      CHECK_THROWS_AS(w.command({"SET", "big", payload}), ConnectionError);
    }
    MEMCUDA_CHECK_MS_BELOW(ms_since(t0), 20000);  // not the 60 s command timeout
    srv.resume();
    CHECK(w.command({"EXISTS", "big"}).integer() == 0);
  }
}

TEST_CASE("moves leave the source empty and safe to destroy", "[redis]") {
  static_assert(!std::is_copy_constructible_v<redis::Connection>);
  static_assert(!std::is_copy_assignable_v<redis::Connection>);
  static_assert(std::is_nothrow_move_constructible_v<redis::Connection>);
  static_assert(std::is_nothrow_move_assignable_v<redis::Connection>);
  static_assert(!std::is_copy_constructible_v<redis::Reply>);
  static_assert(std::is_nothrow_move_constructible_v<redis::Reply>);

  test::RedisServer srv;
  auto a = srv.connect();
  a.command({"SET", "k", "v"});
  redis::Connection b(std::move(a));
  CHECK(a.empty());  // NOLINT(bugprone-use-after-move): the point of the test
  CHECK(!a.connected());
  CHECK(!b.empty());
  CHECK(b.connected());
  CHECK(b.command({"GET", "k"}).str() == "v");
  CHECK_THROWS_AS(a.command({"PING"}), ConnectionError);
  CHECK_THROWS_AS(a.pipeline({{"PING"}}), ConnectionError);
  a.interrupt();  // a no-op, not a crash

  auto d = srv.connect();
  d = std::move(b);
  CHECK(b.empty());
  CHECK(d.command({"GET", "k"}).str() == "v");
  a = std::move(d);  // into a moved-from one
  CHECK(a.command({"GET", "k"}).str() == "v");

  redis::Reply r = a.command({"GET", "k"});
  redis::Reply r2 = std::move(r);
  CHECK(!r);
  CHECK(r2.str() == "v");
  CHECK_THROWS_AS(r.str(), ReplyError);
  CHECK_THROWS_AS(r.integer(), ReplyError);
  CHECK(!r.is_nil());
  CHECK(r.size() == 0);
  CHECK(r.type_name() == "no reply");
}

TEST_CASE("Options are checked before connecting", "[redis]") {
  redis::Options o;
  o.transport = redis::Options::Transport::unix_socket;
  o.path = "/tmp/" + std::string(150, 'x');  // hiredis would truncate it silently
  CHECK_THROWS_AS(redis::Connection(o), InvalidArgument);
  o.path = "/tmp/x.sock";
  o.connect_timeout = 0ms;
  CHECK_THROWS_AS(redis::Connection(o), InvalidArgument);
}

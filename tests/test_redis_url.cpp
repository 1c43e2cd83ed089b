// URL parsing into redis::Options (no server needed).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <optional>
#include <string>

#include "memcuda/redis/options.hpp"

using namespace memcuda;
using redis::Options;
using redis::parse_url;

namespace {

// Sets or unsets an environment variable for one scope and puts back what
// was there.
class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~EnvGuard() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::string parse_error(const std::string& url) {
  try {
    parse_url(url);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  FAIL("parse_url accepted '" << url << "'");
  return {};
}

}  // namespace

TEST_CASE("parse_url accepts the documented forms", "[url]") {
  SECTION("host only") {
    auto o = parse_url("redis://localhost");
    CHECK(o.transport == Options::Transport::tcp);
    CHECK(o.host == "localhost");
    CHECK(o.port == 6379);
    CHECK(o.db == 0);
    CHECK(o.user.empty());
    CHECK(o.password.empty());
  }
  SECTION("host:port") {
    auto o = parse_url("redis://10.1.2.3:6380");
    CHECK(o.host == "10.1.2.3");
    CHECK(o.port == 6380);
  }
  SECTION("host:port/db") {
    auto o = parse_url("redis://redis-1.example.com:7000/5");
    CHECK(o.host == "redis-1.example.com");
    CHECK(o.port == 7000);
    CHECK(o.db == 5);
  }
  SECTION("host/db without port, and a trailing slash") {
    CHECK(parse_url("redis://h/15").db == 15);
    auto o = parse_url("redis://h/");
    CHECK(o.db == 0);
    CHECK(o.port == 6379);
  }
  SECTION("user:password@") {
    auto o = parse_url("redis://alice:s3cret@h:1/2");
    CHECK(o.user == "alice");
    CHECK(o.password == "s3cret");
    CHECK(o.port == 1);
    CHECK(o.db == 2);
  }
  SECTION(":password@ (empty user: password only)") {
    auto o = parse_url("redis://:s3cret@h");
    CHECK(o.user.empty());
    CHECK(o.password == "s3cret");
  }
  SECTION("lone password@ (as redis-cli reads it)") {
    auto o = parse_url("redis://s3cret@h");
    CHECK(o.user.empty());
    CHECK(o.password == "s3cret");
  }
  SECTION("percent-encoded password with '@' and ':'") {
    auto o = parse_url("redis://bob:p%40ss%3Aw%2fd%25@h:6390");
    CHECK(o.user == "bob");
    CHECK(o.password == "p@ss:w/d%");
    CHECK(o.host == "h");
    CHECK(o.port == 6390);
    // A raw '@' in the password works too: the last '@' ends the userinfo.
    CHECK(parse_url("redis://:p@ss@h").password == "p@ss");
  }
  SECTION("IPv6") {
    auto o = parse_url("redis://[::1]:6380");
    CHECK(o.host == "::1");
    CHECK(o.port == 6380);
    CHECK(parse_url("redis://[fe80::1:2]/3").db == 3);
    CHECK(o.describe() == "redis://[::1]:6380");
  }
  SECTION("unix socket") {
    auto o = parse_url("unix:///run/redis/redis.sock");
    CHECK(o.transport == Options::Transport::unix_socket);
    CHECK(o.path == "/run/redis/redis.sock");
    CHECK(o.db == 0);
  }
  SECTION("unix socket with ?db=3") {
    auto o = parse_url("unix:///tmp/r.sock?db=3");
    CHECK(o.path == "/tmp/r.sock");
    CHECK(o.db == 3);
  }
  SECTION("unix socket with credentials") {
    auto o = parse_url("unix://alice:pw%40x@/tmp/r.sock?db=1");
    CHECK(o.user == "alice");
    CHECK(o.password == "pw@x");
    CHECK(o.path == "/tmp/r.sock");
    CHECK(o.db == 1);
    // An '@' inside the path is part of the path.
    CHECK(parse_url("unix:///tmp/a@b.sock").path == "/tmp/a@b.sock");
  }
  SECTION("unix path of exactly 107 bytes, percent-escaped bytes") {
    std::string p = "/" + std::string(106, 'p');
    CHECK(parse_url("unix://" + p).path == p);
    CHECK(parse_url("unix:///tmp/a%20b.sock").path == "/tmp/a b.sock");
  }
  SECTION("db as a query on redis://, case-insensitive scheme, port 65535") {
    CHECK(parse_url("redis://h:1?db=4").db == 4);
    CHECK(parse_url("REDIS://h").host == "h");
    CHECK(parse_url("Unix:///x.sock").path == "/x.sock");
    CHECK(parse_url("redis://h:65535").port == 65535);
  }
  SECTION("timeouts keep their defaults") {
    auto o = parse_url("redis://h");
    Options d;
    CHECK(o.connect_timeout == d.connect_timeout);
    CHECK(o.command_timeout == d.command_timeout);
    CHECK(o.reconnect_timeout == d.reconnect_timeout);
  }
}

TEST_CASE("describe() never prints the password", "[url]") {
  for (const char* url : {"redis://alice:topsecret@h:7/2", "redis://:topsecret@h", "redis://topsecret@h",
                          "unix://alice:topsecret@/tmp/r.sock?db=2", "unix://:topsecret@/tmp/r.sock"}) {
    auto o = parse_url(url);
    CAPTURE(url, o.describe());
    CHECK(o.password == "topsecret");
    CHECK(o.describe().find("topsecret") == std::string::npos);
  }
  CHECK(parse_url("redis://alice:topsecret@h:7/2").describe() == "redis://alice@h:7/2");
  CHECK(parse_url("unix://alice:topsecret@/tmp/r.sock?db=2").describe() == "unix://alice@/tmp/r.sock?db=2");
  CHECK(parse_url("redis://h").describe() == "redis://h:6379");
}

TEST_CASE("an unknown or missing scheme is answered with every accepted form", "[url]") {
  for (const std::string url : {"http://h", "redis+cluster:/h:1", "sentinel://h/s", "localhost:6379"}) {
    INFO(url);
    try {
      (void)parse_url(url);
      FAIL("accepted");
    } catch (const InvalidArgument& e) {
      const std::string m = e.what();
      for (const char* form : {"redis://", "unix://", "redis+sentinel://", "redis+sentinel+unix://", "redis+cluster://"})
        CHECK(m.find(std::string(" ") + form) != std::string::npos);
    }
  }
}

TEST_CASE("parse_url rejects malformed URLs with a message naming the problem", "[url]") {
  struct Case {
    std::string url;
    std::string expect;  // part of the message
  };
  const std::string long_path = "/" + std::string(107, 'p');  // 108 bytes
  const Case cases[] = {
      {"http://h", "unknown scheme 'http'"},
      {"localhost:6379", "no scheme"},
      {"", "empty URL"},
      {"rediss://h", "TLS (rediss://) is not supported"},
      {"redis://", "missing host"},
      {"redis://:6379", "missing host"},
      {"redis://pw@", "missing host"},
      {"redis://h:0", "port 0 is out of range [1, 65535]"},
      {"redis://h:65536", "port 65536 is out of range [1, 65535]"},
      {"redis://h:99999999999999999999", "is out of range"},
      {"redis://h:abc", "port 'abc' is not a number"},
      {"redis://h:+80", "port '+80' is not a number"},
      {"redis://h:", "empty port after ':'"},
      {"redis://[::1]:", "empty port after ':'"},
      {"redis://h/x", "db 'x' is not a number"},
      {"redis://h/-1", "db -1 is out of range"},
      {"redis://h/1/2", "db '1/2' is not a number"},
      {"redis://h/70000", "db 70000 is out of range"},
      {"unix://tmp/r.sock", "unix socket path must be absolute"},
      {"unix://", "missing unix socket path"},
      {"unix://" + long_path, "unix socket path is 108 bytes, longer than the 107"},
      {"unix:///tmp/r.sock?timeout=3", "unknown query parameter 'timeout'"},
      {"unix:///tmp/r.sock?db=1&x=2", "unknown query parameter 'x'"},
      {"unix:///tmp/r.sock?db=1&db=2", "db given twice"},
      {"unix:///tmp/r.sock?", "empty query after '?'"},
      {"unix:///tmp/r.sock?db=", "empty db"},
      {"redis://h/1?db=2", "db given twice"},
      {"redis://h?x=1", "unknown query parameter 'x'"},
      {"redis://my host", "whitespace or control character at offset 10"},
      {"redis://h\t:1", "whitespace or control character at offset 9"},
      {std::string("redis://h\x01"), "whitespace or control character"},
      {"redis://h\x7f", "whitespace or control character"},
      {"redis://:p%zzw@h", "bad %-escape in the password"},
      {"redis://:pw%4@h", "truncated %-escape in the password"},
      {"redis://:pw%@h", "truncated %-escape in the password"},
      {"redis://al%g1ce:pw@h", "bad %-escape in the user name"},
      {"unix:///tmp/a%2.sock", "bad %-escape in the socket path"},
      {"unix:///tmp/a.sock%2", "truncated %-escape in the socket path"},
      {"unix:///tmp/a%00.sock", "NUL byte in the socket path"},
      {"redis://alice:@h", "user 'alice' given without a password"},
      {"redis://:@h", "empty password"},
      {"redis://@h", "empty password"},
      {"redis://[::1", "unterminated '[' in IPv6 address"},
      {"redis://[::1]x", "junk after IPv6 address"},
      {"redis://[]:1", "empty IPv6 address"},
      {"redis://[::g]:1", "bad character in IPv6 address"},
      {"redis://::1:6379", "more than one ':'"},
      {"redis://h$t", "bad character '$' in host"},
      {"redis://h:1:2", "more than one ':'"},
      {"redis://" + std::string(254, 'h'), "host name longer than 253"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.url);
    std::string msg = parse_error(c.url);
    CAPTURE(msg);
    CHECK(msg.find(c.expect) != std::string::npos);
    CHECK(msg.find("invalid Redis URL") != std::string::npos);
  }
  CHECK(std::size(cases) >= 18);
}

TEST_CASE("URL error messages hide the password and escape control bytes", "[url]") {
  std::string msg = parse_error("redis://alice:topsecret@h:0");
  CHECK(msg.find("topsecret") == std::string::npos);
  CHECK(msg.find("redis://alice:***@h:0") != std::string::npos);

  msg = parse_error("redis://topsecret@h:abc");
  CHECK(msg.find("topsecret") == std::string::npos);
  CHECK(msg.find("redis://***@h:abc") != std::string::npos);

  msg = parse_error("redis://:top%zzsecret@h");  // the bad escape is not echoed either
  CHECK(msg.find("secret") == std::string::npos);

  msg = parse_error("unix://u:topsecret@/tmp/r.sock?db=x");
  CHECK(msg.find("topsecret") == std::string::npos);
  CHECK(msg.find("unix://u:***@/tmp/r.sock?db=x") != std::string::npos);

  msg = parse_error(std::string("redis://h\x1b[31m"));
  CHECK(msg.find('\x1b') == std::string::npos);
  CHECK(msg.find("\\x1b[31m") != std::string::npos);
}

TEST_CASE("Options::validate rejects what a URL could not express", "[url]") {
  Options o;
  CHECK_NOTHROW(o.validate());
  auto fails = [](Options bad, const std::string& expect) {
    try {
      bad.validate();
    } catch (const InvalidArgument& e) {
      CAPTURE(e.what());
      CHECK(std::string(e.what()).find(expect) != std::string::npos);
      return;
    }
    FAIL("validate() accepted: " << expect);
  };
  Options a = o;
  a.port = 0;
  fails(a, "port 0");
  a = o;
  a.host.clear();
  fails(a, "empty host");
  a = o;
  a.transport = Options::Transport::unix_socket;
  fails(a, "empty unix socket path");
  a.path = "/" + std::string(200, 'x');
  fails(a, "longer than the 107");
  a = o;
  a.db = -1;
  fails(a, "db -1");
  a = o;
  a.user = "alice";
  fails(a, "without a password");
  a = o;
  a.connect_timeout = std::chrono::milliseconds(0);
  fails(a, "connect_timeout");
  a = o;
  a.command_timeout = std::chrono::milliseconds(-1);
  fails(a, "command_timeout");
}

TEST_CASE("options_from_env reads MEMCUDA_REDIS_URL", "[url]") {
  SECTION("unset: the default URL") {
    EnvGuard g(redis::kUrlEnv, nullptr);
    auto o = redis::options_from_env();
    CHECK(o.transport == Options::Transport::tcp);
    CHECK(o.host == "127.0.0.1");
    CHECK(o.port == 6379);
    CHECK(o.describe() == "redis://127.0.0.1:6379");
  }
  SECTION("empty: the default URL") {
    EnvGuard g(redis::kUrlEnv, "");
    auto o = redis::options_from_env();
    CHECK(o.host == "127.0.0.1");
    CHECK(o.port == 6379);
  }
  SECTION("set: parsed") {
    EnvGuard g(redis::kUrlEnv, "unix://:pw@/tmp/memcuda-test.sock?db=7");
    auto o = redis::options_from_env();
    CHECK(o.transport == Options::Transport::unix_socket);
    CHECK(o.path == "/tmp/memcuda-test.sock");
    CHECK(o.password == "pw");
    CHECK(o.db == 7);
  }
  SECTION("malformed: the error names the variable, not the password") {
    EnvGuard g(redis::kUrlEnv, "redis://:hunter2@h:0");
    try {
      redis::options_from_env();
      FAIL("accepted a malformed MEMCUDA_REDIS_URL");
    } catch (const InvalidArgument& e) {
      std::string m = e.what();
      CHECK(m.find("MEMCUDA_REDIS_URL") != std::string::npos);
      CHECK(m.find("port 0") != std::string::npos);
      CHECK(m.find("hunter2") == std::string::npos);
    }
  }
}

TEST_CASE("URL errors never echo control bytes or a mistyped password", "[url]") {
  for (std::string bad : {std::string("\n://x"), std::string("redis://%0a:@host"), std::string("redis:/:hunter2@localhost:6379")}) {
    try {
      memcuda::redis::parse_url(bad);
      FAIL("accepted " << bad);
    } catch (const memcuda::InvalidArgument& e) {
      std::string m = e.what();
      for (char ch : m) CHECK(static_cast<unsigned char>(ch) >= 0x20);
      CHECK(m.find("hunter2") == std::string::npos);
    }
  }
}

TEST_CASE("sentinel URLs name the sentinels, the service and the credentials", "[url][sentinel]") {
  SECTION("several sentinels, default port, IPv6, db") {
    auto o = parse_url("redis+sentinel://s1:26380,s2,[::1]:26381/mymaster?db=2");
    REQUIRE(o.sentinels.size() == 3);
    CHECK(o.sentinels[0].host == "s1");
    CHECK(o.sentinels[0].port == 26380);
    CHECK(o.sentinels[1].host == "s2");
    CHECK(o.sentinels[1].port == 26379);
    CHECK(o.sentinels[2].host == "::1");
    CHECK(o.sentinels[2].port == 26381);
    CHECK(o.service == "mymaster");
    CHECK(o.db == 2);
    CHECK_NOTHROW(o.validate());
    CHECK(o.describe() == "redis+sentinel://s1:26380,s2:26379,[::1]:26381/mymaster?db=2");
    CHECK(parse_url(o.describe()).describe() == o.describe());
  }
  SECTION("credentials, %-escaped, never in describe()") {
    auto o = parse_url("REDIS+SENTINEL://app:p%40ss@127.0.0.1:1/svc");
    CHECK(o.user == "app");
    CHECK(o.password == "p@ss");
    CHECK(o.service == "svc");
    CHECK(o.describe() == "redis+sentinel://app@127.0.0.1:1/svc");
  }
  SECTION("a sentinel on a unix socket") {
    auto o = parse_url("redis+sentinel+unix://:pw@/run/redis/sentinel.sock/svc-1?db=3");
    REQUIRE(o.sentinels.size() == 1);
    CHECK(o.sentinels[0].path == "/run/redis/sentinel.sock");
    CHECK(o.service == "svc-1");
    CHECK(o.password == "pw");
    CHECK(o.db == 3);
    CHECK_NOTHROW(o.validate());
    CHECK(o.describe() == "redis+sentinel+unix:///run/redis/sentinel.sock/svc-1?db=3");
  }
  SECTION("MEMCUDA_REDIS_URL takes it, with the password of the environment") {
    EnvGuard g(redis::kUrlEnv, "redis+sentinel://h1,h2/svc");
    EnvGuard p(redis::kPasswordEnv, "envpw");
    auto o = redis::options_from_env();
    CHECK(o.sentinels.size() == 2);
    CHECK(o.password == "envpw");
  }
  SECTION("malformed ones say what is wrong") {
    CHECK_THAT(parse_error("redis+sentinel://h:1"), Catch::Contains("missing service name"));
    CHECK_THAT(parse_error("redis+sentinel://h:1/"), Catch::Contains("missing service name"));
    CHECK_THAT(parse_error("redis+sentinel:///svc"), Catch::Contains("no sentinel address"));
    CHECK_THAT(parse_error("redis+sentinel://h1,,h2/svc"), Catch::Contains("empty sentinel address"));
    CHECK_THAT(parse_error("redis+sentinel://h1:0/svc"), Catch::Contains("out of range"));
    CHECK_THAT(parse_error("redis+sentinel://h1:/svc"), Catch::Contains("empty port"));
    CHECK_THAT(parse_error("redis+sentinel://h1/s*v"), Catch::Contains("bad character in the service name"));
    CHECK_THAT(parse_error("redis+sentinel://h1/svc?timeout=1"), Catch::Contains("unknown query parameter"));
    CHECK_THAT(parse_error("redis+sentinel+unix://relative.sock/svc"), Catch::Contains("absolute"));
    CHECK_THAT(parse_error("redis+sentinel://:hunter2@h1/"), !Catch::Contains("hunter2"));
  }
  SECTION("validate() wants a service and sane sentinels") {
    Options o;
    o.sentinels.push_back({.host = "h", .port = 26379, .path = {}});
    CHECK_THROWS_WITH(o.validate(), Catch::Contains("without a service"));
    o.service = "svc";
    o.sentinels.push_back({.host = "", .port = 26379, .path = {}});
    CHECK_THROWS_WITH(o.validate(), Catch::Contains("sentinel's address"));
  }
}

TEST_CASE("cluster URLs name the seed nodes and the credentials", "[url][cluster]") {
  auto o = parse_url("REDIS+CLUSTER://app:p%40ss@n1:7000,n2,[::1]:7002");
  REQUIRE(o.cluster.size() == 3);
  CHECK(o.cluster[0].host == "n1");
  CHECK(o.cluster[0].port == 7000);
  CHECK(o.cluster[1].port == 6379);
  CHECK(o.cluster[2].host == "::1");
  CHECK(o.user == "app");
  CHECK(o.password == "p@ss");
  CHECK(o.sentinels.empty());
  CHECK_NOTHROW(o.validate());
  CHECK(o.describe() == "redis+cluster://app@n1:7000,n2:6379,[::1]:7002");
  CHECK(parse_url("redis+cluster://h:1").describe() == "redis+cluster://h:1");
  CHECK_THAT(parse_error("redis+cluster://"), Catch::Contains("no cluster node address"));
  CHECK_THAT(parse_error("redis+cluster://h1,,h2"), Catch::Contains("empty cluster node address"));
  CHECK_THAT(parse_error("redis+cluster://h1:70000"), Catch::Contains("out of range"));
  CHECK_THAT(parse_error("redis+cluster://h1/2"), Catch::Contains("database 0 only"));
  CHECK_THAT(parse_error("redis+cluster://h1?db=2"), Catch::Contains("database 0 only"));
  CHECK_THAT(parse_error("redis+cluster://:hunter2@h1/"), !Catch::Contains("hunter2"));
  Options bad = o;
  bad.db = 1;
  CHECK_THROWS_WITH(bad.validate(), Catch::Contains("neither sentinels nor databases"));
}

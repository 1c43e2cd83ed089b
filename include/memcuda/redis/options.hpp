// Connection options for the Redis layer and the URL syntax that fills them.
//
//   redis://[[user]:password@]host[:port][/db][?db=N]
//   unix:///path/to/redis.sock[?db=N]            (also unix://user:pass@/path)
//   redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[?db=N]
//   redis+sentinel+unix://[user:pass@]/path/to/sentinel.sock/service[?db=N]
//   redis+cluster://[[user]:password@]host[:port][,host[:port]...]
//
// A sentinel URL names Redis Sentinels (port 26379 by default) and the
// service they watch; every connect asks them for its primary
// (sentinel.hpp). Its credentials are the data nodes' and are offered to
// the sentinels too (sentinel_url.hpp). A cluster URL names any nodes of a
// Redis Cluster; each connect asks one for the slot map and goes to the
// primary of the slot of `cluster_tag` (cluster.hpp).
//
// A lone "redis://secret@host" is a password for the default user, as
// redis-cli reads it; ":secret@" says the same explicitly. Reserved bytes in
// the user, the password and the socket path are %-escaped ("%40" for '@').
// Schemes are case-insensitive. TLS (rediss://) is not supported: the
// registry is node-local.
//
// A URL only fills Options; every field can also be set directly.
// MEMCUDA_REDIS_URL fills the default (redis://127.0.0.1:6379), and
// MEMCUDA_REDIS_PASSWORD (with MEMCUDA_REDIS_USER for an ACL user) the
// credentials a URL does not carry: a password on a command line is visible
// to every user in `ps`, one in the environment is not.
#pragma once

#include "memcuda/config.hpp"

#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace redis {

inline constexpr std::string_view kDefaultUrl = "redis://127.0.0.1:6379";
inline constexpr const char* kUrlEnv = "MEMCUDA_REDIS_URL";
inline constexpr const char* kPasswordEnv = "MEMCUDA_REDIS_PASSWORD";
inline constexpr const char* kUserEnv = "MEMCUDA_REDIS_USER";
// sockaddr_un::sun_path holds 108 bytes with the terminating NUL; hiredis
// would silently truncate a longer path.
inline constexpr std::size_t kMaxUnixPath = 107;
inline constexpr int kMaxDb = 65535;

struct Options;
namespace detail {
inline std::string describe_sentinels(const Options& o);  // sentinel_url.hpp
inline std::string describe_cluster(const Options& o);    // sentinel_url.hpp
}

struct Options {
  enum class Transport { tcp, unix_socket };
  // A Redis Sentinel or cluster seed: TCP, or a unix socket when `path` is set.
  struct Sentinel {
    std::string host;
    int port = 26379;
    std::string path;
  };

  Transport transport = Transport::tcp;
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string path;      // unix socket path (Transport::unix_socket)
  std::string user;      // ACL user; empty means the default user
  std::string password;  // empty: no AUTH
  // A file holding the password (its first line), read at every connect,
  // so a rotated secret (a Kubernetes Secret volume, a vault agent's file)
  // is picked up at the next reconnect without a restart. Overrides
  // `password`; MEMCUDA_REDIS_PASSWORD_FILE sets it (options_from_env).
  std::string password_file;
  int db = 0;
  // Not empty: the server is the primary of `service` as these sentinels
  // name it, asked at each connect; transport, host, port and path are not
  // used then.
  std::vector<Sentinel> sentinels;
  std::string service;
  // Not empty: nodes of a Redis Cluster (TCP), any of which gives the slot
  // map; the server is the primary of the slot of `cluster_tag`, the hash
  // tag of every key (the registry sets it to its namespace).
  std::vector<Sentinel> cluster;
  std::string cluster_tag = "memcuda";
  // After a create or a version flip, wait up to this long for one replica
  // to have it (WAIT 1 <ms>); zero: don't. MEMCUDA_REDIS_REPLICA_WAIT_MS.
  std::chrono::milliseconds replica_wait{0};

  // Bounds one connect(2) (must be > 0).
  std::chrono::milliseconds connect_timeout{1000};
  // Socket timeout for one command (zero: none). Blocking commands add their
  // own wait (Connection::blocking).
  std::chrono::milliseconds command_timeout{2000};
  // After the connection broke, how long commands keep trying to reconnect
  // (with exponential backoff from reconnect_backoff up to 250 ms) before
  // giving up with ConnectionError. Zero: a single attempt.
  std::chrono::milliseconds reconnect_timeout{2000};
  std::chrono::milliseconds reconnect_backoff{5};

  // Sentinel or Cluster: a failover may roll acknowledged writes back.
  bool replicated() const noexcept { return !sentinels.empty() || !cluster.empty(); }

  // The address in URL form, without the password (safe for messages).
  std::string describe() const {
    if (!sentinels.empty()) return detail::describe_sentinels(*this);
    if (!cluster.empty()) return detail::describe_cluster(*this);
    std::string s;
    if (transport == Transport::unix_socket) {
      s = "unix://";
      if (!user.empty()) s += user + "@";
      s += path;
      if (db != 0) s += "?db=" + std::to_string(db);
    } else {
      s = "redis://";
      if (!user.empty()) s += user + "@";
      s += (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
           std::to_string(port);
      if (db != 0) s += "/" + std::to_string(db);
    }
    return s;
  }

  // Throws InvalidArgument when a field is out of range (what parse_url
  // produces always passes). Connection checks this before connecting.
  void validate() const {
    auto bad = [&](const std::string& why) {
      throw InvalidArgument("invalid Redis options for " + describe() + ": " + why);
    };
    for (const auto& sn : sentinels)
      if (sn.path.empty() ? sn.host.empty() || sn.port < 1 || sn.port > 65535 : sn.path.size() > kMaxUnixPath)
        bad("a sentinel's address is empty or out of range");
    if (!sentinels.empty() && service.empty()) bad("sentinels given without a service name");
    for (const auto& n : cluster)
      if (n.host.empty() || n.port < 1 || n.port > 65535) bad("a cluster node's address is empty or out of range");
    if (!cluster.empty() && (!sentinels.empty() || db != 0)) bad("a cluster has neither sentinels nor databases");
    if (replica_wait.count() < 0) bad("replica_wait must not be negative (zero: off)");
    if (sentinels.empty() && transport == Transport::unix_socket) {
      if (path.empty()) bad("empty unix socket path");
      if (path.size() > kMaxUnixPath)
        bad("unix socket path is " + std::to_string(path.size()) + " bytes, longer than the " +
            std::to_string(kMaxUnixPath) + " a socket address holds");
      if (path.find('\0') != std::string::npos) bad("NUL byte in the unix socket path");
    } else {
      if (host.empty()) bad("empty host");
      if (host.find('\0') != std::string::npos) bad("NUL byte in the host");
      if (port < 1 || port > 65535) bad("port " + std::to_string(port) + " is out of range [1, 65535]");
    }
    if (db < 0 || db > kMaxDb) bad("db " + std::to_string(db) + " is out of range [0, 65535]");
    if (!user.empty() && password.empty() && password_file.empty())
      bad("ACL user '" + user + "' given without a password");
    if (connect_timeout.count() <= 0) bad("connect_timeout must be positive");
    if (command_timeout.count() < 0) bad("command_timeout must not be negative (zero: none)");
    if (reconnect_timeout.count() < 0) bad("reconnect_timeout must not be negative");
    if (reconnect_backoff.count() < 0) bad("reconnect_backoff must not be negative");
  }
};

namespace detail {

inline bool url_ctl(char c) { return static_cast<unsigned char>(c) <= 0x20 || c == 0x7f; }

// The URL as it may appear in a message: the password replaced by "***" and
// control bytes escaped, so that neither secrets nor terminal escapes leak
// into logs. Mirrors how parse_url finds the userinfo.
// Control bytes as \xNN, so a message never carries raw terminal bytes.
inline std::string escape_ctl(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (url_ctl(c) && c != ' ') {
      static constexpr char kHex[] = "0123456789abcdef";
      auto b = static_cast<unsigned char>(c);
      out += "\\x";
      out += kHex[b >> 4];
      out += kHex[b & 15];
    } else {
      out += c;
    }
  }
  return out;
}

inline std::string redact_url(std::string_view url) {
  std::string u(url);
  auto sep = u.find("://");
  if (sep == std::string::npos) {
    // A mistyped scheme ("redis:/:secret@host") may still carry a password:
    // hide everything between the first ':' and the last '@'.
    auto at = u.rfind('@');
    auto colon = u.find(':');
    if (at != std::string::npos) {
      std::size_t b = colon != std::string::npos && colon < at ? colon + 1 : 0;
      u = u.substr(0, b) + "***" + u.substr(at);
    }
  } else {
    std::size_t b = sep + 3;
    bool is_unix = u.size() >= 4 && (u[0] | 0x20) == 'u' && (u[1] | 0x20) == 'n' &&
                   (u[2] | 0x20) == 'i' && (u[3] | 0x20) == 'x';
    std::size_t at = is_unix ? u.find('@', b) : u.rfind('@');
    if (is_unix && at != std::string::npos && u.find('/', b) < at) at = std::string::npos;
    if (at != std::string::npos && at >= b) {
      std::string ui = u.substr(b, at - b);
      auto colon = ui.find(':');
      std::string shown = colon == std::string::npos ? "***" : ui.substr(0, colon) + ":***";
      u = u.substr(0, b) + shown + u.substr(at);
    }
  }
  return escape_ctl(u);
}

[[noreturn]] inline void bad_url(std::string_view url, std::string_view why) {
  throw InvalidArgument("invalid Redis URL '" + redact_url(url) + "': " + std::string(why) +
                        " (expected redis://[[user]:password@]host[:port][/db], "
                        "unix:///path.sock[?db=N] or redis+sentinel://host:port[,host:port]/service)");
}

inline int parse_int(std::string_view url, std::string_view text, int lo, int hi,
                     std::string_view what) {
  if (text.empty()) bad_url(url, "empty " + std::string(what));
  long long v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec == std::errc::result_out_of_range ||
      (ec == std::errc{} && p == text.data() + text.size() && (v < lo || v > hi)))
    bad_url(url, std::string(what) + " " + std::string(text) + " is out of range [" +
                     std::to_string(lo) + ", " + std::to_string(hi) + "]");
  if (ec != std::errc{} || p != text.data() + text.size())
    bad_url(url, std::string(what) + " '" + std::string(text) + "' is not a number");
  return static_cast<int>(v);
}

// Percent-decoding for the userinfo and the socket path (passwords may hold
// '@' or ':'). `what` names the part; its bytes are never echoed, since the
// part may be a password.
inline std::string pct_decode(std::string_view url, std::string_view s, std::string_view what) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size()) bad_url(url, "truncated %-escape in the " + std::string(what));
    int hi = hex(s[i + 1]);
    int lo = hex(s[i + 2]);
    if (hi < 0 || lo < 0) bad_url(url, "bad %-escape in the " + std::string(what) + " (want %XX, X hex)");
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

inline void parse_userinfo(std::string_view url, std::string_view ui, Options& o) {
  auto colon = ui.find(':');
  if (colon == std::string_view::npos) {
    // "redis://secret@host": a lone token is the password (as redis-cli reads it).
    o.password = pct_decode(url, ui, "password");
  } else {
    o.user = pct_decode(url, ui.substr(0, colon), "user name");
    o.password = pct_decode(url, ui.substr(colon + 1), "password");
  }
  if (o.password.empty() && !o.user.empty())
    bad_url(url, "user '" + escape_ctl(o.user) + "' given without a password");
  if (o.password.empty()) bad_url(url, "empty password before '@'");
}

// "db=N[&...]": the only parameter is db; anything else is an error rather
// than silently ignored (a typo in a timeout name would otherwise pass).
inline void parse_query(std::string_view url, std::string_view query, Options& o, bool db_set) {
  if (query.empty()) bad_url(url, "empty query after '?'");
  while (true) {
    auto amp = query.find('&');
    std::string_view kv = query.substr(0, amp);
    auto eq = kv.find('=');
    std::string_view key = kv.substr(0, eq);
    if (key != "db")
      bad_url(url, "unknown query parameter '" + std::string(key) + "' (only 'db' is known)");
    if (eq == std::string_view::npos) bad_url(url, "query parameter 'db' without '=N'");
    if (db_set) bad_url(url, "db given twice");
    o.db = parse_int(url, kv.substr(eq + 1), 0, kMaxDb, "db");
    db_set = true;
    if (amp == std::string_view::npos) break;
    query = query.substr(amp + 1);
  }
}

inline bool starts_with_nocase(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (std::size_t i = 0; i < prefix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  return true;
}

// unix://[user:pass@]/path[?db=N]: what follows the scheme.
inline void parse_unix_rest(std::string_view url, std::string_view rest, Options& o) {
  auto at = rest.find('@');
  if (at != std::string_view::npos && rest.find('/') > at) {
    parse_userinfo(url, rest.substr(0, at), o);
    rest = rest.substr(at + 1);
  }
  auto q = rest.find('?');
  std::string_view raw_path = rest.substr(0, q);
  if (raw_path.empty()) bad_url(url, "missing unix socket path");
  if (raw_path.front() != '/')
    bad_url(url, "unix socket path must be absolute (unix:///path/to.sock)");
  o.path = pct_decode(url, raw_path, "socket path");
  if (o.path.find('\0') != std::string::npos) bad_url(url, "NUL byte in the socket path");
  if (o.path.size() > kMaxUnixPath)
    bad_url(url, "unix socket path is " + std::to_string(o.path.size()) + " bytes, longer than the " +
                     std::to_string(kMaxUnixPath) + " a socket address holds");
  if (q != std::string_view::npos) parse_query(url, rest.substr(q + 1), o, false);
}

struct HostPort {
  std::string_view host, port;
  bool has_port = false;
};

// host[:port] or [IPv6]:port, checked character by character.
inline HostPort parse_host_port(std::string_view url, std::string_view hostport) {
  std::string_view host;
  std::string_view port;
  bool has_port = false;
  if (hostport.front() == '[') {  // [::1]:6379
    auto close = hostport.find(']');
    if (close == std::string_view::npos) bad_url(url, "unterminated '[' in IPv6 address");
    host = hostport.substr(1, close - 1);
    if (host.empty()) bad_url(url, "empty IPv6 address in []");
    for (char c : host)
      if (!(std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.'))
        bad_url(url, "bad character in IPv6 address");
    auto after = hostport.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') bad_url(url, "junk after IPv6 address (want ]:port)");
      port = after.substr(1);
      has_port = true;
    }
  } else {
    auto colon = hostport.find(':');
    host = hostport.substr(0, colon);
    if (colon != std::string_view::npos) {
      if (hostport.find(':', colon + 1) != std::string_view::npos)
        bad_url(url, "more than one ':' in host:port (an IPv6 address goes in [])");
      port = hostport.substr(colon + 1);
      has_port = true;
    }
    if (host.empty()) bad_url(url, "missing host");
    for (char c : host)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_'))
        bad_url(url, "bad character '" + std::string(1, c) + "' in host");
  }
  return {host, port, has_port};
}

inline Options parse_sentinel_url(std::string_view url, std::string_view rest, bool unix_socket);  // sentinel_url.hpp
inline Options parse_cluster_url(std::string_view url, std::string_view rest);                     // sentinel_url.hpp

}  // namespace detail

// Parses a Redis URL into Options (timeouts keep their defaults).
// Throws InvalidArgument naming what is wrong; the message never holds the
// password.
inline Options parse_url(std::string_view url) {
  Options o;
  if (url.empty()) detail::bad_url(url, "empty URL");
  std::string_view rest;
  std::size_t sentinel = 0;  // the scheme's length for a sentinel URL
  const bool cluster = detail::starts_with_nocase(url, "redis+cluster://");
  if (detail::starts_with_nocase(url, "redis://")) {
    rest = url.substr(8);
  } else if (detail::starts_with_nocase(url, "unix://")) {
    o.transport = Options::Transport::unix_socket;
    rest = url.substr(7);
  } else if (cluster) {
  } else if (detail::starts_with_nocase(url, "redis+sentinel://")) {
    sentinel = 17;
  } else if (detail::starts_with_nocase(url, "redis+sentinel+unix://")) {
    sentinel = 22;
  } else if (detail::starts_with_nocase(url, "rediss://")) {
    detail::bad_url(url, "TLS (rediss://) is not supported: the registry is node-local");
  } else {
    const std::string_view use = " (use redis://, unix://, redis+sentinel://, redis+sentinel+unix:// or "
                                 "redis+cluster://)";
    auto sep = url.find("://");
    detail::bad_url(url, (sep == std::string_view::npos
                              ? std::string("no scheme")
                              : "unknown scheme '" + detail::escape_ctl(url.substr(0, sep)) + "'") +
                             std::string(use));
  }
  for (std::size_t i = 0; i < url.size(); ++i)
    if (detail::url_ctl(url[i]))
      detail::bad_url(url, "whitespace or control character at offset " + std::to_string(i) +
                               " (%-escape it)");
  if (sentinel) return detail::parse_sentinel_url(url, url.substr(sentinel), sentinel == 22);
  if (cluster) return detail::parse_cluster_url(url, url.substr(16));

  if (o.transport == Options::Transport::unix_socket) {
    detail::parse_unix_rest(url, rest, o);
    return o;
  }

  // redis://[userinfo@]host[:port][/db][?db=N]
  auto at = rest.rfind('@');
  if (at != std::string_view::npos) {
    detail::parse_userinfo(url, rest.substr(0, at), o);
    rest = rest.substr(at + 1);
  }
  std::string_view query;
  bool has_query = false;
  if (auto q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    has_query = true;
    rest = rest.substr(0, q);
  }
  auto slash = rest.find('/');
  std::string_view hostport = rest.substr(0, slash);
  bool db_set = false;
  if (slash != std::string_view::npos) {
    std::string_view db = rest.substr(slash + 1);
    if (!db.empty()) {
      o.db = detail::parse_int(url, db, 0, kMaxDb, "db");
      db_set = true;
    }
  }
  if (hostport.empty()) detail::bad_url(url, "missing host");
  const auto [host, port, has_port] = detail::parse_host_port(url, hostport);
  if (host.size() > 253) detail::bad_url(url, "host name longer than 253 characters");
  o.host = std::string(host);
  if (has_port) {
    if (port.empty()) detail::bad_url(url, "empty port after ':'");
    o.port = detail::parse_int(url, port, 1, 65535, "port");
  }
  if (has_query) detail::parse_query(url, query, o, db_set);
  return o;
}

inline constexpr const char* kPasswordFileEnv = "MEMCUDA_REDIS_PASSWORD_FILE";

// `o` with the credentials of the environment when `o` has no password: the
// password file of MEMCUDA_REDIS_PASSWORD_FILE (read at every connect, so it
// can be rotated), else MEMCUDA_REDIS_PASSWORD; MEMCUDA_REDIS_USER, read
// only with one of them, names the ACL user. A password in the URL wins.
inline Options with_password_from_env(Options o) {
  if (!o.password.empty()) return o;
  const char* file = std::getenv(kPasswordFileEnv);
  const char* pw = std::getenv(kPasswordEnv);
  if (file && *file) {
    o.password_file = file;
  } else if (pw && *pw) {
    o.password = pw;
  } else {
    return o;
  }
  if (const char* user = std::getenv(kUserEnv); user && *user && o.user.empty()) o.user = user;
  return o;
}

// Options from MEMCUDA_REDIS_URL when set and non-empty, else the default
// URL, with the credentials of the environment when the URL has none
// (with_password_from_env). A malformed variable throws InvalidArgument
// naming the variable.
inline Options options_from_env() {
  const char* env = std::getenv(kUrlEnv);
  if (!env || !*env) return with_password_from_env(parse_url(kDefaultUrl));
  try {
    return with_password_from_env(parse_url(env));
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string(kUrlEnv) + ": " + e.what() +
                          "; fix or unset the variable (default " + std::string(kDefaultUrl) + ")");
  }
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::redis

#include "memcuda/redis/sentinel_url.hpp"  // IWYU pragma: export

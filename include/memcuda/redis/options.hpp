// Connection options for the Redis layer and the URL syntax that fills them.
//
//   redis://[[user]:password@]host[:port][/db]
//   unix:///path/to/redis.sock[?db=N]            (also unix://user:pass@/path)
//
// A URL only fills Options; every field can also be set directly.
// MEMCUDA_REDIS_URL fills the default (redis://127.0.0.1:6379).
#pragma once

#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <string>
#include <string_view>

#include "memcuda/error.hpp"

namespace memcuda::redis {

inline constexpr std::string_view kDefaultUrl = "redis://127.0.0.1:6379";
inline constexpr const char* kUrlEnv = "MEMCUDA_REDIS_URL";

struct Options {
  enum class Transport { tcp, unix_socket };

  Transport transport = Transport::tcp;
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string path;      // unix socket path (Transport::unix_socket)
  std::string user;      // ACL user; empty means the default user
  std::string password;  // empty: no AUTH
  int db = 0;

  std::chrono::milliseconds connect_timeout{1000};
  // Socket timeout for one command. Blocking commands add their own wait.
  std::chrono::milliseconds command_timeout{2000};
  // After the connection broke, how long commands keep trying to reconnect
  // (with exponential backoff from reconnect_backoff up to 250 ms) before
  // giving up with ConnectionError. Zero: a single attempt.
  std::chrono::milliseconds reconnect_timeout{2000};
  std::chrono::milliseconds reconnect_backoff{5};

  // The address in URL form, without the password (safe for messages).
  std::string describe() const {
    std::string s;
    if (transport == Transport::unix_socket) {
      s = "unix://" + path;
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
};

namespace detail {

[[noreturn]] inline void bad_url(std::string_view url, std::string_view why) {
  throw InvalidArgument("invalid Redis URL '" + std::string(url) + "': " + std::string(why) +
                        " (expected redis://[[user]:password@]host[:port][/db] or "
                        "unix:///path.sock[?db=N])");
}

inline int parse_int(std::string_view url, std::string_view text, int lo, int hi,
                     std::string_view what) {
  int v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc{} || p != text.data() + text.size() || v < lo || v > hi)
    bad_url(url, std::string(what) + " '" + std::string(text) + "' is not an integer in [" +
                     std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

// Percent-decoding for the userinfo part (passwords may hold '@' or ':').
inline std::string pct_decode(std::string_view url, std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') { out += s[i]; continue; }
    if (i + 2 >= s.size()) bad_url(url, "truncated %-escape");
    auto hex = [&](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      bad_url(url, "bad %-escape");
    };
    out += static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2]));
    i += 2;
  }
  return out;
}

inline void parse_userinfo(std::string_view url, std::string_view ui, Options& o) {
  auto colon = ui.find(':');
  if (colon == std::string_view::npos) {
    // "redis://secret@host": a lone token is the password (as redis-cli reads it).
    o.password = pct_decode(url, ui);
  } else {
    o.user = pct_decode(url, ui.substr(0, colon));
    o.password = pct_decode(url, ui.substr(colon + 1));
  }
  if (o.password.empty() && !o.user.empty()) bad_url(url, "user given without a password");
  if (o.password.empty()) bad_url(url, "empty password");
}

}  // namespace detail

// Parses a Redis URL into Options (timeouts keep their defaults).
// Throws InvalidArgument naming what is wrong.
inline Options parse_url(std::string_view url) {
  Options o;
  std::string_view rest;
  if (url.starts_with("redis://")) {
    rest = url.substr(8);
  } else if (url.starts_with("unix://")) {
    o.transport = Options::Transport::unix_socket;
    rest = url.substr(7);
  } else if (url.starts_with("rediss://")) {
    detail::bad_url(url, "TLS (rediss://) is not supported: the registry is node-local");
  } else {
    detail::bad_url(url, "unknown scheme");
  }
  for (char c : url)
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f)
      detail::bad_url(url, "contains whitespace or a control character");

  if (o.transport == Options::Transport::unix_socket) {
    // unix://[user:pass@]/path[?db=N]
    auto at = rest.find('@');
    if (at != std::string_view::npos && rest.find('/') > at) {
      detail::parse_userinfo(url, rest.substr(0, at), o);
      rest = rest.substr(at + 1);
    }
    auto q = rest.find('?');
    std::string_view path = rest.substr(0, q);
    if (path.empty() || path.front() != '/') detail::bad_url(url, "unix socket path must be absolute");
    if (path.size() > 107) detail::bad_url(url, "unix socket path longer than 107 bytes");
    o.path = std::string(path);
    if (q != std::string_view::npos) {
      std::string_view query = rest.substr(q + 1);
      if (!query.starts_with("db=")) detail::bad_url(url, "only the query parameter 'db' is known");
      o.db = detail::parse_int(url, query.substr(3), 0, 65535, "db");
    }
    return o;
  }

  // redis://[userinfo@]host[:port][/db]
  auto at = rest.rfind('@');
  if (at != std::string_view::npos) {
    detail::parse_userinfo(url, rest.substr(0, at), o);
    rest = rest.substr(at + 1);
  }
  auto slash = rest.find('/');
  std::string_view hostport = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    std::string_view db = rest.substr(slash + 1);
    if (!db.empty()) o.db = detail::parse_int(url, db, 0, 65535, "db");
  }
  if (hostport.empty()) detail::bad_url(url, "missing host");
  std::string_view host;
  std::string_view port;
  if (hostport.front() == '[') {  // [::1]:6379
    auto close = hostport.find(']');
    if (close == std::string_view::npos) detail::bad_url(url, "unterminated IPv6 address");
    host = hostport.substr(1, close - 1);
    auto after = hostport.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') detail::bad_url(url, "junk after IPv6 address");
      port = after.substr(1);
      if (port.empty()) detail::bad_url(url, "empty port");
    }
  } else {
    auto colon = hostport.find(':');
    host = hostport.substr(0, colon);
    if (colon != std::string_view::npos) {
      port = hostport.substr(colon + 1);
      if (port.empty()) detail::bad_url(url, "empty port");
    }
  }
  if (host.empty()) detail::bad_url(url, "missing host");
  for (char c : host)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' || c == ':'))
      detail::bad_url(url, "bad character in host");
  o.host = std::string(host);
  if (!port.empty()) o.port = detail::parse_int(url, port, 1, 65535, "port");
  return o;
}

// Options from MEMCUDA_REDIS_URL when set and non-empty, else the default URL.
inline Options options_from_env() {
  const char* env = std::getenv(kUrlEnv);
  return parse_url(env && *env ? std::string_view(env) : kDefaultUrl);
}

}  // namespace memcuda::redis

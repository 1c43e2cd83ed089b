// The sentinel forms of a Redis URL (options.hpp lists every form):
//
//   redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[?db=N]
//   redis+sentinel+unix://[user:pass@]/path/to/sentinel.sock/service[?db=N]
//
// The port defaults to 26379, Sentinel's. The service is the name the
// sentinels monitor (`sentinel monitor <service> ...`), for the unix form
// the last part of the path. The credentials (or MEMCUDA_REDIS_PASSWORD /
// _PASSWORD_FILE / _USER) are the data nodes'; they are offered to each
// sentinel as well, and a sentinel without a password ignores them
// (sentinel.hpp). A sentinel with a password of its own wants the same one.
//
// Part of options.hpp, which includes this file; include that one.
#pragma once

#include <string>
#include <string_view>

#include "memcuda/redis/options.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace redis::detail {

inline std::string describe_sentinels(const Options& o) {
  const bool on_unix = !o.sentinels.front().path.empty();
  std::string s = on_unix ? "redis+sentinel+unix://" : "redis+sentinel://";
  if (!o.user.empty()) s += o.user + "@";
  for (std::size_t i = 0; i < o.sentinels.size(); ++i) {
    const auto& sn = o.sentinels[i];
    if (i) s += ",";
    if (on_unix) s += sn.path;
    else s += (sn.host.find(':') != std::string::npos ? "[" + sn.host + "]" : sn.host) + ":" + std::to_string(sn.port);
  }
  s += "/" + o.service;
  if (o.db != 0) s += "?db=" + std::to_string(o.db);
  return s;
}

inline Options parse_sentinel_url(std::string_view url, std::string_view rest, bool unix_socket) {
  Options o;
  auto q = rest.find('?');
  std::string_view query = q == std::string_view::npos ? std::string_view() : rest.substr(q + 1);
  rest = rest.substr(0, q);
  // userinfo ends at the last '@' before the addresses (a unix path starts with '/')
  auto at = unix_socket ? rest.find("@/") : rest.rfind('@');
  if (at != std::string_view::npos) {
    parse_userinfo(url, rest.substr(0, at), o);
    rest = rest.substr(at + 1);
  }
  auto slash = rest.rfind('/');
  if (slash == std::string_view::npos || slash + 1 == rest.size())
    bad_url(url, "missing service name after the sentinels (.../<service>)");
  o.service = std::string(rest.substr(slash + 1));
  for (char c : o.service)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_'))
      bad_url(url, "bad character in the service name (letters, digits, '.', '-', '_')");
  std::string_view addrs = rest.substr(0, slash);
  if (unix_socket) {
    Options u;
    parse_unix_rest(url, addrs, u);  // checks the path as unix:// does
    o.sentinels.push_back({.host = {}, .port = 0, .path = u.path});
  } else {
    if (addrs.empty()) bad_url(url, "no sentinel address");
    while (true) {
      auto comma = addrs.find(',');
      std::string_view one = addrs.substr(0, comma);
      if (one.empty()) bad_url(url, "empty sentinel address in the list");
      const auto [host, port, has_port] = parse_host_port(url, one);
      if (has_port && port.empty()) bad_url(url, "empty port after ':'");
      o.sentinels.push_back(
          {.host = std::string(host), .port = has_port ? parse_int(url, port, 1, 65535, "port") : 26379, .path = {}});
      if (comma == std::string_view::npos) break;
      addrs = addrs.substr(comma + 1);
    }
  }
  if (q != std::string_view::npos) parse_query(url, query, o, false);
  return o;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::redis::detail

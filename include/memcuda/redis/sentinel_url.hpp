// The sentinel and cluster forms of a Redis URL (options.hpp lists every form):
//
//   redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[?db=N]
//   redis+sentinel+unix://[user:pass@]/path/to/sentinel.sock/service[?db=N]
//   redis+cluster://[[user]:password@]host[:port][,host[:port]...]
//
// A cluster URL lists seeds (port 6379 by default): any node of the cluster
// answers the slot map. A cluster has only database 0, so no db.
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
#include <vector>

#include "memcuda/redis/options.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace redis::detail {

inline std::string describe_tcp(const std::vector<Options::Sentinel>& list) {
  std::string s;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const auto& n = list[i];
    s += (i ? "," : "") + (n.host.find(':') != std::string::npos ? "[" + n.host + "]" : n.host) + ":" +
         std::to_string(n.port);
  }
  return s;
}

inline std::string describe_cluster(const Options& o) {
  return "redis+cluster://" + (o.user.empty() ? std::string() : o.user + "@") + describe_tcp(o.cluster);
}

// "host[:port],host[:port]...", each port `default_port` when left out.
inline std::vector<Options::Sentinel> parse_addresses(std::string_view url, std::string_view addrs, int default_port,
                                                      std::string_view what) {
  std::vector<Options::Sentinel> out;
  if (addrs.empty()) bad_url(url, "no " + std::string(what) + " address");
  while (true) {
    auto comma = addrs.find(',');
    std::string_view one = addrs.substr(0, comma);
    if (one.empty()) bad_url(url, "empty " + std::string(what) + " address in the list");
    const auto [host, port, has_port] = parse_host_port(url, one);
    if (has_port && port.empty()) bad_url(url, "empty port after ':'");
    out.push_back({.host = std::string(host),
                   .port = has_port ? parse_int(url, port, 1, 65535, "port") : default_port,
                   .path = {}});
    if (comma == std::string_view::npos) return out;
    addrs = addrs.substr(comma + 1);
  }
}

inline Options parse_cluster_url(std::string_view url, std::string_view rest) {
  Options o;
  if (auto at = rest.rfind('@'); at != std::string_view::npos) {
    parse_userinfo(url, rest.substr(0, at), o);
    rest = rest.substr(at + 1);
  }
  if (rest.find_first_of("/?") != std::string_view::npos)
    bad_url(url, "a cluster URL has no path or query (a cluster has database 0 only)");
  o.cluster = parse_addresses(url, rest, 6379, "cluster node");
  return o;
}

inline std::string describe_sentinels(const Options& o) {
  const bool on_unix = !o.sentinels.front().path.empty();
  std::string s = on_unix ? "redis+sentinel+unix://" : "redis+sentinel://";
  if (!o.user.empty()) s += o.user + "@";
  s += on_unix ? o.sentinels.front().path : describe_tcp(o.sentinels);
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
    o.sentinels = parse_addresses(url, addrs, 26379, "sentinel");
  }
  if (q != std::string_view::npos) parse_query(url, query, o, false);
  return o;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::redis::detail

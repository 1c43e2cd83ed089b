// Test harness: a Redis Sentinel topology of private servers on loopback
// ports: a primary, two replicas and three sentinels that monitor it as
// service "memcuda" (quorum 2, down-after 500 ms, failover-timeout 2 s).
// The data nodes take DEBUG from loopback (DEBUG SLEEP: a stalled primary).
// Real servers, no mocks. The constructor returns once both replicas are in
// sync and every sentinel knows them and the two other sentinels, so a
// failover can start.
#pragma once

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/redis/connection.hpp"
#include "support/redis_server.hpp"

namespace memcuda::test {

class SentinelTopology {
 public:
  static constexpr const char* kService = "memcuda";
  static constexpr int kDownAfterMs = 500;

  SentinelTopology() {
    const std::string debug = "enable-debug-command local";
    servers_.push_back(std::make_unique<RedisServer>(RedisServerOptions{.requirepass = {}, .config_lines = {debug}}));
    const std::string of = "replicaof 127.0.0.1 " + std::to_string(servers_[0]->port());
    for (int i = 0; i < 2; ++i)
      servers_.push_back(
          std::make_unique<RedisServer>(RedisServerOptions{.requirepass = {}, .config_lines = {of, debug}}));
    const std::string svc = kService;
    for (int i = 0; i < 3; ++i)
      sentinels_.push_back(std::make_unique<RedisServer>(RedisServerOptions{.requirepass = {},
          .config_lines = {"sentinel monitor " + svc + " 127.0.0.1 " + std::to_string(servers_[0]->port()) + " 2",
                           "sentinel down-after-milliseconds " + svc + " " + std::to_string(kDownAfterMs),
                           "sentinel failover-timeout " + svc + " 2000"},
          .sentinel = true}));
    wait_until("both replicas are in sync and every sentinel knows them and 2 other sentinels",
               std::chrono::seconds(30), [&] {
      for (int i = 1; i < 3; ++i)
        if (servers_[i]->connect().command({"INFO", "replication"}).str().find("master_link_status:up") ==
            std::string_view::npos)
          return false;
      for (auto& s : sentinels_) {
        auto c = s->connect();
        if (c.command({"SENTINEL", "replicas", svc}).size() != 2) return false;
        if (c.command({"SENTINEL", "sentinels", svc}).size() != 2) return false;
      }
      return true;
    });
  }

  // "redis+sentinel://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3/memcuda".
  std::string url() const {
    std::string u = "redis+sentinel://";
    for (std::size_t i = 0; i < sentinels_.size(); ++i)
      u += (i ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(sentinels_[i]->port());
    return u + "/" + kService;
  }

  RedisServer& sentinel(std::size_t i) { return *sentinels_.at(i); }
  // The data nodes: 0 is the first primary, 1 and 2 its replicas.
  RedisServer& server(std::size_t i) { return *servers_.at(i); }

  // The port of the primary a running sentinel names now.
  int primary_port() {
    for (auto& s : sentinels_) {
      if (!s->running()) continue;
      auto r = s->connect().command({"SENTINEL", "get-master-addr-by-name", kService});
      return std::stoi(std::string(r[1].str()));
    }
    throw std::runtime_error("no sentinel is running");
  }
  // The data node the sentinels name as primary now.
  RedisServer& primary() {
    const int p = primary_port();
    for (auto& s : servers_)
      if (s->port() == p) return *s;
    throw std::runtime_error("the sentinels name an unknown primary");
  }

  // Polls `done` every 20 ms until true; throws after `limit`, naming `what`.
  template <class F>
  static void wait_until(const std::string& what, std::chrono::milliseconds limit, F done) {
    const auto until = std::chrono::steady_clock::now() + limit;
    for (;;) {
      try {
        if (done()) return;
      } catch (const std::exception&) {
      }
      if (std::chrono::steady_clock::now() > until) throw std::runtime_error("timed out waiting until " + what);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

 private:
  std::vector<std::unique_ptr<RedisServer>> servers_;
  std::vector<std::unique_ptr<RedisServer>> sentinels_;
};

}  // namespace memcuda::test

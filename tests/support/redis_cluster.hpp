// Test harness: a Redis Cluster of private servers on loopback ports: three
// primaries and a replica each (cluster-enabled, node timeout 1 s), made by
// `redis-cli --cluster create ... --cluster-replicas 1`. Real servers, no
// mocks. The constructor returns once every node says cluster_state:ok and
// every replica is in sync. No redis-cli, or a redis-server without cluster
// support, throws: the tests skip with that reason (no_cluster_support()).
#pragma once

#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "memcuda/redis/connection.hpp"
#include "support/redis_sentinel.hpp"
#include "support/redis_server.hpp"

namespace memcuda::test {

class RedisCluster {
 public:
  RedisCluster() {
    const auto cli = std::filesystem::path(find_redis_server()).parent_path() / "redis-cli";
    if (!std::filesystem::exists(cli)) throw std::runtime_error("no redis-cli beside redis-server: " + cli.string());
    std::string cmd = cli.string() + " --cluster create";
    for (int i = 0; i < 6; ++i) {
      nodes_.push_back(std::make_unique<RedisServer>(RedisServerOptions{.requirepass = {},
          .config_lines = {"cluster-enabled yes", "cluster-config-file nodes.conf", "cluster-node-timeout 1000",
                           "cluster-port " + std::to_string(free_tcp_port())}}));
      cmd += " 127.0.0.1:" + std::to_string(nodes_.back()->port());
    }
    cmd += " --cluster-replicas 1 --cluster-yes >/dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("`" + cmd + "` failed");
    SentinelTopology::wait_until("every node says cluster_state:ok and every replica is in sync and known",
                                 std::chrono::seconds(30), [&] {
      for (auto& n : nodes_) {
        auto c = n->connect();
        if (c.command({"CLUSTER", "INFO"}).str().find("cluster_state:ok") == std::string_view::npos) return false;
        const auto repl = std::string(c.command({"INFO", "replication"}).str());
        if (repl.find("role:slave") != std::string::npos && repl.find("master_link_status:up") == std::string::npos)
          return false;
        auto slots = c.command({"CLUSTER", "SLOTS"});  // each range with its replica: gossip has settled
        if (slots.size() != 3) return false;
        for (std::size_t i = 0; i < slots.size(); ++i)
          if (slots[i].size() < 4) return false;
      }
      return true;
    });
  }

  // "redis+cluster://127.0.0.1:p0,127.0.0.1:p1".
  std::string url() const {
    return "redis+cluster://127.0.0.1:" + std::to_string(nodes_[0]->port()) + ",127.0.0.1:" +
           std::to_string(nodes_[1]->port());
  }

  RedisServer& node(std::size_t i) { return *nodes_.at(i); }
  std::size_t size() const { return nodes_.size(); }

  // The node serving `slot` as primary now, as the first node that answers
  // CLUSTER SLOTS says.
  RedisServer& primary_of(int slot) { return by_port(slot_ports(slot).front()); }
  // One replica of the primary of `slot`.
  RedisServer& replica_of(int slot) {
    const auto ports = slot_ports(slot);
    if (ports.size() < 2) throw std::runtime_error("slot " + std::to_string(slot) + " has no replica");
    return by_port(ports[1]);
  }
  std::string id_of(RedisServer& n) { return std::string(n.connect().command({"CLUSTER", "MYID"}).str()); }
  // A primary that does not serve `slot`.
  RedisServer& other_primary(int slot) {
    const int from = primary_of(slot).port();
    for (auto& n : nodes_)
      if (n->port() != from && n->connect().command({"ROLE"})[0].str() == "master") return *n;
    throw std::runtime_error("no other primary");
  }

  // Moves `slot` to the primary `to` as redis-cli --cluster reshard does:
  // IMPORTING/MIGRATING, then `midway` (keys the source lacks are ASKed to
  // the target now), MIGRATE of every key, SETSLOT NODE on every primary.
  void move_slot(int slot, RedisServer& to, const std::function<void()>& midway = {}) {
    auto src = primary_of(slot).connect();
    auto dst = to.connect();
    const std::string from_id(src.command({"CLUSTER", "MYID"}).str()), to_id(dst.command({"CLUSTER", "MYID"}).str());
    dst.command({"CLUSTER", "SETSLOT", slot, "IMPORTING", from_id});
    src.command({"CLUSTER", "SETSLOT", slot, "MIGRATING", to_id});
    if (midway) midway();
    for (;;) {
      auto keys = src.command({"CLUSTER", "GETKEYSINSLOT", slot, 100});
      if (keys.size() == 0) break;
      std::vector<redis::Arg> m{"MIGRATE", "127.0.0.1", to.port(), "", 0, 5000, "KEYS"};
      for (std::size_t i = 0; i < keys.size(); ++i) m.emplace_back(std::string(keys[i].str()));
      src.command(std::span<const redis::Arg>(m));
    }
    for (auto& n : nodes_)
      if (n->running() && n->connect().command({"ROLE"})[0].str() == "master")
        n->connect().command({"CLUSTER", "SETSLOT", slot, "NODE", to_id});
  }

 private:
  std::vector<int> slot_ports(int slot) {
    for (auto& n : nodes_) {
      if (!n->running()) continue;
      auto r = n->connect().command({"CLUSTER", "SLOTS"});
      for (std::size_t i = 0; i < r.size(); ++i) {
        if (slot < r[i][0].integer() || slot > r[i][1].integer()) continue;
        std::vector<int> ports;
        for (std::size_t j = 2; j < r[i].size(); ++j) ports.push_back(static_cast<int>(r[i][j][1].integer()));
        return ports;
      }
    }
    throw std::runtime_error("no node serves slot " + std::to_string(slot));
  }
  RedisServer& by_port(int port) {
    for (auto& n : nodes_)
      if (n->port() == port) return *n;
    throw std::runtime_error("no node on port " + std::to_string(port));
  }

  std::vector<std::unique_ptr<RedisServer>> nodes_;
};

// A fresh cluster, or null with `why` when none can be made here.
inline std::unique_ptr<RedisCluster> start_cluster(std::string& why) {
  try {
    return std::make_unique<RedisCluster>();
  } catch (const std::exception& e) {
    why = std::string("cannot start a Redis Cluster: ") + e.what();
    return nullptr;
  }
}

}  // namespace memcuda::test

// A process of a fake fleet node (tests/node_worker.cpp "fleet" mode) in a
// pod of its own (pod.hpp), for the [nodes] tests.
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "support/pod.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/text.hpp"

namespace memcuda::test {

using namespace std::chrono_literals;

// A process of fleet node `id` (MEMCUDA_NODE_ID) in a pod of hostname
// `host`: pods of one id share that node's runtime directory (so they are
// one node's containers), and nothing with other nodes but Redis and TCP.
struct FleetProc {
  std::unique_ptr<Child> proc;
  bool leader = false;
  std::string ask(const std::string& line, std::chrono::seconds t = 60s) {
    proc->send(line);
    return answer(t);
  }
  std::string answer(std::chrono::seconds t = 60s) {
    auto l = proc->read_line(t);
    while (l && starts_with(*l, "[")) l = proc->read_line(t);  // UCX's own log lines
    return l.value_or("(no answer)");
  }
};

// `args`: more of the worker's options ("--backend", "cuda").
inline FleetProc fleet_proc(const std::string& host, const std::string& id, const RedisServer& srv,
                            const PodVolume& vol, std::vector<std::string> env = {},
                            const std::vector<std::string>& args = {}) {
  FleetProc f;
  env.insert(env.end(), {"MEMCUDA_FLEET=1", "MEMCUDA_NODE_ID=" + id, "MEMCUDA_RUNTIME_DIR=" + vol.dir + "/rt-" + id,
                         "UCX_TLS=tcp", "UCX_NET_DEVICES=lo"});
  std::vector<std::string> argv{sibling_program("memcuda_node_worker"), "fleet", "--url", srv.unix_url()};
  argv.insert(argv.end(), args.begin(), args.end());
  f.proc = std::make_unique<Child>(pod_argv(host, env, argv, /*share_network=*/true));
  auto line = f.proc->read_line(60s);
  while (line && starts_with(*line, "[")) line = f.proc->read_line(60s);
  REQUIRE(line);
  INFO(*line);
  REQUIRE(starts_with(*line, "ready leader="));
  f.leader = starts_with(*line, "ready leader=1");
  REQUIRE_THAT(*line, Catch::Matchers::EndsWith("node=" + id));
  return f;
}

}  // namespace memcuda::test

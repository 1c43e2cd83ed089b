// A process of a fake fleet node (tests/node_worker.cpp "fleet" mode) in a
// pod of its own (pod.hpp), for the [nodes] tests.
#pragma once

#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
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

// A Python fleet node (python/tests/fleet_node.py) over libmemcuda_c,
// which loads the UCX mover plugin: its interpreter (Debian's first, as the
// pytest suite's: a pyenv python3 on PATH may lack numpy), the C library's
// folder (src/c_api/ of the build tree, beside this binary's folder) and
// the package's root (the working directory when it is a checkout, as on
// the GPU hosts, else the tree this binary was built from).
struct PythonNode {
  std::string python, lib_dir, root;
};
inline std::optional<PythonNode> find_python_node(const std::string& modules) {
  PythonNode n;
  for (const char* p : {"/usr/bin/python3", "python3"})
    if (n.python.empty() &&
        std::system((std::string(p) + " -c 'import " + modules + "' >/dev/null 2>&1").c_str()) == 0)
      n.python = p;
  n.lib_dir = std::filesystem::path(sibling_program("memcuda_node_worker")).parent_path().string() + "/../src/c_api/";
#ifdef MEMCUDA_TEST_SOURCE_DIR
  n.root = std::string(MEMCUDA_TEST_SOURCE_DIR) + "/..";
#endif
  if (::access("python/memcuda/__init__.py", R_OK) == 0) n.root = std::filesystem::current_path().string();
  if (n.python.empty() || n.root.empty() || ::access((n.lib_dir + "libmemcuda_c.so").c_str(), R_OK) != 0 ||
      ::access((n.lib_dir + "libmemcuda_ucx.so").c_str(), R_OK) != 0)
    return std::nullopt;
  return n;
}
// Why a Python node cannot run here (python3 with `modules`, the two libraries), or nothing.
inline std::optional<std::string> python_node_unavailable(const std::string& modules) {
  if (find_python_node(modules)) return std::nullopt;
  return "needs python3 with " + modules + ", the package's tree, and libmemcuda_c.so with libmemcuda_ucx.so beside it "
         "(build targets memcuda_c and memcuda_ucx)";
}
inline FleetProc python_fleet_proc(const std::string& id, const RedisServer& srv, const PodVolume& vol,
                                   std::vector<std::string> env = {}, const std::string& modules = "numpy") {
  const auto n = find_python_node(modules);
  REQUIRE(n);
  env.insert(env.end(), {"MEMCUDA_FLEET=1", "MEMCUDA_NODE_ID=" + id, "MEMCUDA_RUNTIME_DIR=" + vol.dir + "/rt-" + id,
                         "UCX_TLS=tcp", "UCX_NET_DEVICES=lo", "MEMCUDA_LIBRARY=" + n->lib_dir + "libmemcuda_c.so",
                         "PYTHONPATH=" + n->root + "/python", "PYTHONDONTWRITEBYTECODE=1"});
  FleetProc f;
  f.proc = std::make_unique<Child>(pod_argv(id, env, {n->python, n->root + "/python/tests/fleet_node.py", srv.unix_url()},
                                            /*share_network=*/true));
  REQUIRE(f.answer() == "ready");
  f.leader = true;
  return f;
}

}  // namespace memcuda::test

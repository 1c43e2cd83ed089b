// Containers on a GPU host (support/pod.hpp): cuda_vmm_fd tensors shared
// between pods that share only a directory, and a PyTorch consumer in one
// pod reading a tensor a C++ producer made in another. Skipped, with the
// reason, without a GPU with cuMem fd support, without root, or (the
// PyTorch case, also its own CTest entry gpu_torch_tests) without python3
// and a CUDA torch.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "support/gpu.hpp"
#include "support/pod.hpp"
#include "support/redis_server.hpp"
#include "support/skip.hpp"
#include "support/text.hpp"
#include "support/worker.hpp"

#if MEMCUDA_HAS_CUDA()
#include "memcuda/detail/cuda/driver.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

const std::vector<std::string> kVmm{"MEMCUDA_CUDA_ALLOCATION=vmm"};
const std::vector<std::string> kCuda{"--backend", "cuda", "--ttl", "30000", "--session-ttl", "30000"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// The repository root: the working directory when it is one (GPU hosts run
// from there), else the source tree this binary was built from.
std::string repo_root() {
  if (::access("python/memcuda/__init__.py", R_OK) == 0) return ".";
#ifdef MEMCUDA_TEST_SOURCE_DIR
  const std::string up = std::string(MEMCUDA_TEST_SOURCE_DIR) + "/..";
  if (::access((up + "/python/memcuda/__init__.py").c_str(), R_OK) == 0) return up;
#endif
  return {};
}

}  // namespace

#define MEMCUDA_REQUIRE_VMM_PODS()                                                                \
  do {                                                                                            \
    MEMCUDA_REQUIRE_GPU();                                                                        \
    if (!::memcuda::detail::vmm_fd_supported(0))                                                  \
      MEMCUDA_SKIP("device 0 does not support cuMem allocations exported as POSIX fds");          \
    if (auto why = test::pods_unavailable()) MEMCUDA_SKIP(*why);                                  \
  } while (0)

TEST_CASE("pods: cuda_vmm_fd tensors are shared between pods both ways, and survive kill -9 of the leader's pod",
          "[gpu][pods]") {
  MEMCUDA_REQUIRE_VMM_PODS();
  test::RedisServer srv;
  test::PodVolume vol(srv);
  auto c = srv.connect();
  auto a = test::start_pod_worker("gpod-a", srv, vol, kCuda, kVmm);
  REQUIRE(test::ready(*a, 60s));
  auto b = test::start_pod_worker("gpod-b", srv, vol, kCuda, kVmm);
  REQUIRE_FALSE(test::ready(*b, 60s));
  REQUIRE(test::starts_with(a->ask("createp x 4096 2", 60s), "OK"));
  CHECK(std::string(c.command({"HGET", "memcuda:tensor:x", "alloc_kind"}).str()) == "cuda_vmm_fd");
  CHECK(test::field(b->ask("get x", 60s), "sum") == "8192");
  REQUIRE(test::starts_with(b->ask("createp y 1024 3", 60s), "OK"));
  CHECK(test::field(a->ask("get y", 60s), "sum") == "3072");
  CHECK(b->ask("fill x 5") == "OK");
  CHECK(test::field(a->ask("sum x"), "sum") == "20480");
  REQUIRE(a->ask("release x") == "OK");
  REQUIRE(a->ask("release y") == "OK");
  REQUIRE(b->ask("release x") == "OK");

  // The standby (pod b) holds every allocation's fd before the kill.
  auto synced = [&] {
    auto v = c.command({"GET", "memcuda:allocations_version"});
    auto k = c.command({"KEYS", "memcuda:standby:*"});
    for (std::size_t i = 0; i < k.size(); ++i) {
      auto m = c.command({"GET", std::string(k[i].str())});
      if (!v.is_nil() && !m.is_nil() && m.str() == v.str()) return true;
    }
    return false;
  };
  for (int i = 0; i < 500 && !synced(); ++i) std::this_thread::sleep_for(20ms);
  REQUIRE(synced());
  const auto t0 = std::chrono::steady_clock::now();
  a->kill(SIGKILL);
  a->wait();
  auto reader = test::start_pod_worker("gpod-c", srv, vol, with(kCuda, {"--no-control"}), kVmm);
  REQUIRE(reader->read_line(60s));
  std::string rx, ry;
  for (int i = 0; i < 300; ++i) {
    rx = reader->ask("get x", 60s);
    if (test::field(rx, "sum") == "20480") break;
    std::this_thread::sleep_for(20ms);
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  INFO(rx);
  CHECK(test::field(rx, "sum") == "20480");
  ry = reader->ask("get y", 60s);
  INFO(ry);
  CHECK(test::field(ry, "sum") == "3072");
  std::printf("pods (cuda_vmm_fd): readable from a third pod %.0f ms after kill -9 of the allocator of record's pod "
              "(lease and session TTL 30000 ms)\n", ms);
}

// The fds of cuMem allocations come along as memfds do (test_pods_prefetch.cpp).
TEST_CASE("pods: the first cuda_vmm_fd open from another pod brings the owner's other allocations along",
          "[gpu][pods]") {
  MEMCUDA_REQUIRE_VMM_PODS();
  test::RedisServer srv;
  test::PodVolume vol(srv);
  auto a = test::start_pod_worker("gpod-a", srv, vol, kCuda, kVmm);
  REQUIRE(test::ready(*a, 60s));
  constexpr long kFloats = 33554432;  // 128 MiB: half a cuda slab, an allocation of its own
  for (int i = 0; i < 4; ++i)
    REQUIRE(test::starts_with(a->ask("create g" + std::to_string(i) + " " + std::to_string(kFloats) + " 1", 60s),
                              "OK"));
  auto b = test::start_pod_worker("gpod-b", srv, vol, with(kCuda, {"--no-control"}),
                                  with(kVmm, {"MEMCUDA_FD_PARK_MS=60000"}));
  REQUIRE(b->read_line(60s));
  for (int i = 0; i < 4; ++i) CHECK(test::field(b->ask("get g" + std::to_string(i), 60s), "sum") == std::to_string(kFloats));
  const std::string st = b->ask("stats", 60s);
  INFO(st);
  CHECK(test::field(st, "fd_requests") == "1");
  CHECK(test::field(st, "fd_parked_hits") == "3");
  CHECK(test::field(st, "fd_parked") == "0");
}

TEST_CASE("pods: legacy CUDA IPC does not cross pid namespaces, and says so", "[gpu][pods]") {
  MEMCUDA_REQUIRE_GPU();
  if (auto why = test::pods_unavailable()) MEMCUDA_SKIP(*why);
  test::RedisServer srv;
  test::PodVolume vol(srv);
  const std::vector<std::string> ipc{"MEMCUDA_CUDA_ALLOCATION=ipc"};
  auto a = test::start_pod_worker("gpod-a", srv, vol, kCuda, ipc);
  REQUIRE(test::ready(*a, 60s));
  REQUIRE(test::starts_with(a->ask("create x 4096 2", 60s), "OK"));
  auto b = test::start_pod_worker("gpod-b", srv, vol, with(kCuda, {"--no-control"}), ipc);
  REQUIRE(b->read_line(60s));
  const std::string r = b->ask("get x", 60s);
  std::printf("pods: legacy CUDA IPC from another pod: %s\n", r.c_str());
  CHECK(test::starts_with(r, "ERR "));
  CHECK_THAT(r, Catch::Contains("pid namespace"));
  CHECK(test::field(a->ask("sum x"), "sum") == "8192");  // the owner is unharmed
}

TEST_CASE("pods: a PyTorch consumer in a pod reads a tensor a C++ producer made in another", "[gpu][pods][torch]") {
  MEMCUDA_REQUIRE_VMM_PODS();
  const int torch = std::system(
      "python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)' >/dev/null 2>&1");
  if (torch != 0) {
    if (WIFEXITED(torch) && WEXITSTATUS(torch) == 3) MEMCUDA_SKIP("torch is installed but sees no CUDA device");
    MEMCUDA_SKIP("needs python3 with torch (python3 -c 'import torch' failed)");
  }
  const std::string root = repo_root();
  if (root.empty()) MEMCUDA_SKIP("python/memcuda not found (run from the repository root)");
  test::RedisServer srv;
  test::PodVolume vol(srv);
  auto a = test::start_pod_worker("gpod-a", srv, vol, kCuda, kVmm);
  REQUIRE(test::ready(*a, 60s));
  REQUIRE(test::starts_with(a->ask("create w 4096 3", 60s), "OK"));
  test::Child py(test::pod_argv(
      "gpod-torch", {"PYTHONPATH=" + root + "/python"},
      {"python3", root + "/python/tests/pod_consumer.py", srv.unix_url(), vol.runtime_dir, "w"}));
  auto line = py.read_line(120s);
  REQUIRE(line);
  INFO(*line);
  CHECK(test::starts_with(*line, "OK "));
  CHECK(test::field(*line, "sum") == "12288");
  CHECK(test::field(*line, "device") == "cuda:0");
  CHECK(test::field(*line, "same_memory") == "True");
  CHECK(py.wait() == 0);
  // The consumer's values are the producer's memory: a write is seen.
  CHECK(test::field(a->ask("sum w"), "sum") == "12288");
}
#endif

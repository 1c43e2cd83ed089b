// A reader opens every cuda kind a record names, whatever it allocates
// with, in real separate processes: a producer forced to legacy IPC and a
// consumer on the default (cuMem), the reverse, and a consumer in new pid,
// network and mount namespaces with a private /dev/shm (the host's /proc,
// the runtime directory shared) reading a tensor of the default kind.
// Tagged [gpu]: skipped with the reason where no CUDA device (or no cuMem
// fd support, or no unshare) is usable. The host side of the same rule
// (a reader that cannot open a kind, and why) is test_read_kinds.cpp.
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "support/gpu.hpp"
#include "support/pod.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/skip.hpp"
#include "support/text.hpp"
#include "support/worker.hpp"

#if MEMCUDA_HAS_CUDA()
#include "memcuda/detail/cuda/driver.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

using test::field;
using test::hget;
using test::ready;
using test::starts_with;

// The default resolves to cuMem only where device 0 supports it.
#define MEMCUDA_REQUIRE_VMM_DEFAULT()                                                         \
  do {                                                                                        \
    MEMCUDA_REQUIRE_GPU();                                                                    \
    if (!::memcuda::detail::vmm_fd_supported(0))                                              \
      MEMCUDA_SKIP("device 0 does not support cuMem allocations exported as POSIX fds: the " \
                   "default kind is legacy IPC here, there is no mix to test");               \
  } while (0)

// memcuda_test_worker on the cuda backend with MEMCUDA_CUDA_ALLOCATION=kind
// ("": unset, the default), `prefix` (e.g. unshare) before it.
std::unique_ptr<test::Child> worker(const test::RedisServer& srv, const std::string& kind,
                                    std::vector<std::string> extra = {}, std::vector<std::string> prefix = {}) {
  std::vector<std::string> argv = std::move(prefix);
  if (kind.empty()) argv.insert(argv.end(), {"/usr/bin/env", "-u", "MEMCUDA_CUDA_ALLOCATION"});
  else argv.insert(argv.end(), {"/usr/bin/env", "MEMCUDA_CUDA_ALLOCATION=" + kind});
  argv.insert(argv.end(), {test::sibling_program("memcuda_test_worker"), "--url", srv.unix_url(), "--ttl", "2000",
                           "--backend", "cuda"});
  argv.insert(argv.end(), extra.begin(), extra.end());
  return std::make_unique<test::Child>(argv);
}

// The producer makes `w` (a distinct value per element) and the consumer
// reads it byte-identical, writes it, and the producer sees the write: one
// memory, whatever kind each allocates with.
void share_and_check(test::RedisServer& srv, const std::string& producer_kind, const std::string& consumer_kind,
                     const std::string& expect_record_kind) {
  auto c = srv.connect();
  auto a = worker(srv, producer_kind);
  REQUIRE(ready(*a, 60s));
  auto b = worker(srv, consumer_kind, {"--no-control"});
  CHECK_FALSE(ready(*b, 60s));
  REQUIRE(starts_with(a->ask("createp w 1000000 0", 60s), "OK"));
  REQUIRE(a->ask("pattern w 7") == "OK");
  const std::string digest = field(a->ask("digest w"), "fnv");
  REQUIRE_FALSE(digest.empty());
  CHECK(hget(c, "memcuda:tensor:w", "alloc_kind") == expect_record_kind);

  const std::string got = b->ask("get w", 60s);
  INFO(got);
  REQUIRE(starts_with(got, "OK"));
  CHECK(field(b->ask("digest w"), "fnv") == digest);
  REQUIRE(b->ask("fill w 2") == "OK");
  CHECK(a->ask("sum w") == "OK sum=2000000 valid=1");
  REQUIRE(b->ask("release w") == "OK");
  REQUIRE(a->ask("release w") == "OK");
  REQUIRE(a->ask("remove w") == "OK");
}

// argv prefix that runs a program as the first process of new pid,
// network and mount namespaces with a private tmpfs on /dev/shm; /proc
// stays the host's (no --mount-proc), the filesystem is shared otherwise.
// With own_proc, a /proc of the new pid namespace (--mount-proc).
std::vector<std::string> unshared(bool own_proc = false) {
  std::vector<std::string> v{"/usr/bin/unshare", "--pid", "--net", "--mount", "--fork", "--kill-child"};
  if (own_proc) v.push_back("--mount-proc");
  for (const char* a : {"--", "/bin/sh", "-c",
                        "mount -t tmpfs -o size=64m,mode=1777 private-shm /dev/shm || exit 97; exec \"$@\"", "sh"})
    v.push_back(a);
  return v;
}

// Why unshared() cannot run here, or an empty string.
std::string unshare_unavailable() {
  if (::geteuid() != 0) return "unshare into new namespaces and a tmpfs mount need root; CI runs the tests as root";
  if (::access("/usr/bin/unshare", X_OK) != 0) return "no /usr/bin/unshare (util-linux)";
  auto argv = unshared();
  for (const char* a : {"/bin/sh", "-c", "test -z \"$(ls -A /dev/shm)\" && echo unshared-ok"}) argv.push_back(a);
  test::Child probe(argv);
  auto l = probe.read_line(20s);
  const int st = probe.wait();
  if (!l || *l != "unshared-ok")
    return "unshare cannot make new pid, network and mount namespaces here (exit status " + std::to_string(st) + ")";
  return {};
}

}  // namespace

TEST_CASE("kinds: a consumer on the default (cuMem) reads and writes a tensor a producer made with "
          "MEMCUDA_CUDA_ALLOCATION=ipc",
          "[gpu][kinds]") {
  MEMCUDA_REQUIRE_VMM_DEFAULT();
  test::RedisServer srv;
  share_and_check(srv, "ipc", "", "cuda_ipc");
}

TEST_CASE("kinds: a consumer with MEMCUDA_CUDA_ALLOCATION=ipc reads and writes a tensor a producer made with the "
          "default (cuMem)",
          "[gpu][kinds]") {
  MEMCUDA_REQUIRE_VMM_DEFAULT();
  test::RedisServer srv;
  share_and_check(srv, "", "ipc", "cuda_vmm_fd");
}

TEST_CASE("kinds: a consumer in new pid, network and mount namespaces with a private /dev/shm reads a tensor of the "
          "default kind (under the host's /proc it says why it cannot)",
          "[gpu][kinds][pods]") {
  MEMCUDA_REQUIRE_VMM_DEFAULT();
  if (auto why = unshare_unavailable(); !why.empty()) MEMCUDA_SKIP(why);
  test::RedisServer srv;
  test::PodVolume vol(srv);  // the Redis socket's directory, with the runtime directory under it
  auto c = srv.connect();
  const std::vector<std::string> rt{"/usr/bin/env", "MEMCUDA_RUNTIME_DIR=" + vol.runtime_dir};
  auto a = worker(srv, "", {}, rt);
  REQUIRE(ready(*a, 60s));
  REQUIRE(starts_with(a->ask("createp x 4096 2", 60s), "OK"));
  CHECK(hget(c, "memcuda:tensor:x", "alloc_kind") == "cuda_vmm_fd");

  // The host's /proc: the CUDA driver cannot start under a /proc of another
  // pid namespace (cudaErrorOperatingSystem on the H200 hosts' driver); the
  // reader says why, naming /proc, instead of blaming the record's kind.
  auto prefix = unshared();
  prefix.insert(prefix.end(), rt.begin(), rt.end());
  auto b = worker(srv, "", {"--no-control"}, prefix);
  CHECK_FALSE(ready(*b, 60s));
  const std::string refused = b->ask("get x", 60s);
  INFO(refused);
  if (!starts_with(refused, "OK")) {
    CHECK(starts_with(refused, "ERR unavailable kind_reason=no_cuda_device"));
    CHECK(refused.find("/proc is another pid namespace's") != std::string::npos);
  }
  // A /proc of its own: it reads and writes the producer's memory.
  auto own = unshared(true);
  own.insert(own.end(), rt.begin(), rt.end());
  auto d = worker(srv, "", {"--no-control"}, own);
  CHECK_FALSE(ready(*d, 60s));
  const std::string got = d->ask("get x", 60s);
  INFO(got);
  REQUIRE(starts_with(got, "OK"));
  CHECK(field(got, "sum") == "8192");
  REQUIRE(d->ask("fill x 5") == "OK");
  CHECK(field(a->ask("sum x"), "sum") == "20480");
  CHECK(d->ask("release x") == "OK");
}

#endif  // MEMCUDA_HAS_CUDA()

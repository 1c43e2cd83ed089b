// The cuMem (VMM) cuda backend with fds: records of kind
// cuda_vmm_fd, fds handed between real processes, and standby holders that
// keep a dead allocator of record's memory alive for an adoption in place.
// Tagged [gpu]: skipped with a visible reason where no CUDA device (or no
// POSIX-fd cuMem support) is usable.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "memcuda/redis/connection.hpp"
#include "support/gpu.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/skip.hpp"
#include "support/text.hpp"
#include "support/timing.hpp"
#include "support/worker.hpp"

#if MEMCUDA_HAS_CUDA()
#include <cuda_runtime_api.h>

#include "memcuda/detail/cuda/driver.hpp"
#endif

using namespace memcuda;
using namespace std::chrono_literals;

#if MEMCUDA_HAS_CUDA()

namespace {

constexpr int kTtlMs = 400;

#define MEMCUDA_REQUIRE_VMM()                                                                     \
  do {                                                                                            \
    MEMCUDA_REQUIRE_GPU();                                                                        \
    if (!::memcuda::detail::vmm_fd_supported(0))                                                  \
      MEMCUDA_SKIP("device 0 does not support cuMem allocations exported as POSIX fds" +         \
                   (::memcuda::detail::cu_driver().ok() ? std::string()                           \
                                                         : " (driver lacks " +                    \
                                                               ::memcuda::detail::cu_driver().missing + ")")); \
  } while (0)

// A cuda worker with the given cuda allocation kind ("" = the default) and
// environment additions ("NAME=value").
std::unique_ptr<test::Child> worker(const test::RedisServer& srv, const std::string& kind,
                                    std::vector<std::string> extra = {}, std::vector<std::string> env = {}) {
  std::vector<std::string> argv{"/usr/bin/env"};
  if (!kind.empty()) argv.push_back("MEMCUDA_CUDA_ALLOCATION=" + kind);
  argv.insert(argv.end(), env.begin(), env.end());
  argv.push_back(test::sibling_program("memcuda_test_worker"));
  for (const std::string& a : std::vector<std::string>{"--url", srv.unix_url(), "--ttl", std::to_string(kTtlMs),
                                                         "--backend", "cuda"})
    argv.push_back(a);
  argv.insert(argv.end(), extra.begin(), extra.end());
  return std::make_unique<test::Child>(argv);
}

using test::contains;
using test::field;
using test::hget;
using test::ready;
using test::starts_with;

std::string get(redis::Connection& c, const std::string& key) {
  auto r = c.command({"GET", key});
  return r.is_nil() ? std::string() : std::string(r.str());
}

using test::eventually;

std::size_t free_device_memory() {
  std::size_t free = 0, total = 0;
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  REQUIRE(cudaMemGetInfo(&free, &total) == cudaSuccess);
  return free;
}

// Waits until every standby session (other than `except`) reports that it
// synced the current allocations version, i.e. holds every fd published.
bool standbys_synced(redis::Connection& c, const std::string& except_session) {
  return eventually([&] {
    const std::string v = get(c, "memcuda:allocations_version");
    if (v.empty()) return false;
    auto keys = c.command({"KEYS", "memcuda:standby:*"});
    int n = 0;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      std::string k(keys[i].str());
      if (k == "memcuda:standby:" + except_session) continue;
      ++n;
      if (get(c, k) != v) return false;
    }
    return n > 0;
  });
}

}  // namespace

TEST_CASE("vmm: a tensor created by one process reads byte-identical in another, and the record says cuda_vmm_fd",
          "[gpu][vmm]") {
  MEMCUDA_REQUIRE_VMM();
  test::RedisServer srv;
  auto c = srv.connect();
  auto a = worker(srv, "vmm");
  REQUIRE(ready(*a));
  auto b = worker(srv, "vmm", {"--no-control"});
  CHECK_FALSE(ready(*b));

  REQUIRE(starts_with(a->ask("createp w 1000000 0", 30s), "OK"));
  REQUIRE(a->ask("pattern w 7") == "OK");
  const std::string digest = field(a->ask("digest w"), "fnv");
  REQUIRE_FALSE(digest.empty());

  const std::string k = "memcuda:tensor:w";
  CHECK(hget(c, k, "alloc_kind") == "cuda_vmm_fd");
  const std::string handle = hget(c, k, "ipc_handle");
  CHECK(handle.size() == 64);
  CHECK(starts_with(handle, "vmm:"));
  CHECK(starts_with(hget(c, k, "fd_source"), "v1;"));
  // the allocation's fd source is published for standbys
  CHECK(eventually([&] { return c.command({"HLEN", "memcuda:allocations"}).integer() >= 1; }));

  auto got = b->ask("get w", 30s);
  INFO(got);
  REQUIRE(starts_with(got, "OK"));
  CHECK(field(b->ask("digest w"), "fnv") == digest);
  // written by the reader, seen by the creator: one memory
  REQUIRE(b->ask("fill w 2") == "OK");
  CHECK(a->ask("sum w") == "OK sum=2000000 valid=1");

  REQUIRE(b->ask("release w") == "OK");
  REQUIRE(a->ask("release w") == "OK");
  REQUIRE(a->ask("remove w") == "OK");
  CHECK(eventually([&] { return c.command({"EXISTS", k}).integer() == 0; }));
}

TEST_CASE("vmm: in one process, create and get resolve to the exporter's own pointer", "[gpu][vmm]") {
  MEMCUDA_REQUIRE_VMM();
  test::RedisServer srv;
  RegistryOptions o;
  o.redis = srv.options();
  o.lease_ttl = 400ms;
  o.default_backend = BackendKind::cuda;
  o.cuda_allocation = CudaAllocation::vmm;
  TensorRegistry reg(o);
  auto t = reg.create<float>("x", {1024});
  std::vector<float> host(1024, 3.f), back(1024, 0.f);
  t.copy_from_host(host);
  auto g = reg.get<float>("x");
  CHECK(g.data() == t.data());
  g.copy_to_host(back);
  CHECK(back == host);
  CHECK(reg.info("x").alloc_kind == "cuda_vmm_fd");
}

// Standby holding. The allocator of record `a` creates persistent tensors (two
// in one slab, one in a dedicated allocation), writes a distinct pattern
// into each and drops its own references: only their names hold them, and
// no other process maps them. A standby `s` is alive and has fetched (not
// imported) the fd of every allocation. `a` is killed with SIGKILL. `s`
// takes the lease and adopts every allocation in place from the fds it
// holds: every record names it (new generation, same ipc_handle and offset).
// A process started after the kill reads every tensor byte-identical, and
// the leader's pool statistics show every byte adopted, none copied. When
// everything is removed, the device's free memory comes back by the
// tensors' allocations (alloc_bytes of each, once): each freed after its
// last fd and mapping went.
void kill_with_standby(bool holder) {
  test::RedisServer srv;
  auto c = srv.connect();
  auto a = worker(srv, "vmm");
  REQUIRE(ready(*a));
  auto s = worker(srv, "vmm");
  CHECK_FALSE(ready(*s));
  // every process that stays has its CUDA context before the baseline
  REQUIRE(starts_with(a->ask("meminfo"), "OK"));
  REQUIRE(starts_with(s->ask("meminfo"), "OK"));
  const std::size_t baseline = free_device_memory();

  struct T {
    std::string name, dims;
    std::uint64_t bytes;
    std::string digest, handle, offset, gen;
  };
  std::vector<T> ts{{"v_small", "1000", 4000, {}, {}, {}, {}},
                    {"v_mid", "300000", 1200000, {}, {}, {}, {}},
                    {"v_big", "50000000", 200000000, {}, {}, {}, {}}};  // over half a 256 MiB slab: dedicated
  std::uint64_t total = 0;
  std::uint64_t seed = 3;
  for (auto& t : ts) {
    INFO(t.name);
    REQUIRE(starts_with(a->ask("createp " + t.name + " " + t.dims + " 0", 30s), "OK"));
    REQUIRE(a->ask("pattern " + t.name + " " + std::to_string(seed++), 30s) == "OK");
    t.digest = field(a->ask("digest " + t.name, 30s), "fnv");
    REQUIRE(a->ask("release " + t.name) == "OK");
    const std::string k = "memcuda:tensor:" + t.name;
    t.handle = hget(c, k, "ipc_handle");
    t.offset = hget(c, k, "offset");
    t.gen = hget(c, k, "generation");
    CHECK(hget(c, k, "alloc_kind") == "cuda_vmm_fd");
    CHECK(hget(c, k, "refcount") == "1");
    total += t.bytes;
  }
  // what the device gets back at the end: each allocation once
  std::map<std::string, std::uint64_t> allocations;
  for (const auto& t : ts)
    allocations[t.handle] = std::stoull(hget(c, "memcuda:tensor:" + t.name, "alloc_bytes"));
  std::uint64_t allocated = 0;
  for (const auto& [h, n] : allocations) allocated += n;
  CHECK(ts[0].handle == ts[1].handle);  // one slab
  CHECK(ts[0].handle != ts[2].handle);
  const std::string a_session = hget(c, "memcuda:tensor:v_small", "owner");
  REQUIRE(standbys_synced(c, a_session));
  // With `holder`, a process maps every tensor before the kill and reads
  // them through the same pointers, intact, after the takeover.
  std::unique_ptr<test::Child> h;
  std::map<std::string, std::string> ptr;
  if (holder) {
    h = worker(srv, "vmm", {"--no-control"});
    CHECK_FALSE(ready(*h));
    for (const auto& t : ts) {
      INFO(t.name);
      REQUIRE(starts_with(h->ask("get " + t.name, 30s), "OK"));
      auto hd = h->ask("digest " + t.name, 30s);
      CHECK(field(hd, "fnv") == t.digest);
      ptr[t.name] = field(hd, "ptr");
    }
  }

  const std::string s_pid = std::to_string(s->pid());
  a->kill(SIGKILL);
  a->wait();
  REQUIRE(eventually([&] { return s->ask("leader") == "OK leader=1"; }));
  REQUIRE(eventually([&] {
    for (const auto& t : ts)
      if (hget(c, "memcuda:tensor:" + t.name, "owner_pid") != s_pid) return false;
    return true;
  }));
  for (auto& t : ts) {
    INFO(t.name);
    const std::string k = "memcuda:tensor:" + t.name;
    CHECK(hget(c, k, "ipc_handle") == t.handle);  // the same memory: adopted
    CHECK(hget(c, k, "offset") == t.offset);
    CHECK(hget(c, k, "generation") != t.gen);
    CHECK(hget(c, k, "alloc_kind") == "cuda_vmm_fd");
    CHECK(contains(hget(c, k, "fd_source"), ";" + s_pid + ";"));
    CHECK(c.command({"EXISTS", "memcuda:lost:" + t.name}).integer() == 0);
  }

  if (h) {
    for (const auto& t : ts) {
      INFO(t.name);
      auto hd = h->ask("digest " + t.name, 30s);
      CHECK(field(hd, "fnv") == t.digest);
      CHECK(field(hd, "ptr") == ptr[t.name]);  // the same mapping throughout
    }
  }
  {
    auto d = worker(srv, "vmm", {"--no-control"});  // started after the kill
    CHECK_FALSE(ready(*d));
    for (const auto& t : ts) {
      INFO(t.name);
      auto r = d->ask("get " + t.name, 30s);
      INFO(r);
      REQUIRE(starts_with(r, "OK"));
      CHECK(field(d->ask("digest " + t.name, 30s), "fnv") == t.digest);
    }
    std::string st;
    eventually([&] {
      st = d->ask("stats");
      return field(st, "adopted_bytes") == std::to_string(total);
    });
    INFO(st);
    CHECK(field(st, "adopted_bytes") == std::to_string(total));
    CHECK(field(st, "copied_bytes") == "0");
    if (h) {
      // what the holder writes through its old pointer, the new reader sees
      REQUIRE(h->ask("fill v_small 9") == "OK");
      CHECK(d->ask("sum v_small") == "OK sum=9000 valid=1");
    }
    for (const auto& t : ts) REQUIRE(d->ask("release " + t.name) == "OK");
  }  // d exits: its mappings go
  if (h) {
    for (const auto& t : ts) REQUIRE(h->ask("release " + t.name) == "OK");
    h.reset();  // exits: its mappings go
  }

  // Everything removed: the device gets the tensors' memory back. The
  // reference point is taken with the tensors alive and only s and this
  // process holding CUDA contexts, so what comes back is the tensors' alone.
  std::this_thread::sleep_for(500ms);
  const std::size_t with_tensors = free_device_memory();
  for (const auto& t : ts) REQUIRE(s->ask("remove " + t.name) == "OK");
  for (const auto& t : ts)
    CHECK(eventually([&] { return c.command({"EXISTS", "memcuda:tensor:" + t.name}).integer() == 0; }));
  REQUIRE(starts_with(s->ask("trim"), "OK"));
  const std::uint64_t slack = 64ull << 20;
  std::size_t now = 0;
  const bool back = eventually([&] {
    now = free_device_memory();
    return now + slack >= with_tensors + allocated;
  });
  INFO("free with tensors " << with_tensors << ", now " << now << ", allocations " << allocated << ", baseline "
                            << baseline);
  CHECK(back);
  CHECK(now + slack >= baseline);  // and the dead allocator's context is gone too
  CHECK(eventually([&] { return c.command({"HLEN", "memcuda:allocations"}).integer() == 0; }));
}

TEST_CASE("vmm: kill -9 of the allocator of record loses nothing: a standby held the fds, adopts, copies 0 bytes",
          "[gpu][vmm]") {
  MEMCUDA_REQUIRE_VMM();
  kill_with_standby(false);
}

TEST_CASE("vmm: kill -9 with a holder mapping the tensors: its pointers stay valid and shared throughout",
          "[gpu][vmm]") {
  MEMCUDA_REQUIRE_VMM();
  kill_with_standby(true);
}

// The allocator of record `a` makes a replica on GPU 1 and is killed with
// SIGKILL: a reader on GPU 1 keeps reading the copy it holds (adopted by
// the standby like every allocation of `a`), and the standby, now the
// allocator of record, makes the replica of the adopted source again.
TEST_CASE("vmm: kill -9 of the allocator of record that made a replica: its reader reads on, the standby remakes it",
          "[gpu][multi-gpu][replica][vmm]") {
  MEMCUDA_REQUIRE_VMM();
  MEMCUDA_REQUIRE_GPUS(2);
  test::RedisServer srv;
  auto c = srv.connect();
  auto a = worker(srv, "vmm");
  REQUIRE(ready(*a));
  auto s = worker(srv, "vmm");
  CHECK_FALSE(ready(*s));
  REQUIRE(starts_with(a->ask("createp m/w 1000000 2", 30s), "OK"));
  REQUIRE(a->ask("replicate m/w 1", 60s) == "OK n=1");
  const std::string rep = ".memcuda-rep/" + memcuda::detail::device_uuid(1) + "/m/w";
  auto r = worker(srv, "vmm", {"--no-control"}, {"CUDA_VISIBLE_DEVICES=1"});  // its device 0 is GPU 1
  CHECK_FALSE(ready(*r));  // its READY line first: else each answer below is the one before
  auto got = r->ask("getlocal m/w", 30s);
  INFO(got);
  CHECK(field(got, "name") == rep);
  CHECK(field(got, "sum") == "2000000");
  const std::string first = field(got, "gen");
  REQUIRE(standbys_synced(c, hget(c, "memcuda:tensor:m/w", "owner")));

  const std::string src_gen = hget(c, "memcuda:tensor:m/w", "generation");
  a->kill(SIGKILL);
  a->wait();
  REQUIRE(eventually([&] { return s->ask("leader") == "OK leader=1"; }));
  // adopted (a new generation) before the replicate: else it finds the
  // replica of the generation it is about to leave current
  REQUIRE(eventually([&] { return hget(c, "memcuda:tensor:m/w", "generation") != src_gen; }, 30s));
  CHECK(r->ask("sum m/w", 30s) == "OK sum=2000000 valid=1");
  REQUIRE(s->ask("replicate m/w 1", 60s) == "OK n=1");
  auto r2 = worker(srv, "vmm", {"--no-control"}, {"CUDA_VISIBLE_DEVICES=1"});
  CHECK_FALSE(ready(*r2));
  got = r2->ask("getlocal m/w", 30s);
  INFO(got);
  CHECK(field(got, "name") == rep);
  CHECK(field(got, "gen") == hget(c, "memcuda:tensor:" + rep, "generation"));
  CHECK(field(got, "gen") != first);  // made again: the adopted source has a new generation
  CHECK(field(got, "sum") == "2000000");
}

// A tensor created on GPU 1 (the creator sees only GPU 1) is imported by a
// process whose current device is GPU 0: the mapping grants GPU 0 peer
// access, and a kernel on GPU 0 reads it.
TEST_CASE("vmm: a tensor on GPU 1 is imported and read by a kernel of a process on GPU 0", "[gpu][multi-gpu][vmm]") {
  MEMCUDA_REQUIRE_GPUS(2);
  MEMCUDA_REQUIRE_VMM();
  int can = 0;
  REQUIRE(cudaDeviceCanAccessPeer(&can, 0, 1) == cudaSuccess);
  if (!can) MEMCUDA_SKIP("GPU 0 cannot access GPU 1 as a peer");
  test::RedisServer srv;
  auto c = srv.connect();
  auto a = worker(srv, "vmm", {}, {"CUDA_VISIBLE_DEVICES=1"});
  REQUIRE(ready(*a));
  REQUIRE(starts_with(a->ask("createp g1 1000000 3", 30s), "OK"));
  CHECK(hget(c, "memcuda:tensor:g1", "alloc_kind") == "cuda_vmm_fd");
  auto b = worker(srv, "vmm", {"--no-control"}, {"CUDA_VISIBLE_DEVICES=0,1"});
  CHECK_FALSE(ready(*b));
  auto r = b->ask("getsum g1", 30s);
  INFO(r);
  CHECK(r == "OK sum=3000000");
  REQUIRE(a->ask("release g1") == "OK");
  REQUIRE(a->ask("remove g1") == "OK");
}

// A mapping grants its own device and the one current when it is made;
// another peer gets access when it asks (check_device): granting a peer
// costs milliseconds for a large mapping, so no open pays for peers that
// never read.
TEST_CASE("vmm: a mapping grants its device and the current one, check_device grants another peer",
          "[gpu][multi-gpu][vmm]") {
  MEMCUDA_REQUIRE_GPUS(2);
  MEMCUDA_REQUIRE_VMM();
  int can = 0;
  REQUIRE(cudaDeviceCanAccessPeer(&can, 1, 0) == cudaSuccess);
  if (!can) MEMCUDA_SKIP("GPU 1 cannot access GPU 0 as a peer");
  test::RedisServer srv;
  RegistryOptions o;
  o.redis = srv.options();
  o.default_backend = BackendKind::cuda;
  o.cuda_allocation = CudaAllocation::vmm;
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  TensorRegistry reg(o);
  auto t = reg.create<float>("grant/t", {1 << 20});
  REQUIRE(t.device() == 0);
  const auto access = [&](int dev) {
    CUmemLocation loc{};
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = dev;
    unsigned long long flags = 0;
    REQUIRE(detail::cu_driver().MemGetAccess(&flags, &loc, reinterpret_cast<CUdeviceptr>(t.data())) ==
            CUDA_SUCCESS);
    return flags;
  };
  CHECK(access(0) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  CHECK(access(1) == CU_MEM_ACCESS_FLAGS_PROT_NONE);
  t.check_device(1);
  CHECK(access(1) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  CHECK_NOTHROW(t.check_device(1));  // again: idempotent
}

// A graceful stop (the registry destroyed, as at SIGTERM of `memcuda serve`)
// of the allocator of record with a standby: the standby already holds every
// fd (the stop waits for it), adopts every allocation in place once the
// stopped session is gone, and a reader sees every byte; nothing is copied.
TEST_CASE("vmm: a graceful stop of the allocator of record with a standby hands over: nothing lost, nothing copied",
          "[gpu][vmm]") {
  MEMCUDA_REQUIRE_VMM();
  test::RedisServer srv;
  auto c = srv.connect();
  auto a = worker(srv, "vmm");
  REQUIRE(ready(*a));
  auto s = worker(srv, "vmm");
  CHECK_FALSE(ready(*s));
  std::map<std::string, std::string> digest;
  std::uint64_t seed = 11;
  for (const std::string spec : {"g_small 1000", "g_big 50000000"}) {
    const std::string name = spec.substr(0, spec.find(' '));
    REQUIRE(starts_with(a->ask("createp " + spec + " 0", 30s), "OK"));
    REQUIRE(a->ask("pattern " + name + " " + std::to_string(seed++), 30s) == "OK");
    digest[name] = field(a->ask("digest " + name, 30s), "fnv");
    REQUIRE(a->ask("release " + name) == "OK");
  }
  REQUIRE(a->ask("exit", 30s) == "OK");
  CHECK(a->wait() == 0);
  const std::string s_pid = std::to_string(s->pid());
  REQUIRE(eventually([&] { return s->ask("leader") == "OK leader=1"; }));
  REQUIRE(eventually([&] {
    for (const auto& [n, d] : digest)
      if (hget(c, "memcuda:tensor:" + n, "owner_pid") != s_pid) return false;
    return true;
  }));
  auto d = worker(srv, "vmm", {"--no-control"});
  CHECK_FALSE(ready(*d));
  for (const auto& [n, dg] : digest) {
    INFO(n);
    CHECK(c.command({"EXISTS", "memcuda:lost:" + n}).integer() == 0);
    REQUIRE(starts_with(d->ask("get " + n, 30s), "OK"));
    CHECK(field(d->ask("digest " + n, 30s), "fnv") == dg);
    REQUIRE(d->ask("release " + n) == "OK");
  }
  CHECK(field(s->ask("stats"), "copied_bytes") == "0");
}

#else

TEST_CASE("vmm: cuMem backend", "[gpu][vmm]") {
  MEMCUDA_SKIP("built without the CUDA toolkit (MEMCUDA_CUDA=OFF or not found)");
}

#endif

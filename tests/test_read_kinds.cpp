// A reader opens every allocation kind a record names, whatever it
// allocates with; one that cannot open a kind says why, typed
// (KindUnavailable and its reason), never that its allocator of record
// "runs another build". Host side, against a real redis-server and real
// processes: a record of a real host tensor is pointed at cuda memory by
// hand (as anyone who can write Redis could), and a reader that sees no
// CUDA device (CUDA_VISIBLE_DEVICES="", or a build without CUDA) is asked
// for it. The cuda mixes themselves run on a GPU host (test_gpu_kinds.cpp).
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "memcuda/detail/backend/process_cache.hpp"
#include "memcuda/memcuda.hpp"
#include "support/gpu.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/text.hpp"
#include "support/worker.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

using test::contains;
using test::hget;
using test::starts_with;

const std::string kUuid = "GPU-00000000-0000-0000-0000-0000000000aa";

// Points the record of `name` at cuda memory of `kind`, as its allocator of
// record would write it, under a fresh alloc_id (no mapping of any process
// is found for it: a reader opens what the record names).
void point_at_cuda(redis::Connection& c, const std::string& name, const std::string& kind) {
  const std::string key = "memcuda:tensor:" + name;
  std::string handle = kind == "cuda_ipc" ? std::string(64, '\x11') : "vmm:" + hget(c, key, "owner") + ":9001";
  handle.resize(64, '\0');
  c.command({"HSET", key, "backend", "cuda", "alloc_kind", kind, "ipc_handle", handle, "device", "0", "device_uuid",
             kUuid, "alloc_id", "9001"});
  if (kind == "cuda_ipc") c.command({"HDEL", key, "fd_source"});
}

// A reader process that sees no CUDA device (and allocates host memory).
std::unique_ptr<test::Child> blind_reader(const test::RedisServer& srv) {
  return std::make_unique<test::Child>(std::vector<std::string>{
      "/usr/bin/env", "CUDA_VISIBLE_DEVICES=", test::sibling_program("memcuda_test_worker"), "--url", srv.unix_url(),
      "--backend", "host", "--no-control"});
}

}  // namespace

TEST_CASE("kinds: a reader that sees no CUDA device gets KindUnavailable saying so, for either cuda kind",
          "[kinds][redis]") {
  test::RedisServer srv;
  auto c = srv.connect();
  TensorRegistry owner(test::host_options(srv));
  auto t = owner.create<float>("t", {4});
  const std::string kind = GENERATE(std::string("cuda_ipc"), std::string("cuda_vmm_fd"));
  INFO(kind);
  point_at_cuda(c, "t", kind);
  const std::string refcount = hget(c, "memcuda:tensor:t", "refcount");

  auto r = blind_reader(srv);
  CHECK_FALSE(test::ready(*r));
  const std::string err = r->ask("get t", 30s);
  INFO(err);
  REQUIRE(starts_with(err, "ERR unavailable kind_reason="));
  const std::string reason = test::field(err, "kind_reason");
#if MEMCUDA_HAS_CUDA()
  if (test::gpu_available()) CHECK(reason == "no_cuda_device");  // a driver is here: only the variable hid the GPUs
  else CHECK((reason == "no_cuda_device" || reason == "no_cuda_driver"));
#else
  CHECK(reason == "built_without_cuda");
#endif
  CHECK(contains(err, "tensor 't' is a " + kind + " allocation"));
  CHECK_FALSE(contains(err, "another"));  // not blamed on the allocator of record's build or configuration
  CHECK(hget(c, "memcuda:tensor:t", "refcount") == refcount);  // a refused get keeps no reference
  CHECK(r->ask("exit") == "OK");
}

TEST_CASE("kinds: a kind this version does not know is KindUnavailable(unknown_kind), a kind its backend "
          "contradicts a bad record",
          "[kinds][redis]") {
  test::RedisServer srv;
  auto c = srv.connect();
  TensorRegistry owner(test::host_options(srv));
  TensorRegistry reader(test::host_options(srv, false));
  auto t = owner.create<float>("t", {4});
  const std::string key = "memcuda:tensor:t";
  const std::string refcount = hget(c, key, "refcount");

  // fresh alloc_ids: the reader finds no mapping and opens what the record names
  c.command({"HSET", key, "alloc_kind", "host_future_fd", "alloc_id", "9001"});
  try {
    (void)reader.get<float>("t");
    FAIL("opened a kind this version does not know");
  } catch (const KindUnavailable& e) {
    CHECK(e.reason() == KindErrc::unknown_kind);
    CHECK(e.kind() == "host_future_fd");
    CHECK(contains(e.what(), "newer version"));
  }

  c.command({"HSET", key, "alloc_kind", "cuda_vmm_fd", "alloc_id", "9002"});  // backend still "host"
  try {
    (void)reader.get<float>("t");
    FAIL("opened a host record of a cuda kind");
  } catch (const ProtocolError& e) {
    CHECK(e.errc() == ProtocolErrc::bad_record);
    CHECK(contains(e.what(), "backend host but allocation kind cuda_vmm_fd"));
  }
  reader.flush();
  CHECK(hget(c, key, "refcount") == refcount);
}

TEST_CASE("kinds: import_cache, from the options (MEMCUDA_IMPORT_CACHE), is how many idle mappings a process keeps",
          "[kinds][redis][options]") {
  {
    ::setenv("MEMCUDA_IMPORT_CACHE", "3", 1);
    CHECK(RegistryOptions::from_env().import_cache == 3);
    ::setenv("MEMCUDA_IMPORT_CACHE", "many", 1);
    CHECK_THROWS_WITH(RegistryOptions::from_env(), Catch::Contains("MEMCUDA_IMPORT_CACHE is 'many'"));
    ::unsetenv("MEMCUDA_IMPORT_CACHE");
    CHECK(RegistryOptions::from_env().import_cache == 16);
    CHECK(RegistryOptions{}.import_cache == 16);
  }
  test::RedisServer srv;
  auto w = test::start_worker(srv.unix_url(), {"--backend", "host"});  // the owner: this process imports
  REQUIRE(test::ready(*w));
  // 16 MiB each, half a host slab: an allocation of its own, one mapping each
  REQUIRE(starts_with(w->ask("createp a 4194304 1", 30s), "OK"));
  REQUIRE(starts_with(w->ask("createp b 4194304 2", 30s), "OK"));
  auto& pc = detail::Process::get().cache();
  pc.drop_idle();

  auto o = test::host_options(srv, false);
  o.import_cache = 0;
  {
    TensorRegistry reader(o);
    CHECK(reader.get<float>("a").size() == 4194304);  // got and dropped: its mapping is idle at once
    reader.flush();
    CHECK(pc.idle_imports() == 0);
  }
  o.import_cache = 2;
  TensorRegistry reader(o);
  (void)reader.get<float>("a");
  (void)reader.get<float>("b");
  reader.flush();
  CHECK(pc.idle_imports() == 2);
  o.import_cache = 1;
  TensorRegistry lower(o);  // the last registry made sets it: the older idle one closes
  CHECK(pc.idle_imports() == 1);
  CHECK(w->ask("exit") == "OK");
}

// Every tensor the registry creates reads as zeros when it is handed out,
// though the pool reuses the blocks of freed tensors: create and
// create_many, host backend here (real redis-server), cuda backends in the
// [gpu] cases. Each case checks that a freed block was in fact reused (the
// same allocation and offset), so a pass is not a fresh slab's luck.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "support/gpu.hpp"
#include "support/redis_server.hpp"
#include "support/skip.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

RegistryOptions zero_opts(const test::RedisServer& srv, BackendKind backend) {
  RegistryOptions o;
  o.redis = srv.options();
  o.lease_ttl = 400ms;
  o.default_backend = backend;
  o.pool.host_slab_bytes = 1 << 20;
  o.pool.pack_batches_min_bytes = 0;  // batches placed block by block, in the slabs creates use too
  return o;
}

using Place = std::pair<std::uint64_t, std::uint64_t>;  // alloc_id, offset

Place place_of(TensorRegistry& reg, const std::string& name) {
  auto i = reg.info(name);
  return {i.alloc_id, i.offset};
}

bool all_zero(const std::vector<std::uint8_t>& v) {
  return std::all_of(v.begin(), v.end(), [](std::uint8_t b) { return b == 0; });
}

// Creates `rounds` times a tensor of `n` bytes, checks it reads as zeros,
// writes non-zero bytes into it and frees it; true when some round got the
// memory of an earlier one.
bool create_write_free(TensorRegistry& reg, std::size_t n, int rounds) {
  std::set<Place> seen;
  bool reused = false;
  for (int i = 0; i < rounds; ++i) {
    INFO("round " << i);
    auto t = reg.create<std::uint8_t>("z", {static_cast<std::int64_t>(n)});
    reused |= !seen.insert(place_of(reg, "z")).second;
    std::vector<std::uint8_t> v(n, 0x11);
    t.copy_to_host(v);
    CHECK(all_zero(v));
    std::fill(v.begin(), v.end(), 0xAB);
    t.copy_from_host(v);
    reg.remove("z");
    t.release();
    reg.flush();  // the release is sent (and the block freed) in the background
  }
  return reused;
}

// The same with create_many of three tensors.
bool create_many_write_free(TensorRegistry& reg, int rounds) {
  const std::vector<std::pair<std::string, std::int64_t>> sizes{{"b0", 1000}, {"b1", 3000}, {"b2", 256}};
  std::set<Place> seen;
  bool reused = false;
  for (int i = 0; i < rounds; ++i) {
    INFO("round " << i);
    std::vector<TensorSpec> specs;
    for (const auto& [name, n] : sizes) specs.push_back({name, DType::u8, {n}, {}});
    auto made = reg.create_many(specs);
    std::vector<std::string> names;
    for (const auto& [name, n] : sizes) {
      INFO(name);
      names.push_back(name);
      reused |= !seen.insert(place_of(reg, name)).second;
      SharedTensor<std::uint8_t> t(made.at(name).handle());
      std::vector<std::uint8_t> v(static_cast<std::size_t>(n), 0x11);
      t.copy_to_host(v);
      CHECK(all_zero(v));
      std::fill(v.begin(), v.end(), 0xCD);
      t.copy_from_host(v);
    }
    REQUIRE(reg.remove_many(names).ok());
    made.clear();
    reg.flush();
  }
  return reused;
}

}  // namespace

TEST_CASE("a new host tensor reads as zeros where a freed tensor's bytes were", "[redis][pool]") {
  test::RedisServer srv;
  TensorRegistry reg(zero_opts(srv, BackendKind::host));
  CHECK(create_write_free(reg, 1000, 8));
  CHECK(create_write_free(reg, 200 << 10, 4));  // several blocks of a slab
}

TEST_CASE("create_many hands out host tensors that read as zeros on reused blocks", "[redis][pool][batch]") {
  test::RedisServer srv;
  TensorRegistry reg(zero_opts(srv, BackendKind::host));
  CHECK(create_many_write_free(reg, 6));
}

#if MEMCUDA_HAS_CUDA()

TEST_CASE("cuda: a new tensor reads as zeros where a freed tensor's bytes were", "[gpu]") {
  MEMCUDA_REQUIRE_GPU();
  for (auto kind : {CudaAllocation::ipc, CudaAllocation::automatic}) {
    INFO("cuda_allocation " << to_string(kind));
    test::RedisServer srv;
    auto o = zero_opts(srv, BackendKind::cuda);
    o.cuda_allocation = kind;
    TensorRegistry reg(o);
    CHECK(create_write_free(reg, 1000, 8));
    CHECK(create_write_free(reg, 4 << 20, 4));
    CHECK(create_many_write_free(reg, 6));
  }
}

#endif  // MEMCUDA_HAS_CUDA()

// create_many's BeforePublish hook, where a replicate enqueues its copies
// (detail/registry/create/batch_allocator.hpp): it sees each entry's
// memory after the blocks are zeroed and before the script publishes them,
// what it writes is what a reader of the new tensor reads, and a refused
// batch calls settle() before any block goes back to its pool. Host
// backend against a real redis-server.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "memcuda/detail/registry/core.hpp"
#include "memcuda/memcuda.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/timing.hpp"

using namespace memcuda;

namespace {

constexpr std::int64_t kBytes = 4096;

protocol::Command batch(const std::string& holder, const std::vector<std::string>& names) {
  protocol::Command many;
  many.op = protocol::Op::create_many;
  many.holder = holder;
  for (const auto& n : names) {
    protocol::CreateEntry e;
    e.name = n;
    e.dtype = DType::u8;
    e.shape = Shape{kBytes};
    e.backend = BackendKind::host;
    e.persistent = true;
    many.tensors.push_back(std::move(e));
  }
  return many;
}

}  // namespace

TEST_CASE("create many's before-publish hook writes what readers read, and a refused batch settles it first",
          "[batch]") {
  test::RedisServer srv;
  redis::Connection raw{srv.options()};
  TensorRegistry reg(test::host_options(srv, true));
  auto& core = detail::RegistryAccess::core(reg);
  const std::vector<std::string> names{"hook/a", "hook/b", "hook/c"};
  int runs = 0, settles = 0;
  std::size_t unpublished = 0;  // records the hook found already there: must stay 0
  detail::BatchAllocator::BeforePublish hook{
      [&](const std::vector<void*>& dst) {
        ++runs;
        REQUIRE(dst.size() == names.size());
        for (std::size_t i = 0; i < dst.size(); ++i) {
          const auto* p = static_cast<const unsigned char*>(dst[i]);
          CHECK(std::count(p, p + kBytes, static_cast<unsigned char>(0)) == kBytes);  // zeroed before the hook
          std::memset(dst[i], 0x40 + static_cast<int>(i), kBytes);
          unpublished += raw.command({"EXISTS", core.ctx.keys.tensor(names[i])}).integer() != 0;
        }
      },
      [&] { ++settles; }};
  auto conn = core.ctx.pool.acquire();
  auto made = detail::BatchAllocator::create_many(core.alloc, *conn, batch(core.ctx.session, names), &hook);
  REQUIRE(made.size() == names.size());
  CHECK(runs == 1);
  CHECK(settles == 0);  // every block published: none goes back
  CHECK(unpublished == 0);
  for (std::size_t i = 0; i < names.size(); ++i) {
    auto t = reg.get<std::uint8_t>(names[i]);
    std::vector<std::uint8_t> got(kBytes);
    t.copy_to_host(got);
    CHECK(std::count(got.begin(), got.end(), static_cast<std::uint8_t>(0x40 + i)) == kBytes);
  }

  // One name taken: nothing is published, and settle() runs before the
  // blocks the hook wrote go back to the pool.
  CHECK_THROWS_AS(detail::BatchAllocator::create_many(core.alloc, *conn,
                                                      batch(core.ctx.session, {"hook/d", "hook/b", "hook/e"}), &hook),
                  AlreadyExists);
  CHECK(runs == 2);
  CHECK(settles == 1);
  CHECK(raw.command({"EXISTS", core.ctx.keys.tensor("hook/d")}).integer() == 0);

  // Without a hook: as before, zeros.
  auto plain = detail::BatchAllocator::create_many(core.alloc, *conn, batch(core.ctx.session, {"hook/f"}));
  REQUIRE(plain.size() == 1);
  CHECK(runs == 2);
  auto f = reg.get<std::uint8_t>("hook/f");
  std::vector<std::uint8_t> zeros(kBytes, 1);
  f.copy_to_host(zeros);
  CHECK(std::count(zeros.begin(), zeros.end(), std::uint8_t{0}) == kBytes);
  // The batch's own references (holder: this session) go with the registry.
}

// A replicate copies from and into blocks of its own without references
// (replicator.hpp): while an InUse names a block, a free of it keeps it out
// of its pool, and the end of the last InUse naming it lets it go; a block
// no InUse names is freed as ever.
TEST_CASE("a block freed while a replicate uses it stays out of its pool until the last use ends", "[batch]") {
  test::RedisServer srv;
  TensorRegistry reg(test::host_options(srv, true));
  auto& core = detail::RegistryAccess::core(reg);
  auto freed_while = [&](std::optional<SharedTensor<std::uint8_t>>& t) {
    const auto gen = t->generation();
    t.reset();
    reg.flush();
    REQUIRE(test::eventually([&] { return !core.alloc.owns(gen); }, std::chrono::seconds(10)));
  };
  std::optional<SharedTensor<std::uint8_t>> a = reg.create<std::uint8_t>("use/a", {kBytes});
  const void* block = a->data();
  std::optional<detail::Allocator::InUse> outer(std::in_place, core.alloc);
  std::optional<detail::Allocator::InUse> inner(std::in_place, core.alloc);
  REQUIRE(outer->own(a->generation()));
  REQUIRE(inner->own(a->generation()));
  CHECK_FALSE(inner->own(a->generation() + 1000));  // not a generation this process owns
  freed_while(a);
  auto b = reg.create<std::uint8_t>("use/b", {kBytes});
  CHECK(b.data() != block);
  inner.reset();
  auto c = reg.create<std::uint8_t>("use/c", {kBytes});
  CHECK(c.data() != block);
  outer.reset();  // back to its pool: the next block of its size is it
  auto d = reg.create<std::uint8_t>("use/d", {kBytes});
  CHECK(d.data() == block);
  // a block nobody marked goes back at once, while another is in use
  std::optional<detail::Allocator::InUse> other(std::in_place, core.alloc);
  REQUIRE(other->own(b.generation()));
  std::optional<SharedTensor<std::uint8_t>> e = reg.create<std::uint8_t>("use/e", {kBytes});
  const void* e_block = e->data();
  freed_while(e);
  auto f = reg.create<std::uint8_t>("use/f", {kBytes});
  CHECK(f.data() == e_block);
}

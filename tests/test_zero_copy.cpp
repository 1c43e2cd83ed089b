// Zero copy or an error (docs/design.md): a reader whose code cannot use a
// tensor's pointer in place gets NotZeroCopy naming both sides, never a
// pointer that faults and never a copy it did not ask for; opted-in copies
// (the bindings' allow_copy) are counted in stats. Host cases run in CI;
// [gpu] cases on one GPU, [multi-gpu] ones where two are visible.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "memcuda/detail/base/copy_count.hpp"
#include "memcuda/memcuda.hpp"
#include "support/gpu.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/skip.hpp"

using namespace memcuda;
using Catch::Matchers::Contains;

namespace {

// The message of what `f` throws as E (fails the case when it throws nothing).
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  FAIL("nothing thrown");
  return {};
}

}  // namespace

TEST_CASE("zero copy: NotZeroCopy is an Unavailable with its own wire code, and comes back as itself") {
  NotZeroCopy e("x");
  CHECK(std::string(e.code()) == "not_zero_copy");
  CHECK(dynamic_cast<const Unavailable*>(&e) != nullptr);
  CHECK_THROWS_AS(throw_for_code("not_zero_copy", "tensor 'w' lives on CUDA device 1"), NotZeroCopy);
  CHECK(message_of<NotZeroCopy>([] { throw_for_code("not_zero_copy", "why and what to do"); }) ==
        "why and what to do");
}

TEST_CASE("zero copy: a host tensor is usable in place by host code only: a kernel device gets NotZeroCopy") {
  test::RedisServer srv;
  TensorRegistry reg(test::host_options(srv));
  auto t = reg.create<float>("zc/host", {4});
  t.copy_from_host(std::vector<float>{1, 2, 3, 4});
  auto r = reg.get<float>("zc/host");
  const auto before = reg.stats().process;
  CHECK_NOTHROW(r.check_device(-1));
  const std::string why = message_of<NotZeroCopy>([&] { r.check_device(0); });
  CHECK_THAT(why, Contains("tensor 'zc/host' is host memory") && Contains("CUDA device 0") &&
                      Contains("cannot read it in place") && Contains("cuda backend"));
  CHECK_THROWS_AS(r.check_device(-2), InvalidArgument);
  // The default read never copies: the view is the tensor's own memory and
  // nothing was counted.
  CHECK(r.data() == t.data());
  const auto after = reg.stats().process;
  CHECK(after.copies == before.copies);
  CHECK(after.copied_bytes == before.copied_bytes);
}

TEST_CASE("zero copy: an opted-in copy is counted in stats and warned about once per call site and tensor") {
  test::RedisServer srv;
  TensorRegistry reg(test::host_options(srv));
  const auto before = reg.stats().process;
  auto& count = detail::Process::get().copies();
  count.note("a test's copy", "zc/a", 100, "a reason");
  count.note("a test's copy", "zc/a", 28, "a reason");  // same site and tensor: counted, not logged again
  const auto after = reg.stats().process;
  CHECK(after.copies == before.copies + 2);
  CHECK(after.copied_bytes == before.copied_bytes + 128);
}

#if MEMCUDA_HAS_CUDA()

namespace {
RegistryOptions cuda_options(const test::RedisServer& srv) {
  RegistryOptions o = test::host_options(srv);
  o.default_backend = BackendKind::cuda;
  return o;
}
}  // namespace

TEST_CASE("zero copy: a cuda tensor is usable on its device, and host code gets NotZeroCopy", "[gpu]") {
  MEMCUDA_REQUIRE_GPU();
  test::RedisServer srv;
  TensorRegistry reg(cuda_options(srv));
  const auto before = reg.stats().process.copies;
  auto t = reg.create<float>("zc/dev", {1024});
  auto r = reg.get<float>("zc/dev");
  CHECK_NOTHROW(r.check_device(r.device()));
  const std::string why = message_of<NotZeroCopy>([&] { r.check_device(-1); });
  CHECK_THAT(why, Contains("device memory on CUDA device " + std::to_string(r.device())) &&
                      Contains("host code cannot dereference it") && Contains("copy_to_host"));
  CHECK_THROWS_AS(r.check_device(detail::device_count()), InvalidArgument);
  CHECK(reg.stats().process.copies == before);
}

TEST_CASE("zero copy: a tensor on GPU 1 read from GPU 0: fine with peer access, NotZeroCopy naming both without",
          "[gpu][multi-gpu]") {
  MEMCUDA_REQUIRE_GPUS(2);
  test::RedisServer srv;
  TensorRegistry reg(cuda_options(srv));
  CreateOptions on1;
  on1.device = 1;
  auto t = reg.create<float>("zc/on1", {1024}, on1);
  REQUIRE(t.device() == 1);
  int can = 0;
  REQUIRE(cudaDeviceCanAccessPeer(&can, 0, 1) == cudaSuccess);
  INFO("cudaDeviceCanAccessPeer(0, 1) = " << can);
  if (can) {
    CHECK_NOTHROW(t.check_device(0));
  } else {
    const std::string why = message_of<NotZeroCopy>([&] { t.check_device(0); });
    CHECK_THAT(why, Contains("CUDA device 1") && Contains("device 0 cannot access") &&
                        Contains("cudaDeviceCanAccessPeer(0, 1) is 0"));
  }
  CHECK_NOTHROW(t.check_device(1));
}

#endif  // MEMCUDA_HAS_CUDA()

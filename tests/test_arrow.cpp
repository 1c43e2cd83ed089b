// Arrow C Device Data Interface export (memcuda/arrow.hpp). The structs
// come from tests/arrow_spec.h, written from the specification, included
// first: the library's header must then skip its own copy (the guard macros)
// and still compile against the specification's. A consumer in another
// process (tests/arrow_consumer.c, C, no Arrow library) reads a host tensor
// through the C ABI; on a GPU host a consumer orders its stream on the
// export's sync_event.
#include "arrow_spec.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "memcuda/arrow.hpp"
#include "memcuda/memcuda.hpp"
#include "memcuda/redis/connection.hpp"
#include "support/gpu.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/skip.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

static_assert(sizeof(ArrowSchema) == 72 && sizeof(ArrowArray) == 80, "the specification's layouts (64-bit)");
static_assert(sizeof(ArrowDeviceArray) == 128, "the specification: exactly 128 bytes on 64-bit systems");

namespace {

// The value of `key` in Arrow's metadata encoding; "" when absent.
std::string metadata_value(const char* md, const std::string& key) {
  if (!md) return {};
  auto next = [&md] {  // one length-prefixed string
    std::int32_t len;
    std::memcpy(&len, md, 4);
    std::string s(md + 4, static_cast<std::size_t>(len));
    md += 4 + len;
    return s;
  };
  std::int32_t n;
  std::memcpy(&n, md, 4);
  md += 4;
  for (; n > 0; --n) {
    std::string k = next();
    std::string v = next();
    if (k == key) return v;
  }
  return {};
}

}  // namespace

TEST_CASE("export_arrow: a host tensor as a flat primitive array, zero copy, holding its own reference",
          "[redis][arrow]") {
  test::RedisServer srv;
  TensorRegistry reg(test::host_options(srv));
  auto t = reg.create<std::int32_t>("arrow/a", {3, 4});
  std::vector<std::int32_t> v(12);
  for (int i = 0; i < 12; ++i) v[i] = i * 7 - 20;
  t.copy_from_host(v);

  ArrowExport e = to_arrow(t);
  const ArrowSchema& s = e.schema;
  const ArrowArray& a = e.array.array;
  CHECK(std::string(s.format) == "i");
  CHECK(std::string(s.name) == "arrow/a");
  CHECK(s.flags == 0);  // no nulls: not nullable
  CHECK(s.n_children == 0);
  CHECK(s.dictionary == nullptr);
  CHECK(metadata_value(s.metadata, "memcuda.dtype") == "i32");
  CHECK(metadata_value(s.metadata, "memcuda.shape") == "[3,4]");
  CHECK(a.length == 12);
  CHECK(a.null_count == 0);
  CHECK(a.offset == 0);
  CHECK(a.n_buffers == 2);
  CHECK(a.buffers[0] == nullptr);  // validity: none
  CHECK(a.buffers[1] == t.data());  // the tensor's memory itself
  CHECK(a.n_children == 0);
  CHECK(e.array.device_type == ARROW_DEVICE_CPU);
  CHECK(e.array.device_id == 0);
  CHECK(e.array.sync_event == nullptr);  // host: nothing to wait for
  CHECK(e.array.reserved[0] == 0);
  CHECK(e.array.reserved[2] == 0);
  CHECK(static_cast<const std::int32_t*>(a.buffers[1])[11] == 57);

  // The array's share keeps the reference (and the mapping) after the handle goes.
  t.release();
  reg.flush();
  CHECK(reg.info("arrow/a").refcount == 1);
  CHECK(static_cast<const std::int32_t*>(a.buffers[1])[0] == -20);
  // The specification's move: bitwise copy, source marked released.
  ArrowSchema s2;
  ArrowDeviceArray a2;
  e.move_to(&s2, &a2);
  CHECK(e.schema.release == nullptr);
  CHECK(e.array.array.release == nullptr);
  e.reset();  // released structs: a no-op
  reg.flush();
  CHECK(reg.info("arrow/a").refcount == 1);
  a2.array.release(&a2.array);
  CHECK(a2.array.release == nullptr);  // the release callback marks the struct released
  s2.release(&s2);
  CHECK(s2.release == nullptr);
  reg.flush();
  CHECK_THROWS_AS(reg.info("arrow/a"), NotFound);  // the last reference went with the array
}

TEST_CASE("export_arrow: every dtype's format string, and bool and bf16 under strict types", "[redis][arrow]") {
  test::RedisServer srv;
  TensorRegistry reg(test::host_options(srv));
  const std::vector<std::pair<DType, std::string>> table = {
      {DType::bool_, "C"}, {DType::u8, "C"},  {DType::i8, "c"},   {DType::i16, "s"}, {DType::i32, "i"},
      {DType::i64, "l"},   {DType::u16, "S"}, {DType::u32, "I"},  {DType::u64, "L"}, {DType::f16, "e"},
      {DType::bf16, "w:2"}, {DType::f32, "f"}, {DType::f64, "g"}};
  for (const auto& [d, fmt] : table) {
    const std::string name = "arrow/dt/" + std::string(to_string(d));
    INFO(name);
    auto t = reg.create_any(name, d, {5});
    auto e = to_arrow(t);
    CHECK(std::string(e.schema.format) == fmt);
    CHECK(metadata_value(e.schema.metadata, "memcuda.dtype") == to_string(d));
    CHECK(e.array.array.length == 5);
    ArrowExportOptions strict;
    strict.strict_types = true;
    ArrowSchema s;
    ArrowDeviceArray a;
    if (d == DType::bool_ || d == DType::bf16) {
      CHECK_THROWS_AS(export_arrow(t, &s, &a, strict), TypeMismatch);
      CHECK(s.release == nullptr);  // both read released after a failure
      CHECK(a.array.release == nullptr);
    } else {
      export_arrow(t, &s, &a, strict);
      CHECK(std::string(s.format) == fmt);
      a.array.release(&a.array);
      s.release(&s);
    }
  }
  auto scalar = reg.create<float>("arrow/scalar", {});
  ArrowExportOptions list;
  list.fixed_size_list = true;
  CHECK_THROWS_AS(to_arrow(scalar, list), InvalidArgument);  // no innermost dimension
  CHECK(to_arrow(scalar).array.array.length == 1);
  CHECK_THROWS_AS(to_arrow(SharedTensor<float>()), InvalidArgument);
  ArrowSchema s;
  CHECK_THROWS_AS(export_arrow(scalar, nullptr, nullptr), InvalidArgument);
  // The schema alone: no reference taken.
  export_arrow(scalar, &s, nullptr);
  CHECK(std::string(s.format) == "f");
  s.release(&s);
}

TEST_CASE("export_arrow: a fixed-size list of the innermost dimension, whose child may be moved out",
          "[redis][arrow]") {
  test::RedisServer srv;
  TensorRegistry reg(test::host_options(srv));
  auto t = reg.create<double>("arrow/list", {2, 3, 4});
  std::vector<double> v(24);
  for (int i = 0; i < 24; ++i) v[i] = i + 0.5;
  t.copy_from_host(v);
  ArrowExportOptions o;
  o.fixed_size_list = true;
  auto e = to_arrow(t, o);
  CHECK(std::string(e.schema.format) == "+w:4");
  REQUIRE(e.schema.n_children == 1);
  CHECK(std::string(e.schema.children[0]->format) == "g");
  CHECK(metadata_value(e.schema.metadata, "memcuda.shape") == "[2,3,4]");
  const ArrowArray& a = e.array.array;
  CHECK(a.length == 6);  // 2 * 3 lists of 4
  CHECK(a.n_buffers == 1);  // a fixed-size list has only the validity buffer
  CHECK(a.buffers[0] == nullptr);
  REQUIRE(a.n_children == 1);
  CHECK(a.children[0]->length == 24);
  CHECK(a.children[0]->buffers[1] == t.data());

  // The specification lets a consumer move a child out and release the
  // parent: the child then keeps the memory and the reference on its own.
  ArrowArray child = *a.children[0];
  a.children[0]->release = nullptr;
  ArrowSchema child_schema = *e.schema.children[0];
  e.schema.children[0]->release = nullptr;
  e.reset();
  t.release();
  reg.flush();
  CHECK(reg.info("arrow/list").refcount == 1);
  CHECK(static_cast<const double*>(child.buffers[1])[23] == 23.5);
  CHECK(std::string(child_schema.format) == "g");
  child.release(&child);
  child_schema.release(&child_schema);
  reg.flush();
  CHECK_THROWS_AS(reg.info("arrow/list"), NotFound);

  // A zero-sized innermost dimension: lists of nothing, one per outer position.
  auto z = reg.create<float>("arrow/empty", {3, 0});
  auto ez = to_arrow(z, o);
  CHECK(std::string(ez.schema.format) == "+w:0");
  CHECK(ez.array.array.length == 3);
  CHECK(ez.array.array.children[0]->length == 0);
}

TEST_CASE("to_arrow of a state dict exports each member, holding the dict's one reference", "[redis][arrow]") {
  test::RedisServer srv;
  redis::Connection c(srv.options());
  TensorRegistry reg(test::host_options(srv));
  std::vector<float> w(6, 1.5f);
  std::vector<std::int64_t> steps{7};
  PublishOptions po;
  po.create.persistent = true;  // linked as a state-dict record: an open is ONE reference, on the record
  publish_state_dict(reg, "m/", {{"w", DType::f32, {2, 3}, w.data()}, {"steps", DType::i64, {1}, steps.data()}}, po);
  const auto link = c.command({"GET", "memcuda:dictlink:m/"});
  REQUIRE(!link.is_nil());
  const std::string record = "memcuda:dict:" + std::string(link.str());
  auto record_refcount = [&] { return std::stoll(std::string(c.command({"HGET", record, "refcount"}).str())); };
  std::map<std::string, ArrowExport> out;
  {
    auto dict = open_state_dict(reg, "m/");
    out = to_arrow(dict);
  }
  REQUIRE(out.size() == 2);
  CHECK(std::string(out.at("w").schema.format) == "f");
  CHECK(out.at("w").array.array.length == 6);
  CHECK(static_cast<const float*>(out.at("w").array.array.buffers[1])[5] == 1.5f);
  CHECK(std::string(out.at("steps").schema.format) == "l");
  CHECK(static_cast<const std::int64_t*>(out.at("steps").array.array.buffers[1])[0] == 7);
  reg.flush();
  CHECK(record_refcount() == 1);  // the open's, kept by the exports after the dict went
  out.erase("w");
  reg.flush();
  CHECK(record_refcount() == 1);  // one member's export still holds it
  out.clear();
  reg.flush();
  CHECK(record_refcount() == 0);
}

TEST_CASE("an Arrow consumer in another process reads a host tensor and its release gives the reference back",
          "[redis][arrow][processes]") {
  std::string consumer;
  try {
    consumer = test::sibling_program("memcuda_arrow_consumer");
  } catch (const std::exception&) {
    MEMCUDA_SKIP("memcuda_arrow_consumer not built (it needs libmemcuda_c, which needs <dlpack/dlpack.h>)");
  }
  test::RedisServer srv;
  auto o = test::host_options(srv);
  o.name_space = "arrowx";
  TensorRegistry reg(o);
  auto t = reg.create<std::int32_t>("cols/x", {5, 8}, test::persistent());
  std::vector<std::int32_t> v(40);
  long long sum = 0;
  for (int i = 0; i < 40; ++i) sum += v[i] = i * i - 100;
  t.copy_from_host(v);
  t.release();
  reg.flush();
  REQUIRE(reg.info("cols/x").refcount == 1);  // the name's only
  for (const char* flags : {"0", "1"}) {  // flat, then MEMCUDA_ARROW_FIXED_SIZE_LIST
    INFO("flags " << flags);
    test::Child c({consumer, srv.unix_url(), "arrowx", "cols/x", flags});
    auto line = c.read_line(60s);
    REQUIRE(line);
    INFO(*line);
    CHECK(line->rfind("OK format=i length=40 sum=" + std::to_string(sum) + " dtype=i32 ", 0) == 0);
    // After the export: the name's and the consumer's. After the consumer's
    // handle went: still 2 (the array's share). After the array's release: 1.
    CHECK(line->find("refcounts=2,2,1") != std::string::npos);
    CHECK(c.wait() == 0);
    CHECK(reg.info("cols/x").refcount == 1);
  }
}

#if MEMCUDA_HAS_CUDA() && defined(MEMCUDA_TEST_KERNELS)
extern "C" cudaError_t memcuda_test_slow_fill(float* p, std::size_t n, float v, unsigned spin_ms, cudaStream_t s);

TEST_CASE("cuda: an Arrow export's sync_event orders a consumer after the producer's publish", "[gpu][arrow]") {
  MEMCUDA_REQUIRE_GPU();
  test::RedisServer srv;
  RegistryOptions o;
  o.redis = srv.options();
  o.lease_ttl = 400ms;
  o.default_backend = BackendKind::cuda;
  TensorRegistry reg(o);
  const std::size_t n = 1 << 20;
  auto t = reg.create<float>("arrow/g", {static_cast<std::int64_t>(n)});
  std::vector<float> ones(n, 1.f), got(n);
  t.copy_from_host(ones);
  {
    auto e = to_arrow(t);
    CHECK(e.array.device_type == ARROW_DEVICE_CUDA);
    CHECK(e.array.device_id == t.device());
    CHECK(e.array.array.buffers[1] == t.data());
    CHECK(e.array.sync_event == nullptr);  // nothing published yet
  }
  cudaStream_t s{}, c{}, raw{};
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(memcuda_test_slow_fill(t.data(), n, 2.f, 2000, s) == cudaSuccess);  // 2 s, then writes 2.0
  t.publish(s);
  auto e = to_arrow(t);  // newest_event: the publish above
  REQUIRE(e.array.sync_event != nullptr);
  ArrowExportOptions opened;
  opened.newest_event = false;
  CHECK(to_arrow(t, opened).array.sync_event == nullptr);  // the handle's record predates the publish
  // Control: a read that ignores sync_event sees the old values while the producer still runs.
  REQUIRE(cudaMemcpyAsync(got.data(), e.array.array.buffers[1], n * 4, cudaMemcpyDeviceToHost, raw) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(raw) == cudaSuccess);
  CHECK(got[n - 1] == 1.f);
  // The consumer the specification describes: wait on *sync_event, then read.
  REQUIRE(cudaStreamWaitEvent(c, *static_cast<cudaEvent_t*>(e.array.sync_event), 0) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(got.data(), e.array.array.buffers[1], n * 4, cudaMemcpyDeviceToHost, c) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(c) == cudaSuccess);
  CHECK(got[0] == 2.f);
  CHECK(got[n - 1] == 2.f);
  t.release();
  reg.flush();
  CHECK(reg.info("arrow/g").refcount == 1);  // the export's share
  e.reset();
  reg.flush();
  CHECK_THROWS_AS(reg.info("arrow/g"), NotFound);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  for (auto x : {s, c, raw}) cudaStreamDestroy(x);
}
#endif

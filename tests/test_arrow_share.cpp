// Arrow import (memcuda::share_arrow, memcuda/arrow_share.hpp): an array a
// foreign producer made (built here from the specification's structs, no
// Arrow library) is registered by name without a copy, read by another
// process, and released through its own release callback once the last
// reference goes; what is not a dense, shareable tensor is refused with a
// typed error, the array released and nothing registered.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "memcuda/arrow_share.hpp"
#include "memcuda/memcuda.hpp"
#include "support/memfd_buffer.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/text.hpp"
#include "support/timing.hpp"
#include "support/worker.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

// A producer's array over `data`: a primitive array of `format`, or with
// list_n > 0 a fixed-size list "+w:<list_n>" of one. Its release callbacks
// count into `released` (the array's) so a test sees whether and when the
// registry let go. An array never released leaks its counter's reference.
struct Foreign {
  ArrowSchema schema{}, child_schema{};
  ArrowArray array{}, child{};
  const void* bufs[2] = {nullptr, nullptr};
  const void* child_bufs[2] = {nullptr, nullptr};
  ArrowSchema* schema_children[1] = {nullptr};
  ArrowArray* array_children[1] = {nullptr};
  std::string format, child_format, metadata;
  std::shared_ptr<std::atomic<int>> released = std::make_shared<std::atomic<int>>(0);

  Foreign(std::string fmt, const void* data, std::int64_t length, std::int64_t list_n = 0) : format(std::move(fmt)) {
    schema.format = format.c_str();
    schema.name = "col";
    schema.release = [](ArrowSchema* s) { s->release = nullptr; };
    array.length = length;
    // The callback owns a reference to the counter: the registry may release
    // the array on its release thread after this Foreign is gone.
    array.release = [](ArrowArray* a) {
      auto* counter = static_cast<std::shared_ptr<std::atomic<int>>*>(a->private_data);
      (*counter)->fetch_add(1);
      delete counter;
      a->release = nullptr;
    };
    array.private_data = new std::shared_ptr<std::atomic<int>>(released);
    if (list_n == 0) {
      bufs[1] = data;
      array.n_buffers = 2;
      array.buffers = bufs;
      return;
    }
    child_format = format;
    format = "+w:" + std::to_string(list_n);
    schema.format = format.c_str();
    child_schema.format = child_format.c_str();
    child_schema.name = "item";
    child_schema.release = schema.release;
    schema_children[0] = &child_schema;
    schema.n_children = 1;
    schema.children = schema_children;
    child_bufs[1] = data;
    child.length = length * list_n;
    child.n_buffers = 2;
    child.buffers = child_bufs;
    array_children[0] = &child;
    array.n_buffers = 1;
    array.buffers = bufs;
    array.n_children = 1;
    array.children = array_children;
  }
  void set_metadata(std::vector<std::pair<std::string, std::string>> kv) {
    metadata = detail::arrow_metadata(kv);
    schema.metadata = metadata.data();
  }
};

}  // namespace

// Fails without share_arrow: nothing else registers an Arrow array's memory.
TEST_CASE("share_arrow: a producer's host array is read by another process without a copy, and released after the "
          "last reference",
          "[redis][multiprocess][host][arrow][borrow]") {
  test::RedisServer srv;
  TensorRegistry owner(test::host_options(srv));
  test::MemfdBuffer buf(1000, 2.0f);
  Foreign f("f", buf.p, 990);
  f.array.offset = 10;  // the first 10 elements are not the array's
  {
    auto h = share_arrow(owner, "ar", &f.schema, &f.array);
    CHECK(f.array.release == nullptr);  // taken over
    CHECK(h.data() == buf.p + 10);      // no copy
    CHECK(h.dtype() == DType::f32);
    CHECK(h.shape() == Shape{990});
    CHECK(owner.info("ar").borrowed);
    auto reader = test::start_worker(srv.unix_url(), {"--backend", "host", "--no-control"});
    CHECK_FALSE(test::ready(*reader));
    auto r = reader->ask("get ar", 20s);
    INFO(r);
    REQUIRE(test::starts_with(r, "OK"));
    CHECK(test::field(r, "sum") == "1980");
    CHECK(reader->ask("release ar") == "OK");
    CHECK(reader->ask("exit") == "OK");
    CHECK(f.released->load() == 0);  // our handle still holds it
  }
  owner.flush();
  CHECK(test::eventually([&] { return f.released->load() == 1; }, 10s));
  CHECK_THROWS_AS(owner.info("ar"), NotFound);
}

TEST_CASE("share_arrow: a fixed-size list keeps its offsets, and memcuda's metadata restores the shape and dtype",
          "[redis][host][arrow][borrow]") {
  test::RedisServer srv;
  TensorRegistry reg(test::host_options(srv));
  test::MemfdBuffer buf(64, 1.0f);
  {
    Foreign f("f", buf.p, 3, 4);
    f.child.offset = 2;
    f.child.length = 16;  // items 1..3 of 4 elements each
    f.array.offset = 1;   // list item 1 starts at child element 2 + 4
    auto h = share_arrow(reg, "list", &f.schema, &f.array);
    CHECK(h.data() == buf.p + 6);
    CHECK(h.shape() == Shape{3, 4});
    CHECK(h.dtype() == DType::f32);
  }
  {
    Foreign f("f", buf.p, 12);
    f.set_metadata({{"memcuda.dtype", "f32"}, {"memcuda.shape", "[3,2,2]"}});
    CHECK(share_arrow(reg, "shaped", &f.schema, &f.array).shape() == Shape{3, 2, 2});
  }
  {
    Foreign f("f", buf.p, 12);
    f.set_metadata({{"memcuda.shape", "[5,5]"}});  // 25 elements, not 12: the flat shape stands
    CHECK(share_arrow(reg, "flat", &f.schema, &f.array).shape() == Shape{12});
  }
  {
    Foreign f("w:2", buf.p, 8);
    f.set_metadata({{"memcuda.dtype", "bf16"}});
    CHECK(share_arrow(reg, "bf", &f.schema, &f.array).dtype() == DType::bf16);
  }
  {
    Foreign f("C", buf.p, 8);
    f.set_metadata({{"memcuda.dtype", "bool"}});
    CHECK(share_arrow(reg, "flags", &f.schema, &f.array).dtype() == DType::bool_);
  }
  reg.flush();
}

TEST_CASE("share_arrow: what is not a dense shareable tensor is refused, the array released, nothing registered",
          "[redis][host][arrow][borrow]") {
  test::RedisServer srv;
  TensorRegistry reg(test::host_options(srv));
  test::MemfdBuffer buf(64, 1.0f);
  auto refused = [&](Foreign& f, auto kind, const char* says, ArrowDeviceType device = ARROW_DEVICE_CPU) {
    ArrowDeviceArray d{};
    d.array = f.array;
    f.array.release = nullptr;
    d.device_type = device;
    bool thrown = false;
    try {
      (void)share_arrow(reg, "bad", &f.schema, &d);
    } catch (const decltype(kind)& e) {
      thrown = true;
      INFO(e.what());
      CHECK(test::contains(e.what(), says));
    }
    CHECK(thrown);
    CHECK(d.array.release == nullptr);
    CHECK(f.released->load() == 1);  // released on the spot
    CHECK_THROWS_AS(reg.info("bad"), NotFound);
  };
  SECTION("nulls") {
    Foreign f("f", buf.p, 8);
    f.array.null_count = 3;
    refused(f, InvalidArgument(""), "3 null(s)");
  }
  SECTION("an unknown null count over a validity buffer") {
    Foreign f("f", buf.p, 8);
    f.array.null_count = -1;
    f.bufs[0] = buf.p;
    refused(f, InvalidArgument(""), "unknown null count");
  }
  SECTION("a bit-packed boolean") {
    Foreign f("b", buf.p, 8);
    refused(f, TypeMismatch(""), "bit-packed");
  }
  SECTION("a string array") {
    Foreign f("u", buf.p, 8);
    refused(f, TypeMismatch(""), "not a fixed-width number type");
  }
  SECTION("a list of no elements per item") {
    Foreign f("f", buf.p, 2, 1);
    f.format = "+w:0";
    f.schema.format = f.format.c_str();
    refused(f, InvalidArgument(""), "no elements per item");
  }
  SECTION("a list whose child is too short") {
    Foreign f("f", buf.p, 4, 4);
    f.child.length = 10;
    refused(f, InvalidArgument(""), "16 needed");
  }
  SECTION("garbled metadata") {
    Foreign f("f", buf.p, 8);
    f.metadata = std::string("\xfb\xff\xff\xff", 4);  // -5 pairs
    f.schema.metadata = f.metadata.data();
    refused(f, InvalidArgument(""), "unreadable schema metadata");
  }
  SECTION("pinned host memory") {
    Foreign f("f", buf.p, 8);
    refused(f, NotShareable(""), "pinned host", ARROW_DEVICE_CUDA_HOST);
  }
  SECTION("another device type") {
    Foreign f("f", buf.p, 8);
    refused(f, InvalidArgument(""), "neither CPU nor CUDA", ARROW_DEVICE_VULKAN);
  }
  SECTION("malloc'd memory") {
    std::vector<float> heap(8, 1.0f);
    Foreign f("f", heap.data(), 8);
    refused(f, NotShareable(""), "private anonymous memory");
  }
  SECTION("no schema") {
    Foreign f("f", buf.p, 8);
    ArrowDeviceArray d{};
    d.array = f.array;
    CHECK_THROWS_AS(share_arrow(reg, "bad", nullptr, &d), InvalidArgument);
    CHECK(f.released->load() == 1);
  }
}

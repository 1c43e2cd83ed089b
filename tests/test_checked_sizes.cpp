// Lengths, offsets and counts from outside (Arrow arrays, DLPack tensors, fd
// wire counts, shapes) at the 2^62 / 2^63 / 2^64 edges: each is refused with
// InvalidArgument before any product or address wraps.
#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "memcuda/arrow_share.hpp"
#include "memcuda/detail/base/checked.hpp"
#include "memcuda/detail/fd/fd_wire.hpp"
#include "memcuda/memcuda.hpp"
#include "memcuda/share.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/text.hpp"

using namespace memcuda;

namespace {

constexpr std::int64_t k62 = std::int64_t{1} << 62;
constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();
constexpr std::uint64_t kU64Max = std::numeric_limits<std::uint64_t>::max();

// A flat primitive array (or, with list_n, a fixed-size list of one) over a
// small buffer, only for arrow_import_layout: nothing is shared.
struct Layout {
  float data[16] = {};
  const void* bufs[2] = {nullptr, data};
  const void* list_bufs[2] = {nullptr, nullptr};
  ArrowSchema schema{}, child_schema{};
  ArrowArray array{}, child{};
  ArrowSchema* schema_children[1] = {&child_schema};
  ArrowArray* array_children[1] = {&child};
  std::string format;

  Layout(std::int64_t offset, std::int64_t length, std::int64_t list_n = 0) {
    array.offset = offset;
    array.length = length;
    if (list_n == 0) {
      schema.format = "f";
      array.n_buffers = 2;
      array.buffers = bufs;
      return;
    }
    format = "+w:" + std::to_string(list_n);
    schema.format = format.c_str();
    schema.n_children = 1;
    schema.children = schema_children;
    child_schema.format = "f";
    array.n_buffers = 1;
    array.buffers = list_bufs;
    array.n_children = 1;
    array.children = array_children;
    child.n_buffers = 2;
    child.buffers = bufs;
    child.length = 16;
  }
  detail::ArrowImportLayout layout() { return detail::arrow_import_layout(schema, array, "import"); }
};

}  // namespace

TEST_CASE("checked arithmetic refuses at the 2^63 and 2^64 edges and passes just below", "[overflow]") {
  using detail::checked_add;
  using detail::checked_mul;
  CHECK(checked_mul<std::int64_t>(k62, 1, "x") == k62);
  CHECK(test::contains(test::invalid_argument_of([] { (void)checked_mul<std::int64_t>(k62, 2, "int64 product"); }),
                       "int64 product: 4611686018427387904 * 2 overflows int64"));
  CHECK(checked_mul<std::uint64_t>(std::uint64_t{1} << 63, 1, "x") == std::uint64_t{1} << 63);
  CHECK(test::contains(test::invalid_argument_of([] { (void)checked_mul<std::uint64_t>(std::uint64_t{1} << 62, 4, "u"); }),
                       "overflows uint64"));
  CHECK(checked_add<std::int64_t>(kI64Max - 1, 1, "x") == kI64Max);
  CHECK_THROWS_AS(checked_add<std::int64_t>(kI64Max, 1, "x"), InvalidArgument);
  CHECK_THROWS_AS(checked_add<std::uint64_t>(kU64Max, 1, "x"), InvalidArgument);
  int local = 0;
  CHECK_THROWS_AS(detail::checked_advance(&local, kU64Max, "x"), InvalidArgument);
}

// Failed before the check: offset 2^62 of f32 made 2^64 bytes, wrapped to 0,
// and shared elements 0..3.
TEST_CASE("Arrow import: an offset or length whose byte count wraps is refused", "[overflow][arrow]") {
  SECTION("offset 2^62 of f32") {
    Layout l(k62, 4);
    CHECK(test::contains(test::invalid_argument_of([&] { (void)l.layout(); }),
                         "(offset + length) * item size: 4611686018427387908 * 4 overflows int64"));
  }
  SECTION("offset + length past 2^63") {
    Layout l(kI64Max, 1);
    CHECK(test::contains(test::invalid_argument_of([&] { (void)l.layout(); }), "offset + length"));
  }
  SECTION("length 2^62 of f32") {
    Layout l(0, k62);
    CHECK_THROWS_AS(l.layout(), InvalidArgument);
  }
  SECTION("a list's child offset 2^62") {
    Layout l(0, 2, 2);
    l.child.offset = k62;
    CHECK(test::contains(test::invalid_argument_of([&] { (void)l.layout(); }), "the list's child"));
  }
  SECTION("a list whose offset times its size passes 2^63") {
    Layout l(k62, 1, 4);
    CHECK(test::contains(test::invalid_argument_of([&] { (void)l.layout(); }), "offset * list size"));
  }
  SECTION("in range still imports, at the right element") {
    Layout l(3, 4);
    CHECK(l.layout().data == &l.data[3]);
    Layout li(1, 2, 4);
    CHECK(li.layout().data == &li.data[4]);
  }
}

// Failed before the check: a byte_offset of 2^64 - 1 moved the address back
// one byte, and strides of huge dims multiplied past int64.
TEST_CASE("DLPack import: a byte_offset that wraps the address or dims past the limit are refused",
          "[overflow][dlpack]") {
  float data[4] = {};
  std::int64_t shape[2] = {2, 2};
  DLTensor t{};
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = 2;
  t.dtype = {kDLFloat, 32, 1};
  t.shape = shape;
  void* out = nullptr;
  DType dt{};
  Shape sh;
  SECTION("byte_offset 2^64 - 1") {
    t.byte_offset = kU64Max;
    CHECK(test::contains(test::invalid_argument_of([&] { detail::dl_share_layout(t, "x", out, dt, sh); }), "byte_offset"));
  }
  SECTION("dims of 2^62 with strides") {
    std::int64_t big[2] = {k62, 4};
    std::int64_t strides[2] = {4, 1};
    t.shape = big;
    t.strides = strides;
    CHECK_THROWS_AS(detail::dl_share_layout(t, "x", out, dt, sh), InvalidArgument);
  }
  SECTION("in range still imports") {
    t.byte_offset = 4;
    detail::dl_share_layout(t, "x", out, dt, sh);
    CHECK(out == &data[1]);
  }
}

TEST_CASE("shapes at the 2^63 and 2^64 element edges are refused, not wrapped", "[overflow]") {
  const std::int64_t d32 = std::int64_t{1} << 32;
  CHECK(element_count(Shape{d32, d32 / 2}) == std::uint64_t{1} << 63);
  CHECK_THROWS_AS(element_count(Shape{d32, d32}), ProtocolError);        // 2^64
  CHECK_THROWS_AS(byte_size(DType::f32, Shape{d32, d32 / 4}), ProtocolError);  // 2^62 elements, 2^64 bytes
  CHECK_THROWS_AS(contiguous_strides(Shape{2, d32, d32, 1}), ProtocolError);   // a stride of 2^64
  CHECK_THROWS_AS(element_count(Shape{k62}), ProtocolError);                    // a dim past 2^40
}

// Failed before the check: 2^16 + 1 ids went out with a count of 1.
TEST_CASE("fd wire: a batch count past what the u16 header carries is refused when encoding", "[overflow][fd]") {
  namespace fdwire = detail::fdwire;
  fdwire::Request r;
  r.ids.assign(65537, 1);
  CHECK_THROWS_AS(fdwire::encode_request(r), InvalidArgument);
  r.ids.assign(fdwire::kMaxBatch + 1, 1);
  CHECK_THROWS_AS(fdwire::encode_request(r), InvalidArgument);
  fdwire::Reply rep;
  rep.entries.resize(fdwire::kMaxBatch + 1);
  CHECK_THROWS_AS(fdwire::encode_reply(rep), InvalidArgument);
  r.ids.assign(fdwire::kMaxBatch, 1);
  CHECK(fdwire::encode_request(r).size() == fdwire::kHeader + 8 * fdwire::kMaxBatch);
}

// Failed before the check: [2^40, 2^23, 0] is a valid empty shape (its strides
// fit) whose outer product, 2^63, overflowed the fixed-size list's length.
TEST_CASE("Arrow export: a fixed-size list whose outer dimensions overflow int64 is refused",
          "[redis][overflow][arrow]") {
  test::RedisServer srv;
  TensorRegistry reg(test::host_options(srv));
  const std::int64_t d40 = std::int64_t{1} << 40;
  auto t = reg.create<float>("arrow/huge-empty", {d40, std::int64_t{1} << 23, 0});
  ArrowExportOptions o;
  o.fixed_size_list = true;
  CHECK(test::contains(test::invalid_argument_of([&] { (void)to_arrow(t, o); }), "outer dimensions"));
  auto ok = reg.create<float>("arrow/empty", {d40, 3, 0});
  CHECK(to_arrow(ok, o).array.array.length == 3 * d40);
}

// Sliced reads (memcuda/slice.hpp): views of a tensor that share its
// reference, their copies as rows at a pitch, their DLPack export, and shard
// rules over a state dict. Real redis-server, host backend.
#include <catch2/catch.hpp>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "memcuda/dlpack.hpp"
#include "memcuda/memcuda.hpp"
#include "memcuda/redis/connection.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"

using namespace memcuda;
using Catch::Matchers::Contains;

namespace {

// A host tensor whose element i holds i.
SharedTensor<float> iota(TensorRegistry& reg, const std::string& name, Shape shape) {
  auto t = reg.create<float>(name, std::move(shape), test::persistent());
  std::vector<float> v(t.size());
  std::iota(v.begin(), v.end(), 0.0f);
  t.copy_from_host(v);
  return t;
}

std::vector<float> read(const SharedTensor<float>& t) {
  std::vector<float> v(t.size());
  t.copy_to_host(v);
  return v;
}

// Element [i][j][k] of a tensor of `strides` from iota, as the flat index.
float at(const Shape& strides, std::uint64_t offset_elems, std::vector<std::int64_t> idx) {
  std::int64_t f = static_cast<std::int64_t>(offset_elems);
  for (std::size_t d = 0; d < idx.size(); ++d) f += idx[d] * strides[d];
  return static_cast<float>(f);
}

struct World {
  test::RedisServer srv;
  TensorRegistry leader{test::host_options(srv)};
  TensorRegistry reader{test::host_options(srv, false)};
};

}  // namespace

TEST_CASE("slice: a tp view of every rank shares the reference and reads its rows", "[redis][slice]") {
  World w;
  iota(w.leader, "m/w", {8, 6});
  w.leader.flush();
  auto t = w.reader.get<float>("m/w");
  REQUIRE(w.leader.info("m/w").refcount == 2);  // the name's and the reader's
  for (unsigned world : {1u, 2u, 4u, 8u}) {
    for (unsigned r = 0; r < world; ++r) {
      auto v = t.slice(SliceSpec::tp(0, r, world));
      const std::int64_t rows = 8 / world;
      CHECK(v.shape() == Shape{rows, 6});
      CHECK(v.strides() == Shape{6, 1});
      CHECK(v.contiguous());
      CHECK(v.byte_offset() == static_cast<std::uint64_t>(r * rows * 6 * 4));
      CHECK(reinterpret_cast<char*>(v.data()) == reinterpret_cast<char*>(t.data()) + v.byte_offset());
      CHECK(v.size() == static_cast<std::uint64_t>(rows * 6));
      CHECK(v.bytes() == v.size() * 4);
      auto got = read(v);
      std::vector<float> want(got.size());
      std::iota(want.begin(), want.end(), static_cast<float>(r * rows * 6));
      CHECK(got == want);
    }
  }
  // Columns: rank r of 3 along dim 1 is 8 rows of 2 elements at a pitch of 6.
  for (unsigned r = 0; r < 3; ++r) {
    auto v = t.slice(SliceSpec::tp(1, r, 3));
    CHECK(v.shape() == Shape{8, 2});
    CHECK(v.strides() == Shape{6, 1});
    CHECK_FALSE(v.contiguous());
    const auto rows = v.rows();
    CHECK(rows.width == 8);
    CHECK(rows.pitch == 24);
    CHECK(rows.height == 8);
    auto got = read(v);
    for (std::int64_t i = 0; i < 8; ++i)
      for (std::int64_t j = 0; j < 2; ++j) CHECK(got[i * 2 + j] == static_cast<float>(i * 6 + r * 2 + j));
  }
  // No view takes a reference, and a view alone keeps the reader's.
  auto a = t.slice(SliceSpec::tp(0, 0, 2));
  auto b = a.slice({.dim = 1, .start = 1});
  w.reader.flush();
  CHECK(w.leader.info("m/w").refcount == 2);
  t = {};
  w.reader.flush();
  CHECK(w.leader.info("m/w").refcount == 2);
  CHECK(read(b)[0] == 1.0f);
  a.release();  // a released view is empty, like a released handle
  CHECK_THROWS_AS(a.shape(), InvalidArgument);
  CHECK(a.byte_offset() == 0);
  b = {};
  w.reader.flush();
  CHECK(w.leader.info("m/w").refcount == 1);
}

TEST_CASE("slice: a view narrowed to one column is rows of one element", "[redis][slice]") {
  World w;
  auto t = iota(w.leader, "col", {8, 6});
  auto c = t.slice({.dim = 1, .start = 4, .length = 1});
  CHECK(c.rows().width == 4);
  CHECK(c.rows().pitch == 24);
  CHECK(c.rows().height == 8);
  CHECK(read(c) == std::vector<float>{4, 10, 16, 22, 28, 34, 40, 46});
  auto local = copy_slice(c, LocalOptions{.backend = BackendKind::host});
  CHECK(std::vector<float>(local.data(), local.data() + 8) == read(c));
  // The inner two dimensions merge, then the unit one is rows of one element.
  auto cube = iota(w.leader, "col3", {4, 6, 5}).slice({.dim = 2, .start = 2, .length = 1});
  CHECK(cube.rows().height == 24);
  CHECK(cube.rows().pitch == 20);
  auto got = read(cube);
  REQUIRE(got.size() == 24);
  for (std::size_t i = 0; i < 24; ++i) CHECK(got[i] == static_cast<float>(i * 5 + 2));
  // Writes land in the column only.
  c.copy_from_host(std::vector<float>(8, -1.0f));
  auto all = read(t);
  for (std::size_t i = 0; i < 48; ++i) CHECK(all[i] == (i % 6 == 4 ? -1.0f : static_cast<float>(i)));
}

TEST_CASE("slice: an empty view at the end copies and exports nothing", "[redis][slice][dlpack]") {
  World w;
  auto t = iota(w.leader, "e", {4, 6});
  auto v = t.slice({.dim = 0, .start = 4, .length = 0});
  CHECK(v.size() == 0);
  CHECK(v.bytes() == 0);
  std::vector<float> none;
  v.copy_to_host(none);
  v.copy_from_host(none);
  CHECK(copy_slice(v, LocalOptions{.backend = BackendKind::host}).shape() == Shape{0, 6});
  DLManagedTensor* m = to_dlpack(v);
  CHECK(m->dl_tensor.shape[0] == 0);
  CHECK(m->dl_tensor.shape[1] == 6);
  m->deleter(m);
  auto cols = t.slice({.dim = 1, .start = 6, .length = 0});
  CHECK(cols.shape() == Shape{4, 0});
  cols.copy_to_host(none);
}

TEST_CASE("slice: slices compose, strides kept and offsets added", "[redis][slice]") {
  World w;
  iota(w.leader, "c", {4, 6, 5});
  auto t = w.reader.get_slice<float>("c", {.dim = 1, .start = 1, .length = 4});
  auto v = t.slice({.dim = 0, .start = 2, .length = 2}).slice({.dim = 1, .start = 1, .length = 2});
  CHECK(v.shape() == Shape{2, 2, 5});
  CHECK(v.strides() == Shape{30, 5, 1});
  CHECK(v.byte_offset() == (1 * 5 + 2 * 30 + 1 * 5) * 4);
  const auto rows = v.rows();  // dims 1 and 2 merge: 2 rows of 10 elements, 30 apart
  CHECK(rows.width == 40);
  CHECK(rows.pitch == 120);
  CHECK(rows.height == 2);
  auto got = read(v);
  std::size_t n = 0;
  for (std::int64_t i = 0; i < 2; ++i)
    for (std::int64_t j = 0; j < 2; ++j)
      for (std::int64_t k = 0; k < 5; ++k) CHECK(got[n++] == at({30, 5, 1}, 70, {i, j, k}));
  // length -1: to the end; a whole-range slice is the tensor.
  auto tail = v.slice({.dim = 2, .start = 3});
  CHECK(tail.shape() == Shape{2, 2, 2});
  auto whole = w.reader.get<float>("c").slice({.dim = 0});
  CHECK(whole.contiguous());
  CHECK(read(whole) == read(w.reader.get<float>("c")));
  // Untyped handles keep the view; as<U>() types one again, dtype checked.
  SharedTensor<void> u = v;
  CHECK(u.shape() == v.shape());
  CHECK(u.data() == static_cast<void*>(v.data()));
  auto back = u.as<const float>();
  CHECK(back.shape() == v.shape());
  CHECK(back.data() == v.data());
  CHECK_THROWS_WITH(u.as<std::int32_t>(), Contains("'c'") && Contains("f32"));
  CHECK_FALSE(SharedTensor<void>{}.as<float>());
  // So do read-only untyped handles, through DLPack too.
  SharedTensor<const void> ro = v;
  DLManagedTensor* m = to_dlpack(ro);
  CHECK(m->dl_tensor.data == static_cast<void*>(v.data()));
  CHECK(m->dl_tensor.strides[0] == 30);
  m->deleter(m);
}

TEST_CASE("slice: writes and copies of a view touch its elements only", "[redis][slice]") {
  World w;
  iota(w.leader, "x", {4, 6});
  auto t = w.reader.get<float>("x");
  auto cols = t.slice({.dim = 1, .start = 2, .length = 3});
  std::vector<float> ones(12, -1.0f);
  cols.copy_from_host(ones);
  auto all = read(t);
  for (std::int64_t i = 0; i < 4; ++i)
    for (std::int64_t j = 0; j < 6; ++j)
      CHECK(all[i * 6 + j] == (j >= 2 && j < 5 ? -1.0f : static_cast<float>(i * 6 + j)));
  // A strided view is copied whole; a part of it is refused.
  std::vector<float> part(3);
  CHECK_THROWS_WITH(cols.copy_to_host(part, 3), Contains("strided view of 'x'") && Contains("copied whole"));
  // A contiguous view copies any range of itself.
  auto row = t.slice({.dim = 0, .start = 3, .length = 1});
  std::vector<float> two(2);
  row.copy_to_host(two, 4);
  CHECK(two == std::vector<float>{-1.0f, 23.0f});  // [3][4] was written through cols
  CHECK_THROWS_AS(row.copy_to_host(two, 5), InvalidArgument);
  // copy_slice: a dense local copy (host here; one cudaMemcpy2DAsync on a GPU).
  auto local = copy_slice(cols, LocalOptions{.backend = BackendKind::host});
  CHECK(local.shape() == Shape{4, 3});
  CHECK(std::vector<float>(local.data(), local.data() + 12) == ones);
  // Sliced in two dimensions that do not merge: not one 2D copy.
  iota(w.leader, "cube", {3, 4, 5});
  auto cube = w.reader.get<float>("cube").slice({.dim = 1, .start = 1, .length = 2}).slice(
      {.dim = 2, .start = 0, .length = 3});
  CHECK_FALSE(cube.contiguous());
  std::vector<float> out(cube.size());
  CHECK_THROWS_WITH(cube.copy_to_host(out), Contains("view of 'cube'") && Contains("2 or more dimensions"));
  CHECK_THROWS_AS(copy_slice(cube, LocalOptions{.backend = BackendKind::host}), InvalidArgument);
}

TEST_CASE("slice: bad ranges are InvalidArgument naming the tensor, shape and dimension", "[redis][slice]") {
  World w;
  w.leader.create<std::uint8_t>("m/w", {11008, 2}, test::persistent());
  w.leader.create<float>("s", {}, test::persistent());
  auto t = w.reader.get<std::uint8_t>("m/w");
  auto msg = [&](const SliceSpec& s) {
    try {
      (void)t.slice(s);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(msg(SliceSpec::tp(0, 0, 3)), Contains("dimension 0 of 'm/w' is 11008, not divisible by world 3"));
  CHECK_THAT(msg({.dim = 2}), Contains("slice of 'm/w' (shape [11008,2]): dimension 2 is out of range for rank 2"));
  CHECK_THAT(msg({.dim = -1}), Contains("dimension -1 is out of range"));
  CHECK_THAT(msg({.dim = 1, .start = 3}), Contains("start 3 is outside dimension 1 (2 elements)"));
  CHECK_THAT(msg({.dim = 1, .start = -1}), Contains("start -1 is outside dimension 1"));
  CHECK_THAT(msg({.dim = 1, .start = 1, .length = 2}), Contains("start 1 + length 2 does not fit dimension 1"));
  CHECK_THAT(msg({.dim = 1, .start = 0, .length = -2}), Contains("length -2 does not fit"));
  CHECK_THAT(msg({.dim = 0, .start = 1, .length = INT64_MAX}), Contains("overflows"));
  CHECK_THAT(msg(SliceSpec::tp(0, 0, 0)), Contains("'m/w'") && Contains("world is 0"));
  CHECK_THAT(msg(SliceSpec::tp(0, 4, 4)), Contains("rank 4 is not below world 4"));
  CHECK(t.slice({.dim = 1, .start = 2, .length = 0}).size() == 0);  // empty, at the end: fine
  CHECK_THROWS_WITH(w.reader.get_slice<float>("s", {}), Contains("'s'") && Contains("rank-0"));
  CHECK_THROWS_AS(w.reader.get_slice<float>("m/w", {}), TypeMismatch);
  CHECK_THROWS_AS(w.reader.get_slice<float>("nope", {}), NotFound);
  w.reader.flush();
  w.leader.flush();
  CHECK(w.leader.info("s").refcount == 1);  // the failed get_slice gave its reference back
}

TEST_CASE("slice: DLPack exports the view's shape, strides and first element", "[redis][slice][dlpack]") {
  World w;
  iota(w.leader, "d", {4, 6});
  auto t = w.reader.get<float>("d");
  auto v = t.slice(SliceSpec::tp(1, 1, 2)).slice({.dim = 0, .start = 1, .length = 2});
  DLManagedTensor* m = to_dlpack(v);
  const DLTensor& d = m->dl_tensor;
  CHECK(d.ndim == 2);
  CHECK(d.shape[0] == 2);
  CHECK(d.shape[1] == 3);
  CHECK(d.strides[0] == 6);
  CHECK(d.strides[1] == 1);
  // torch ignores byte_offset: the pointer is the view's first element.
  CHECK(d.byte_offset == 0);
  CHECK(d.data == static_cast<void*>(t.data() + 9));
  CHECK(static_cast<float*>(d.data)[6 + 2] == 17.0f);  // [1][2] of the view: [2][5] of the tensor
  t = {};
  v = {};
  w.reader.flush();
  w.leader.flush();
  CHECK(w.leader.info("d").refcount == 2);  // the export holds the reader's reference
  m->deleter(m);
  w.reader.flush();
  CHECK(w.leader.info("d").refcount == 1);
}

namespace {

std::int64_t record_refcount(redis::Connection& c, const std::string& prefix) {
  auto id = c.command({"GET", "memcuda:dictlink:" + prefix});
  REQUIRE(!id.is_nil());
  auto r = c.command({"HGET", "memcuda:dict:" + std::string(id.str()), "refcount"});
  return std::stoll(std::string(r.str()));
}

}  // namespace

TEST_CASE("shard rules: first match wins, whole and unmatched names whole, unused rules refused", "[redis][slice][state_dict]") {
  World w;
  redis::Connection c{w.srv.options()};
  std::vector<float> src(64);
  std::iota(src.begin(), src.end(), 0.0f);
  PublishOptions po;
  po.create.persistent = true;
  publish_state_dict(w.leader, "llm/",
                     {{"l0.qkv.weight", DType::f32, {8, 4}, src.data()},
                      {"l0.o_proj.weight", DType::f32, {4, 8}, src.data()},
                      {"l0.norm.weight", DType::f32, {4}, src.data()},
                      {"l0.bias", DType::f32, {8}, src.data()}},
                     po)
      .clear();
  w.leader.flush();
  ShardRules rules{.rank = 1, .world = 2, .rules = {{"*.qkv.weight", 0}, {"*.norm.weight", ShardRule::whole}, {"*.weight", 1}}};
  {
    auto sd = open_state_dict(w.reader, "llm/", rules);
    REQUIRE(sd.size() == 4);
    CHECK(sd.at("l0.qkv.weight").shape() == Shape{4, 4});  // its own rule, not "*.weight"
    CHECK(sd.at("l0.qkv.weight").byte_offset() == 16 * 4);
    CHECK(sd.at("l0.o_proj.weight").shape() == Shape{4, 4});  // "*.weight": dim 1
    CHECK(sd.at("l0.o_proj.weight").strides() == Shape{8, 1});
    CHECK(sd.at("l0.norm.weight").shape() == Shape{4});  // ShardRule::whole
    CHECK(sd.at("l0.bias").shape() == Shape{8});         // no rule: whole
    auto o = read(sd.at("l0.o_proj.weight").as<float>());
    CHECK(o == std::vector<float>{4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31});
    // One script, one reference: the dict record's, not one per tensor or view.
    CHECK(record_refcount(c, "llm/") == 1);
    CHECK(w.leader.info("llm/l0.qkv.weight").refcount == 2);  // its name and the record's pin
  }
  w.reader.flush();
  CHECK(record_refcount(c, "llm/") == 0);
  rules.rules.push_back({"*.q_proj.weight", 0});
  CHECK_THROWS_WITH(open_state_dict(w.reader, "llm/", rules), Contains("'*.q_proj.weight' matches no tensor"));
  w.reader.flush();
  CHECK(record_refcount(c, "llm/") == 0);  // nothing kept
  rules.allow_unused = true;
  CHECK(open_state_dict(w.reader, "llm/", rules).size() == 4);
  CHECK_THROWS_WITH(open_state_dict(w.reader, "llm/", {.rank = 0, .world = 3, .rules = {{"*.bias", 0}}}),
                    Contains("dimension 0 of 'llm/l0.bias' is 8, not divisible by world 3"));
  CHECK_THROWS_WITH(open_state_dict(w.reader, "llm/", {.rank = 2, .world = 2, .rules = {}}), Contains("rank 2 of world 2"));
  // Negative dimensions count from the end, as in numpy and torch.
  {
    auto last = open_state_dict(w.reader, "llm/",
                                {.rank = 1, .world = 2, .rules = {{"*.o_proj.weight", -1}, {"*.qkv.weight", -2}}});
    CHECK(last.at("l0.o_proj.weight").shape() == Shape{4, 4});
    CHECK(last.at("l0.o_proj.weight").byte_offset() == 4 * 4);
    CHECK(last.at("l0.qkv.weight").shape() == Shape{4, 4});
    CHECK(last.at("l0.qkv.weight").byte_offset() == 16 * 4);
  }
  CHECK_THROWS_WITH(open_state_dict(w.reader, "llm/", {.rank = 0, .world = 2, .rules = {{"*.norm.weight", -2}}}),
                    Contains("'*.norm.weight'") && Contains("dimension -2") && Contains("'llm/l0.norm.weight'"));
  // A rule every match of which an earlier rule took is named as shadowed, not as a typo.
  CHECK_THROWS_WITH(open_state_dict(w.reader, "llm/", {.rank = 0, .world = 2, .rules = {{"*.weight", ShardRule::whole},
                                                                                         {"*.qkv.weight", 0}}}),
                    Contains("'*.qkv.weight'") && Contains("taken by an earlier rule '*.weight'"));
  w.reader.flush();
  CHECK(record_refcount(c, "llm/") == 0);  // nothing kept
}

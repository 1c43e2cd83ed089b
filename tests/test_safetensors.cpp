// Publishing from a reader in pieces (StateDictEntry::read, PublishOptions::
// staging_bytes) and from a safetensors file (memcuda/safetensors.hpp): the
// bytes arrive whole, read by another process; the reader is never asked for
// more than half the staging size; a reader that fails and a malformed file
// are typed errors that leave nothing under the prefix. Real redis-server,
// a real worker process; host backend here, cuda in the [gpu] case.
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "support/gpu.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/worker.hpp"

using namespace memcuda;

namespace {

struct Tensor {
  std::string name, dtype;
  std::vector<std::int64_t> shape;
  std::string bytes;
};

// A safetensors file written by the format's rules: an 8-byte little-endian
// header length, the JSON header, the data. `header_override` replaces the
// generated header (malformed files).
std::string write_safetensors(const std::vector<Tensor>& ts, const std::string& tag,
                              const std::string& header_override = {}) {
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}", data;
  for (const auto& t : ts) {
    header += ",\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
    for (std::size_t i = 0; i < t.shape.size(); ++i) header += (i ? "," : "") + std::to_string(t.shape[i]);
    header += "],\"data_offsets\":[" + std::to_string(data.size()) + "," + std::to_string(data.size() + t.bytes.size()) +
              "]}";
    data += t.bytes;
  }
  header += "}";
  if (!header_override.empty()) header = header_override;
  const auto path = std::filesystem::temp_directory_path() /
                    ("memcuda-test-" + std::to_string(::getpid()) + "-" + tag + ".safetensors");
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>((n >> (8 * i)) & 0xff));
  f << header << data;
  return path.string();
}

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

std::vector<float> ramp(std::size_t n, float from) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

double sum(const std::vector<float>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

// A small model: a 300x1000 f32 matrix (1.2 MB, many pieces at a 64 KiB
// staging size), an f32 vector, an i64 vector and a bf16 matrix.
std::vector<Tensor> model() {
  std::vector<std::int64_t> ids(100);
  std::iota(ids.begin(), ids.end(), -50);
  std::vector<std::uint16_t> half(64, 0x3f80);  // bf16 1.0
  return {{"layers.0.weight", "F32", {300, 1000}, bytes_of(ramp(300000, 0.0f))},
          {"layers.0.bias", "F32", {1000}, bytes_of(ramp(1000, 7.0f))},
          {"ids", "I64", {100}, bytes_of(ids)},
          {"norm", "BF16", {8, 8}, bytes_of(half)}};
}

bool nothing_under(TensorRegistry& reg, const std::string& prefix) { return reg.list(prefix + "*").empty(); }

}  // namespace

TEST_CASE("safetensors: a file published in pieces arrives whole, read by another process", "[redis][state_dict]") {
  test::RedisServer srv;
  TensorRegistry reg(test::host_options(srv));
  const auto ts = model();
  const std::string path = write_safetensors(ts, "whole");
  auto entries = safetensors_entries(path);
  REQUIRE(entries.size() == 4);
  CHECK(entries[0].name == "layers.0.weight");
  CHECK(entries[0].dtype == DType::f32);
  CHECK(entries[0].shape == Shape{300, 1000});
  CHECK(entries[3].dtype == DType::bf16);

  // Every read the publish makes, through a wrapper: sizes and order.
  std::size_t largest = 0, calls = 0;
  bool in_order = true;
  for (auto& e : entries) {
    auto inner = e.read;
    auto next = std::make_shared<std::uint64_t>(0);
    e.read = [&, inner, next](std::uint64_t off, void* dst, std::size_t n) {
      largest = std::max(largest, n);
      ++calls;
      in_order = in_order && off == *next;
      *next = off + n;
      inner(off, dst, n);
    };
  }
  PublishOptions po;
  po.create.persistent = true;
  po.staging_bytes = 64 << 10;
  auto sd = publish_state_dict(reg, "st/", entries, po);
  REQUIRE(sd.size() == 4);
  CHECK(largest <= (32u << 10));
  CHECK(calls >= 1'200'000 / (32 << 10));
  CHECK(in_order);
  for (const auto& t : ts) {
    INFO(t.name);
    const auto& got = sd.at(t.name);
    REQUIRE(got.bytes() == t.bytes.size());
    CHECK(std::memcmp(got.data(), t.bytes.data(), t.bytes.size()) == 0);
  }
  sd.clear();
  reg.flush();

  auto w = test::start_worker(srv.unix_url(), {"--no-control", "--backend", "host"});
  CHECK_FALSE(test::ready(*w));  // READY, and a follower
  CHECK(w->ask("get st/layers.0.weight").find("sum=" + std::to_string(static_cast<long long>(sum(ramp(300000, 0.0f))))) !=
        std::string::npos);
  CHECK(w->ask("get st/layers.0.bias").find("sum=" + std::to_string(static_cast<long long>(sum(ramp(1000, 7.0f))))) !=
        std::string::npos);
  std::filesystem::remove(path);
}

TEST_CASE("safetensors: a reader that fails, a file that shrank and bad options leave nothing behind",
          "[redis][state_dict]") {
  test::RedisServer srv;
  TensorRegistry reg(test::host_options(srv));
  std::vector<float> a(16, 1.0f);

  SECTION("a reader that throws: its error, and the batch removed") {
    std::vector<StateDictEntry> entries = {{"a", DType::f32, {16}, a.data()}, {"b", DType::f32, {4096}, nullptr}};
    entries[1].read = [](std::uint64_t off, void*, std::size_t) {
      if (off > 0) throw Unavailable("the source went away");
    };
    PublishOptions po;
    po.staging_bytes = 8192;
    CHECK_THROWS_WITH(publish_state_dict(reg, "fail/", entries, po), Catch::Contains("the source went away"));
    CHECK(nothing_under(reg, "fail/"));
  }
  SECTION("staging below 8 KiB is refused before anything is made") {
    PublishOptions po;
    po.staging_bytes = 4096;
    std::vector<StateDictEntry> entries = {{"a", DType::f32, {16}, a.data()}};
    CHECK_THROWS_AS(publish_state_dict(reg, "small/", entries, po), InvalidArgument);
    CHECK(nothing_under(reg, "small/"));
  }
  SECTION("a file cut short after its header was read") {
    const std::string path = write_safetensors(model(), "shrunk");
    auto entries = safetensors_entries(path);
    std::filesystem::resize_file(path, 8 + 100);  // inside the header's length: every read comes up short
    try {
      publish_state_dict(reg, "shrunk/", entries);
      FAIL("published a file that shrank");
    } catch (const InvalidArgument& e) {
      CHECK_THAT(e.what(), Catch::Contains("ends at byte"));
    }
    CHECK(nothing_under(reg, "shrunk/"));
    std::filesystem::remove(path);
  }
}

TEST_CASE("safetensors: malformed files are InvalidArgument naming the fault, a missing one NotFound", "[state_dict]") {
  const std::vector<Tensor> one = {{"w", "F32", {4}, bytes_of(ramp(4, 0.0f))}};
  struct Case {
    const char* what;
    std::string header;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"not JSON", "{\"w\": [", "invalid JSON"},
      {"not an object", "[1,2]", "not a JSON object"},
      {"an F8 dtype", R"({"w":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", "which mem-cuda has not"},
      {"offsets that do not match the shape", R"({"w":{"dtype":"F32","shape":[5],"data_offsets":[0,16]}})",
       "need 20"},
      {"offsets past the end", R"({"w":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", "lie outside"},
      {"no dtype", R"({"w":{"shape":[4],"data_offsets":[0,16]}})", "lacks a string dtype"},
      {"a negative dimension", R"({"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", "negative dimension"},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    const std::string path = write_safetensors(one, "bad", c.header);
    try {
      (void)safetensors_entries(path);
      FAIL("accepted");
    } catch (const InvalidArgument& e) {
      CHECK_THAT(e.what(), Catch::Contains(c.says));
    }
    std::filesystem::remove(path);
  }
  {
    INFO("a header length past the end of the file");
    const auto path = std::filesystem::temp_directory_path() / ("memcuda-test-len-" + std::to_string(::getpid()));
    std::ofstream(path, std::ios::binary) << std::string("\xff\xff\x00\x00\x00\x00\x00\x00{}", 10);
    CHECK_THROWS_WITH(safetensors_entries(path.string()), Catch::Contains("header length"));
    std::filesystem::remove(path);
  }
  CHECK_THROWS_AS(safetensors_entries("/nonexistent/model.safetensors"), NotFound);
}

TEST_CASE("safetensors: a file published into device tensors through a small staging buffer", "[gpu][state_dict]") {
  MEMCUDA_REQUIRE_GPU();
  test::RedisServer srv;
  auto o = test::host_options(srv);
  o.default_backend = BackendKind::cuda;
  TensorRegistry reg(o);
  const auto ts = model();
  const std::string path = write_safetensors(ts, "gpu");
  PublishOptions po;
  po.staging_bytes = 64 << 10;  // 1.2 MB through 2 x 32 KiB
  auto sd = publish_state_dict(reg, "gst/", safetensors_entries(path), po);
  for (const auto& t : ts) {
    INFO(t.name);
    const auto& got = sd.at(t.name);
    REQUIRE(got.backend() == BackendKind::cuda);
    std::vector<std::byte> back(t.bytes.size());
    got.copy_to_host(back);
    CHECK(std::memcmp(back.data(), t.bytes.data(), t.bytes.size()) == 0);
  }
  std::filesystem::remove(path);
}

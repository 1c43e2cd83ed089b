// memcuda/dtype.hpp: the 13 element types, their wire names and sizes, and
// the compile-time mapping from C++ types.
#include <catch2/catch.hpp>
#include <cstdint>
#include <set>
#include <string>
#include <type_traits>

#include "memcuda/dtype.hpp"

using memcuda::DType;

namespace {

struct Expected {
  DType type;
  const char* name;
  std::size_t size;
};

constexpr Expected kTable[] = {
    {DType::bool_, "bool", 1}, {DType::u8, "u8", 1},     {DType::i8, "i8", 1},
    {DType::i16, "i16", 2},    {DType::i32, "i32", 4},   {DType::i64, "i64", 8},
    {DType::u16, "u16", 2},    {DType::u32, "u32", 4},   {DType::u64, "u64", 8},
    {DType::f16, "f16", 2},    {DType::bf16, "bf16", 2}, {DType::f32, "f32", 4},
    {DType::f64, "f64", 8},
};

// Compile-time mapping; a wrong entry fails the build, not just the run.
static_assert(memcuda::dtype_of<bool> == DType::bool_);
static_assert(memcuda::dtype_of<std::int8_t> == DType::i8);
static_assert(memcuda::dtype_of<std::int16_t> == DType::i16);
static_assert(memcuda::dtype_of<std::int32_t> == DType::i32);
static_assert(memcuda::dtype_of<std::int64_t> == DType::i64);
static_assert(memcuda::dtype_of<long> == (sizeof(long) == 8 ? DType::i64 : DType::i32));
static_assert(memcuda::dtype_of<long long> == DType::i64);
static_assert(memcuda::dtype_of<std::uint8_t> == DType::u8);
static_assert(memcuda::dtype_of<std::uint16_t> == DType::u16);
static_assert(memcuda::dtype_of<std::uint32_t> == DType::u32);
static_assert(memcuda::dtype_of<std::uint64_t> == DType::u64);
static_assert(memcuda::dtype_of<unsigned long> ==
              (sizeof(unsigned long) == 8 ? DType::u64 : DType::u32));
static_assert(memcuda::dtype_of<unsigned long long> == DType::u64);
static_assert(memcuda::dtype_of<float> == DType::f32);
static_assert(memcuda::dtype_of<double> == DType::f64);
static_assert(memcuda::dtype_of<memcuda::half> == DType::f16);
static_assert(memcuda::dtype_of<memcuda::bfloat16> == DType::bf16);
static_assert(memcuda::dtype_of<const float> == DType::f32);
static_assert(memcuda::dtype_of<volatile std::int16_t> == DType::i16);
static_assert(memcuda::dtype_of<const volatile double> == DType::f64);
#if MEMCUDA_HAS_CUDA_FP16()
static_assert(memcuda::dtype_of<__half> == DType::f16);
static_assert(memcuda::TensorElement<__half>);
#endif
#if MEMCUDA_HAS_CUDA_BF16()
static_assert(memcuda::dtype_of<__nv_bfloat16> == DType::bf16);
static_assert(memcuda::TensorElement<const __nv_bfloat16>);
#endif

static_assert(memcuda::TensorElement<float>);
static_assert(memcuda::TensorElement<const std::uint64_t>);
static_assert(memcuda::TensorElement<memcuda::half>);
static_assert(!memcuda::TensorElement<char>);
static_assert(!memcuda::TensorElement<wchar_t>);
static_assert(!memcuda::TensorElement<char8_t>);
static_assert(!memcuda::TensorElement<long double>);
static_assert(!memcuda::TensorElement<float*>);
static_assert(!memcuda::TensorElement<float&>);
static_assert(!memcuda::TensorElement<std::string>);
static_assert(!memcuda::TensorElement<void>);
struct NotAnElement {};
static_assert(!memcuda::TensorElement<NotAnElement>);

static_assert(sizeof(memcuda::half) == 2 && std::is_trivially_copyable_v<memcuda::half>);
static_assert(sizeof(memcuda::bfloat16) == 2 && std::is_trivially_copyable_v<memcuda::bfloat16>);
static_assert(memcuda::itemsize(DType::bf16) == 2 && memcuda::to_string(DType::f64) == "f64");

template <class T>
bool maps_to(DType d) {
  return memcuda::dtype_of<T> == d && memcuda::itemsize(memcuda::dtype_of<T>) == sizeof(T);
}

}  // namespace

TEST_CASE("every dtype has its wire name and size", "[dtype]") {
  REQUIRE(memcuda::kAllDTypes.size() == std::size(kTable));
  std::set<std::string> names;
  for (std::size_t i = 0; i < std::size(kTable); ++i) {
    const Expected& e = kTable[i];
    INFO("dtype " << e.name);
    CHECK(memcuda::kAllDTypes[i] == e.type);
    CHECK(static_cast<std::size_t>(e.type) == i);  // enum values are part of the ABI
    CHECK(memcuda::to_string(e.type) == e.name);
    CHECK(memcuda::itemsize(e.type) == e.size);
    names.insert(e.name);
  }
  CHECK(names.size() == 13);
}

TEST_CASE("dtype names round-trip through dtype_from_string", "[dtype]") {
  for (DType t : memcuda::kAllDTypes) {
    auto back = memcuda::dtype_from_string(memcuda::to_string(t));
    REQUIRE(back.has_value());
    CHECK(*back == t);
  }
}

TEST_CASE("dtype_from_string accepts the documented aliases", "[dtype]") {
  struct Alias {
    const char* name;
    DType type;
  };
  const Alias aliases[] = {
      {"float16", DType::f16},   {"float32", DType::f32}, {"float64", DType::f64},
      {"bfloat16", DType::bf16}, {"int8", DType::i8},     {"int16", DType::i16},
      {"int32", DType::i32},     {"int64", DType::i64},   {"uint8", DType::u8},
      {"uint16", DType::u16},    {"uint32", DType::u32},  {"uint64", DType::u64},
  };
  for (const Alias& a : aliases) {
    INFO("alias " << a.name);
    auto t = memcuda::dtype_from_string(a.name);
    REQUIRE(t.has_value());
    CHECK(*t == a.type);
  }
}

TEST_CASE("dtype_from_string rejects everything else", "[dtype]") {
  const char* bad[] = {"",     "F32",       "f 32", " f32",  "f32 ",    "float", "double",
                       "half", "int",       "f128", "bool_", "Bool",    "i128",  "float32x",
                       "u8\n", "complex64", "bf8",  "fp16",  "uint128", "f3"};
  for (const char* s : bad) {
    INFO("name \"" << s << "\"");
    CHECK_FALSE(memcuda::dtype_from_string(s).has_value());
  }
  CHECK_FALSE(memcuda::dtype_from_string(std::string_view("f32\0", 4)).has_value());
}

TEST_CASE("dtype_of maps each C++ element type", "[dtype]") {
  CHECK(maps_to<bool>(DType::bool_));
  CHECK(maps_to<std::int8_t>(DType::i8));
  CHECK(maps_to<std::int16_t>(DType::i16));
  CHECK(maps_to<std::int32_t>(DType::i32));
  CHECK(maps_to<std::int64_t>(DType::i64));
  CHECK(maps_to<long long>(DType::i64));
  CHECK(maps_to<std::uint8_t>(DType::u8));
  CHECK(maps_to<std::uint16_t>(DType::u16));
  CHECK(maps_to<std::uint32_t>(DType::u32));
  CHECK(maps_to<std::uint64_t>(DType::u64));
  CHECK(maps_to<unsigned long long>(DType::u64));
  CHECK(maps_to<float>(DType::f32));
  CHECK(maps_to<double>(DType::f64));
  CHECK(maps_to<memcuda::half>(DType::f16));
  CHECK(maps_to<memcuda::bfloat16>(DType::bf16));
  CHECK(maps_to<const float>(DType::f32));
  CHECK(maps_to<const volatile std::uint32_t>(DType::u32));
#if MEMCUDA_HAS_CUDA_FP16()
  CHECK(maps_to<__half>(DType::f16));
#endif
#if MEMCUDA_HAS_CUDA_BF16()
  CHECK(maps_to<__nv_bfloat16>(DType::bf16));
#endif
}

TEST_CASE("out-of-range DType values are harmless", "[dtype]") {
  auto bogus = static_cast<DType>(200);
  CHECK(memcuda::itemsize(bogus) == 0);
  CHECK(memcuda::to_string(bogus).empty());
}

// libFuzzer target: a shape as text (shape_from_string), the form the tensor
// Hash stores ("[2,3]"); also the tensor name rules, which live beside it.
//
// Checks:
//  - shape_from_string throws nothing but ProtocolError;
//  - an accepted shape passes validate_shape, shape_to_string of it parses
//    back to the same shape, and element_count, byte_size (every dtype) and
//    contiguous_strides throw nothing but ProtocolError;
//  - is_valid_name(text) is true exactly when validate_name(text) does not
//    throw, and validate_name throws nothing but ProtocolError(bad_name).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_support.hpp"
#include "memcuda/dtype.hpp"
#include "memcuda/error.hpp"
#include "memcuda/shape.hpp"

namespace {

// Runs f; true when it returned, false when it threw ProtocolError.
template <class F>
bool protocol_call(const char* what, F&& f) {
  try {
    f();
    return true;
  } catch (const memcuda::ProtocolError& e) {
    MEMCUDA_FUZZ_CHECK(*e.what() != '\0', "empty ProtocolError message");
    return false;
  } catch (...) {
    MEMCUDA_FUZZ_UNEXPECTED(what);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text = memcuda_fuzz::as_text(data, size);

  bool valid = protocol_call("validate_name", [&] { memcuda::validate_name(text); });
  MEMCUDA_FUZZ_CHECK(valid == memcuda::is_valid_name(text), memcuda_fuzz::shown(text));

  memcuda::Shape shape;
  if (!protocol_call("shape_from_string", [&] { shape = memcuda::shape_from_string(text); }))
    return 0;
  MEMCUDA_FUZZ_CHECK(protocol_call("validate_shape", [&] { memcuda::validate_shape(shape); }));
  std::string canonical = memcuda::shape_to_string(shape);
  memcuda::Shape back;
  MEMCUDA_FUZZ_CHECK(
      protocol_call("shape_from_string", [&] { back = memcuda::shape_from_string(canonical); }),
      canonical);
  MEMCUDA_FUZZ_CHECK(back == shape, canonical);

  std::uint64_t elements = 0;
  bool counted = protocol_call("element_count", [&] { elements = memcuda::element_count(shape); });
  for (memcuda::DType dt : memcuda::kAllDTypes) {
    std::uint64_t bytes = 0;
    if (protocol_call("byte_size", [&] { bytes = memcuda::byte_size(dt, shape); }))
      MEMCUDA_FUZZ_CHECK(counted && bytes == elements * memcuda::itemsize(dt) &&
                         bytes <= memcuda::kMaxTensorBytes);
  }
  protocol_call("contiguous_strides", [&] {
    memcuda::Shape strides = memcuda::contiguous_strides(shape);
    MEMCUDA_FUZZ_CHECK(strides.size() == shape.size());
  });
  return 0;
}

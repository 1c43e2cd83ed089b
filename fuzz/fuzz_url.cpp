// libFuzzer target: a Redis URL (redis::parse_url), as MEMCUDA_REDIS_URL or
// a caller may give it.
//
// Checks:
//  - parse_url throws nothing but InvalidArgument;
//  - its message holds no control bytes (options.hpp: "neither secrets nor
//    terminal escapes leak into logs");
//  - Options that parse_url returns pass Options::validate() (options.hpp:
//    "what parse_url produces always passes"), and describe() works.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_support.hpp"
#include "memcuda/error.hpp"
#include "memcuda/redis/options.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view url = memcuda_fuzz::as_text(data, size);
  memcuda::redis::Options o;
  try {
    o = memcuda::redis::parse_url(url);
  } catch (const memcuda::InvalidArgument& e) {
    std::string_view msg = e.what();
    for (char c : msg) {
      auto b = static_cast<unsigned char>(c);
      MEMCUDA_FUZZ_CHECK(b >= 0x20 && b != 0x7f,
                         "control byte in the message: " + memcuda_fuzz::shown(msg));
    }
    return 0;
  } catch (...) {
    MEMCUDA_FUZZ_UNEXPECTED("parse_url");
  }
  try {
    o.validate();
  } catch (...) {
    MEMCUDA_FUZZ_UNEXPECTED("Options::validate of what parse_url returned");
  }
  (void)o.describe();
  return 0;
}

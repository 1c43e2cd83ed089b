// libFuzzer target: the layout an Arrow import takes from a producer's
// array (memcuda::detail::arrow_import_layout, memcuda/arrow_share.hpp),
// whose offsets and lengths are untrusted. An input is one line of text:
//
//   <format> <offset> <length>                          a flat array
//   +w:<n> <offset> <length> <format> <offset> <length>  a fixed-size list and its child
//
// over a small buffer. Checks:
//  - arrow_import_layout throws nothing but InvalidArgument / TypeMismatch;
//  - an accepted layout starts at the element the offsets name, computed
//    here without overflow (__int128), never at an address that wrapped;
//  - its shape holds the elements the array describes (its limits are the
//    share's to check, after this).
// UBSan aborts on any signed overflow on the way.
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.hpp"
#include "memcuda/arrow_share.hpp"

namespace {

std::vector<std::string> words(std::string_view s) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i < s.size() && out.size() < 7) {
    while (i < s.size() && s[i] == ' ') ++i;
    std::size_t j = i;
    while (j < s.size() && s[j] != ' ' && s[j] != '\n') ++j;
    if (j > i) out.emplace_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

bool number(const std::string& w, std::int64_t& v) {
  auto [p, ec] = std::from_chars(w.data(), w.data() + w.size(), v);
  return ec == std::errc() && p == w.data() + w.size();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto w = words(memcuda_fuzz::as_text(data, size));
  if (w.size() != 3 && w.size() != 6) return 0;
  std::int64_t off = 0, len = 0, coff = 0, clen = 0;
  if (!number(w[1], off) || !number(w[2], len)) return 0;
  const bool list = w.size() == 6;
  if (list && (!number(w[4], coff) || !number(w[5], clen))) return 0;

  static double buffer[64];
  const void* bufs[2] = {nullptr, buffer};
  const void* list_bufs[1] = {nullptr};
  ArrowSchema schema{}, child_schema{};
  ArrowArray array{}, child{};
  ArrowSchema* schema_children[1] = {&child_schema};
  ArrowArray* array_children[1] = {&child};
  schema.format = w[0].c_str();
  array.offset = off;
  array.length = len;
  if (!list) {
    array.n_buffers = 2;
    array.buffers = bufs;
  } else {
    schema.n_children = 1;
    schema.children = schema_children;
    child_schema.format = w[3].c_str();
    array.n_buffers = 1;
    array.buffers = list_bufs;
    array.n_children = 1;
    array.children = array_children;
    child.offset = coff;
    child.length = clen;
    child.n_buffers = 2;
    child.buffers = bufs;
  }
  memcuda::detail::ArrowImportLayout l;
  try {
    l = memcuda::detail::arrow_import_layout(schema, array, "fuzz");
  } catch (const memcuda::InvalidArgument& e) {
    MEMCUDA_FUZZ_CHECK(*e.what() != '\0', "empty InvalidArgument message");
    return 0;
  } catch (const memcuda::TypeMismatch&) {
    return 0;
  } catch (...) {
    MEMCUDA_FUZZ_UNEXPECTED("arrow_import_layout");
  }
  // Where the first element is, computed wide: the layout must agree.
  const __int128 item = static_cast<__int128>(memcuda::itemsize(l.dtype));
  __int128 first = off;
  std::int64_t n = 1;
  if (list) {
    std::from_chars(w[0].data() + 3, w[0].data() + w[0].size(), n);
    first = static_cast<__int128>(coff) + static_cast<__int128>(off) * n;
  }
  const __int128 at = static_cast<__int128>(reinterpret_cast<std::uintptr_t>(buffer)) + first * item;
  MEMCUDA_FUZZ_CHECK(at == static_cast<__int128>(reinterpret_cast<std::uintptr_t>(l.data)),
                     "the first element is not at offset * item size: " + memcuda_fuzz::shown(w[0]));
  __int128 elements = 1;  // the shape is validated by the share that follows, not here
  for (std::int64_t d : l.shape) elements *= d;
  MEMCUDA_FUZZ_CHECK(elements == static_cast<__int128>(len) * n, "shape and length disagree");
  return 0;
}

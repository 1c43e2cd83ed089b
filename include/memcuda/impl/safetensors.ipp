// safetensors_entries (memcuda/safetensors.hpp).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "memcuda/detail/fd/unique_fd.hpp"
#include "memcuda/protocol/json_util.hpp"
#include "memcuda/safetensors.hpp"

MEMCUDA_NAMESPACE_BEGIN

namespace detail::safetensors {

inline constexpr std::uint64_t kMaxHeader = std::uint64_t{100} << 20;  // the format's own limit

[[noreturn]] inline void bad(const std::string& path, const std::string& why) {
  throw InvalidArgument("'" + path + "' is not a safetensors file mem-cuda can publish: " + why);
}

inline std::optional<DType> dtype_of(std::string_view s) {
  static constexpr std::pair<std::string_view, DType> kMap[] = {
      {"BOOL", DType::bool_}, {"U8", DType::u8},   {"I8", DType::i8},   {"I16", DType::i16}, {"I32", DType::i32},
      {"I64", DType::i64},    {"U16", DType::u16}, {"U32", DType::u32}, {"U64", DType::u64}, {"F16", DType::f16},
      {"BF16", DType::bf16},  {"F32", DType::f32}, {"F64", DType::f64}};
  for (auto& [k, v] : kMap)
    if (k == s) return v;
  return std::nullopt;
}

// pread of exactly `n` bytes at `off`.
inline void read_exact(int fd, const std::string& path, std::uint64_t off, void* dst, std::size_t n) {
  auto* p = static_cast<unsigned char*>(dst);
  while (n > 0) {
    ssize_t got = ::pread(fd, p, n, static_cast<off_t>(off));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw Unavailable("reading '" + path + "' failed: " + std::strerror(errno));
    if (got == 0) bad(path, "it ends at byte " + std::to_string(off) + ", before the data its header describes");
    p += got;
    off += static_cast<std::uint64_t>(got);
    n -= static_cast<std::size_t>(got);
  }
}

}  // namespace detail::safetensors

std::vector<StateDictEntry> safetensors_entries(const std::string& path) {
  namespace st = detail::safetensors;
  namespace json = boost::json;
  auto fd = std::make_shared<detail::UniqueFd>(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!*fd) {
    if (errno == ENOENT) throw NotFound("safetensors file '" + path + "' does not exist");
    throw InvalidArgument("cannot open safetensors file '" + path + "': " + std::strerror(errno));
  }
  struct stat sb{};
  if (::fstat(fd->get(), &sb) != 0 || !S_ISREG(sb.st_mode)) st::bad(path, "not a regular file");
  const auto size = static_cast<std::uint64_t>(sb.st_size);
  if (size < 8) st::bad(path, "shorter than the 8-byte header length");
  unsigned char len8[8];
  st::read_exact(fd->get(), path, 0, len8, 8);
  std::uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | len8[i];
  if (hlen > st::kMaxHeader || hlen > size - 8)
    st::bad(path, "its header length (" + std::to_string(hlen) + " bytes) exceeds the file or the format's 100 MiB");
  std::string header(static_cast<std::size_t>(hlen), '\0');
  st::read_exact(fd->get(), path, 8, header.data(), header.size());
  json::value doc = protocol::detail::parse_document(header, "safetensors header of '" + path + "'", st::kMaxHeader);
  if (!doc.is_object()) st::bad(path, "its header is not a JSON object");
  const std::uint64_t data_start = 8 + hlen;
  const std::uint64_t data_size = size - data_start;
  std::vector<StateDictEntry> out;
  for (const auto& [key, v] : doc.as_object()) {
    const std::string name(key);
    if (name == "__metadata__") continue;
    const std::string what = "tensor '" + name + "'";
    if (!v.is_object()) st::bad(path, what + " is not an object");
    const auto& o = v.as_object();
    const json::value* dt = protocol::detail::find(o, "dtype");
    const json::value* sh = protocol::detail::find(o, "shape");
    const json::value* offs = protocol::detail::find(o, "data_offsets");
    if (!dt || !dt->is_string() || !sh || !sh->is_array() || !offs || !offs->is_array() || offs->as_array().size() != 2)
      st::bad(path, what + " lacks a string dtype, a shape array or a data_offsets pair");
    auto dtype = st::dtype_of(std::string_view(dt->as_string()));
    if (!dtype) st::bad(path, what + " has dtype " + std::string(dt->as_string()) + ", which mem-cuda has not");
    std::vector<std::int64_t> dims;
    std::uint64_t elems = 1;
    for (const auto& d : sh->as_array()) {
      if (!d.is_int64() && !d.is_uint64()) st::bad(path, what + " has a shape entry that is not an integer");
      if (d.is_int64() && d.as_int64() < 0) st::bad(path, what + " has a negative dimension");
      const auto x = d.is_int64() ? static_cast<std::uint64_t>(d.as_int64()) : d.as_uint64();
      if (x != 0 && elems > (std::uint64_t{1} << 62) / x) st::bad(path, what + " has too many elements");
      elems *= x;
      dims.push_back(static_cast<std::int64_t>(x));
    }
    auto off_at = [&](std::size_t i) -> std::uint64_t {
      const json::value& x = offs->as_array()[i];
      if (x.is_uint64()) return x.as_uint64();
      if (x.is_int64() && x.as_int64() >= 0) return static_cast<std::uint64_t>(x.as_int64());
      st::bad(path, what + " has a data offset that is not a non-negative integer");
    };
    const std::uint64_t begin = off_at(0), end = off_at(1);
    if (begin > end || end > data_size)
      st::bad(path, what + "'s data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                        ") lie outside the file's " + std::to_string(data_size) + " data bytes");
    if (end - begin != elems * itemsize(*dtype))
      st::bad(path, what + " has " + std::to_string(end - begin) + " data bytes, but its shape and dtype need " +
                        std::to_string(elems * itemsize(*dtype)));
    StateDictEntry e;
    e.name = name;
    e.dtype = *dtype;
    e.shape = std::move(dims);
    const std::uint64_t base = data_start + begin;
    e.read = [fd, path, base](std::uint64_t off, void* dst, std::size_t n) {
      st::read_exact(fd->get(), path, base + off, dst, n);
    };
    out.push_back(std::move(e));
  }
  return out;
}

MEMCUDA_NAMESPACE_END  // namespace memcuda

// Text rendering for the memcuda tool: human units, ages, hex, aligned
// tables, tensor elements decoded per dtype, and holder ids that name a
// process. Pure functions; nothing here talks to Redis or a device.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <algorithm>
#include <bit>
#include <boost/json.hpp>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "memcuda/detail/base/holder_id.hpp"
#include "memcuda/detail/fd/fd_access.hpp"
#include "memcuda/dtype.hpp"
#include "memcuda/shape.hpp"

namespace memcuda::cli {

// 1023 -> "1023 B", 1536 -> "1.5 KiB", 3 << 30 -> "3.0 GiB".
inline std::string human_bytes(std::uint64_t n) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (n < 1024) return std::to_string(n) + " B";
  double v = static_cast<double>(n);
  std::size_t u = 0;
  while (v >= 1024.0 && u + 1 < std::size(kUnits)) {
    v /= 1024.0;
    ++u;
  }
  // 1023.96 KiB would print as "1024.0 KiB": show the next unit instead.
  if (v >= 1023.95 && u + 1 < std::size(kUnits)) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  return buf;
}

// Time since an event, in its largest whole unit: "42s", "5m", "3h", "2d".
// A negative age (clocks of two processes disagree) shows as "0s".
inline std::string human_age(std::int64_t ms) {
  std::int64_t s = ms < 0 ? 0 : ms / 1000;
  if (s < 60) return std::to_string(s) + "s";
  if (s < 3600) return std::to_string(s / 60) + "m";
  if (s < 86400) return std::to_string(s / 3600) + "h";
  return std::to_string(s / 86400) + "d";
}

inline std::string hex(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) {
    auto b = static_cast<unsigned char>(c);
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

// Columns of text, padded to the widest cell; numeric columns right-aligned.
class Table {
 public:
  struct Column {
    std::string title;
    bool right = false;
  };
  explicit Table(std::vector<Column> cols) : cols_(std::move(cols)) {}

  void add(std::vector<std::string> row) {
    row.resize(cols_.size());
    rows_.push_back(std::move(row));
  }
  bool empty() const noexcept { return rows_.empty(); }

  std::string render() const {
    std::vector<std::size_t> w(cols_.size());
    return render_with(w, true);
  }

  // Renders the rows added since the last flush and forgets them, so that a
  // long listing is printed a page at a time: the header comes with the
  // first page, and a column only ever widens (a wider cell of a later page
  // widens it from there on).
  std::string flush() {
    if (widths_.empty()) widths_.resize(cols_.size());
    std::string out = render_with(widths_, !flushed_);
    flushed_ = true;
    rows_.clear();
    return out;
  }

 private:
  std::string render_with(std::vector<std::size_t>& w, bool header) const {
    for (std::size_t c = 0; c < cols_.size(); ++c) {
      w[c] = std::max(w[c], cols_[c].title.size());
      for (const auto& r : rows_) w[c] = std::max(w[c], r[c].size());
    }
    std::string out;
    auto line = [&](auto cell) {
      std::string l;
      for (std::size_t c = 0; c < cols_.size(); ++c) {
        std::string v = cell(c);
        std::string pad(w[c] - v.size(), ' ');
        if (c) l += "  ";
        l += cols_[c].right ? pad + v : v + pad;
      }
      while (!l.empty() && l.back() == ' ') l.pop_back();
      out += l + "\n";
    };
    if (header) line([&](std::size_t c) { return cols_[c].title; });
    for (const auto& r : rows_) line([&](std::size_t c) { return r[c]; });
    return out;
  }

  std::vector<Column> cols_;
  std::vector<std::vector<std::string>> rows_;
  std::vector<std::size_t> widths_;  // flush(): the widths so far
  bool flushed_ = false;
};

// IEEE binary16 -> binary32, exact (every half is a float): subnormals,
// infinities and NaN (payload kept) included.
inline float half_to_float(std::uint16_t h) {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      mant <<= 1;
      ++e;
    } while ((mant & 0x400u) == 0);
    bits = sign | (static_cast<std::uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

// bfloat16 is the high half of a binary32.
inline float bfloat16_to_float(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

// The shortest text that reads back as the same value ("0.1", "1e+30").
template <class F>
std::string float_text(F v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

namespace detail {

template <class T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Calls f with the element at `p` (itemsize(dtype) bytes, host memory)
// decoded: a bool, a 64-bit integer, or a float or double (f16 and bf16
// widened to float).
template <class F>
auto visit_element(DType dtype, const std::byte* p, F&& f) {
  switch (dtype) {
    case DType::bool_: return f(load<std::uint8_t>(p) != 0);
    case DType::u8: return f(std::uint64_t{load<std::uint8_t>(p)});
    case DType::i8: return f(std::int64_t{load<std::int8_t>(p)});
    case DType::i16: return f(std::int64_t{load<std::int16_t>(p)});
    case DType::i32: return f(std::int64_t{load<std::int32_t>(p)});
    case DType::i64: return f(load<std::int64_t>(p));
    case DType::u16: return f(std::uint64_t{load<std::uint16_t>(p)});
    case DType::u32: return f(std::uint64_t{load<std::uint32_t>(p)});
    case DType::u64: return f(load<std::uint64_t>(p));
    case DType::f16: return f(half_to_float(load<std::uint16_t>(p)));
    case DType::bf16: return f(bfloat16_to_float(load<std::uint16_t>(p)));
    case DType::f32: return f(load<float>(p));
    case DType::f64: break;
  }
  return f(load<double>(p));
}

}  // namespace detail

// One element at `p` as text.
inline std::string element_text(DType dtype, const std::byte* p) {
  return detail::visit_element(dtype, p, [](auto v) -> std::string {
    if constexpr (std::is_same_v<decltype(v), bool>) return v ? "true" : "false";
    else if constexpr (std::is_integral_v<decltype(v)>) return std::to_string(v);
    else return float_text(v);
  });
}

// The same element as a JSON value: a boolean, an integer or a number (JSON
// cannot spell NaN or infinity: those become the strings "nan", "inf").
inline boost::json::value element_json(DType dtype, const std::byte* p) {
  return detail::visit_element(dtype, p, [](auto v) -> boost::json::value {
    if constexpr (std::is_floating_point_v<decltype(v)>)
      return std::isfinite(v) ? boost::json::value(static_cast<double>(v)) : boost::json::value(float_text(v));
    else return boost::json::value(v);
  });
}

// "--shape 2,3", "[2,3]", "2x3"; "" or "[]" is a scalar. Validated against
// the shape rules (rank, dimension range); ProtocolError otherwise, and
// std::nullopt when the text is not a list of integers at all.
inline std::optional<Shape> parse_shape(std::string_view text) {
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') text = text.substr(1, text.size() - 2);
  Shape s;
  if (text.empty()) return s;
  std::size_t pos = 0;
  for (;;) {
    auto end = text.find_first_of(",x", pos);
    std::string_view d = text.substr(pos, end == std::string_view::npos ? std::string_view::npos : end - pos);
    std::int64_t v = 0;
    auto [p, ec] = std::from_chars(d.data(), d.data() + d.size(), v);
    if (d.empty() || ec != std::errc() || p != d.data() + d.size()) return std::nullopt;
    s.push_back(v);
    if (end == std::string_view::npos) break;
    pos = end + 1;
  }
  return s;
}

// The process a holder id names, when it names one: a registry session
// "<pid>-<hex>" or a JSON client's "pid:<pid>" (the grammar is
// detail::HolderId's). "@name", "anonymous" and free-form holders name none,
// nor does "pid:<pid>@<ns>" of another pid namespace than this one's.
inline std::optional<pid_t> holder_pid(std::string_view id) {
  using memcuda::detail::HolderId;
  if (auto ns = HolderId::pid_namespace_of(id); ns && *ns != memcuda::detail::pid_namespace_inode()) return std::nullopt;
  return HolderId::pid_of(id);
}

// Whether a process with this pid exists on this machine. EPERM means it
// exists but belongs to someone else: alive.
inline bool pid_alive(pid_t pid) { return memcuda::detail::HolderId::process_alive(pid); }

}  // namespace memcuda::cli

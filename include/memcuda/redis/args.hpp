// Command arguments: Arg turns strings and integers into the bytes of one
// argument, Command is an owned argument list (for pipelines), and
// detail::append_resp encodes a command in RESP, the wire format Redis reads.
#pragma once

#include "memcuda/config.hpp"

#include <charconv>
#include <iterator>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

MEMCUDA_NAMESPACE_BEGIN namespace redis {

// One argument of a command: bytes, converted from strings and integers.
// Lvalue strings, string_views and C strings are viewed: their bytes must
// outlive the Arg. A temporary std::string is moved in and owned, so
// `std::vector<Arg> v{make_key()}` does not dangle.
class Arg {
 public:
  Arg(std::string_view s) noexcept : view_(s) {}                       // NOLINT
  Arg(const std::string& s) noexcept : view_(s) {}                     // NOLINT
  Arg(std::string&& s) noexcept : own_(std::move(s)), view_(own_) {}   // NOLINT
  Arg(const char* s) noexcept : view_(s) {}                            // NOLINT
  template <class I>
    requires(std::is_integral_v<I> && !std::is_same_v<I, bool> && !std::is_same_v<I, char>)
  Arg(I v) : own_(std::to_string(v)), view_(own_) {}                   // NOLINT
  Arg(const Arg& o) : own_(o.own_), view_(o.owns() ? std::string_view(own_) : o.view_) {}
  // A move keeps a view a view and re-points an owned string (its bytes
  // move with it, or are copied out of the small-string buffer), so a
  // std::vector<Arg> grows without copying every owned argument.
  Arg(Arg&& o) noexcept : Arg(std::move(o), o.owns()) {}
  Arg& operator=(const Arg&) = delete;
  std::string_view view() const noexcept { return view_; }

 private:
  Arg(Arg&& o, bool owned) noexcept : own_(std::move(o.own_)), view_(owned ? std::string_view(own_) : o.view_) {}
  bool owns() const noexcept { return !own_.empty() && view_.data() == own_.data(); }
  std::string own_;
  std::string_view view_;
};

// An owned argument list, e.g. one command of a pipeline.
using Command = std::vector<std::string>;

namespace detail {
inline std::string_view bytes_of(const Arg& a) noexcept { return a.view(); }
inline std::string_view bytes_of(const std::string& s) noexcept { return s; }

// RESP encoding of one command (an array of bulk strings), appended to
// `out`. Done here rather than by hiredis so that Connection can send the
// bytes with send(MSG_NOSIGNAL) and a pipeline in one write.
template <class Range>
void append_resp(std::string& out, const Range& args) {
  // Sized first and written with to_chars: this runs for every command on
  // the hot paths, and growing the buffer piecemeal (plus a to_string per
  // length) cost about as much as the rest of a get's client side.
  auto put_len = [&out](char tag, std::size_t n) {
    char buf[24];
    buf[0] = tag;
    char* end = std::to_chars(buf + 1, buf + sizeof buf - 2, n).ptr;
    *end++ = '\r';
    *end++ = '\n';
    out.append(buf, static_cast<std::size_t>(end - buf));
  };
  std::size_t total = 16;
  for (const auto& a : args) total += bytes_of(a).size() + 16;
  out.reserve(out.size() + total);
  put_len('*', std::size(args));
  for (const auto& a : args) {
    std::string_view v = bytes_of(a);
    put_len('$', v.size());
    out.append(v.data(), v.size());
    out.append("\r\n", 2);
  }
}
}  // namespace detail

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::redis

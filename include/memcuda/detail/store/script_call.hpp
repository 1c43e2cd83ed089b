// How the store runs its scripts: one immutable Script per source (its SHA
// computed once, shared by every thread). Only detail/store/ runs scripts
// (scripts/check-tree.py): each script's KEYS and ARGV are built by its one
// typed call, which lists them in the order the Lua reads them.
#pragma once

#include "memcuda/config.hpp"

#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "memcuda/detail/store/reply.hpp"
#include "memcuda/redis/script.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::store {

template <const auto& Source>
const redis::Script& script() {
  static const redis::Script s{std::string(Source)};
  return s;
}
template <const auto& Source>
redis::Reply eval(redis::Connection& c, std::span<const redis::Arg> keys, std::span<const redis::Arg> args) {
  return script<Source>().eval(c, keys, args);
}
template <const auto& Source>
redis::Reply eval(redis::Connection& c, std::initializer_list<redis::Arg> keys, std::span<const redis::Arg> args) {
  return script<Source>().eval(c, {keys.begin(), keys.size()}, args);
}
template <const auto& Source>
redis::Reply eval(redis::Connection& c, std::initializer_list<redis::Arg> keys,
                  std::initializer_list<redis::Arg> args) {
  return script<Source>().eval(c, keys, args);
}

// A script's {status, ...} answer, its status read once (script_status).
struct Answer {
  std::string status;
  redis::Reply reply;
  bool is(std::string_view s) const { return status == s; }
  redis::ReplyView operator[](std::size_t i) const { return reply[i]; }
  std::size_t size() const { return reply.size(); }
};
inline Answer answer(redis::Reply r) {
  std::string st = script_status(r);
  return {std::move(st), std::move(r)};
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::store

// Reading Redis replies and script statuses, and the errors they turn into.
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>

#include "memcuda/detail/base/fault.hpp"
#include "memcuda/error.hpp"
#include "memcuda/protocol.hpp"
#include "memcuda/redis/reply.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// A number from a script's table: Lua numbers arrive as integers, Hash
// values (HGET) as strings.
inline std::int64_t reply_int(redis::ReplyView v) {
  if (v.is_integer()) return v.integer();
  std::string s(v.str());
  try {
    return std::stoll(s);
  } catch (const std::exception&) {
    throw InternalError("expected a number from Redis, got '" + s + "'");
  }
}
inline std::uint64_t reply_u64(redis::ReplyView v) { return static_cast<std::uint64_t>(reply_int(v)); }

inline protocol::Fields fields_from_reply(redis::ReplyView r) {
  protocol::Fields f;
  f.reserve(r.size() / 2);
  for (std::size_t i = 0; i + 1 < r.size(); i += 2)
    f.emplace_back(std::string(r[i].str()), std::string(r[i + 1].str()));
  return f;
}

// The server-side block of BLPOP/BLMOVE, in seconds with millisecond digits.
inline std::string seconds_arg(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", std::max<double>(ms.count(), 1.0) / 1000.0);
  return buf;
}

// The status a script returned (the first element of its table). The
// fault point makes it one no script returns, to test how unknown ones are
// handled.
inline std::string script_status(const redis::Reply& r) {
  if (MEMCUDA_FAULT("script.unknown_status")) return "fault:unknown-status";
  return std::string(r[0].str());
}

// What a script's 'stray' status means: the key under a tensor's name is not
// a record of ours (a Hash without a generation, e.g. written by hand, or not
// a Hash at all). It is left as it is; this says what it is and how to clear it.
inline std::string stray_record(const std::string& key, std::string_view type) {
  const std::string what = type == "hash" ? std::string("a Hash without a 'generation' field")
                                          : "a " + std::string(type) + ", not a Hash";
  return "the key '" + key + "' exists but is not a mem-cuda tensor record (" + what +
         "); it was left untouched. If nothing of yours is stored there, delete it (redis-cli DEL '" + key +
         "') and try again";
}

// A status the code does not know: a bug or a script of another version,
// never a lost lease (only 'notleader' says that).
// A record the acquire scripts refused to take a reference to: its
// generation or refcount does not parse or is negative.
inline ProtocolError corrupt_record(const std::string& name, std::string_view what) {
  return ProtocolError(ProtocolErrc::bad_record, "the record of '" + name + "' is corrupt (" + std::string(what) +
                                                     "): no reference taken; the allocator of record quarantines "
                                                     "it (`memcuda quarantine`)");
}

[[noreturn]] inline void unexpected_status(std::string_view script, std::string_view status) {
  throw InternalError("the " + std::string(script) + " script returned '" + std::string(status) +
                      "', a status this version of mem-cuda does not know");
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

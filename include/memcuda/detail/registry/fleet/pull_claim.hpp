// A pull's claim on a name (docs/protocol.md, "Fleets"): the node that
// pulls a name now says so with `memcuda:pulling:<name>` (SET NX with a
// TTL); another node pulling the same set leaves that name for its second
// round, which waits until the claim goes and then reads the name from the
// claimer's new replica. A claim only orders the work: a stale or foreign
// one costs a wait of its TTL at most, never a byte.
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/detail/store/keys.hpp"
#include "memcuda/detail/store/reply.hpp"
#include "memcuda/redis/connection.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// How long a node gets to serve `bytes` before a pull passes it over: 5 s
// and what the bytes take at 100 MB/s.
inline std::chrono::milliseconds serve_limit(std::uint64_t bytes) {
  return std::chrono::milliseconds(5000 + std::min<std::uint64_t>(bytes, std::uint64_t{1} << 50) / 100000);
}

// What a claim lasts: the serve limit of the record's `bytes` field (nil
// or malformed: 0).
inline std::chrono::milliseconds claim_ttl(redis::ReplyView bytes) {
  std::uint64_t n = 0;
  if (bytes.is_string()) std::from_chars(bytes.str().data(), bytes.str().data() + bytes.str().size(), n);
  return serve_limit(n);
}

// Claims `name` for node `scope`: false when another node (or a key of
// another type) has the name's claim key.
inline bool claim_pull(redis::Connection& c, const Keys& k, const std::string& name, const std::string& scope,
                       std::chrono::milliseconds ttl) {
  return !c.command({"SET", k.pulling(name), scope, "NX", "PX", std::to_string(ttl.count())}).is_nil();
}

// This node is done with `name` (pulled or failed). Redis failing: the claim lapses.
inline void unclaim_pull(redis::Connection& c, const Keys& k, const std::string& name) noexcept {
  try {
    c.command({"DEL", k.pulling(name)});
  } catch (const std::exception&) {
  }
}

// Waits while another node's claim on `name` stands, for `bound` at most,
// calling `tick` each time round; a key without a TTL is no claim, and
// one of node `mine` (left by an earlier try) is not waited for. -> the
// claimer's node scope ("" when there was no claim).
inline std::string wait_for_claim(redis::Connection& c, const Keys& k, const std::string& name,
                                  const std::string& mine, std::chrono::milliseconds bound,
                                  const std::function<void()>& tick) {
  const std::string key = k.pulling(name);
  std::vector<std::exception_ptr> errs;  // a key of another type: GET's error, no claim
  auto r = c.pipeline({{"PTTL", key}, {"GET", key}}, &errs);
  if (errs[1] || !r[0].is_integer() || reply_int(r[0].view()) <= 0 || !r[1].is_string()) return {};
  std::string claimer(r[1].str());
  if (claimer == mine) return {};
  const auto until = std::chrono::steady_clock::now() + bound;
  while (std::chrono::steady_clock::now() < until) {
    tick();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    auto t = c.command({"PTTL", key});
    if (!t.is_integer() || reply_int(t.view()) <= 0) break;
  }
  return claimer;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

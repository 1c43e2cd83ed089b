// Giving up a dead owner's tensor: the mark-lost script (the record goes,
// the name is free again, a marker makes get() raise Lost). Migration runs
// it for a tensor nobody alive could copy, and at once for every borrowed
// tensor of a dead owner: borrowed memory (TensorRegistry::share) was that
// process's own buffer, so it is never adopted or copied through a holder
// (docs/design.md, "Borrowed tensors").
#pragma once

#include "memcuda/config.hpp"

#include <span>
#include <string>
#include <vector>

#include "memcuda/detail/base/log.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/leader/lease.hpp"
#include "memcuda/detail/store/reply.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// How long get() of a given-up name says Lost (the marker's expiry).
inline constexpr std::int64_t kLostMarkerTtlMs = 24 * 3600 * 1000;

// Runs mark lost for `t` (refused while a live session holds it, unless
// `force`); returns the script's status: lost, held, gone or notleader.
inline std::string mark_lost(Context& ctx, redis::Connection& c, const std::string& token, const TensorInfo& t,
                             bool force) {
  const std::string tk = ctx.keys.tensor(t.name), nk = ctx.keys.names(), lk = ctx.keys.leader(),
                    mk = ctx.keys.lost(t.name);
  redis::Arg kv[] = {tk, lk, nk, mk};
  std::vector<redis::Arg> args{token, t.generation, t.owner, ctx.keys.prefix(), kLostMarkerTtlMs, now_ms(),
                               force ? "1" : "0"};
  auto r = ctx.scripts.mark_lost.eval(c, std::span<const redis::Arg>(kv), std::span<const redis::Arg>(args));
  return script_status(r);
}

// A borrowed tensor of a dead owner: lost, whoever holds it (their open
// mappings follow the driver's rule; a new open would fail anyway). True
// when this call gave it up.
inline bool give_up_borrowed(Context& ctx, Lease& lease, redis::Connection& c, const std::string& token,
                             const TensorInfo& t) {
  const std::string st = mark_lost(ctx, c, token, t, true);
  if (st == "gone") return false;
  if (st != "lost") lease.fail_status("mark_lost", st, "giving up borrowed '" + t.name + "'");
  log(LogLevel::warn, "'" + t.name + "' (generation " + std::to_string(t.generation) +
                          ") is lost: it was a buffer borrowed from " + t.owner + " (pid " +
                          std::to_string(t.owner_pid) + "), which died");
  return true;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

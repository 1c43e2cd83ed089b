// Giving up a dead owner's tensor: the mark-lost script (the record goes,
// the name is free again, a marker makes get() raise Lost). Migration runs
// it for a tensor nobody alive could copy, and at once for every borrowed
// tensor of a dead owner: borrowed memory (TensorRegistry::share) was that
// process's own buffer, so it is never adopted or copied through a holder
// (docs/design.md, "Borrowed tensors").
#pragma once

#include "memcuda/config.hpp"

#include <string>

#include "memcuda/detail/base/log.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/lease/lease.hpp"
#include "memcuda/detail/store/recovery_scripts.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// How long get() of a given-up name says Lost (the marker's expiry).
inline constexpr std::int64_t kLostMarkerTtlMs = 24 * 3600 * 1000;

// A borrowed tensor of a dead owner: lost, whoever holds it (their open
// mappings follow the driver's rule; a new open would fail anyway). True
// when this call gave it up.
inline bool give_up_borrowed(Context& ctx, Lease& lease, redis::Connection& c, const std::string& token,
                             const TensorInfo& t) {
  const std::string st = store::mark_lost(c, ctx.keys, token, t, kLostMarkerTtlMs, true).status;
  if (st == "gone") return false;
  if (st != "lost") lease.fail_status("mark_lost", st, "giving up borrowed '" + t.name + "'");
  log(LogLevel::warn, "'" + t.name + "' (generation " + std::to_string(t.generation) +
                          ") is lost: it was a buffer borrowed from " + t.owner + " (pid " +
                          std::to_string(t.owner_pid) + "), which died");
  return true;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

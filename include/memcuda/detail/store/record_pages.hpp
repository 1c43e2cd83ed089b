// The records of a listing page, read in parallel lanes. A page is up to
// 1000 HGETALLs of ~25-field records: the client's share of that (hiredis
// making ~50 reply objects per record, then RecordReader) is about as long
// as Redis's, and it runs after Redis's for each page. Split over a few
// connections that are free at that moment, each lane's parse and decode
// overlap Redis serving the others, and each other on a multi-core host.
// A lane that finds no free connection runs on the caller's, after its own:
// a listing never waits for another thread's lease.
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <future>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "memcuda/detail/base/log.hpp"
#include "memcuda/detail/store/keys.hpp"
#include "memcuda/protocol/record_desc.hpp"
#include "memcuda/redis/connection_pool.hpp"
#include "memcuda/tensor_info.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

struct RecordLane {
  std::vector<TensorInfo> records;
  std::vector<std::pair<std::string, std::string>> unreadable;  // name, why
};

// One lane: the records of names[lo, hi) on `c`, in order. A record that
// cannot be read (a key of the wrong type, fields that do not parse) is
// skipped and named, never the listing's failure; the allocator of
// record's GC quarantines it. A name removed meanwhile is left out.
inline RecordLane read_lane(redis::Connection& c, const Keys& keys, const std::vector<std::string>& names,
                            std::size_t lo, std::size_t hi) {
  RecordLane lane;
  std::vector<redis::Command> cmds;
  cmds.reserve(hi - lo);
  for (std::size_t i = lo; i < hi; ++i) cmds.push_back({"HGETALL", keys.tensor(names[i])});
  std::vector<std::exception_ptr> errs;
  auto replies = c.pipeline(cmds, &errs);
  lane.records.reserve(replies.size());
  for (std::size_t i = 0; i < replies.size(); ++i) {
    auto& r = replies[i];
    if (r.is_error()) {
      lane.unreadable.emplace_back(names[lo + i], std::string(r.view().str()));
      continue;
    }
    if (r.size() == 0) continue;
    try {
      // Straight from the reply's views: no copy of the fields, no map
      // (what decode_record accepts and refuses, fuzz_desc checks).
      protocol::RecordReader rr;
      redis::ReplyView h = r.view();
      for (std::size_t j = 0; j + 1 < h.size(); j += 2) rr.add(h[j].str(), h[j + 1].str());
      lane.records.push_back(rr.finish());
    } catch (const std::exception& e) {
      lane.unreadable.emplace_back(names[lo + i], e.what());
    }
  }
  return lane;
}

// The records of `names` in order, appended to `out`; `own` is the
// caller's connection, `pool` lends the other lanes theirs.
inline void read_records(redis::ConnectionPool& pool, redis::Connection& own, const Keys& keys,
                         const std::vector<std::string>& names, std::vector<TensorInfo>& out,
                         std::uint64_t* unreadable) {
  constexpr std::size_t kMaxLanes = 4, kMinPerLane = 200;
  const std::size_t n = names.size();
  const std::size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t want = std::min({kMaxLanes, hw, std::max<std::size_t>(1, n / kMinPerLane)});
  struct Extra {
    std::size_t lo, hi;
    std::optional<redis::ConnectionPool::Lease> lease;
    std::future<RecordLane> done;
  };
  std::vector<Extra> extra;
  for (std::size_t k = 1; k < want; ++k) {
    auto lease = pool.try_acquire();
    if (!lease) break;
    extra.push_back({n * k / want, n * (k + 1) / want, std::move(lease), {}});
  }
  // Lanes without a connection of their own: the caller's range grows to
  // where the first lane with one starts.
  const std::size_t own_hi = extra.empty() ? n : extra.front().lo;
  if (!extra.empty()) extra.back().hi = n;
  for (auto& e : extra) {
    try {
      e.done = std::async(std::launch::async,
                          [&names, &keys, &e] { return read_lane(**e.lease, keys, names, e.lo, e.hi); });
    } catch (const std::system_error&) {  // no thread: the lane runs below, on this one
    }
  }
  std::vector<RecordLane> lanes;
  std::exception_ptr first_error;
  try {
    lanes.push_back(read_lane(own, keys, names, 0, own_hi));
  } catch (...) {
    first_error = std::current_exception();
  }
  for (auto& e : extra) {  // every lane is waited for before anything leaves
    try {
      lanes.push_back(e.done.valid() ? e.done.get() : read_lane(**e.lease, keys, names, e.lo, e.hi));
    } catch (...) {
      e.lease->discard();  // cut off midway: its replies may still be on the way
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
  for (auto& l : lanes) {
    for (auto& t : l.records) out.push_back(std::move(t));
    for (const auto& [name, why] : l.unreadable) {
      if (unreadable) ++*unreadable;
      log(LogLevel::warn, "listing: skipping the unreadable record of '" + name + "': " + why);
    }
  }
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

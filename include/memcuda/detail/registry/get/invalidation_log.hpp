// The recent invalidation events of one holdings table (holdings.hpp), so
// that a get whose Redis reply a message overtook never leaves a stale
// entry: a lookup takes a token (the sequence number of the last event),
// and the result is kept only if no event since that token concerns its
// name or generation. The log is bounded; a token older than the log reads
// as stale (the entry is simply not kept).
//
// Not thread-safe: the owning table's mutex guards it.
#pragma once

#include "memcuda/config.hpp"

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <utility>

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class InvalidationLog {
 public:
  // The sequence number a lookup takes as its token.
  std::uint64_t last() const noexcept { return seq_; }

  void all() { push(Event{++seq_, Event::all, 0, {}}); }
  void generation(std::uint64_t gen) { push(Event{++seq_, Event::generation, gen, {}}); }
  void name(std::string_view n) { push(Event{++seq_, Event::name, 0, std::string(n)}); }

  // Whether an event after `token` concerns (name, gen); true when the log
  // no longer reaches back that far.
  bool stale_since(std::uint64_t token, std::string_view name, std::uint64_t gen) const {
    if (token == seq_) return false;
    if (events_.empty() || events_.front().seq > token + 1) return true;
    for (auto it = events_.rbegin(); it != events_.rend() && it->seq > token; ++it) {
      if (it->kind == Event::all) return true;
      if (it->kind == Event::generation && it->gen == gen) return true;
      if (it->kind == Event::name && it->named == name) return true;
    }
    return false;
  }

 private:
  struct Event {
    enum Kind { all, generation, name } kind;
    std::uint64_t seq;
    std::uint64_t gen;
    std::string named;  // for kind name
    Event(std::uint64_t s, Kind k, std::uint64_t g, std::string n) : kind(k), seq(s), gen(g), named(std::move(n)) {}
  };

  void push(Event e) {
    events_.push_back(std::move(e));
    if (events_.size() > kSize) events_.pop_front();
  }

  static constexpr std::size_t kSize = 1024;
  std::uint64_t seq_ = 1;
  std::deque<Event> events_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

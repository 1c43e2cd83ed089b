// The server side of a version 2 request (fd_wire_batch.hpp): which fds
// answer it. Kept apart from FdServer, which calls it under its lock.
#pragma once

#include "memcuda/config.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <string>
#include <unordered_set>
#include <vector>

#include "memcuda/detail/fd/fd_wire_batch.hpp"
#include "memcuda/detail/fd/unique_fd.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// Fds a version 2 reply sends along besides those asked for, at most (the
// client names its own bound; this caps it).
inline constexpr std::size_t kMaxOffer = 64;

// An fd a server serves, borrowed, and the key of its allocation.
struct ServedEntry {
  int fd = -1;
  std::string key;
};

// The entries answering `req` and the fds to send with them (one per ok
// entry, in order): every id asked for, each on its own (an unknown one
// fails alone), then up to req.offer (capped at kMaxOffer) allocations
// not in `sent` (what this connection already received), those made
// after the ids asked for first (a model's tensors are allocated in a
// row), then those before. *dup_errno: a dup that failed. Any allocation
// served is one the peer may ask for by id (its policy was checked), so an
// offer gives it nothing it could not have.
inline fdwire::BatchReply answer_batch(const std::map<std::uint64_t, ServedEntry>& fds,
                                       const std::unordered_set<std::uint64_t>& sent, const fdwire::BatchRequest& req,
                                       std::vector<UniqueFd>* copies, int* dup_errno) {
  fdwire::BatchReply rep;
  // False when a dup failed (out of fds): nothing more is offered then.
  auto take = [&](std::uint64_t id, const ServedEntry* s, bool offered) {
    fdwire::BatchEntry e;
    e.id = id;
    e.offered = offered;
    if (!s) {
      e.status = fdwire::Status::unknown_id;
    } else if (UniqueFd d(::fcntl(s->fd, F_DUPFD_CLOEXEC, 0)); d) {
      e.key = s->key;
      copies->push_back(std::move(d));
    } else if (offered) {
      return false;  // an offer is no answer: leave it out
    } else {
      e.status = fdwire::Status::server_error;
      *dup_errno = errno;
    }
    rep.entries.push_back(std::move(e));
    return true;
  };
  std::uint64_t top = 0, bottom = ~std::uint64_t{0};
  for (std::uint64_t id : req.ids) {
    auto it = fds.find(id);
    take(id, it == fds.end() ? nullptr : &it->second, false);
    top = std::max(top, id);
    bottom = std::min(bottom, id);
  }
  std::size_t room = *dup_errno ? 0 : std::min({std::size_t{req.offer}, kMaxOffer, fdwire::kMaxBatch - req.ids.size()});
  auto offer = [&](std::uint64_t id, const ServedEntry& s) {
    if (sent.count(id) || std::find(req.ids.begin(), req.ids.end(), id) != req.ids.end()) return;
    room = take(id, &s, true) ? room - 1 : 0;
  };
  for (auto it = fds.upper_bound(top); room && it != fds.end(); ++it) offer(it->first, it->second);
  for (auto it = std::make_reverse_iterator(fds.lower_bound(bottom)); room && it != fds.rend(); ++it)
    offer(it->first, it->second);
  return rep;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

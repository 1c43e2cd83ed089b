// Connecting through Redis Sentinel: the sentinels are asked in turn for
// the primary of the service (SENTINEL get-master-addr-by-name), and the
// primary they name is connected to and must answer ROLE with "master", so
// no connection ever writes to a replica. A sentinel that is down, does not
// know the service or names a server that is not (or no longer) the
// primary is skipped; when none leads to a primary, the ConnectionError
// names the service and each sentinel's answer, and the reconnect loop
// (connect.hpp) asks again until reconnect_timeout. Every reconnect comes
// through here, so after a failover each connection finds the new primary;
// a SentinelWatch makes the connections that are still up leave an old
// primary that has not learnt yet that it was replaced.
//
// Part of connection.hpp, which includes this file; include that one.
#pragma once

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "memcuda/error.hpp"
#include "memcuda/redis/connection.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace redis {

namespace detail {

// The address of a sentinel as Options of its own: no credentials (offered
// separately), no db, no sentinels.
inline Options sentinel_options(const Options& o, const Options::Sentinel& s, std::chrono::milliseconds timeout) {
  Options so;
  so.transport = s.path.empty() ? Options::Transport::tcp : Options::Transport::unix_socket;
  so.host = s.host;
  so.port = s.port;
  so.path = s.path;
  so.connect_timeout = timeout;
  so.command_timeout = o.command_timeout;
  return so;
}

// Offers the credentials to a sentinel. One without a password of its own
// refuses AUTH with a plain ERR: it needs none then. False, with `why`,
// when it refuses them otherwise.
inline bool offer_credentials(Connection& s, const Options& o, const std::string& password, std::string& why) {
  if (password.empty()) return true;
  try {
    if (o.user.empty()) s.command({"AUTH", password});
    else s.command({"AUTH", o.user, password});
  } catch (const AuthError& e) {
    if (e.prefix() != "ERR") {
      why = "refused the credentials (" + e.prefix() + ")";
      return false;
    }
  }
  return true;
}

// What the sentinel `s` says the primary of `o.service` is; nullopt with
// `why` filled when it says nothing usable.
inline std::optional<std::pair<std::string, int>> primary_of(Connection& s, const Options& o, std::string& why) {
  Reply r = s.command({"SENTINEL", "get-master-addr-by-name", o.service});
  if (r.is_nil()) {
    why = "does not monitor '" + o.service + "'";
    return std::nullopt;
  }
  if (r.size() != 2 || !r[0].is_string() || !r[1].is_string()) {
    why = "answered a " + r.type_name() + ", not [host, port]";
    return std::nullopt;
  }
  int port = 0;
  const auto p = r[1].str();
  std::from_chars(p.data(), p.data() + p.size(), port);
  return std::pair{std::string(r[0].str()), port};
}

// What this process last heard from a SentinelWatch about each service's
// primary (keyed by the sentinel URL), and how often it changed. A
// connection remembers the count it was made under and leaves its server
// before its next command once the count grew (Connection::primary_moved).
struct PrimaryBook {
  std::mutex m;
  std::map<std::string, std::string> last;  // "host:port"
  std::atomic<std::uint64_t> changes{0};
};
inline PrimaryBook& primaries() {
  static PrimaryBook b;
  return b;
}
inline std::string known_primary(const Options& o) {
  auto& b = primaries();
  std::lock_guard lk(b.m);
  auto it = b.last.find(o.describe());
  return it == b.last.end() ? std::string() : it->second;
}
inline void note_primary(const Options& o, const std::string& addr) {
  auto& b = primaries();
  std::lock_guard lk(b.m);
  auto& last = b.last[o.describe()];
  if (!last.empty() && last != addr) b.changes.fetch_add(1);
  last = addr;
}

// The password now: Options::password, or the first line of its file.
inline std::string password_now(const Options& o) {
  if (o.password_file.empty()) return o.password;
  std::ifstream in(o.password_file);
  std::string line;
  std::getline(in, line);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return line;
}

}  // namespace detail

// A sentinel whose answer differs from the primary the watch heard of last
// may lag behind a failover: the first pass skips it, the second (all of
// them disagreeing) takes it.
inline void Connection::connect_via_sentinels(std::chrono::milliseconds timeout) {
  const std::string password = opts_.password_file.empty() ? opts_.password : read_password_file();
  primary_changes_ = detail::primaries().changes.load();  // before asking: a change meanwhile means once more
  const std::string known = detail::known_primary(opts_);
  std::string answers;
  for (int pass = known.empty() ? 1 : 0; pass < 2; ++pass) {
    answers.clear();
    for (const auto& sn : opts_.sentinels) {
      const Options so = detail::sentinel_options(opts_, sn, timeout);
      std::string why;
      try {
        Connection s(so);
        auto primary = detail::offer_credentials(s, opts_, password, why) ? detail::primary_of(s, opts_, why)
                                                                          : std::nullopt;
        if (primary) {
          const std::string addr = primary->first + ":" + std::to_string(primary->second);
          why = "names " + addr + ", which ";
          if (pass == 0 && addr != known) {
            why += "is not the primary " + known + " a sentinel named last (lagging behind a failover?)";
          } else {
            Options at = so;
            at.transport = Options::Transport::tcp;
            at.host = primary->first;
            at.port = primary->second;
            connect_to(at, timeout);
            Reply role = handshake({"ROLE"});
            if (!role.is_error() && role.size() > 0 && role[0].str() == "master") return;
            why += "answers ROLE " + std::string(role.size() > 0 ? role[0].str() : role.type_name()) +
                   ", not master (a failover under way?)";
            drop();
          }
        }
      } catch (const AuthError& e) {
        if (!why.empty()) throw;  // the primary refused the credentials: waiting does not fix that
        why = e.what();
      } catch (const detail::Interrupted&) {
        throw;
      } catch (const RedisError& e) {
        why += e.what();
      }
      answers += "; " + so.describe() + " " + why;
    }
  }
  throw ConnectionError("no primary of the Redis Sentinel service '" + opts_.service + "' (" + opts_.describe() +
                        ")" + answers + ": start a sentinel that monitors it, or wait for its failover");
}

// True when a SentinelWatch of this process heard of another primary since
// this connection was made: ensure_connected() then leaves the server.
inline bool Connection::primary_moved() const noexcept {
  return !opts_.sentinels.empty() && primary_changes_ != detail::primaries().changes.load(std::memory_order_relaxed);
}

// Through sentinels, a server answering READONLY (a primary demoted under
// this connection) or LOADING (one still loading its data) did not run the
// command.
inline bool Connection::primary_lost(const Reply& rep) const {
  if (opts_.sentinels.empty() || !rep.is_error()) return false;
  const auto prefix = error_prefix(rep.view().str());
  return prefix == "READONLY" || prefix == "LOADING";
}

// After such an answer the socket is dropped, so that the next connect asks
// the sentinels again; true means "send it again", while `until` (the
// command's reconnect_timeout) is not reached.
inline bool Connection::follow_failover(const Reply& rep, std::chrono::steady_clock::time_point until) {
  if (!primary_lost(rep)) return false;
  drop();
  return std::chrono::steady_clock::now() < until && backoff(opts_.reconnect_backoff);
}

namespace detail {
// `o` for a sentinel asked beside other work: connect and command within `t`.
inline Options quick_options(Options o, std::chrono::milliseconds t) {
  o.connect_timeout = std::min(o.connect_timeout, t);
  if (o.command_timeout.count() == 0 || o.command_timeout > t) o.command_timeout = t;
  return o;
}
// The primary ("host:port") the sentinel `at` names, through `conn` (made
// and authenticated when empty, dropped when anything fails); nullopt
// when it fails or names none.
inline std::optional<std::string> ask_sentinel(std::optional<Connection>& conn, const Options& o,
                                               const Options::Sentinel& at) noexcept {
  try {
    std::string why;
    if (!conn) {
      conn.emplace(sentinel_options(o, at, o.connect_timeout));
      if (!offer_credentials(*conn, o, password_now(o), why)) throw ConnectionError(why);
    }
    if (auto p = primary_of(*conn, o, why)) return p->first + ":" + std::to_string(p->second);
  } catch (const std::exception&) {
  }
  conn.reset();
  return std::nullopt;
}
}  // namespace detail

// Asks a sentinel (the first that answers, kept while it does) for the
// primary of the service, each time poll() is called (the registry's
// heartbeat does, every period). An old primary that is still up takes
// writes until the sentinels reconfigure it, up to some 10 s after they
// named its successor, and what it takes then is lost: when the answer
// changes, every connection of the process made before leaves its server
// before its next command (Connection::primary_moved). A poll tries one
// sentinel, within kTimeout, so that a sentinel out of reach does not hold
// the heartbeat up; a failed one hands over to the next for the next poll.
// Nothing for a server URL. One thread at a time.
class SentinelWatch {
 public:
  static constexpr std::chrono::milliseconds kTimeout{250};

  explicit SentinelWatch(Options o) : opts_(detail::quick_options(std::move(o), kTimeout)) {}

  void poll() noexcept {
    if (opts_.sentinels.empty()) return;
    if (auto addr = detail::ask_sentinel(conn_, opts_, opts_.sentinels[next_])) {
      detail::note_primary(opts_, *addr);
      return;
    }
    next_ = (next_ + 1) % opts_.sentinels.size();
  }

 private:
  Options opts_;
  std::optional<Connection> conn_;
  std::size_t next_ = 0;
};

// Every sentinel of the service asked for its primary at once. While a
// failover spreads they differ: the sentinel that led it names the new
// primary first, the others learn it from its hellos within seconds, and
// until then processes following them still write to the old primary
// (create/held_frees.hpp waits for them). A sentinel that fails is left
// out for kRetry, so one out of reach costs one timeout now and then.
// One thread at a time.
class SentinelCensus {
 public:
  static constexpr std::chrono::seconds kRetry{5};

  struct Answer {
    std::size_t answered = 0;           // sentinels that named a primary
    std::optional<std::string> agreed;  // "host:port" when they all named the same one
  };

  explicit SentinelCensus(Options o)
      : opts_(detail::quick_options(std::move(o), SentinelWatch::kTimeout)), peers_(opts_.sentinels.size()) {}

  Answer ask() noexcept {
    Answer a;
    bool differ = false;
    const auto now = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < peers_.size(); ++i) {
      auto& p = peers_[i];
      if (now < p.retry_at) continue;
      if (auto addr = detail::ask_sentinel(p.conn, opts_, opts_.sentinels[i])) {
        if (a.answered++ == 0) a.agreed = std::move(addr);
        else differ |= *a.agreed != *addr;
        continue;
      }
      p.retry_at = now + kRetry;
    }
    if (differ) a.agreed.reset();
    return a;
  }

 private:
  struct Peer {
    std::optional<Connection> conn;
    std::chrono::steady_clock::time_point retry_at{};
  };
  Options opts_;
  std::vector<Peer> peers_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::redis

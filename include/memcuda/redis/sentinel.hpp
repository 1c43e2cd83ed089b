// Connecting through Redis Sentinel: the sentinels are asked in turn for
// the primary of the service (SENTINEL get-master-addr-by-name), and the
// primary they name is connected to and must answer ROLE with "master", so
// no connection ever writes to a replica. A sentinel that is down, does not
// know the service or names a server that is not (or no longer) the
// primary is skipped; when none leads to a primary, the ConnectionError
// names the service and each sentinel's answer, and the reconnect loop
// (connect.hpp) asks again until reconnect_timeout. Every reconnect comes
// through here, so after a failover each connection finds the new primary.
//
// Part of connection.hpp, which includes this file; include that one.
#pragma once

#include <algorithm>
#include <charconv>
#include <chrono>
#include <optional>
#include <string>
#include <utility>

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

// What one sentinel says the primary of `o.service` is; nullopt with
// `why` filled when it says nothing usable.
inline std::optional<std::pair<std::string, int>> ask_sentinel(const Options& o, const Options& so,
                                                               const std::string& password, std::string& why) {
  Connection s(so);
  if (!password.empty()) {
    // A sentinel without a password of its own refuses AUTH with a plain
    // ERR: it needs none then. Any other refusal is about the credentials.
    try {
      if (o.user.empty()) s.command({"AUTH", password});
      else s.command({"AUTH", o.user, password});
    } catch (const AuthError& e) {
      if (e.prefix() != "ERR") {
        why = "refused the credentials (" + e.prefix() + ")";
        return std::nullopt;
      }
    }
  }
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

}  // namespace detail

inline void Connection::connect_via_sentinels(std::chrono::milliseconds timeout) {
  const std::string password = opts_.password_file.empty() ? opts_.password : read_password_file();
  std::string answers;
  for (const auto& sn : opts_.sentinels) {
    const Options so = detail::sentinel_options(opts_, sn, timeout);
    std::string why;
    try {
      if (auto primary = detail::ask_sentinel(opts_, so, password, why)) {
        Options at = so;
        at.transport = Options::Transport::tcp;
        at.host = primary->first;
        at.port = primary->second;
        why = "names " + at.describe() + ", which ";
        connect_to(at, timeout);
        Reply role = handshake({"ROLE"});
        if (!role.is_error() && role.size() > 0 && role[0].str() == "master") return;
        why += "answers ROLE " + std::string(role.size() > 0 ? role[0].str() : role.type_name()) +
               ", not master (a failover under way?)";
        drop();
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
  throw ConnectionError("no primary of the Redis Sentinel service '" + opts_.service + "' (" + opts_.describe() +
                        ")" + answers + ": start a sentinel that monitors it, or wait for its failover");
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
  if (std::chrono::steady_clock::now() >= until) return false;
  std::unique_lock lk(intr_->m);  // a backoff that interrupt() ends; the next connect then fails
  intr_->cv.wait_for(lk, std::max(opts_.reconnect_backoff, std::chrono::milliseconds(1)),
                     [&] { return intr_->pending; });
  return true;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::redis

// Connecting to a Redis Cluster: every key of a registry carries the hash
// tag of its namespace (keys.hpp), so all of them live in one slot and a
// connection talks to one node, the primary of that slot. A connect asks
// a node (the one a MOVED named last, else the seeds in turn) for CLUSTER
// SLOTS and goes to the slot's primary. Replies that say the slot is
// elsewhere or busy are followed within the command's reconnect_timeout:
// MOVED (the slot moved for good: reconnect there, send again), ASK (it is
// being migrated: ASKING then the command on the named node, once),
// TRYAGAIN and CLUSTERDOWN (wait, send again; a CLUSTERDOWN that outlasts
// reconnect_timeout is a ConnectionError), UNBLOCKED (a blocked command
// whose primary became a replica). Not a general cluster client:
// one slot per connection.
//
// Part of connection.hpp, which includes this file; include that one.
#pragma once

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/error.hpp"
#include "memcuda/redis/connection.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace redis {

namespace detail {

// CRC16-CCITT (XMODEM), as Redis Cluster hashes keys: the slot of a key is
// crc16(tag) mod 16384, the tag being the text between the first '{' and
// the next '}' when that is not empty, else the whole key.
inline std::uint16_t crc16(std::string_view s) noexcept {
  std::uint16_t crc = 0;
  for (unsigned char c : s) {
    crc ^= static_cast<std::uint16_t>(c << 8);
    for (int i = 0; i < 8; ++i) crc = (crc & 0x8000) ? static_cast<std::uint16_t>((crc << 1) ^ 0x1021) : crc << 1;
  }
  return crc;
}

inline int key_slot(std::string_view key) noexcept {
  if (auto open = key.find('{'); open != std::string_view::npos) {
    auto close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) key = key.substr(open + 1, close - open - 1);
  }
  return crc16(key) % 16384;
}

// "host:port" of the primary serving `slot` in a CLUSTER SLOTS reply, or "".
inline std::string slot_primary(const Reply& slots, int slot) {
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const auto range = slots[i];
    if (range.size() < 3 || !range[0].is_integer() || !range[1].is_integer()) continue;
    if (slot < range[0].integer() || slot > range[1].integer()) continue;
    const auto node = range[2];
    if (node.size() < 2 || !node[0].is_string() || !node[1].is_integer()) return {};
    return std::string(node[0].str()) + ":" + std::to_string(node[1].integer());
  }
  return {};
}

// `o`'s credentials at "host:port".
inline Options node_options(const Options& o, std::string_view addr) {
  Options at = o;
  at.cluster.clear();
  at.transport = Options::Transport::tcp;
  const auto colon = addr.rfind(':');
  at.host = std::string(addr.substr(0, colon));
  at.port = 0;
  if (colon != std::string_view::npos) std::from_chars(addr.data() + colon + 1, addr.data() + addr.size(), at.port);
  return at;
}

}  // namespace detail

inline void Connection::connect_via_cluster(std::chrono::milliseconds timeout) {
  const int slot = detail::key_slot("{" + opts_.cluster_tag + "}");
  std::string answers;
  if (!cluster_node_.empty()) {  // a MOVED named it: no need to ask
    try {
      return connect_to(detail::node_options(opts_, cluster_node_), timeout);
    } catch (const AuthError&) {
      throw;
    } catch (const detail::Interrupted&) {
      throw;
    } catch (const RedisError& e) {
      answers += "; " + cluster_node_ + " (named by MOVED) " + e.what();
      cluster_node_.clear();
    }
  }
  for (const auto& seed : opts_.cluster) {
    const Options so = detail::node_options(opts_, seed.host + ":" + std::to_string(seed.port));
    std::string why;
    try {
      connect_to(so, timeout);
      Reply slots = handshake({"CLUSTER", "SLOTS"});
      const std::string addr = slots.is_error() ? std::string() : detail::slot_primary(slots, slot);
      if (addr.empty()) {
        why = slots.is_error() ? "answers " + std::string(slots.str()) : "serves no node for the slot";
        drop();
      } else {
        if (addr == seed.host + ":" + std::to_string(seed.port)) return;
        drop();
        why = "names " + addr + ", which ";
        return connect_to(detail::node_options(opts_, addr), timeout);
      }
    } catch (const AuthError&) {
      throw;
    } catch (const detail::Interrupted&) {
      throw;
    } catch (const RedisError& e) {
      why += e.what();
    }
    answers += "; " + so.describe() + " " + why;
  }
  throw ConnectionError("no node of the Redis Cluster " + opts_.describe() + " serves slot " + std::to_string(slot) +
                        " (hash tag {" + opts_.cluster_tag + "})" + answers +
                        ": check `redis-cli --cluster check`, or wait for its failover");
}

// True when `rep` says to send the command again: after MOVED (to the node
// it names), TRYAGAIN, CLUSTERDOWN or UNBLOCKED (after a backoff), while
// `until` is not reached. An ASK is answered here: `rep` becomes the
// reply of the node it names, asked once. A CLUSTERDOWN still there at
// `until` throws ConnectionError, as a server out of reach does.
inline bool Connection::follow_cluster(Reply& rep, std::string_view buf, const std::string& what,
                                       std::chrono::steady_clock::time_point until) {
  if (opts_.cluster.empty() || !rep.is_error()) return false;
  const std::string text(rep.str());
  const auto prefix = error_prefix(text);
  const auto addr = text.substr(text.rfind(' ') + 1);  // "MOVED <slot> <host:port>"
  if (prefix == "ASK") {
    rep = std::move(ask(addr, {std::string(buf)}, what).front());
    return false;
  }
  if (prefix != "MOVED" && prefix != "TRYAGAIN" && prefix != "CLUSTERDOWN" && prefix != "UNBLOCKED") return false;
  if (std::chrono::steady_clock::now() >= until) {
    if (prefix != "CLUSTERDOWN") return false;
    drop();  // the next command asks the seeds again: this node may be cut off from the rest
    throw ConnectionError("the Redis Cluster " + opts_.describe() + " did not serve slot " +
                          std::to_string(detail::key_slot("{" + opts_.cluster_tag + "}")) + " (hash tag {" +
                          opts_.cluster_tag + "}) to '" + what + "' within " +
                          std::to_string(opts_.reconnect_timeout.count()) + " ms (reconnect_timeout): " + server_ +
                          " answers " + text +
                          " (a slot without a node, or most primaries out of reach: `redis-cli --cluster check`)");
  }
  // The same node: keys being migrated (TRYAGAIN), or a slot without a
  // node or most primaries out of reach (CLUSTERDOWN; once the slot is
  // served elsewhere, this node says MOVED).
  if (prefix == "TRYAGAIN" || prefix == "CLUSTERDOWN") return backoff(kClusterWait);
  drop();
  cluster_node_ = prefix == "MOVED" ? addr : std::string();  // UNBLOCKED: ask the seeds again
  return prefix == "MOVED" || backoff(kClusterWait);
}

// The replies of `cmds` (each one command in RESP) sent once to the node
// `addr` that an ASK named, each after ASKING, which holds for one command.
inline std::vector<Reply> Connection::ask(std::string_view addr, const std::vector<std::string>& cmds,
                                          const std::string& what) {
  std::string asking, buf;
  detail::append_resp(asking, std::initializer_list<Arg>{"ASKING"});
  for (const auto& c : cmds) buf += asking + c;
  Connection there(detail::node_options(opts_, addr));
  there.in_flight_ = true;
  there.send_all(buf, what);
  std::vector<Reply> out;
  for (std::size_t i = 0; i < cmds.size(); ++i) {
    Reply ok = there.read_reply(what);
    Reply rep = there.read_reply(what);
    out.push_back(ok.is_error() ? std::move(ok) : std::move(rep));
  }
  there.in_flight_ = false;
  return out;
}

// Waits `d`, or until interrupt() (the next command then fails); true.
inline bool Connection::backoff(std::chrono::milliseconds d) {
  std::unique_lock lk(intr_->m);
  intr_->cv.wait_for(lk, std::max(d, std::chrono::milliseconds(1)), [&] { return intr_->pending; });
  return true;
}

// A pipeline answered ASK throughout (the keys it touches have moved to
// the importing node of a migration) goes there, once.
inline void Connection::follow_ask(std::vector<Reply>& out, const std::vector<Command>& cmds,
                                   const std::string& what) {
  if (opts_.cluster.empty() || out.empty()) return;
  for (const auto& r : out)
    if (!r.is_error() || error_prefix(r.str()) != "ASK") return;
  std::vector<std::string> each(cmds.size());
  for (std::size_t i = 0; i < cmds.size(); ++i) detail::append_resp(each[i], cmds[i]);
  const std::string text(out.front().str());
  out = ask(text.substr(text.rfind(' ') + 1), each, what);
}

inline bool Connection::cluster_retry(const Reply& rep) const {
  if (opts_.cluster.empty() || !rep.is_error()) return false;
  const auto prefix = error_prefix(rep.str());
  return prefix == "MOVED" || prefix == "TRYAGAIN" || prefix == "CLUSTERDOWN";
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::redis

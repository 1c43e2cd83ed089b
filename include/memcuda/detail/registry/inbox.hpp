// Messages from the allocator of record to one session (its inbox list):
// forget a dead exporter's mappings, close slabs the leader returned, free
// memory the session still owns, copy a tensor whose exporter died. This
// file holds their wire form (one function per message, so moving to the
// typed codecs of protocol/ is a local change) and the sending side; the
// registry's thread of the receiving session executes them (core.hpp).
#pragma once

#include <boost/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "memcuda/detail/registry/context.hpp"

namespace memcuda::detail::inbox {

struct Forget {
  std::string owner;
};
struct Unmap {
  std::string owner;
  std::vector<std::uint64_t> alloc_ids;
};
struct Free {
  std::uint64_t generation = 0;
};
// Copy `from` (mapped by the holder) into `to` (the leader's new memory).
struct Migrate {
  std::uint64_t id = 0;
  std::string reply_to;
  TensorInfo from, to;
};
struct Unknown {
  std::string op;
};
using Message = std::variant<Forget, Unmap, Free, Migrate, Unknown>;

struct MigrateAnswer {
  std::uint64_t id = 0;
  bool ok = true;
  std::string error;
};

inline std::string to_hex(std::string_view b) {
  static const char* d = "0123456789abcdef";
  std::string out;
  out.reserve(2 * b.size());
  for (unsigned char ch : b) {
    out.push_back(d[ch >> 4]);
    out.push_back(d[ch & 15]);
  }
  return out;
}
inline std::string from_hex(std::string_view h) {
  auto v = [](char ch) -> int {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    throw ProtocolError(ProtocolErrc::bad_value, "bad hex digit in an inbox message");
  };
  if (h.size() % 2) throw ProtocolError(ProtocolErrc::bad_value, "odd hex length in an inbox message");
  std::string out;
  for (std::size_t i = 0; i < h.size(); i += 2) out.push_back(static_cast<char>(v(h[i]) * 16 + v(h[i + 1])));
  return out;
}

// ---- the wire form (hand-built JSON until protocol/inbox.hpp) ----

inline std::string encode(const Message& msg) {
  boost::json::object m;
  if (auto* f = std::get_if<Forget>(&msg)) {
    m = {{"op", "forget"}, {"owner", f->owner}};
  } else if (auto* u = std::get_if<Unmap>(&msg)) {
    boost::json::array a;
    for (auto id : u->alloc_ids) a.push_back(id);
    m = {{"op", "unmap"}, {"owner", u->owner}, {"alloc_ids", a}};
  } else if (auto* fr = std::get_if<Free>(&msg)) {
    m = {{"op", "free"}, {"generation", fr->generation}};
  } else if (auto* mg = std::get_if<Migrate>(&msg)) {
    const TensorInfo &from = mg->from, &to = mg->to;
    m = {{"op", "migrate"},
         {"id", mg->id},
         {"reply_to", mg->reply_to},
         {"name", from.name},
         {"backend", std::string(to_string(from.backend))},
         {"bytes", from.bytes},
         {"from_owner", from.owner},
         {"from_alloc_id", from.alloc_id},
         {"from_offset", from.offset},
         {"to_owner", to.owner},
         {"to_owner_pid", to.owner_pid},
         {"to_alloc_id", to.alloc_id},
         {"to_offset", to.offset},
         {"to_alloc_bytes", to.alloc_bytes},
         {"to_handle", to_hex(to.ipc_handle)},
         {"to_device", to.device},
         {"to_device_uuid", to.device_uuid}};
  } else {
    m = {{"op", std::get<Unknown>(msg).op}};
  }
  return boost::json::serialize(m);
}

// Throws ProtocolError (or a Boost.JSON/out_of_range error) on a malformed message.
inline Message decode(std::string_view raw, const std::string& node) {
  if (raw.size() > protocol::kMaxCommandBytes) throw ProtocolError(ProtocolErrc::too_large, "inbox message too large");
  boost::json::object m = boost::json::parse(raw).as_object();
  auto str = [&](const char* k) { return std::string(m.at(k).as_string()); };
  auto u64 = [&](const char* k) { return m.at(k).to_number<std::uint64_t>(); };
  const std::string op = str("op");
  if (op == "forget") return Forget{str("owner")};
  if (op == "unmap") {
    Unmap u{str("owner"), {}};
    for (const auto& id : m.at("alloc_ids").as_array()) u.alloc_ids.push_back(id.to_number<std::uint64_t>());
    return u;
  }
  if (op == "free") return Free{u64("generation")};
  if (op == "migrate") {
    Migrate g;
    g.id = u64("id");
    g.reply_to = str("reply_to");
    TensorInfo &from = g.from, &to = g.to;
    from.name = to.name = str("name");
    auto b = backend_from_string(str("backend"));
    if (!b) throw ProtocolError(ProtocolErrc::bad_value, "unknown backend in a migrate message");
    from.backend = to.backend = *b;
    from.owner = str("from_owner");
    from.alloc_id = u64("from_alloc_id");
    from.offset = u64("from_offset");
    from.bytes = to.bytes = u64("bytes");
    to.owner = str("to_owner");
    to.owner_pid = m.at("to_owner_pid").to_number<std::int64_t>();
    to.alloc_id = u64("to_alloc_id");
    to.offset = u64("to_offset");
    to.alloc_bytes = u64("to_alloc_bytes");
    to.ipc_handle = from_hex(str("to_handle"));
    to.device = static_cast<int>(m.at("to_device").to_number<std::int64_t>());
    to.device_uuid = str("to_device_uuid");
    to.node = node;
    return g;
  }
  return Unknown{op};
}

inline std::string encode_answer(const MigrateAnswer& a) {
  boost::json::object o{{"id", a.id}, {"ok", a.ok}};
  if (!a.ok) o["error"] = a.error;
  return boost::json::serialize(o);
}
inline MigrateAnswer decode_answer(std::string_view raw) {
  boost::json::object o = boost::json::parse(raw).as_object();
  MigrateAnswer a;
  a.id = o.at("id").to_number<std::uint64_t>();
  a.ok = o.at("ok").as_bool();
  if (!a.ok) a.error = std::string(o.at("error").as_string());
  return a;
}

// Leaves a message in a session's inbox (kept a minute: a session that
// never reads it is dead and its inbox expires).
inline void send(redis::Connection& c, const Keys& keys, const std::string& sid, const Message& msg) {
  const std::string k = keys.inbox(sid);
  c.pipeline({{"LPUSH", k, encode(msg)}, {"PEXPIRE", k, "60000"}});
}

}  // namespace memcuda::detail::inbox

// Messages from the allocator of record to one session (its inbox list):
// forget a dead exporter's mappings, close slabs the leader returned, free
// memory the session still owns, copy a tensor whose exporter died. This
// file maps them to and from their wire form (protocol/inbox.hpp) and sends
// them; the registry's thread of the receiving session executes them
// (core.hpp).
#pragma once

#include "memcuda/config.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "memcuda/detail/registry/context.hpp"
#include "memcuda/protocol/inbox.hpp"
#include "memcuda/detail/store/lists.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::inbox {

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

// ---- the wire form: protocol/inbox.hpp's typed codecs ----

inline std::string encode(const Message& msg) {
  if (auto* f = std::get_if<Forget>(&msg)) return protocol::encode_inbox(protocol::ForgetMessage{f->owner});
  if (auto* u = std::get_if<Unmap>(&msg)) return protocol::encode_inbox(protocol::UnmapMessage{u->owner, u->alloc_ids});
  if (auto* fr = std::get_if<Free>(&msg)) return protocol::encode_inbox(protocol::FreeMessage{fr->generation});
  if (auto* mg = std::get_if<Migrate>(&msg)) {
    const TensorInfo &from = mg->from, &to = mg->to;
    protocol::MigrateMessage m;
    m.id = mg->id;
    m.reply_to = mg->reply_to;
    m.name = from.name;
    m.backend = from.backend;
    m.bytes = from.bytes;
    m.from_owner = from.owner;
    m.from_alloc_id = from.alloc_id;
    m.from_offset = from.offset;
    m.to_owner = to.owner;
    m.to_owner_pid = to.owner_pid;
    m.to_alloc_id = to.alloc_id;
    m.to_offset = to.offset;
    m.to_alloc_bytes = to.alloc_bytes;
    m.to_handle = to.ipc_handle;
    m.to_device = to.device;
    m.to_device_uuid = to.device_uuid;
    return protocol::encode_inbox(m);
  }
  throw InvalidArgument("inbox: cannot send a message of unknown op '" + std::get<Unknown>(msg).op + "'");
}

// Throws ProtocolError on a malformed message; an op this version does not
// know comes back as Unknown.
inline Message decode(std::string_view raw, const std::string& node) {
  protocol::InboxMessage in;
  try {
    in = protocol::decode_inbox(raw);
  } catch (const ProtocolError& e) {
    if (e.errc() != ProtocolErrc::unknown_op) throw;
    return Unknown{e.what()};
  }
  if (auto* f = std::get_if<protocol::ForgetMessage>(&in)) return Forget{f->owner};
  if (auto* u = std::get_if<protocol::UnmapMessage>(&in)) return Unmap{u->owner, u->alloc_ids};
  if (auto* fr = std::get_if<protocol::FreeMessage>(&in)) return Free{fr->generation};
  const auto& m = std::get<protocol::MigrateMessage>(in);
  Migrate g;
  g.id = m.id;
  g.reply_to = m.reply_to;
  TensorInfo &from = g.from, &to = g.to;
  from.name = to.name = m.name;
  from.backend = to.backend = m.backend;
  from.owner = m.from_owner;
  from.alloc_id = m.from_alloc_id;
  from.offset = m.from_offset;
  from.bytes = to.bytes = m.bytes;
  to.owner = m.to_owner;
  to.owner_pid = m.to_owner_pid;
  to.alloc_id = m.to_alloc_id;
  to.offset = m.to_offset;
  to.alloc_bytes = m.to_alloc_bytes;
  to.ipc_handle = m.to_handle;
  to.device = m.to_device;
  to.device_uuid = m.to_device_uuid;
  to.node = node;
  return g;
}

inline std::string encode_answer(const MigrateAnswer& a) {
  protocol::MigrateAnswer p{a.id, a.ok, {}};
  if (!a.ok) p.error = a.error;
  return protocol::encode_migrate_answer(p);
}
inline MigrateAnswer decode_answer(std::string_view raw) {
  auto p = protocol::decode_migrate_answer(raw);
  return {p.id, p.ok, p.error.value_or(std::string())};
}

// Leaves a message in a session's inbox (kept a minute: a session that
// never reads it is dead and its inbox expires).
inline void send(redis::Connection& c, const Keys& keys, const std::string& sid, const Message& msg) {
  store::push_expiring(c, keys.inbox(sid), encode(msg));
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::inbox

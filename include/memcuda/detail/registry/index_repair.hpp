// The leader's part of the schema repair (store/schema.hpp says what each
// key is and how it is rebuilt; store/schema_repair.hpp does it): the owners
// index needs the liveness of sessions, and a holder's reference index is
// checked where GC reads it (a dead holder's) or where the sweep's write to
// it fails.
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/detail/base/log.hpp"
#include "memcuda/detail/base/node.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/liveness.hpp"
#include "memcuda/detail/store/keys.hpp"
#include "memcuda/detail/store/name_index.hpp"
#include "memcuda/protocol/session.hpp"
#include "memcuda/redis/connection.hpp"
#include "memcuda/detail/store/indexes.hpp"
#include "memcuda/detail/store/records.hpp"
#include "memcuda/detail/store/schema_repair.hpp"
#include "memcuda/detail/store/lease.hpp"
#include "memcuda/detail/store/sessions.hpp"

#include <unistd.h>

MEMCUDA_NAMESPACE_BEGIN namespace detail::index_repair {

using schema::move_aside;

// memcuda:owners again: every live session that may lead (it may own
// records) and the lease holder's. Returns how many it wrote.
inline std::size_t rebuild_owners(redis::Connection& c, const Keys& k, const std::string& node) {
  std::vector<std::string> ids;
  std::vector<std::exception_ptr> errs;
  auto base = store::sessions_and_leader(c, k, &errs);
  if (!base[0].is_error())
    for (std::size_t i = 0; i < base[0].size(); ++i) ids.emplace_back(base[0][i].str());
  std::vector<redis::Command> add;
  if (!base[1].is_error() && !base[1].is_nil()) {
    const std::string token(base[1].str());
    if (auto sp = token.find(' '); sp != std::string::npos) add.push_back(store::add_owner_cmd(k, token.substr(sp + 1)));
  }
  if (!ids.empty()) {
    std::vector<redis::Command> get;
    for (const auto& id : ids) get.push_back(store::read_session_cmd(k, id));
    auto v = c.pipeline(get, &errs);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (v[i].is_error() || v[i].is_nil() || session_proves_death(v[i].str(), node)) continue;
      try {
        if (protocol::decode_session(v[i].str()).allocator_capable) add.push_back(store::add_owner_cmd(k, ids[i]));
      } catch (const std::exception&) {  // unreadable: not a session that leads
      }
    }
  }
  if (!add.empty()) c.pipeline(add, &errs);
  return add.size();
}

// The periodic check of every fixed key of the schema (store/schema.hpp,
// schema_repair.hpp) by the lease holder of `token`; `full` at lease win.
// Returns how many keys it moved.
inline std::size_t check(redis::Connection& c, const Context& ctx, const std::string& token, bool full = false) {
  const Keys& k = ctx.keys;
  return schema::check(c, k, full, [&](schema::Fix f) {
    if (f == schema::Fix::owners) rebuild_owners(c, k, ctx.node);
    else if (f == schema::Fix::owner_uid) store::write_owner_uid(c, k, std::to_string(::geteuid()));
    else if (f == schema::Fix::lease && !token.empty()) schema::restore_lease(c, k, token, ctx.opts.lease_ttl);
  });
}

// Up to `n` members of a holder's reference index. An index of the wrong
// type is moved aside (the sweep writes the references back from the
// records) and reads as empty.
inline std::vector<std::string> refs_page(redis::Connection& c, const Keys& k, const std::string& holder,
                                          std::size_t n) {
  std::vector<std::exception_ptr> errs;
  const std::string key = k.refs(holder);
  auto r = store::sample_refs(c, k, holder, n, &errs);
  std::vector<std::string> out;
  if (r.is_error()) {
    const std::string type = store::key_type(c, key);
    if (type != "set" && type != "none")
      move_aside(c, k, key, type, "set", "the garbage collector's sweep writes the references back from the records");
    return out;
  }
  for (std::size_t i = 0; i < r.size(); ++i) out.emplace_back(r[i].str());
  return out;
}

// After a pipeline of index writes (SADD to refs:<h> and holders): each key
// whose write failed for its type is moved aside and its writes sent again.
inline void redo_failed(redis::Connection& c, const Keys& k, const std::vector<redis::Command>& writes,
                        const std::vector<std::exception_ptr>& errs) {
  std::vector<std::string> bad;
  for (std::size_t i = 0; i < writes.size() && i < errs.size(); ++i) {
    if (!errs[i] || writes[i].size() < 2) continue;
    const std::string key(writes[i][1]);
    if (std::find(bad.begin(), bad.end(), key) == bad.end()) bad.push_back(key);
  }
  if (bad.empty()) return;
  std::vector<redis::Command> again;
  for (const auto& key : bad) {
    const std::string type = store::key_type(c, key);
    if (type == "set" || type == "none") continue;  // changed meanwhile, or not a type fault
    if (move_aside(c, k, key, type, "set", "written again from the records now") < 0) continue;
    for (const auto& w : writes)
      if (w.size() >= 2 && std::string_view(w[1]) == key) again.push_back(w);
  }
  std::vector<std::exception_ptr> e2;
  if (!again.empty()) c.pipeline(again, &e2);
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::index_repair

// Typed access to the index keys outside the scripts (index_fn.hpp says
// what each holds): a holder's reference index memcuda:refs:<holder>, the
// holders index memcuda:holders and the state-dict ids memcuda:dict_ids.
// The scripts keep them in step with the records; the allocator of record's
// sweep and repair (detail/registry/gc/, index_repair.hpp) write what they lack. Each
// function sends exactly the commands its name says; the *_cmd forms build
// one for a caller's pipeline.
#pragma once

#include "memcuda/config.hpp"

#include <cstddef>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/detail/store/keys.hpp"
#include "memcuda/redis/connection.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::store {

// The member of a holder's reference index for one reference: '<generation>:<name>'.
inline std::string ref_member(std::string_view gen, std::string_view name) {
  std::string m;
  m.reserve(gen.size() + 1 + name.size());
  m.append(gen).append(1, ':').append(name);
  return m;
}
// SADD of one member to a holder's reference index, and of a holder to the holders index.
inline redis::Command add_ref_cmd(const Keys& k, std::string_view holder, std::string member) {
  return {"SADD", k.refs(holder), std::move(member)};
}
inline redis::Command add_holder_cmd(const Keys& k, std::string holder) { return {"SADD", k.holders(), std::move(holder)}; }

// Up to `n` members of a holder's reference index (SRANDMEMBER); an index of
// the wrong type is an error reply in `errs`.
inline redis::Reply sample_refs(redis::Connection& c, const Keys& k, std::string_view holder, std::size_t n,
                                std::vector<std::exception_ptr>* errs) {
  return std::move(c.pipeline({{"SRANDMEMBER", k.refs(holder), std::to_string(n)}}, errs)[0]);
}

// The ids of every state-dict record (SMEMBERS), and one forgotten (SREM).
inline redis::Reply dict_ids(redis::Connection& c, const Keys& k) { return c.command({"SMEMBERS", k.dict_ids()}); }
inline void forget_dict_id(redis::Connection& c, const Keys& k, std::string_view id) {
  c.command({"SREM", k.dict_ids(), id});
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::store

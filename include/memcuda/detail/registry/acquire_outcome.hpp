// What an acquire script's answer means, for whoever ran it: a client's
// get (Client::acquire) or the leader's get for a JSON client (Executor).
// A refused acquire throws the error that names why; a reference taken to
// a record that does not decode is given back before the error is thrown
// (else it would be held until the holder ends).
#pragma once

#include "memcuda/config.hpp"

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/lease_view.hpp"
#include "memcuda/detail/registry/own_allocator.hpp"
#include "memcuda/detail/store/records.hpp"
#include "memcuda/detail/store/reply.hpp"
#include "memcuda/protocol/record_desc.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// The outcome of an acquire script run for `name` on node `node`.
inline TensorInfo acquire_outcome(const redis::Reply& r, const std::string& name, std::optional<DType> dtype,
                                  std::string_view node, LeaseView& lease) {
  const std::string st = script_status(r);
  if (st == "ok") return protocol::decode_record(fields_from_reply(r[1]));
  if (st == "corrupt") throw corrupt_record(name, r[1].str());
  if (st == "notfound") throw NotFound("no tensor named '" + name + "'");
  if (st == "dtype")
    throw TypeMismatch("tensor '" + name + "' holds " + std::string(r[1].str()) + ", not " +
                       std::string(dtype ? to_string(*dtype) : "?"));
  if (st == "node")
    throw Unavailable("tensor '" + name + "' lives on node " + std::string(r[1].str()) + ", this is " +
                      std::string(node));
  if (st == "lost") {
    std::map<std::string, std::string> m;
    for (auto& [f, v] : fields_from_reply(r[1])) m[f] = v;
    namespace f = store::field;
    throw Lost("tensor '" + name + "' (generation " + m[std::string(f::generation)] +
               ") was lost: its allocator of record (pid " + m[std::string(f::owner_pid)] + ", session " +
               m[std::string(f::owner)] + ", epoch " + m[std::string(f::epoch)] +
               ") died and no live process held a copy; the name is free to create again");
  }
  if (st == "state") {
    if (r[1].str() == "lost")
      throw Lost("tensor '" + name + "' was lost: its allocator of record died and nobody held it");
    throw NotFound("tensor '" + name + "' is not ready (state " + std::string(r[1].str()) + ")");
  }
  lease.fail_status("acquire", st, "getting '" + name + "'", st == "notleader" ? r[1].str() : "");
}

// acquire_outcome, and `holder`'s reference given back when the script
// took one to a record that does not decode.
inline TensorInfo acquired(Context& ctx, LeaseView& lease, OwnAllocator& alloc, const redis::Reply& r,
                           const std::string& name, std::optional<DType> dtype, const std::string& holder) {
  try {
    return acquire_outcome(r, name, dtype, ctx.node, lease);
  } catch (const ProtocolError&) {
    if (script_status(r) != "ok") throw;
    std::uint64_t gen = 0;
    for (auto& [f, v] : fields_from_reply(r[1]))
      if (f == store::field::generation) gen = protocol::detail::parse_decimal<std::uint64_t>(v).value_or(0);
    if (gen) {
      try {
        auto c = ctx.pool.acquire();
        alloc.release(*c, name, gen, holder, "");
      } catch (const std::exception& e) {
        log(LogLevel::warn, "giving back the reference to corrupt record '" + name + "': " + e.what());
      }
    }
    throw;
  }
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

// What an acquire script's answer means, for whoever ran it: a client's
// get (Client::acquire) or the leader's get for a JSON client (Executor).
// A refused acquire throws the error that names why; a reference taken to
// a record that does not decode is given back before the error is thrown
// (else it would be held until the holder ends).
#pragma once

#include "memcuda/config.hpp"

#include <optional>
#include <string>
#include <string_view>

#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/lease_view.hpp"
#include "memcuda/detail/registry/own_allocator.hpp"
#include "memcuda/detail/store/records.hpp"
#include "memcuda/detail/store/reply.hpp"
#include "memcuda/detail/store/scripts.hpp"
#include "memcuda/protocol/record_desc.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

inline TensorInfo acquired(Context& ctx, LeaseView& lease, OwnAllocator& alloc, const store::Answer& r,
                           const std::string& name, std::optional<DType> dtype, const std::string& holder) {
  if (r.is("notleader")) lease.fail_status("acquire", r.status, "getting '" + name + "'", r[1].str());
  if (!r.is("ok"))
    store::throw_refused("acquire", r.status, r.size() > 1 ? r[1] : r.reply.view(), name, dtype, ctx.node);
  try {
    return protocol::decode_record(fields_from_reply(r[1]));
  } catch (const ProtocolError&) {
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

// Where a record's memory is: the fields that name a pool block of the
// allocator of record, written alike by a create, a create many and a
// migration into a new home.
#pragma once

#include "memcuda/config.hpp"

#include <unistd.h>

#include <cstdint>

#include "memcuda/detail/pool/device_pool.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/tensor_info.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// Where a record's memory is: block `pb` of this allocator of record, under
// its lease epoch. The fields a create writes and a migration rewrites.
inline void place_in(TensorInfo& t, const PoolBlock& pb, const Context& ctx, std::uint64_t epoch) {
  const Allocation& a = pb.slab->allocation();
  t.ipc_handle = a.handle;
  t.alloc_kind = a.alloc_kind;
  t.fd_source = a.fd_source;
  t.offset = pb.block.offset;
  t.alloc_bytes = a.size;
  t.alloc_id = a.alloc_id;
  t.device = a.device;
  t.device_uuid = a.device_uuid;
  t.owner = ctx.session;
  t.owner_pid = ::getpid();
  t.epoch = epoch;
  t.node = ctx.node;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

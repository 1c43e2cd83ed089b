// Where a record's memory is: the device a create asks for, and the fields
// that name a pool block of the allocator of record, written alike by a
// create, a create many and a migration into a new home.
#pragma once

#include "memcuda/config.hpp"

#include <unistd.h>

#include <cstdint>
#include <optional>
#include <string>

#include "memcuda/detail/base/node.hpp"
#include "memcuda/detail/cuda/runtime.hpp"
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

// The device ordinal a create names, in this process: a host tensor's is
// -1. Ordinals differ between processes with different
// CUDA_VISIBLE_DEVICES; the UUID, when the sender gave it, is what names
// the device.
inline int device_for(BackendKind kind, std::optional<int> device, const std::optional<std::string>& uuid,
                      const Context& ctx) {
  if (kind != BackendKind::cuda) return -1;
  int d = device.value_or(ctx.opts.default_device);
#if MEMCUDA_HAS_CUDA()
  if (uuid) d = ordinal_of_uuid(*uuid, d);
#else
  (void)uuid;
#endif
  return d;
}

// The record of a new tensor in block `pb`, before the create script
// gives it its generation, refcount and holders.
inline TensorInfo new_record(const std::string& name, DType dtype, const Shape& shape, std::uint64_t bytes,
                             BackendKind kind, const PoolBlock& pb, const Context& ctx, std::uint64_t epoch,
                             const std::string& create_id) {
  TensorInfo t;
  t.name = name;
  t.dtype = dtype;
  t.shape = shape;
  t.ctime_ms = now_ms();
  t.bytes = bytes;
  t.backend = kind;
  place_in(t, pb, ctx, epoch);
  t.state = TensorState::ready;
  t.create_id = create_id;
  return t;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

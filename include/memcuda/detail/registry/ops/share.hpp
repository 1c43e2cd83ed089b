// TensorRegistry::share: a buffer this process already has, registered by
// name without a copy (docs/design.md, "Borrowed tensors", says how others
// open it and how the last release reaches this process). The share script
// publishes it unfenced (this process owns the memory, not the allocator
// of record); the registry keeps the buffer's keep-alive (get/borrowed.hpp)
// until the record's last reference goes.
#pragma once

#include "memcuda/config.hpp"

#include <unistd.h>

#include <exception>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "memcuda/detail/backend/borrow.hpp"
#include "memcuda/detail/backend/borrow_cuda.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/detail/registry/get/client.hpp"
#include "memcuda/detail/registry/core.hpp"
#include "memcuda/detail/store/reply.hpp"
#include "memcuda/detail/store/share_scripts.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// A share made ready for its script: the record's fields, and the block
// that stands for the buffer (already this process's own export).
struct PreparedShare {
  TensorInfo t;
  std::vector<std::string> fields;
  std::shared_ptr<ExportedBlock> block;
  void* ptr = nullptr;
  bool persistent = false;
};

inline PreparedShare prepare_share(Core& core, std::string_view name_in, void* ptr, DType dtype, Shape shape,
                                   const ShareOptions& opts) {
  const std::string name(name_in);
  ::memcuda::validate_name(name);
  validate_shape(shape);
  if (!ptr) throw InvalidArgument("share '" + name + "': the pointer is null");
  const std::uint64_t bytes = byte_size(dtype, shape);
  if (bytes == 0)
    throw InvalidArgument("share '" + name + "': " + std::string(to_string(dtype)) + " " + shape_to_string(shape) +
                          " has no bytes: there is nothing to share");
  if (!core.ctx.opts.control_thread)
    throw InvalidArgument("share '" + name + "': this registry runs no control thread (RegistryOptions::"
                          "control_thread), and the last release by another process reaches the owner through "
                          "the inbox that thread reads");
  const std::string& session = core.ctx.session;
  const std::uint64_t id = core.borrowed.next_alloc_id();
  Allocation a;
  std::optional<int> device;
#if MEMCUDA_HAS_CUDA()
  device = device_of_pointer(ptr);
  if (device) a = borrow_cuda(ptr, bytes, *device, id, session);
#endif
  if (!device) a = borrow_host(ptr, bytes, id, session);
  a.keep_alive = opts.keep_alive;

  PreparedShare p;
  TensorInfo& t = p.t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.ctime_ms = now_ms();
  t.node = core.ctx.node;
  t.device = a.device;
  t.device_uuid = a.device_uuid;
  t.bytes = bytes;
  t.backend = a.kind;
  t.ipc_handle = a.handle;
  t.offset = static_cast<std::uint64_t>(static_cast<char*>(ptr) - static_cast<char*>(a.base));
  t.alloc_bytes = a.size;
  t.alloc_id = id;
  t.alloc_kind = a.alloc_kind;
  t.fd_source = a.fd_source;
  t.state = TensorState::ready;
  t.owner = session;
  t.owner_pid = ::getpid();
  t.borrowed = true;
  protocol::for_each_record_field(t, [&](auto&& f, auto&& v) {
    namespace rf = protocol::record_field;
    const std::string_view n(f);
    if (n == rf::generation || n == rf::state || n == rf::refcount || n.starts_with(rf::holder_prefix)) return;
    p.fields.emplace_back(n);
    p.fields.emplace_back(std::string_view(v));
  });
  // Our own export from here: a get of this name in this process resolves
  // to `ptr` (a process cannot open its own IPC handle). A failure below
  // drops the block: the fd is no longer served, the keep-alive goes.
  p.block = std::make_shared<ExportedBlock>(Process::get().backends().borrowed, std::move(a));
  Process::get().cache().add_export(session, p.block);
  p.ptr = ptr;
  p.persistent = opts.persistent;
  return p;
}

// The share script's answer for `p`: the tensor, now held by this process.
inline Opened finish_share(Core& core, PreparedShare& p, const redis::Reply& r) {
  TensorInfo& t = p.t;
  const std::string st = script_status(r);
  if (st == "exists")
    throw AlreadyExists("share '" + t.name + "': a tensor of that name exists (generation " +
                        std::to_string(reply_u64(r[1])) + "); remove it first or share under another name");
  if (st == "stray") throw AlreadyExists("cannot share '" + t.name + "': " + stray_record(core.ctx.keys.tensor(t.name), r[1].str()));
  if (st != "ok") throw InternalError("share script answered '" + st + "'");
  t.generation = reply_u64(r[1]);
  t.refcount = reply_int(r[2]);
  t.holders[core.ctx.session] = 1;
  if (p.persistent) t.holders[std::string(HolderId::kName)] = 1;
  core.borrowed.add(t, p.persistent, p.block);
  core.holdings.took(t);
  return {t, p.ptr, p.block};
}

inline Opened share_buffer(Core& core, std::string_view name, void* ptr, DType dtype, Shape shape,
                           const ShareOptions& opts) {
  auto p = prepare_share(core, name, ptr, dtype, std::move(shape), opts);
  auto conn = core.ctx.pool.acquire();
  auto r = store::share_record(*conn, core.ctx.keys, p.t.name, core.ctx.session, p.persistent, p.fields);
  return finish_share(core, p, r);
}

// Many shares in one pipeline: each item's tensor, or the error that
// refused it (in the order given). Nothing reaches Redis when one of them
// cannot be shared at all (NotShareable, a bad name): that error is thrown.
inline std::vector<std::variant<Opened, std::exception_ptr>> share_buffers(Core& core,
                                                                           std::vector<ShareRequest>& items) {
  std::set<std::string_view> seen;
  for (const auto& it : items)
    if (!seen.insert(it.name).second) throw InvalidArgument("share_many: '" + it.name + "' is given twice");
  std::vector<PreparedShare> ps;
  ps.reserve(items.size());
  for (auto& it : items) ps.push_back(prepare_share(core, it.name, it.data, it.dtype, std::move(it.shape), it.opts));
  std::vector<redis::Command> cmds;
  cmds.reserve(ps.size());
  for (const auto& p : ps)
    cmds.push_back(store::share_record_cmd(core.ctx.keys, p.t.name, core.ctx.session, p.persistent, p.fields));
  auto conn = core.ctx.pool.acquire();
  std::vector<std::exception_ptr> errors;
  auto replies = store::share_records(*conn, cmds, errors);
  std::vector<std::variant<Opened, std::exception_ptr>> out;
  out.reserve(ps.size());
  for (std::size_t i = 0; i < ps.size(); ++i) {
    try {
      if (errors[i]) std::rethrow_exception(errors[i]);
      out.emplace_back(finish_share(core, ps[i], replies[i]));
    } catch (...) {
      out.emplace_back(std::current_exception());
    }
  }
  return out;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail

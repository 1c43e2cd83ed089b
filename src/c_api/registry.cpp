// The C ABI's registry calls: open/close, create, get, remove, wait, flush,
// info, list, stats, garbage collection (the batch calls are in batch.cpp).
//
// This is libmemcuda_c's implementation TU: when the public headers are split
// into declarations and <memcuda/implementation.hpp>, the latter is included
// here, once (the other TUs only include the declarations).
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "c_api_internal.hpp"

using memcuda_c::guarded;

namespace {

std::chrono::milliseconds ms(std::int64_t v) { return std::chrono::milliseconds(v); }

// Whether the caller's struct (struct_size) holds the field at [offset, offset + size).
bool has(const memcuda_registry_options* c, std::size_t offset, std::size_t size) {
  return c->struct_size >= offset + size;
}
// A connection count: 0 keeps the default, else 1.. .
void count(std::int64_t v, std::size_t& field, const char* what) {
  if (v < 0) throw memcuda::InvalidArgument(std::string(what) + " must not be negative (0: the default)");
  if (v > 0) field = static_cast<std::size_t>(v);
}

memcuda::RegistryOptions to_options(const memcuda_registry_options* c) {
  auto o = memcuda::RegistryOptions::from_env();  // the MEMCUDA_* variables; the struct's fields win
  if (!c) return o;
  if (!has(c, offsetof(memcuda_registry_options, command_timeout_ms), sizeof c->command_timeout_ms))
    memcuda_c::check_struct(c, "options");  // older than the first release's struct: refused with its message
  if (c->url && *c->url) o.redis = memcuda::redis::with_password_from_env(memcuda::redis::parse_url(c->url));
  if (c->name_space) o.name_space = c->name_space;
  o.control_thread = c->control_thread != 0;
  switch (c->default_backend) {
    case MEMCUDA_BACKEND_DEFAULT: break;
    case MEMCUDA_BACKEND_CUDA: o.default_backend = memcuda::BackendKind::cuda; break;
    case MEMCUDA_BACKEND_HOST: o.default_backend = memcuda::BackendKind::host; break;
    default: throw memcuda::InvalidArgument("default_backend " + std::to_string(c->default_backend) + " is not a MEMCUDA_BACKEND_* value");
  }
  if (c->default_device < 0) throw memcuda::InvalidArgument("default_device must not be negative");
  o.default_device = c->default_device;
  auto set = [](std::int64_t v, std::chrono::milliseconds& field, const char* what) {
    if (v < 0) throw memcuda::InvalidArgument(std::string(what) + " must not be negative (0: the default)");
    if (v > 0) field = ms(v);
  };
  set(c->request_timeout_ms, o.request_timeout, "request_timeout_ms");
  set(c->lease_ttl_ms, o.lease_ttl, "lease_ttl_ms");
  set(c->session_ttl_ms, o.session_ttl, "session_ttl_ms");
  set(c->gc_interval_ms, o.gc_interval, "gc_interval_ms");
  set(c->connect_timeout_ms, o.redis.connect_timeout, "connect_timeout_ms");
  set(c->command_timeout_ms, o.redis.command_timeout, "command_timeout_ms");
  // Fields appended after the first release: read only when the caller's struct has them.
  if (has(c, offsetof(memcuda_registry_options, client_connections), sizeof c->client_connections))
    count(c->client_connections, o.client_connections, "client_connections");
  if (has(c, offsetof(memcuda_registry_options, waiting_connections), sizeof c->waiting_connections))
    count(c->waiting_connections, o.waiting_connections, "waiting_connections");
  if (has(c, offsetof(memcuda_registry_options, share_references), sizeof c->share_references)) {
    switch (c->share_references) {
      case MEMCUDA_SHARING_DEFAULT: break;
      case MEMCUDA_SHARING_ON: o.share_references = true; break;
      case MEMCUDA_SHARING_OFF: o.share_references = false; break;
      default: throw memcuda::InvalidArgument("share_references " + std::to_string(c->share_references) + " is not a MEMCUDA_SHARING_* value");
    }
  }
  if (has(c, offsetof(memcuda_registry_options, release_linger_ms), sizeof c->release_linger_ms)) {
    const std::int64_t v = c->release_linger_ms;
    if (v < -1 || v > 60000)
      throw memcuda::InvalidArgument("release_linger_ms " + std::to_string(v) + " is out of range (-1: none, 0: the default, at most 60000)");
    if (v == -1) o.release_linger = std::chrono::microseconds(0);
    if (v > 0) o.release_linger = ms(v);
  }
  if (has(c, offsetof(memcuda_registry_options, cuda_allocation), sizeof c->cuda_allocation)) {
    switch (c->cuda_allocation) {
      case MEMCUDA_CUDA_ALLOCATION_DEFAULT: break;
      case MEMCUDA_CUDA_ALLOCATION_AUTO: o.cuda_allocation = memcuda::CudaAllocation::automatic; break;
      case MEMCUDA_CUDA_ALLOCATION_VMM: o.cuda_allocation = memcuda::CudaAllocation::vmm; break;
      case MEMCUDA_CUDA_ALLOCATION_IPC: o.cuda_allocation = memcuda::CudaAllocation::ipc; break;
      default: throw memcuda::InvalidArgument("cuda_allocation " + std::to_string(c->cuda_allocation) + " is not a MEMCUDA_CUDA_ALLOCATION_* value");
    }
  }
  if (has(c, offsetof(memcuda_registry_options, serve_stall_timeout_ms), sizeof c->serve_stall_timeout_ms)) {
    const std::int64_t v = c->serve_stall_timeout_ms;
    if (v < -1) throw memcuda::InvalidArgument("serve_stall_timeout_ms must be -1 (never), 0 (the default) or positive");
    if (v == -1) o.serve_stall_timeout = ms(0);
    if (v > 0) o.serve_stall_timeout = ms(v);
  }
  if (has(c, offsetof(memcuda_registry_options, runtime_dir), sizeof c->runtime_dir) && c->runtime_dir &&
      *c->runtime_dir)
    o.runtime_dir = c->runtime_dir;
  auto ids = [](const std::uint32_t* p, std::size_t n, std::vector<std::uint32_t>& field, const char* what) {
    if (!p) return;  // the default (the variable)
    if (n > 65536) throw memcuda::InvalidArgument(std::string(what) + "_count " + std::to_string(n) + " is too large");
    field.assign(p, p + n);
  };
  if (has(c, offsetof(memcuda_registry_options, allowed_uids_count), sizeof c->allowed_uids_count))
    ids(c->allowed_uids, c->allowed_uids_count, o.allowed_uids, "allowed_uids");
  if (has(c, offsetof(memcuda_registry_options, allowed_gids_count), sizeof c->allowed_gids_count))
    ids(c->allowed_gids, c->allowed_gids_count, o.allowed_gids, "allowed_gids");
  return o;
}

// The registry's options in the C struct's terms (memcuda_registry_get_options).
void from_options(const memcuda::RegistryOptions& o, memcuda_registry_options* c) {
  memcuda_registry_options f{};
  f.struct_size = c->struct_size;
  f.url = nullptr;
  f.name_space = o.name_space.c_str();
  f.control_thread = o.control_thread ? 1 : 0;
  f.default_backend = !o.default_backend                             ? MEMCUDA_BACKEND_DEFAULT
                      : *o.default_backend == memcuda::BackendKind::cuda ? MEMCUDA_BACKEND_CUDA
                                                                         : MEMCUDA_BACKEND_HOST;
  f.default_device = o.default_device;
  f.request_timeout_ms = o.request_timeout.count();
  f.lease_ttl_ms = o.lease_ttl.count();
  f.session_ttl_ms = o.session_ttl.count();
  f.gc_interval_ms = o.gc_interval.count();
  f.connect_timeout_ms = o.redis.connect_timeout.count();
  f.command_timeout_ms = o.redis.command_timeout.count();
  f.client_connections = static_cast<std::int64_t>(o.client_connections);
  f.waiting_connections = static_cast<std::int64_t>(o.waiting_connections);
  f.share_references = o.share_references ? MEMCUDA_SHARING_ON : MEMCUDA_SHARING_OFF;
  const auto linger = std::chrono::duration_cast<std::chrono::milliseconds>(o.release_linger).count();
  f.release_linger_ms = linger > 0 ? linger : -1;
  using memcuda::CudaAllocation;
  f.cuda_allocation = o.cuda_allocation.value_or(CudaAllocation::automatic) == CudaAllocation::vmm ? MEMCUDA_CUDA_ALLOCATION_VMM
                      : o.cuda_allocation.value_or(CudaAllocation::automatic) == CudaAllocation::ipc
                          ? MEMCUDA_CUDA_ALLOCATION_IPC
                          : MEMCUDA_CUDA_ALLOCATION_AUTO;
  f.serve_stall_timeout_ms = o.serve_stall_timeout.count() > 0 ? o.serve_stall_timeout.count() : -1;
  f.runtime_dir = o.runtime_dir.c_str();
  f.allowed_uids = o.allowed_uids.empty() ? nullptr : o.allowed_uids.data();
  f.allowed_uids_count = o.allowed_uids.size();
  f.allowed_gids = o.allowed_gids.empty() ? nullptr : o.allowed_gids.data();
  f.allowed_gids_count = o.allowed_gids.size();
  std::memcpy(c, &f, std::min<std::size_t>(c->struct_size, sizeof f));
}

// Opens one tensor and checks the dtype, returning a new C handle.
// With a stream, the stream also waits for the producer's last publish
// (the event handle comes with the record: no extra round trip).
memcuda_tensor* open_one(memcuda_registry* r, const char* name, int dtype, const void* const* stream = nullptr) {
  auto want = memcuda_c::want_dtype(dtype);
  auto& reg = memcuda_c::registry(r);
  auto n = memcuda_c::name_arg(name);
  auto t = stream ? reg.get<void>(n, static_cast<memcuda::StreamHandle>(const_cast<void*>(*stream)))
                  : reg.get<void>(n);
  if (want && t.dtype() != *want)
    throw memcuda::TypeMismatch("tensor '" + t.name() + "' is " + std::string(memcuda::to_string(t.dtype())) +
                                ", not " + std::string(memcuda::to_string(*want)));
  return new memcuda_tensor(std::move(t));
}

// Every field of memcuda_stats from TensorRegistry::stats().
void fill_stats(memcuda_stats* s, const memcuda::RegistryStats& st) {
  s->leader_present = st.leader.present;
  s->leader_is_self = st.leader.is_self;
  s->leader_epoch = st.leader.epoch;
  memcuda_c::copy_cstr(s->leader_session, sizeof s->leader_session, st.leader.session);
  s->sessions = st.sessions;
  s->tensors = st.tensors;
  s->bytes = st.bytes;
  s->queue_length = st.queue_length;
  s->pools = st.pools.size();
  for (const auto& p : st.pools) {
    s->pool_in_use += p.in_use;
    s->pool_reserved += p.reserved;
  }
  s->owned_allocations = st.process.owned_allocations;
  s->owned_bytes = st.process.owned_bytes;
  s->creates = st.process.creates;
  s->frees = st.process.frees;
  s->live_imports = st.process.live_imports;
  s->import_opens = st.process.import_opens;
  s->import_hits = st.process.import_hits;
  s->copies = st.process.copies;
  s->copied_bytes = st.process.copied_bytes;
}

}  // namespace

extern "C" {

void memcuda_registry_options_init(memcuda_registry_options* o) {
  if (!o) return;
  *o = memcuda_registry_options{};
  o->struct_size = sizeof *o;
  o->control_thread = 1;
  o->default_backend = MEMCUDA_BACKEND_DEFAULT;
}

int memcuda_registry_get_options(const memcuda_registry* reg, memcuda_registry_options* out) {
  return guarded([&] {
    if (!reg) throw memcuda::InvalidArgument("registry is NULL");
    if (!out) throw memcuda::InvalidArgument("out is NULL");
    if (out->struct_size < offsetof(memcuda_registry_options, client_connections))
      throw memcuda::InvalidArgument("out->struct_size is " + std::to_string(out->struct_size) +
                                     " (call memcuda_registry_options_init first)");
    from_options(reg->reg.options(), out);
  });
}

int memcuda_registry_open(const memcuda_registry_options* opts, memcuda_registry** out) {
  return guarded([&] {
    memcuda_c::out_arg(out);
    *out = new memcuda_registry(to_options(opts));
  });
}

void memcuda_registry_close(memcuda_registry* reg) { delete reg; }

const char* memcuda_registry_session_id(const memcuda_registry* reg) { return reg ? reg->session.c_str() : ""; }

int memcuda_registry_is_leader(const memcuda_registry* reg, int* out) {
  return guarded([&] {
    if (!reg || !out) throw memcuda::InvalidArgument("registry or out is NULL");
    *out = reg->reg.is_leader() ? 1 : 0;
  });
}

void memcuda_create_options_init(memcuda_create_options* o) {
  if (!o) return;
  *o = memcuda_create_options{};
  o->struct_size = sizeof *o;
  o->backend = MEMCUDA_BACKEND_DEFAULT;
  o->device = -1;
}

int memcuda_create(memcuda_registry* reg, const char* name, int dtype, const int64_t* shape, int ndim,
                   const memcuda_create_options* opts, memcuda_tensor** out) {
  return guarded([&] {
    memcuda_c::out_arg(out);
    auto& r = memcuda_c::registry(reg);
    auto s = memcuda_c::create_spec(name, dtype, shape, ndim, opts);
    auto t = r.create_any(s.name, s.dtype, std::move(s.shape), s.options);
    *out = new memcuda_tensor(std::move(t));
  });
}

int memcuda_get(memcuda_registry* reg, const char* name, int dtype, memcuda_tensor** out) {
  return guarded([&] {
    memcuda_c::out_arg(out);
    *out = open_one(reg, name, dtype);
  });
}

int memcuda_get_on_stream(memcuda_registry* reg, const char* name, int dtype, void* stream, memcuda_tensor** out) {
  return guarded([&] {
    memcuda_c::out_arg(out);
    const void* s = stream;
    *out = open_one(reg, name, dtype, &s);
  });
}

int memcuda_remove(memcuda_registry* reg, const char* name) {
  return guarded([&] { memcuda_c::registry(reg).remove(memcuda_c::name_arg(name)); });
}

int memcuda_wait(memcuda_registry* reg, const char* name, int64_t timeout_ms, int* ready) {
  return guarded([&] {
    if (timeout_ms < 0) throw memcuda::InvalidArgument("timeout_ms must not be negative");
    bool ok = memcuda_c::registry(reg).wait(memcuda_c::name_arg(name), ms(timeout_ms));
    if (ready) *ready = ok ? 1 : 0;
  });
}

int memcuda_flush(memcuda_registry* reg, int64_t timeout_ms) {
  return guarded([&] { memcuda_c::registry(reg).flush(ms(timeout_ms < 0 ? -1 : timeout_ms)); });
}

void memcuda_tensor_info_init(memcuda_tensor_info* info) {
  if (!info) return;
  *info = memcuda_tensor_info{};
  info->struct_size = sizeof *info;
}

int memcuda_info(memcuda_registry* reg, const char* name, memcuda_tensor_info* info) {
  return guarded([&] {
    memcuda_c::check_struct(info, "info");
    memcuda_c::fill_info(info, memcuda_c::registry(reg).info(memcuda_c::name_arg(name)));
  });
}

int memcuda_list(memcuda_registry* reg, const char* pattern, memcuda_tensor_info** out, size_t* count) {
  return guarded([&] {
    if (!out || !count) throw memcuda::InvalidArgument("out or count is NULL");
    *out = nullptr;
    *count = 0;
    auto all = memcuda_c::registry(reg).list(pattern ? pattern : "*");
    if (all.empty()) return;
    // malloc'd so that memcuda_free_infos is a plain free of one block.
    auto* arr = static_cast<memcuda_tensor_info*>(std::calloc(all.size(), sizeof(memcuda_tensor_info)));
    if (!arr) throw std::bad_alloc();
    for (size_t i = 0; i < all.size(); ++i) {
      arr[i].struct_size = sizeof(memcuda_tensor_info);
      memcuda_c::fill_info(&arr[i], all[i]);
    }
    *out = arr;
    *count = all.size();
  });
}

int memcuda_list_page(memcuda_registry* reg, const char* pattern, const char* after, size_t limit,
                      memcuda_tensor_info** out, size_t* count, char* next) {
  return guarded([&] {
    if (!out || !count || !next) throw memcuda::InvalidArgument("out, count or next is NULL");
    *out = nullptr;
    *count = 0;
    next[0] = 0;
    auto page = memcuda_c::registry(reg).list_page(pattern ? pattern : "*", after ? after : "", limit);
    if (page.next.size() > MEMCUDA_MAX_NAME_BYTES) throw memcuda::InternalError("a name longer than the maximum");
    if (!page.tensors.empty()) {
      auto* arr = static_cast<memcuda_tensor_info*>(std::calloc(page.tensors.size(), sizeof(memcuda_tensor_info)));
      if (!arr) throw std::bad_alloc();
      for (size_t i = 0; i < page.tensors.size(); ++i) {
        arr[i].struct_size = sizeof(memcuda_tensor_info);
        memcuda_c::fill_info(&arr[i], page.tensors[i]);
      }
      *out = arr;
      *count = page.tensors.size();
    }
    std::memcpy(next, page.next.c_str(), page.next.size() + 1);
  });
}

void memcuda_free_infos(memcuda_tensor_info* infos) { std::free(infos); }

void memcuda_stats_init(memcuda_stats* s) {
  if (!s) return;
  *s = memcuda_stats{};
  s->struct_size = sizeof *s;
}

int memcuda_stats_get(memcuda_registry* reg, memcuda_stats* s) {
  return guarded([&] {
    // A caller built before copies/copied_bytes passes the older size:
    // fill what it has room for (one struct, written in full here).
    constexpr std::uint32_t before_copies = offsetof(memcuda_stats, copies);
    if (!s) throw memcuda::InvalidArgument("stats is NULL");
    if (s->struct_size < before_copies) memcuda_c::check_struct(s, "stats");
    const std::uint32_t room = s->struct_size < sizeof *s ? before_copies : sizeof *s;
    auto st = memcuda_c::registry(reg).stats();
    memcuda_stats full;
    memcuda_stats_init(&full);
    fill_stats(&full, st);
    std::memcpy(s, &full, room);
    s->struct_size = room;
  });
}

int memcuda_collect_garbage(memcuda_registry* reg, memcuda_gc_report* report) {
  return guarded([&] {
    if (report) memcuda_c::check_struct(report, "report");
    auto g = memcuda_c::registry(reg).collect_garbage();
    if (!report) return;
    report->dead_holders = g.dead_holders;
    report->references_dropped = g.references_dropped;
    report->tensors_freed = g.tensors_freed;
    report->sessions_pruned = g.sessions_pruned;
    report->tensors_migrated = g.tensors_migrated;
    report->tensors_lost = g.tensors_lost;
  });
}

}  // extern "C"

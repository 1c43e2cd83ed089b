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

// Opens one tensor and checks the dtype, returning a new C handle.
// With a stream, the stream also waits for the producer's last publish
// (the event handle comes with the record: no extra round trip).
memcuda_tensor* open_one(memcuda_registry* r, const char* name, int dtype, const memcuda::GetOptions& o = {}) {
  auto want = memcuda_c::want_dtype(dtype);
  auto& reg = memcuda_c::registry(r);
  auto n = memcuda_c::name_arg(name);
  auto t = reg.get<void>(n, o);
  if (want && t.dtype() != *want)
    throw memcuda::TypeMismatch("tensor '" + t.name() + "' is " + std::string(memcuda::to_string(t.dtype())) +
                                ", not " + std::string(memcuda::to_string(*want)));
  return new memcuda_tensor(std::move(t));
}

// The C records of `all`, malloc'd so that memcuda_free_infos is a plain
// free of one block; NULL for none.
memcuda_tensor_info* info_array(const std::vector<memcuda::TensorInfo>& all) {
  if (all.empty()) return nullptr;
  auto* arr = static_cast<memcuda_tensor_info*>(std::calloc(all.size(), sizeof(memcuda_tensor_info)));
  if (!arr) throw std::bad_alloc();
  for (size_t i = 0; i < all.size(); ++i) {
    arr[i].struct_size = sizeof(memcuda_tensor_info);
    memcuda_c::fill_info(&arr[i], all[i]);
  }
  return arr;
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
  s->pulls = st.process.pulls;
  s->pulled_bytes = st.process.pulled_bytes;
}

}  // namespace

extern "C" {

int memcuda_registry_open(const memcuda_registry_options* opts, memcuda_registry** out) {
  return guarded([&] {
    memcuda_c::out_arg(out);
    *out = new memcuda_registry(memcuda_c::to_options(opts));
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
    memcuda::GetOptions o;
    o.stream = static_cast<memcuda::StreamHandle>(stream);
    *out = open_one(reg, name, dtype, o);
  });
}

int memcuda_get_local(memcuda_registry* reg, const char* name, int dtype, int reader_device, void* stream,
                      memcuda_tensor** out) {
  return guarded([&] {
    memcuda_c::out_arg(out);
    memcuda::GetOptions o;
    o.replica = memcuda::LocalReplica::use;
    o.reader_device = reader_device;
    o.stream = static_cast<memcuda::StreamHandle>(stream);
    *out = open_one(reg, name, dtype, o);
  });
}

int memcuda_remove(memcuda_registry* reg, const char* name) {
  return guarded([&] { memcuda_c::registry(reg).remove(memcuda_c::name_arg(name)); });
}

int memcuda_wait(memcuda_registry* reg, const char* name, int64_t timeout_ms, int* ready) {
  return guarded([&] {
    if (timeout_ms < 0) throw memcuda::InvalidArgument("timeout_ms must not be negative");
    bool ok = memcuda_c::registry(reg).wait(memcuda_c::name_arg(name), std::chrono::milliseconds(timeout_ms));
    if (ready) *ready = ok ? 1 : 0;
  });
}

int memcuda_flush(memcuda_registry* reg, int64_t timeout_ms) {
  return guarded([&] { memcuda_c::registry(reg).flush(std::chrono::milliseconds(timeout_ms < 0 ? -1 : timeout_ms)); });
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
    *out = info_array(all);
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
    *out = info_array(page.tensors);
    *count = page.tensors.size();
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
    memcuda_c::check_struct(s, "stats");
    auto st = memcuda_c::registry(reg).stats();
    memcuda_stats_init(s);
    fill_stats(s, st);
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

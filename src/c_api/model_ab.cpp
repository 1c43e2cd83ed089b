// The C ABI's A/B model versions (include/memcuda/model_ab.hpp): a
// producer stages a model's next version in a second set of tensors and
// commits it; readers pin a version and advance when they choose.
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "c_api_internal.hpp"
#include "memcuda/model_ab.hpp"

using memcuda_c::guarded;

struct memcuda_model_writer {
  memcuda::ModelVersionWriter w;
};

struct memcuda_pinned_model {
  memcuda::PinnedModel m;
};

namespace {

// A StateDict as memcuda_get_prefix's array (sorted by name: a map's order);
// name_offset: how much of each name is the prefix.
void dict_to_array(const memcuda::StateDict& d, memcuda_tensor*** out, size_t* count, size_t* name_offset) {
  if (!out || !count) throw memcuda::InvalidArgument("out or count is NULL");
  if (name_offset) *name_offset = d.empty() ? 0 : d.begin()->second.name().size() - d.begin()->first.size();
  memcuda_c::to_array(memcuda::StateDict(d), out, count);
}

}  // namespace

extern "C" {

void memcuda_model_version_options_init(memcuda_model_version_options* o) {
  if (!o) return;
  *o = memcuda_model_version_options{};
  o->struct_size = sizeof *o;
  o->backend = MEMCUDA_BACKEND_DEFAULT;
  o->device = -1;
  o->max_versions = 2;
}

int memcuda_begin_model_version(memcuda_registry* reg, const char* prefix, const memcuda_tensor_spec* specs,
                                size_t count, const memcuda_model_version_options* opts, memcuda_model_writer** out) {
  return guarded([&] {
    memcuda_c::out_arg(out);
    if (count > 0 && !specs) throw memcuda::InvalidArgument("specs is NULL");
    memcuda::ModelVersionOptions o;
    if (opts) {
      memcuda_c::check_struct(opts, "model version options");
      o.backend = memcuda_c::backend_arg(opts->backend);
      o.device = opts->device < 0 ? -1 : opts->device;
      o.max_versions = opts->max_versions;
      if (opts->n_replicas > 0 && !opts->replicas) throw memcuda::InvalidArgument("replicas is NULL");
      o.replicas.assign(opts->replicas, opts->replicas + opts->n_replicas);
    }
    std::vector<memcuda::StateDictEntry> entries;
    entries.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      auto s = memcuda_c::create_spec(specs[i].name, specs[i].dtype, specs[i].shape, specs[i].ndim, nullptr);
      entries.push_back({s.name, s.dtype, s.shape, nullptr});
    }
    auto w = std::make_unique<memcuda_model_writer>();
    w->w = memcuda::begin_model_version(memcuda_c::registry(reg), memcuda_c::prefix_arg(prefix), entries, o);
    *out = w.release();
  });
}

int memcuda_model_writer_version(const memcuda_model_writer* w, uint64_t* version) {
  return guarded([&] {
    if (!w || !version) throw memcuda::InvalidArgument("writer or version is NULL");
    *version = w->w.version();
  });
}

int memcuda_model_writer_tensors(const memcuda_model_writer* w, memcuda_tensor*** out, size_t* count,
                                 size_t* name_offset) {
  return guarded([&] {
    if (!w) throw memcuda::InvalidArgument("writer is NULL");
    dict_to_array(w->w.tensors(), out, count, name_offset);
  });
}

int memcuda_model_writer_commit(memcuda_model_writer* w, void* stream, uint64_t* version) {
  return guarded([&] {
    if (!w) throw memcuda::InvalidArgument("writer is NULL");
    auto v = w->w.commit(static_cast<memcuda::StreamHandle>(stream));
    if (version) *version = v;
  });
}

int memcuda_model_writer_abort(memcuda_model_writer* w) {
  return guarded([&] {
    if (!w) throw memcuda::InvalidArgument("writer is NULL");
    w->w.abort();
  });
}

void memcuda_model_writer_free(memcuda_model_writer* w) { delete w; }

int memcuda_open_model(memcuda_registry* reg, const char* prefix, void* stream, memcuda_pinned_model** out) {
  return guarded([&] {
    memcuda_c::out_arg(out);
    auto m = std::make_unique<memcuda_pinned_model>();
    m->m = memcuda::open_model(memcuda_c::registry(reg), memcuda_c::prefix_arg(prefix), static_cast<memcuda::StreamHandle>(stream));
    *out = m.release();
  });
}

int memcuda_open_model_local(memcuda_registry* reg, const char* prefix, void* stream, int reader_device,
                             memcuda_pinned_model** out) {
  return guarded([&] {
    memcuda_c::out_arg(out);
    auto m = std::make_unique<memcuda_pinned_model>();
    memcuda::OpenModelOptions o;
    o.local = true;
    o.reader_device = reader_device < 0 ? -1 : reader_device;
    m->m = memcuda::open_model(memcuda_c::registry(reg), memcuda_c::prefix_arg(prefix),
                               static_cast<memcuda::StreamHandle>(stream), o);
    *out = m.release();
  });
}

int memcuda_pinned_model_version(const memcuda_pinned_model* m, uint64_t* version) {
  return guarded([&] {
    if (!m || !version) throw memcuda::InvalidArgument("model or version is NULL");
    *version = m->m.version();
  });
}

int memcuda_pinned_model_tensors(const memcuda_pinned_model* m, memcuda_tensor*** out, size_t* count,
                                 size_t* name_offset) {
  return guarded([&] {
    if (!m) throw memcuda::InvalidArgument("model is NULL");
    dict_to_array(m->m.tensors(), out, count, name_offset);
  });
}

int memcuda_pinned_model_latest(const memcuda_pinned_model* m, uint64_t* version) {
  return guarded([&] {
    if (!m || !version) throw memcuda::InvalidArgument("model or version is NULL");
    *version = m->m.latest();
  });
}

int memcuda_pinned_model_advance(memcuda_pinned_model* m, void* stream, int* moved) {
  return guarded([&] {
    if (!m) throw memcuda::InvalidArgument("model is NULL");
    const bool b = m->m.advance(static_cast<memcuda::StreamHandle>(stream));
    if (moved) *moved = b ? 1 : 0;
  });
}

void memcuda_pinned_model_free(memcuda_pinned_model* m) { delete m; }

}  // extern "C"

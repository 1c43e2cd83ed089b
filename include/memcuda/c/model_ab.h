/* The C ABI's A/B model versions (C++: include/memcuda/model_ab.hpp),
 * part of memcuda/c/memcuda.h (which includes this header). */
#ifndef MEMCUDA_C_MODEL_AB_H
#define MEMCUDA_C_MODEL_AB_H

#include "memcuda/c/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- A/B model versions (include/memcuda/model_ab.hpp) --------------------
 * A producer stages version N+1 of a model in a second set of tensors while
 * readers keep N; one commit makes N+1 current; each reader keeps its
 * version until it advances; N's memory goes with its last reader. */
typedef struct memcuda_model_writer memcuda_model_writer; /* opaque */
typedef struct memcuda_pinned_model memcuda_pinned_model; /* opaque */

typedef struct memcuda_model_version_options {
  uint32_t struct_size;  /* sizeof(memcuda_model_version_options) */
  int backend;           /* MEMCUDA_BACKEND_* of the new tensors (DEFAULT: the registry's) */
  int device;            /* cuda ordinal; -1: the current device */
  uint32_t max_versions; /* versions that may have memory at once, the new one included (>= 2) */
  const int* replicas;   /* cuda: devices that get a replica of the version before commit makes it current */
  size_t n_replicas;     /* entries of replicas (0: none) */
} memcuda_model_version_options;

MEMCUDA_C_EXPORT void memcuda_model_version_options_init(memcuda_model_version_options* o);
/* Stages the next version of `prefix`: specs[i].name is relative to the
 * prefix (specs[i].options is ignored: opts says the memory). Its tensors
 * are not visible to readers until memcuda_model_writer_commit. opts may be
 * NULL. ALREADY_EXISTS while another live process stages one;
 * BUDGET_EXCEEDED when max_versions versions still have memory. */
MEMCUDA_C_EXPORT int memcuda_begin_model_version(memcuda_registry* reg, const char* prefix,
                                                 const memcuda_tensor_spec* specs, size_t count,
                                                 const memcuda_model_version_options* opts,
                                                 memcuda_model_writer** out);
/* The version the commit will make current. */
MEMCUDA_C_EXPORT int memcuda_model_writer_version(const memcuda_model_writer* w, uint64_t* version);
/* The staged tensors as in memcuda_get_prefix (sorted by name, freed with
 * memcuda_free_tensor_array after releasing each); memcuda_tensor_name(t) +
 * *name_offset is the name relative to the prefix (name_offset may be NULL). */
MEMCUDA_C_EXPORT int memcuda_model_writer_tensors(const memcuda_model_writer* w, memcuda_tensor*** out, size_t* count,
                                                  size_t* name_offset);
/* Makes the staged version current in one atomic step, ordered after the
 * work enqueued on `stream` (cuda; NULL: legacy default). *version may be NULL. */
MEMCUDA_C_EXPORT int memcuda_model_writer_commit(memcuda_model_writer* w, void* stream, uint64_t* version);
/* Gives the staging up (idempotent). */
MEMCUDA_C_EXPORT int memcuda_model_writer_abort(memcuda_model_writer* w);
/* Frees the writer (uncommitted: given up without network I/O). NULL is a no-op. */
MEMCUDA_C_EXPORT void memcuda_model_writer_free(memcuda_model_writer* w);

/* Pins the model's current version (one reference) and orders `stream`
 * after its producer's event. NOT_FOUND when there is no such model. */
MEMCUDA_C_EXPORT int memcuda_open_model(memcuda_registry* reg, const char* prefix, void* stream,
                                        memcuda_pinned_model** out);
/* memcuda_open_model whose tensors (and those of each advance) come from
 * the replicas on `reader_device` (-1: the calling thread's current device)
 * when every tensor of the version has a current one there (options'
 * replicas), else from the version itself; `stream` also waits for the
 * replicas' copies. */
MEMCUDA_C_EXPORT int memcuda_open_model_local(memcuda_registry* reg, const char* prefix, void* stream,
                                              int reader_device, memcuda_pinned_model** out);
MEMCUDA_C_EXPORT int memcuda_pinned_model_version(const memcuda_pinned_model* m, uint64_t* version);
/* The pinned version's tensors, as memcuda_model_writer_tensors. */
MEMCUDA_C_EXPORT int memcuda_pinned_model_tensors(const memcuda_pinned_model* m, memcuda_tensor*** out,
                                                  size_t* count, size_t* name_offset);
/* The model's current version (one round trip, orders nothing). */
MEMCUDA_C_EXPORT int memcuda_pinned_model_latest(const memcuda_pinned_model* m, uint64_t* version);
/* Moves to the current version when newer, `stream` ordered after its
 * producer's event; *moved = 1 then, else 0 (may be NULL). Handles taken
 * before keep their version's memory until released. */
MEMCUDA_C_EXPORT int memcuda_pinned_model_advance(memcuda_pinned_model* m, void* stream, int* moved);
/* Unpins (the release is queued: no network I/O). NULL is a no-op. */
MEMCUDA_C_EXPORT void memcuda_pinned_model_free(memcuda_pinned_model* m);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MEMCUDA_C_MODEL_AB_H */

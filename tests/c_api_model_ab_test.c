/* The C ABI's A/B model versions (include/memcuda/c/memcuda.h): a writer
 * stages and commits, a pinned reader keeps its version until it advances,
 * the limit on live versions is BUDGET_EXCEEDED. Compiled as C99 against the
 * redis-server that tests/c_api_with_redis.sh starts; host backend. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memcuda/c/memcuda.h"

static int g_checks = 0;
static int g_failures = 0;

#define CHECK(cond)                                                                         \
  do {                                                                                      \
    ++g_checks;                                                                             \
    if (!(cond)) {                                                                          \
      ++g_failures;                                                                         \
      fprintf(stderr, "%s:%d: CHECK(%s) failed (last error %d %s: %s)\n", __FILE__, __LINE__, \
              #cond, memcuda_last_error_code(), memcuda_error_name(memcuda_last_error_code()), \
              memcuda_last_error_message());                                                \
    }                                                                                       \
  } while (0)
#define CHECK_OK(call) CHECK((call) == MEMCUDA_OK)

/* Stages a version of model "m/" with one f32 tensor "w" of 4 elements, each `v`. */
static memcuda_model_writer* stage(memcuda_registry* r, float v, int expect, uint32_t max_versions) {
  memcuda_tensor_spec spec;
  memcuda_model_version_options mo;
  memcuda_model_writer* w = NULL;
  memcuda_tensor** ts = NULL;
  size_t n = 0, off = 0, i;
  int64_t shape[1] = {4};
  memcuda_tensor_spec_init(&spec);
  memcuda_model_version_options_init(&mo);
  mo.max_versions = max_versions;
  spec.name = "w";
  spec.dtype = MEMCUDA_DTYPE_F32;
  spec.ndim = 1;
  spec.shape = shape;
  CHECK(memcuda_begin_model_version(r, "m/", &spec, 1, &mo, &w) == expect);
  if (!w) return NULL;
  CHECK_OK(memcuda_model_writer_tensors(w, &ts, &n, &off));
  CHECK(n == 1);
  if (n == 1) {
    float* p = (float*)memcuda_tensor_data(ts[0]);
    CHECK(strcmp(memcuda_tensor_name(ts[0]) + off, "w") == 0);
    for (i = 0; i < 4; ++i) p[i] = v;
    memcuda_tensor_release(ts[0]);
  }
  memcuda_free_tensor_array(ts);
  return w;
}

static float pinned_sum(const memcuda_pinned_model* m) {
  memcuda_tensor** ts = NULL;
  size_t n = 0, off = 0, i;
  float s = 0;
  CHECK_OK(memcuda_pinned_model_tensors(m, &ts, &n, &off));
  CHECK(n == 1);
  if (n == 1) {
    const float* p = (const float*)memcuda_tensor_data(ts[0]);
    CHECK(strcmp(memcuda_tensor_name(ts[0]) + off, "w") == 0);
    for (i = 0; i < 4; ++i) s += p[i];
    memcuda_tensor_release(ts[0]);
  }
  memcuda_free_tensor_array(ts);
  return s;
}

int main(void) {
  memcuda_registry_options o;
  memcuda_registry* r = NULL;
  memcuda_model_writer* w;
  memcuda_pinned_model* m = NULL;
  uint64_t v = 0;
  int moved = -1;
  const char* url = getenv("MEMCUDA_TEST_REDIS_URL");
  if (!url || !*url) {
    printf("SKIPPED: MEMCUDA_TEST_REDIS_URL is not set (run through tests/c_api_with_redis.sh)\n");
    return 77;
  }
  memcuda_registry_options_init(&o);
  o.url = url;
  o.name_space = "cab";
  o.control_thread = 1;
  o.default_backend = MEMCUDA_BACKEND_HOST;
  if (memcuda_registry_open(&o, &r) != MEMCUDA_OK) {
    fprintf(stderr, "memcuda_registry_open: %s\n", memcuda_last_error_message());
    return 1;
  }
  CHECK(memcuda_open_model(r, "m/", NULL, &m) == MEMCUDA_ERR_NOT_FOUND);
  CHECK(m == NULL);
  w = stage(r, 1.0f, MEMCUDA_OK, 2);
  CHECK_OK(memcuda_model_writer_version(w, &v));
  CHECK(v == 1);
  CHECK_OK(memcuda_model_writer_commit(w, NULL, &v));
  CHECK(v == 1);
  memcuda_model_writer_free(w);

  CHECK_OK(memcuda_open_model(r, "m/", NULL, &m));
  CHECK_OK(memcuda_pinned_model_version(m, &v));
  CHECK(v == 1);
  CHECK(pinned_sum(m) == 4.0f);

  w = stage(r, 2.0f, MEMCUDA_OK, 2);
  CHECK_OK(memcuda_model_writer_commit(w, NULL, &v));
  CHECK(v == 2);
  memcuda_model_writer_free(w);
  CHECK(pinned_sum(m) == 4.0f); /* still pinned on 1 */
  CHECK_OK(memcuda_pinned_model_latest(m, &v));
  CHECK(v == 2);

  /* 1 (pinned) and 2 have memory: a third is refused */
  w = stage(r, 3.0f, MEMCUDA_ERR_BUDGET_EXCEEDED, 2);
  CHECK(w == NULL);

  CHECK_OK(memcuda_pinned_model_advance(m, NULL, &moved));
  CHECK(moved == 1);
  CHECK(pinned_sum(m) == 8.0f);
  CHECK_OK(memcuda_pinned_model_advance(m, NULL, &moved));
  CHECK(moved == 0);

  /* abort: nothing becomes current (room for 1 until the collector frees it) */
  w = stage(r, 9.0f, MEMCUDA_OK, 3);
  if (w) {
    CHECK_OK(memcuda_model_writer_abort(w));
    CHECK(memcuda_model_writer_commit(w, NULL, &v) == MEMCUDA_ERR_INVALID_ARGUMENT);
    memcuda_model_writer_free(w);
  }
  CHECK_OK(memcuda_pinned_model_latest(m, &v));
  CHECK(v == 2);
  memcuda_pinned_model_free(m);
  memcuda_registry_close(r);
  printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}

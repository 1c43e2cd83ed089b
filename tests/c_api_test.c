/* Drives libmemcuda_c through its C header, compiled as C99, against the
 * redis-server that tests/c_api_with_redis.sh starts (MEMCUDA_TEST_REDIS_URL).
 * Host backend: runs on any machine. Prints one line per failed check and
 * exits 1 if any failed. */
#include <dlpack/dlpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memcuda/c/memcuda.h"

static int g_checks = 0;
static int g_failures = 0;

#define CHECK(cond)                                                                 \
  do {                                                                              \
    ++g_checks;                                                                     \
    if (!(cond)) {                                                                  \
      ++g_failures;                                                                 \
      fprintf(stderr, "%s:%d: CHECK(%s) failed (last error %d %s: %s)\n", __FILE__, \
              __LINE__, #cond, memcuda_last_error_code(),                           \
              memcuda_error_name(memcuda_last_error_code()), memcuda_last_error_message()); \
    }                                                                               \
  } while (0)
#define CHECK_OK(call) CHECK((call) == MEMCUDA_OK)

static const char* g_url;

static memcuda_registry* open_registry(int control_thread) {
  memcuda_registry_options o;
  memcuda_registry* r = NULL;
  memcuda_registry_options_init(&o);
  o.url = g_url;
  o.name_space = "capi";
  o.control_thread = control_thread;
  o.default_backend = MEMCUDA_BACKEND_HOST;
  o.request_timeout_ms = 3000;
  if (memcuda_registry_open(&o, &r) != MEMCUDA_OK) {
    fprintf(stderr, "memcuda_registry_open: %s\n", memcuda_last_error_message());
    exit(1);
  }
  return r;
}

static int64_t refcount_of(memcuda_registry* r, const char* name) {
  memcuda_tensor_info info;
  memcuda_tensor_info_init(&info);
  if (memcuda_info(r, name, &info) != MEMCUDA_OK) return -1;
  return info.refcount;
}

static void test_version_and_tables(void) {
  CHECK(memcuda_abi_version() == MEMCUDA_C_ABI_VERSION);
  CHECK(memcuda_version() >= 100);
  CHECK(strlen(memcuda_version_string()) >= 5);
  CHECK(strcmp(memcuda_dtype_name(MEMCUDA_DTYPE_BF16), "bf16") == 0);
  CHECK(memcuda_dtype_from_name("float32") == MEMCUDA_DTYPE_F32);
  CHECK(memcuda_dtype_from_name("nope") == -1);
  CHECK(memcuda_dtype_itemsize(MEMCUDA_DTYPE_F64) == 8);
  CHECK(memcuda_dtype_itemsize(99) == 0);
  CHECK(strcmp(memcuda_error_name(MEMCUDA_ERR_NOT_FOUND), "not_found") == 0);
  CHECK(strcmp(memcuda_error_name(MEMCUDA_ERR_REDIS_AUTH), "redis_auth") == 0);
  CHECK(memcuda_error_parent(MEMCUDA_ERR_PROTOCOL) == MEMCUDA_ERR_INVALID_ARGUMENT);
  CHECK(memcuda_error_parent(MEMCUDA_ERR_REDIS_AUTH) == MEMCUDA_ERR_REDIS_CONNECTION);
  CHECK(memcuda_error_parent(MEMCUDA_ERR_TIMEOUT) == MEMCUDA_ERR_REDIS);
  CHECK(memcuda_error_parent(MEMCUDA_ERR_NOT_FOUND) == MEMCUDA_ERR_ERROR);
  CHECK(memcuda_error_parent(MEMCUDA_ERR_ERROR) == MEMCUDA_OK);
  CHECK(strcmp(memcuda_error_name(MEMCUDA_ERR_NOT_ZERO_COPY), "not_zero_copy") == 0);
  CHECK(memcuda_error_parent(MEMCUDA_ERR_NOT_ZERO_COPY) == MEMCUDA_ERR_UNAVAILABLE);
}

static void test_create_get_bytes(memcuda_registry* leader, memcuda_registry* client) {
  int64_t shape[2] = {3, 4};
  memcuda_tensor* t = NULL;
  memcuda_tensor* u = NULL;
  float* p;
  float back[12];
  int i, ok = 1, ready = 0;
  uint64_t version = 0;
  CHECK_OK(memcuda_create(leader, "c.w", MEMCUDA_DTYPE_F32, shape, 2, NULL, &t));
  CHECK(t != NULL);
  if (!t) return;
  CHECK(strcmp(memcuda_tensor_name(t), "c.w") == 0);
  CHECK(memcuda_tensor_dtype(t) == MEMCUDA_DTYPE_F32);
  CHECK(memcuda_tensor_ndim(t) == 2);
  CHECK(memcuda_tensor_shape(t)[0] == 3 && memcuda_tensor_shape(t)[1] == 4);
  CHECK(memcuda_tensor_bytes(t) == 48);
  CHECK(memcuda_tensor_backend(t) == MEMCUDA_BACKEND_HOST);
  CHECK(memcuda_tensor_device(t) == -1);
  CHECK(memcuda_tensor_generation(t) > 0);
  p = (float*)memcuda_tensor_data(t);
  for (i = 0; i < 12; ++i) p[i] = (float)i * 1.5f;
  CHECK_OK(memcuda_tensor_publish(t, NULL, &version));
  CHECK(version == 1);

  CHECK_OK(memcuda_wait(client, "c.w", 1000, &ready));
  CHECK(ready == 1);
  CHECK_OK(memcuda_get(client, "c.w", MEMCUDA_DTYPE_F32, &u));
  CHECK(u != NULL);
  if (!u) return;
  CHECK(memcuda_tensor_generation(u) == memcuda_tensor_generation(t));
  CHECK_OK(memcuda_tensor_copy_to_host(u, back, sizeof back, 0));
  for (i = 0; i < 12; ++i) ok &= back[i] == (float)i * 1.5f;
  CHECK(ok);
  CHECK(refcount_of(client, "c.w") == 2);

  /* A write through the copy API lands in the creator's mapping. */
  back[0] = 42.0f;
  CHECK_OK(memcuda_tensor_copy_from_host(u, back, sizeof(float), 4 * sizeof(float)));
  CHECK(p[4] == 42.0f);
  CHECK(memcuda_tensor_copy_from_host(u, back, 8, 44) == MEMCUDA_ERR_INVALID_ARGUMENT);
  CHECK_OK(memcuda_tensor_wait_published(u, NULL));

  /* Releases are queued; flush makes them visible. */
  memcuda_tensor_release(u);
  CHECK_OK(memcuda_flush(client, -1));
  CHECK(refcount_of(client, "c.w") == 1);
  memcuda_tensor_release(t);
  CHECK_OK(memcuda_flush(leader, -1));
  CHECK(refcount_of(client, "c.w") == -1);
  CHECK(memcuda_last_error_code() == MEMCUDA_ERR_NOT_FOUND);
}

static void test_errors(memcuda_registry* r) {
  int64_t shape[1] = {4};
  memcuda_tensor* t = NULL;
  memcuda_tensor* dup = NULL;
  memcuda_tensor_info info;
  memcuda_registry_options o;
  memcuda_registry* bad = NULL;

  CHECK(memcuda_get(r, "c.none", MEMCUDA_DTYPE_ANY, &t) == MEMCUDA_ERR_NOT_FOUND);
  CHECK(t == NULL);
  CHECK(memcuda_last_error_code() == MEMCUDA_ERR_NOT_FOUND);
  CHECK(strstr(memcuda_last_error_message(), "c.none") != NULL);
  memcuda_clear_error();
  CHECK(memcuda_last_error_code() == MEMCUDA_OK);

  CHECK_OK(memcuda_create(r, "c.e", MEMCUDA_DTYPE_I32, shape, 1, NULL, &t));
  CHECK(memcuda_create(r, "c.e", MEMCUDA_DTYPE_I32, shape, 1, NULL, &dup) == MEMCUDA_ERR_ALREADY_EXISTS);
  CHECK(memcuda_get(r, "c.e", MEMCUDA_DTYPE_F32, &dup) == MEMCUDA_ERR_TYPE_MISMATCH);
  CHECK(dup == NULL);
  CHECK(memcuda_create(r, "bad name", MEMCUDA_DTYPE_I32, shape, 1, NULL, &dup) == MEMCUDA_ERR_PROTOCOL);
  CHECK(memcuda_create(r, "c.x", MEMCUDA_DTYPE_ANY, shape, 1, NULL, &dup) == MEMCUDA_ERR_INVALID_ARGUMENT);
  CHECK(memcuda_create(r, "c.x", MEMCUDA_DTYPE_I32, NULL, 1, NULL, &dup) == MEMCUDA_ERR_INVALID_ARGUMENT);
  CHECK(memcuda_get(NULL, "c.e", MEMCUDA_DTYPE_ANY, &dup) == MEMCUDA_ERR_INVALID_ARGUMENT);
  CHECK(memcuda_remove(r, "c.none") == MEMCUDA_ERR_NOT_FOUND);
  info.struct_size = 4; /* too small: refused, nothing written past it */
  CHECK(memcuda_info(r, "c.e", &info) == MEMCUDA_ERR_INVALID_ARGUMENT);

  /* A removed name: the handle stays usable but is no longer valid. */
  {
    int valid = -1;
    CHECK_OK(memcuda_tensor_valid(t, &valid));
    CHECK(valid == 1);
    CHECK_OK(memcuda_remove(r, "c.e"));
    CHECK_OK(memcuda_tensor_valid(t, &valid));
    CHECK(valid == 0);
    CHECK(memcuda_tensor_publish(t, NULL, NULL) == MEMCUDA_ERR_STALE_HANDLE);
    memcuda_tensor_release(t);
  }

  /* Nobody listens there: a connection error, typed. */
  memcuda_registry_options_init(&o);
  o.url = "unix:///nonexistent/memcuda-capi.sock";
  o.connect_timeout_ms = 200;
  CHECK(memcuda_registry_open(&o, &bad) == MEMCUDA_ERR_REDIS_CONNECTION);
  CHECK(bad == NULL);
  o.url = "bogus://x";
  CHECK(memcuda_registry_open(&o, &bad) == MEMCUDA_ERR_INVALID_ARGUMENT);
}

static void test_list_stats_get_many(memcuda_registry* r) {
  int64_t shape[1] = {16};
  memcuda_tensor* a = NULL;
  memcuda_tensor* b = NULL;
  memcuda_tensor* got[3] = {NULL, NULL, NULL};
  const char* names[3] = {"c.l.a", "c.l.b", "c.l.missing"};
  memcuda_tensor_info* infos = NULL;
  memcuda_stats st;
  memcuda_gc_report gc;
  memcuda_create_options co;
  size_t n = 0;
  int is_leader = 0;

  memcuda_create_options_init(&co);
  co.persistent = 1;
  CHECK_OK(memcuda_create(r, "c.l.a", MEMCUDA_DTYPE_U8, shape, 1, &co, &a));
  CHECK_OK(memcuda_create(r, "c.l.b", MEMCUDA_DTYPE_BF16, shape, 1, NULL, &b));
  CHECK(refcount_of(r, "c.l.a") == 2); /* the name's reference + ours */

  CHECK_OK(memcuda_list(r, "c.l.*", &infos, &n));
  CHECK(n == 2);
  if (n == 2) {
    CHECK(strcmp(infos[0].name, "c.l.a") == 0 && infos[0].dtype == MEMCUDA_DTYPE_U8);
    CHECK(strcmp(infos[1].name, "c.l.b") == 0 && infos[1].dtype == MEMCUDA_DTYPE_BF16);
    CHECK(infos[1].ndim == 1 && infos[1].shape[0] == 16 && infos[1].bytes == 32);
    CHECK(infos[0].state == MEMCUDA_STATE_READY && infos[0].backend == MEMCUDA_BACKEND_HOST);
  }
  memcuda_free_infos(infos);
  CHECK_OK(memcuda_list(r, "c.none.*", &infos, &n));
  CHECK(n == 0 && infos == NULL);
  {
    /* Paging: one name per page, in order, then "" as the next start. */
    char next[MEMCUDA_MAX_NAME_BYTES + 1];
    CHECK_OK(memcuda_list_page(r, "c.l.*", NULL, 1, &infos, &n, next));
    CHECK(n == 1 && strcmp(infos[0].name, "c.l.a") == 0 && strcmp(next, "c.l.a") == 0);
    memcuda_free_infos(infos);
    CHECK_OK(memcuda_list_page(r, "c.l.*", "c.l.a", 1, &infos, &n, next));
    CHECK(n == 1 && strcmp(infos[0].name, "c.l.b") == 0 && strcmp(next, "c.l.b") == 0);
    memcuda_free_infos(infos);
    CHECK_OK(memcuda_list_page(r, "c.l.*", "c.l.b", 1, &infos, &n, next));
    CHECK(n == 0 && infos == NULL && next[0] == 0);
    CHECK(memcuda_list_page(r, "c.l.*", NULL, 0, &infos, &n, next) == MEMCUDA_ERR_INVALID_ARGUMENT);
  }

  /* All or nothing: a missing name leaves nothing open. */
  CHECK(memcuda_get_many(r, names, 3, got) == MEMCUDA_ERR_NOT_FOUND);
  CHECK(got[0] == NULL && got[1] == NULL && got[2] == NULL);
  CHECK_OK(memcuda_flush(r, -1));
  CHECK(refcount_of(r, "c.l.a") == 2);
  CHECK_OK(memcuda_get_many(r, names, 2, got));
  CHECK(got[0] && got[1] && memcuda_tensor_dtype(got[1]) == MEMCUDA_DTYPE_BF16);
  /* A batch takes its own reference per name in its one round trip (unlike
     memcuda_get, which shares the handle this registry already holds), over
     the same mapping; released, the refcounts are back to their baseline. */
  CHECK_OK(memcuda_flush(r, -1));
  CHECK(refcount_of(r, "c.l.b") == 2);
  CHECK(refcount_of(r, "c.l.a") == 3);
  CHECK(got[1] && memcuda_tensor_data(got[1]) == memcuda_tensor_data(b));
  memcuda_tensor_release(got[0]);
  memcuda_tensor_release(got[1]);
  CHECK_OK(memcuda_flush(r, -1));
  CHECK(refcount_of(r, "c.l.b") == 1);
  CHECK(refcount_of(r, "c.l.a") == 2);

  memcuda_stats_init(&st);
  CHECK_OK(memcuda_stats_get(r, &st));
  CHECK(st.leader_present == 1 && st.leader_is_self == 1);
  CHECK(st.tensors == 2);
  CHECK(st.sessions >= 2);
  CHECK(st.creates >= 2);
  /* Zero copy or an error: host memory is for host code; nothing was copied
     unless a binding says it copied (memcuda_note_copy). */
  CHECK(st.copies == 0 && st.copied_bytes == 0);
  CHECK_OK(memcuda_tensor_check_device(a, -1));
  CHECK(memcuda_tensor_check_device(a, 0) == MEMCUDA_ERR_NOT_ZERO_COPY);
  CHECK(strstr(memcuda_last_error_message(), "is host memory") != NULL);
  CHECK_OK(memcuda_note_copy(a, "c_api_test", 16, "a test's reason"));
  CHECK_OK(memcuda_stats_get(r, &st));
  CHECK(st.copies == 1 && st.copied_bytes == 16);
  CHECK_OK(memcuda_registry_is_leader(r, &is_leader));
  CHECK(is_leader == 1);
  CHECK(strlen(memcuda_registry_session_id(r)) > 0);
  gc.struct_size = sizeof gc;
  CHECK_OK(memcuda_collect_garbage(r, &gc));
  CHECK(gc.references_dropped == 0);

  memcuda_tensor_release(a);
  memcuda_tensor_release(b);
  CHECK_OK(memcuda_remove(r, "c.l.a"));
  CHECK_OK(memcuda_flush(r, -1));
  CHECK(refcount_of(r, "c.l.a") == -1);
  CHECK(refcount_of(r, "c.l.b") == -1);
}

/* The batch calls: one create_many, one get_prefix, one get_many each, all or
 * nothing, and the references of a refused batch given back (the refcounts
 * return to their baseline). */
static void test_batch(memcuda_registry* r) {
  int64_t s2[2] = {4, 8};
  int64_t s1[1] = {5};
  memcuda_tensor_spec specs[3];
  memcuda_tensor* made[3] = {NULL, NULL, NULL};
  memcuda_tensor* got[3] = {NULL, NULL, NULL};
  memcuda_tensor** arr = NULL;
  const char* bad_order[3] = {"c.b.x", "c.b.zz.missing", "c.b.aa.missing"};
  const char* twice[2] = {"c.b.w", "c.b.w"};
  size_t n = 99, i;

  for (i = 0; i < 3; ++i) {
    memcuda_tensor_spec_init(&specs[i]);
    specs[i].options.persistent = 1;
  }
  CHECK(specs[0].struct_size == sizeof(memcuda_tensor_spec));
  CHECK(specs[0].options.struct_size == sizeof(memcuda_create_options) && specs[0].options.device == -1);
  specs[0].name = "c.b.w"; specs[0].dtype = MEMCUDA_DTYPE_BF16; specs[0].ndim = 2; specs[0].shape = s2;
  specs[1].name = "c.b.b"; specs[1].dtype = MEMCUDA_DTYPE_F32; specs[1].ndim = 1; specs[1].shape = s1;
  specs[2].name = "c.b.x"; specs[2].dtype = MEMCUDA_DTYPE_I64; specs[2].ndim = 0; specs[2].shape = NULL;
  CHECK_OK(memcuda_create_many(r, specs, 3, made));
  CHECK(made[0] && made[1] && made[2]);
  if (!made[0] || !made[1] || !made[2]) return;
  CHECK(strcmp(memcuda_tensor_name(made[0]), "c.b.w") == 0 && memcuda_tensor_bytes(made[0]) == 64);
  CHECK(strcmp(memcuda_tensor_name(made[1]), "c.b.b") == 0 && memcuda_tensor_dtype(made[1]) == MEMCUDA_DTYPE_F32);
  CHECK(memcuda_tensor_ndim(made[2]) == 0 && memcuda_tensor_bytes(made[2]) == 8);
  ((float*)memcuda_tensor_data(made[1]))[4] = 2.5f;
  for (i = 0; i < 3; ++i) memcuda_tensor_release(made[i]);
  CHECK_OK(memcuda_flush(r, -1));
  CHECK(refcount_of(r, "c.b.w") == 1); /* the name's own reference */

  /* A taken name refuses the whole batch: nothing created, out[] all NULL. */
  specs[0].name = "c.b.new";
  specs[1].name = "c.b.x"; /* taken */
  specs[2].name = "c.b.new2";
  made[0] = made[2] = (memcuda_tensor*)&n; /* must come back NULL */
  CHECK(memcuda_create_many(r, specs, 3, made) == MEMCUDA_ERR_ALREADY_EXISTS);
  CHECK(strstr(memcuda_last_error_message(), "c.b.x") != NULL);
  CHECK(made[0] == NULL && made[1] == NULL && made[2] == NULL);
  CHECK(refcount_of(r, "c.b.new") == -1 && refcount_of(r, "c.b.new2") == -1);
  specs[1].name = "c.b.new";
  CHECK(memcuda_create_many(r, specs, 2, made) == MEMCUDA_ERR_INVALID_ARGUMENT); /* named twice */
  CHECK(refcount_of(r, "c.b.new") == -1);
  specs[0].dtype = MEMCUDA_DTYPE_ANY;
  CHECK(memcuda_create_many(r, specs, 1, made) == MEMCUDA_ERR_INVALID_ARGUMENT);
  specs[0].struct_size = 4;
  CHECK(memcuda_create_many(r, specs, 1, made) == MEMCUDA_ERR_INVALID_ARGUMENT);
  CHECK_OK(memcuda_create_many(r, NULL, 0, NULL));

  /* get_prefix: every name under the prefix, sorted, in one round trip. */
  CHECK_OK(memcuda_get_prefix(r, "c.b.", &arr, &n));
  CHECK(n == 3 && arr != NULL);
  if (n == 3 && arr) {
    CHECK(strcmp(memcuda_tensor_name(arr[0]), "c.b.b") == 0);
    CHECK(strcmp(memcuda_tensor_name(arr[1]), "c.b.w") == 0);
    CHECK(strcmp(memcuda_tensor_name(arr[2]), "c.b.x") == 0);
    CHECK(((float*)memcuda_tensor_data(arr[0]))[4] == 2.5f);
    CHECK_OK(memcuda_tensor_wait_opened(arr[0], NULL)); /* host: nothing to wait for */
    CHECK(memcuda_tensor_wait_opened(NULL, NULL) == MEMCUDA_ERR_INVALID_ARGUMENT);
    CHECK_OK(memcuda_flush(r, -1));
    CHECK(refcount_of(r, "c.b.w") == 2);
    for (i = 0; i < n; ++i) memcuda_tensor_release(arr[i]);
  }
  memcuda_free_tensor_array(arr);
  CHECK_OK(memcuda_flush(r, -1));
  CHECK(refcount_of(r, "c.b.w") == 1);
  CHECK_OK(memcuda_get_prefix(r, "c.nothing.", &arr, &n));
  CHECK(n == 0 && arr == NULL);
  CHECK(memcuda_get_prefix(r, "c.b.", NULL, &n) == MEMCUDA_ERR_INVALID_ARGUMENT);

  /* A partial failure: c.b.x was taken by the batch, then given back. The
     error is the first refused name in the order given, not in name order. */
  got[0] = (memcuda_tensor*)&n;
  CHECK(memcuda_get_many(r, bad_order, 3, got) == MEMCUDA_ERR_NOT_FOUND);
  CHECK(strstr(memcuda_last_error_message(), "c.b.zz.missing") != NULL);
  CHECK(got[0] == NULL && got[1] == NULL && got[2] == NULL);
  CHECK_OK(memcuda_flush(r, -1));
  CHECK(refcount_of(r, "c.b.x") == 1);

  /* A name given twice: two shares of one reference. */
  CHECK_OK(memcuda_get_many(r, twice, 2, got));
  CHECK(got[0] && got[1] && memcuda_tensor_data(got[0]) == memcuda_tensor_data(got[1]));
  CHECK_OK(memcuda_flush(r, -1));
  CHECK(refcount_of(r, "c.b.w") == 2);
  memcuda_tensor_release(got[0]);
  CHECK_OK(memcuda_flush(r, -1));
  CHECK(refcount_of(r, "c.b.w") == 2); /* got[1] still holds it */
  memcuda_tensor_release(got[1]);
  CHECK_OK(memcuda_flush(r, -1));
  CHECK(refcount_of(r, "c.b.w") == 1);

  CHECK_OK(memcuda_remove(r, "c.b.w"));
  CHECK_OK(memcuda_remove(r, "c.b.b"));
  CHECK_OK(memcuda_remove(r, "c.b.x"));
  CHECK_OK(memcuda_flush(r, -1));
  CHECK(refcount_of(r, "c.b.x") == -1);
}

/* Model versions: a producer publishes, a waiter sees each new version once. */
static void test_versions(memcuda_registry* leader, memcuda_registry* client) {
  int64_t shape[1] = {4};
  memcuda_tensor* t = NULL;
  uint64_t v = 99;
  CHECK_OK(memcuda_create(leader, "c.v/w", MEMCUDA_DTYPE_F32, shape, 1, NULL, &t));
  CHECK_OK(memcuda_current_version(client, "c.v/", &v));
  CHECK(v == 0); /* tensors, no version yet */
  CHECK_OK(memcuda_wait_version(client, "c.v/", 0, 50, NULL, &v));
  CHECK(v == 0); /* timed out: not an error */
  CHECK_OK(memcuda_publish_version(leader, "c.v/", NULL, MEMCUDA_BACKEND_DEFAULT, -1, &v));
  CHECK(v == 1);
  CHECK_OK(memcuda_wait_version(client, "c.v/", 0, 2000, NULL, &v));
  CHECK(v == 1);
  CHECK_OK(memcuda_wait_version(client, "c.v/", 1, 50, NULL, &v));
  CHECK(v == 0);
  CHECK_OK(memcuda_publish_version(leader, "c.v/", NULL, MEMCUDA_BACKEND_HOST, -1, NULL));
  CHECK_OK(memcuda_wait_version(client, "c.v/", 1, 2000, NULL, &v));
  CHECK(v == 2);
  CHECK_OK(memcuda_current_version(leader, "c.v/", &v));
  CHECK(v == 2);
  CHECK(memcuda_current_version(client, "c.none/", &v) == MEMCUDA_ERR_NOT_FOUND);
  CHECK(memcuda_publish_version(leader, "c.none/", NULL, MEMCUDA_BACKEND_DEFAULT, -1, NULL) == MEMCUDA_ERR_NOT_FOUND);
  CHECK(memcuda_publish_version(leader, "c.v/", NULL, 7, -1, NULL) == MEMCUDA_ERR_INVALID_ARGUMENT);
  CHECK(memcuda_wait_version(client, NULL, 0, 10, NULL, &v) == MEMCUDA_ERR_INVALID_ARGUMENT);
  memcuda_tensor_release(t);
  CHECK_OK(memcuda_flush(leader, -1));
}

static void test_dlpack(memcuda_registry* r) {
  int64_t shape[3] = {2, 3, 5};
  memcuda_tensor* t = NULL;
  memcuda_tensor* t2 = NULL;
  DLManagedTensor* m = NULL;
  CHECK_OK(memcuda_create(r, "c.dl", MEMCUDA_DTYPE_I16, shape, 3, NULL, &t));
  if (!t) return;
  CHECK_OK(memcuda_tensor_retain(t, &t2));
  CHECK_OK(memcuda_tensor_to_dlpack(t, &m));
  CHECK(m != NULL);
  if (!m) return;
  memcuda_tensor_release(t);
  memcuda_tensor_release(t2);
  CHECK_OK(memcuda_flush(r, -1));
  CHECK(refcount_of(r, "c.dl") == 1); /* the DLPack view keeps it */
  CHECK(m->dl_tensor.device.device_type == kDLCPU);
  CHECK(m->dl_tensor.ndim == 3);
  CHECK(m->dl_tensor.shape[2] == 5);
  CHECK(m->dl_tensor.strides[0] == 15);
  CHECK(m->dl_tensor.dtype.code == kDLInt && m->dl_tensor.dtype.bits == 16);
  ((int16_t*)m->dl_tensor.data)[29] = 7; /* the whole extent is addressable */
  m->deleter(m);
  CHECK_OK(memcuda_flush(r, -1));
  CHECK(refcount_of(r, "c.dl") == -1);
}

/* The calls over many handles: fields of a batch in one call (equal to what
 * the accessors say), one stream order, one DLPack span per allocation that
 * holds every covered reference until its deleter runs. */
static void test_batch_views(memcuda_registry* r) {
  int64_t s2[2] = {3, 5};
  int64_t s1[1] = {7};
  memcuda_tensor_spec specs[3];
  memcuda_tensor* made[3] = {NULL, NULL, NULL};
  memcuda_tensor_fields f[3];
  DLManagedTensor* m = NULL;
  size_t i, j, same = 0;
  for (i = 0; i < 3; ++i) {
    memcuda_tensor_spec_init(&specs[i]);
    specs[i].options.persistent = 1;
  }
  specs[0].name = "c.v.a"; specs[0].dtype = MEMCUDA_DTYPE_BF16; specs[0].ndim = 2; specs[0].shape = s2;
  specs[1].name = "c.v.b"; specs[1].dtype = MEMCUDA_DTYPE_F32; specs[1].ndim = 1; specs[1].shape = s1;
  specs[2].name = "c.v.c"; specs[2].dtype = MEMCUDA_DTYPE_U8; specs[2].ndim = 0; specs[2].shape = NULL;
  CHECK_OK(memcuda_create_many(r, specs, 3, made));
  if (!made[0] || !made[1] || !made[2]) return;

  CHECK(memcuda_tensors_fields((const memcuda_tensor* const*)made, 3, f, sizeof f[0] - 1) ==
        MEMCUDA_ERR_INVALID_ARGUMENT);
  CHECK_OK(memcuda_tensors_fields((const memcuda_tensor* const*)made, 3, f, sizeof f[0]));
  for (i = 0; i < 3; ++i) {
    CHECK(f[i].struct_size == sizeof(memcuda_tensor_fields));
    CHECK(strcmp(f[i].name, memcuda_tensor_name(made[i])) == 0);
    CHECK(f[i].data == memcuda_tensor_data(made[i]));
    CHECK(f[i].dtype == memcuda_tensor_dtype(made[i]) && f[i].ndim == memcuda_tensor_ndim(made[i]));
    CHECK(f[i].bytes == memcuda_tensor_bytes(made[i]) && f[i].generation == memcuda_tensor_generation(made[i]));
    CHECK(f[i].backend == MEMCUDA_BACKEND_HOST && f[i].device == -1 && f[i].has_event == 0);
    CHECK((char*)f[i].alloc_base + f[i].offset == (char*)f[i].data);
    CHECK(f[i].offset + f[i].bytes <= f[i].alloc_bytes);
    for (j = 0; j < (size_t)f[i].ndim; ++j) CHECK(f[i].shape[j] == memcuda_tensor_shape(made[i])[j]);
  }
  {
    memcuda_tensor* with_null[2];
    with_null[0] = made[0];
    with_null[1] = NULL;
    CHECK(memcuda_tensors_fields((const memcuda_tensor* const*)with_null, 2, f, sizeof f[0]) ==
          MEMCUDA_ERR_INVALID_ARGUMENT);
    CHECK_OK(memcuda_tensors_fields((const memcuda_tensor* const*)made, 3, f, sizeof f[0]));
  }
  CHECK_OK(memcuda_tensors_wait_opened((const memcuda_tensor* const*)made, 3, NULL)); /* host: no event */
  CHECK(memcuda_tensors_to_dlpack_span(NULL, 0, &m) == MEMCUDA_ERR_INVALID_ARGUMENT && m == NULL);

  /* A span of tensor 0 alone, and of whichever others share its allocation. */
  {
    const memcuda_tensor* group[3];
    group[0] = made[0];
    same = 1;
    for (i = 1; i < 3; ++i)
      if (f[i].alloc_base == f[0].alloc_base) group[same++] = made[i];
    CHECK_OK(memcuda_tensors_to_dlpack_span(group, same, &m));
    if (!m) return;
    CHECK(m->dl_tensor.ndim == 1 && m->dl_tensor.dtype.code == kDLUInt && m->dl_tensor.dtype.bits == 8);
    CHECK(m->dl_tensor.device.device_type == kDLCPU);
    for (i = 0; i < same; ++i) {
      memcuda_tensor_fields g;
      CHECK_OK(memcuda_tensors_fields(&group[i], 1, &g, sizeof g));
      CHECK((char*)g.data >= (char*)m->dl_tensor.data);
      CHECK((char*)g.data + g.bytes <= (char*)m->dl_tensor.data + m->dl_tensor.shape[0]);
    }
    if (same < 3) { /* tensors of two allocations make no span */
      DLManagedTensor* bad = NULL;
      CHECK(memcuda_tensors_to_dlpack_span((const memcuda_tensor* const*)made, 3, &bad) ==
            MEMCUDA_ERR_INVALID_ARGUMENT && bad == NULL);
    }
  }
  for (i = 0; i < 3; ++i) memcuda_tensor_release(made[i]);
  CHECK_OK(memcuda_flush(r, -1));
  CHECK(refcount_of(r, "c.v.a") == 2); /* the name's and the span's */
  CHECK(refcount_of(r, "c.v.c") == (same == 3 ? 2 : 1));
  m->deleter(m);
  CHECK_OK(memcuda_flush(r, -1));
  CHECK(refcount_of(r, "c.v.a") == 1 && refcount_of(r, "c.v.b") == 1 && refcount_of(r, "c.v.c") == 1);
}

/* A state-dict record: linked over a persistent dict, opened under one
 * reference (members' refcounts do not move), unlinked by a remove (opens
 * go name by name again), and its pins dropped by GC once unheld. */
static void test_state_dict_record(memcuda_registry* r) {
  int64_t s1[1] = {4};
  memcuda_tensor_spec specs[3];
  memcuda_tensor* made[3] = {NULL, NULL, NULL};
  memcuda_tensor** arr = NULL;
  size_t n = 0, i;
  int linked = -1;
  memcuda_gc_report rep;
  const char* names[3] = {"c.sd/a", "c.sd/b", "c.sd/c"};
  for (i = 0; i < 3; ++i) {
    memcuda_tensor_spec_init(&specs[i]);
    specs[i].options.persistent = 1;
    specs[i].name = names[i];
    specs[i].dtype = MEMCUDA_DTYPE_F32;
    specs[i].ndim = 1;
    specs[i].shape = s1;
  }
  CHECK_OK(memcuda_create_many(r, specs, 3, made));
  if (!made[0] || !made[1] || !made[2]) return;
  for (i = 0; i < 3; ++i) ((float*)memcuda_tensor_data(made[i]))[0] = (float)(i + 1);
  CHECK_OK(memcuda_link_state_dict(r, "c.sd/", (const memcuda_tensor* const*)made, 2, &linked));
  CHECK(linked == 0); /* c.sd/c is under the prefix too: refused */
  CHECK_OK(memcuda_link_state_dict(r, "c.sd/", (const memcuda_tensor* const*)made, 3, &linked));
  CHECK(linked == 1);
  for (i = 0; i < 3; ++i) memcuda_tensor_release(made[i]);
  CHECK_OK(memcuda_flush(r, -1));
  CHECK(refcount_of(r, "c.sd/a") == 2); /* its name's and the record's pin */

  CHECK_OK(memcuda_open_state_dict(r, "c.sd/", &arr, &n));
  CHECK(n == 3 && arr != NULL);
  if (n != 3 || !arr) return;
  CHECK(strcmp(memcuda_tensor_name(arr[2]), "c.sd/c") == 0);
  CHECK(((float*)memcuda_tensor_data(arr[1]))[0] == 2.0f);
  CHECK_OK(memcuda_flush(r, -1));
  CHECK(refcount_of(r, "c.sd/a") == 2); /* one reference for the dict, on its record */

  /* A remove unlinks the record: the open handles stay good, a new open
   * goes name by name, GC drops the pins once nobody holds the record. */
  CHECK_OK(memcuda_remove(r, "c.sd/a"));
  CHECK(((float*)memcuda_tensor_data(arr[0]))[0] == 1.0f);
  {
    memcuda_tensor** arr2 = NULL;
    size_t n2 = 0;
    CHECK_OK(memcuda_open_state_dict(r, "c.sd/", &arr2, &n2));
    CHECK(n2 == 2);
    CHECK_OK(memcuda_flush(r, -1));
    CHECK(refcount_of(r, "c.sd/b") == 3); /* name, pin, and this open's own */
    for (i = 0; i < n2; ++i) memcuda_tensor_release(arr2[i]);
    memcuda_free_tensor_array(arr2);
  }
  memset(&rep, 0, sizeof rep);
  rep.struct_size = sizeof rep;
  CHECK_OK(memcuda_flush(r, -1));
  CHECK_OK(memcuda_collect_garbage(r, &rep));
  CHECK(refcount_of(r, "c.sd/b") == 2); /* still held through the record */
  for (i = 0; i < n; ++i) memcuda_tensor_release(arr[i]);
  memcuda_free_tensor_array(arr);
  CHECK_OK(memcuda_flush(r, -1));
  CHECK_OK(memcuda_collect_garbage(r, &rep)); /* the record is gone: its pins go */
  CHECK(refcount_of(r, "c.sd/b") == 1 && refcount_of(r, "c.sd/c") == 1);
  CHECK_OK(memcuda_remove(r, "c.sd/b"));
  CHECK_OK(memcuda_remove(r, "c.sd/c"));
}

/* Slices: views sharing the handle's reference, their strides and data, a
 * strided view's whole copy, tp shards, and a state dict opened as a shard. */
static void test_slices(memcuda_registry* r) {
  int64_t shape[2] = {4, 6};
  memcuda_tensor* t = NULL;
  memcuda_tensor* cols = NULL;
  memcuda_tensor* rows = NULL;
  memcuda_tensor* bad = NULL;
  memcuda_tensor** arr = NULL;
  memcuda_shard_rule rule;
  float* p;
  float got[8];
  size_t n = 0, i;
  int ok = 1;
  CHECK_OK(memcuda_create(r, "c.sl/w", MEMCUDA_DTYPE_F32, shape, 2, NULL, &t));
  if (!t) return;
  p = (float*)memcuda_tensor_data(t);
  for (i = 0; i < 24; ++i) p[i] = (float)i;
  CHECK(memcuda_tensor_strides(t)[0] == 6 && memcuda_tensor_strides(t)[1] == 1);
  CHECK_OK(memcuda_tensor_slice(t, 1, 4, -1, &cols)); /* columns 4..5 */
  CHECK_OK(memcuda_tensor_slice_tp(t, 0, 1, 2, &rows)); /* rows 2..3 */
  if (!cols || !rows) return;
  CHECK(memcuda_tensor_shape(cols)[0] == 4 && memcuda_tensor_shape(cols)[1] == 2);
  CHECK(memcuda_tensor_strides(cols)[0] == 6 && memcuda_tensor_strides(cols)[1] == 1);
  CHECK(memcuda_tensor_bytes(cols) == 32);
  CHECK((float*)memcuda_tensor_data(cols) == p + 4);
  CHECK((float*)memcuda_tensor_data(rows) == p + 12);
  CHECK(refcount_of(r, "c.sl/w") == 1); /* views take no reference */
  CHECK_OK(memcuda_tensor_copy_to_host(cols, got, sizeof got, 0));
  for (i = 0; i < 4; ++i) ok &= got[2 * i] == (float)(6 * i + 4) && got[2 * i + 1] == (float)(6 * i + 5);
  CHECK(ok);
  CHECK(memcuda_tensor_copy_to_host(cols, got, 8, 8) == MEMCUDA_ERR_INVALID_ARGUMENT); /* strided: whole only */
  memcuda_tensor_release(cols);
  cols = NULL;
  CHECK_OK(memcuda_tensor_slice(t, 1, 4, 1, &cols)); /* one column: rows of one element */
  if (!cols) return;
  CHECK_OK(memcuda_tensor_copy_to_host(cols, got, 16, 0));
  CHECK(got[0] == 4.0f && got[1] == 10.0f && got[2] == 16.0f && got[3] == 22.0f);
  CHECK(memcuda_tensor_slice_tp(t, 1, 0, 4, &bad) == MEMCUDA_ERR_INVALID_ARGUMENT);
  CHECK(bad == NULL && strstr(memcuda_last_error_message(), "not divisible by world 4") != NULL);
  CHECK(memcuda_tensor_slice(t, 2, 0, -1, &bad) == MEMCUDA_ERR_INVALID_ARGUMENT);
  CHECK(memcuda_tensor_slice(t, 0, 3, 2, &bad) == MEMCUDA_ERR_INVALID_ARGUMENT);
  memcuda_tensor_release(cols);
  memcuda_tensor_release(rows);

  rule.pattern = "*";
  rule.dim = 1;
  CHECK_OK(memcuda_open_state_dict_sharded(r, "c.sl/", 2, 3, &rule, 1, 0, &arr, &n));
  CHECK(n == 1);
  if (n == 1) {
    memcuda_tensor_fields f;
    CHECK(memcuda_tensor_shape(arr[0])[1] == 2 && (float*)memcuda_tensor_data(arr[0]) == p + 4);
    CHECK_OK(memcuda_tensors_fields((const memcuda_tensor* const*)arr, 1, &f, sizeof f));
    CHECK((char*)f.alloc_base + f.offset == (char*)f.data); /* offset is the view's */
    CHECK(f.offset + f.bytes <= f.alloc_bytes);
    memcuda_tensor_release(arr[0]);
  }
  memcuda_free_tensor_array(arr);
  rule.dim = -1; /* the last dimension, as in numpy */
  CHECK_OK(memcuda_open_state_dict_sharded(r, "c.sl/", 1, 2, &rule, 1, 0, &arr, &n));
  if (n == 1) {
    CHECK(memcuda_tensor_shape(arr[0])[1] == 3 && (float*)memcuda_tensor_data(arr[0]) == p + 3);
    memcuda_tensor_release(arr[0]);
  }
  memcuda_free_tensor_array(arr);
  rule.dim = MEMCUDA_SHARD_WHOLE;
  CHECK_OK(memcuda_open_state_dict_sharded(r, "c.sl/", 1, 2, &rule, 1, 0, &arr, &n));
  if (n == 1) {
    CHECK(memcuda_tensor_shape(arr[0])[1] == 6 && (float*)memcuda_tensor_data(arr[0]) == p);
    memcuda_tensor_release(arr[0]);
  }
  memcuda_free_tensor_array(arr);
  rule.dim = -3;
  CHECK(memcuda_open_state_dict_sharded(r, "c.sl/", 0, 2, &rule, 1, 0, &arr, &n) == MEMCUDA_ERR_INVALID_ARGUMENT);
  CHECK(n == 0 && arr == NULL);
  rule.dim = 1;
  CHECK(memcuda_open_state_dict_sharded(r, "c.sl/", 0, 0, &rule, 1, 0, &arr, &n) == MEMCUDA_ERR_INVALID_ARGUMENT);
  CHECK(memcuda_open_state_dict_sharded(r, "c.sl/", 3, 3, &rule, 1, 0, &arr, &n) == MEMCUDA_ERR_INVALID_ARGUMENT);
  CHECK(n == 0 && arr == NULL);
  rule.pattern = "nothing*";
  CHECK(memcuda_open_state_dict_sharded(r, "c.sl/", 0, 3, &rule, 1, 0, &arr, &n) == MEMCUDA_ERR_INVALID_ARGUMENT);
  CHECK(n == 0 && arr == NULL);
  memcuda_tensor_release(t);
  CHECK_OK(memcuda_flush(r, -1));
  CHECK(refcount_of(r, "c.sl/w") == -1); /* every view released: freed */
}

int main(void) {
  memcuda_registry* leader;
  memcuda_registry* client;
  g_url = getenv("MEMCUDA_TEST_REDIS_URL");
  if (!g_url || !*g_url) {
    printf("SKIPPED: MEMCUDA_TEST_REDIS_URL is not set (run through tests/c_api_with_redis.sh)\n");
    return 77;
  }
  test_version_and_tables();
  leader = open_registry(1);
  client = open_registry(0);
  test_create_get_bytes(leader, client);
  test_errors(leader);
  test_list_stats_get_many(leader);
  test_batch(leader);
  test_versions(leader, client);
  test_dlpack(leader);
  test_batch_views(leader);
  test_state_dict_record(leader);
  test_slices(leader);
  memcuda_registry_close(client);
  memcuda_registry_close(leader);
  memcuda_registry_close(NULL);
  memcuda_tensor_release(NULL);
  printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}

/* The C ABI's registry options (memcuda_registry_options and its pool
 * options, memcuda_registry_get_options, a struct_size that is not the
 * library's) and memcuda_get_many's contract
 * (docs/protocol.md, "The get_many contract"), compiled as C99 against the
 * redis-server that tests/c_api_with_redis.sh starts. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

static const char* g_url;

static void base_options(memcuda_registry_options* o, int control_thread) {
  memcuda_registry_options_init(o);
  o->url = g_url;
  o->name_space = "copt";
  o->control_thread = control_thread;
  o->default_backend = MEMCUDA_BACKEND_HOST;
}

static int64_t refcount_of(memcuda_registry* r, const char* name) {
  memcuda_tensor_info info;
  memcuda_tensor_info_init(&info);
  if (memcuda_info(r, name, &info) != MEMCUDA_OK) return -1;
  return info.refcount;
}

/* The runtime directory and peer policy reach the registry and read back.
 * They are the process's, one at a time: run while no other registry is open. */
static void test_transfer_fields(void) {
  memcuda_registry_options o, got;
  memcuda_registry* r = NULL;
  static const uint32_t uids[] = {1234, 5678};
  base_options(&o, 0);
  o.runtime_dir = "/tmp/memcuda-copt-test/";
  o.allowed_uids = uids;
  o.allowed_uids_count = 2;
  CHECK_OK(memcuda_registry_open(&o, &r));
  if (!r) return;
  memcuda_registry_options_init(&got);
  CHECK_OK(memcuda_registry_get_options(r, &got));
  CHECK(got.runtime_dir && strcmp(got.runtime_dir, "/tmp/memcuda-copt-test") == 0); /* '/' dropped */
  CHECK(got.allowed_uids_count == 2 && got.allowed_uids[0] == 1234 && got.allowed_uids[1] == 5678);
  CHECK(got.allowed_gids_count == 0 && got.allowed_gids == NULL);
  {
    memcuda_registry* other = NULL; /* another directory while r is open: refused */
    base_options(&o, 0);
    o.runtime_dir = "/tmp/memcuda-copt-other";
    CHECK(memcuda_registry_open(&o, &other) == MEMCUDA_ERR_INVALID_ARGUMENT && other == NULL);
  }
  memcuda_registry_close(r);
}

/* Every field reaches the registry, and reads back as set. */
static void test_fields(void) {
  memcuda_registry_options o, got;
  memcuda_registry* r = NULL;
  base_options(&o, 0);
  o.client_connections = 3;
  o.waiting_connections = 5;
  o.share_references = MEMCUDA_SHARING_OFF;
  o.release_linger_ms = 250;
  o.cuda_allocation = MEMCUDA_CUDA_ALLOCATION_IPC;
  o.serve_stall_timeout_ms = 4000;
  CHECK_OK(memcuda_registry_open(&o, &r));
  if (!r) return;
  memcuda_registry_options_init(&got);
  CHECK_OK(memcuda_registry_get_options(r, &got));
  CHECK(got.client_connections == 3);
  CHECK(got.waiting_connections == 5);
  CHECK(got.share_references == MEMCUDA_SHARING_OFF);
  CHECK(got.release_linger_ms == 250);
  CHECK(got.cuda_allocation == MEMCUDA_CUDA_ALLOCATION_IPC);
  CHECK(got.serve_stall_timeout_ms == 4000);
  CHECK(got.control_thread == 0);
  CHECK(got.default_backend == MEMCUDA_BACKEND_HOST);
  CHECK(got.name_space && strcmp(got.name_space, "copt") == 0);
  CHECK(got.url == NULL);
  memcuda_registry_close(r);

  /* The defaults (the test runs without MEMCUDA_* variables of these). */
  base_options(&o, 0);
  CHECK_OK(memcuda_registry_open(&o, &r));
  if (!r) return;
  memcuda_registry_options_init(&got);
  CHECK_OK(memcuda_registry_get_options(r, &got));
  CHECK(got.client_connections == 4);
  CHECK(got.waiting_connections == 16);
  CHECK(got.share_references == MEMCUDA_SHARING_ON);
  CHECK(got.release_linger_ms == -1);
  CHECK(got.cuda_allocation == MEMCUDA_CUDA_ALLOCATION_AUTO);
  CHECK(got.serve_stall_timeout_ms == 30000);
  CHECK(got.request_timeout_ms == 5000);
  {
    char want[64];
    snprintf(want, sizeof want, "/tmp/memcuda-%u", (unsigned)geteuid());
    CHECK(got.runtime_dir && strcmp(got.runtime_dir, want) == 0);
    CHECK(got.allowed_uids_count == 0 && got.allowed_gids_count == 0);
  }
  memcuda_registry_close(r);

  /* Bad values: INVALID_ARGUMENT, no registry. */
  base_options(&o, 0);
  o.share_references = 7;
  r = NULL;
  CHECK(memcuda_registry_open(&o, &r) == MEMCUDA_ERR_INVALID_ARGUMENT && r == NULL);
  base_options(&o, 0);
  o.release_linger_ms = 60001;
  CHECK(memcuda_registry_open(&o, &r) == MEMCUDA_ERR_INVALID_ARGUMENT && r == NULL);
  base_options(&o, 0);
  o.cuda_allocation = 9;
  CHECK(memcuda_registry_open(&o, &r) == MEMCUDA_ERR_INVALID_ARGUMENT && r == NULL);
  base_options(&o, 0);
  o.runtime_dir = "relative/dir";
  CHECK(memcuda_registry_open(&o, &r) == MEMCUDA_ERR_INVALID_ARGUMENT && r == NULL);
  base_options(&o, 0);
  o.client_connections = -1;
  CHECK(memcuda_registry_open(&o, &r) == MEMCUDA_ERR_INVALID_ARGUMENT && r == NULL);
}

/* A struct_size other than the library's sizeof (a header and library that
 * differ, or a struct never initialised) is refused, not misread. */
static void test_struct_size(void) {
  memcuda_registry_options o;
  memcuda_registry* r = NULL;
  base_options(&o, 0);
  o.struct_size = (uint32_t)offsetof(memcuda_registry_options, pool);
  CHECK(memcuda_registry_open(&o, &r) == MEMCUDA_ERR_INVALID_ARGUMENT && r == NULL);
  CHECK(strstr(memcuda_last_error_message(), "struct_size") != NULL);
  o.struct_size = (uint32_t)sizeof o + 8;
  CHECK(memcuda_registry_open(&o, &r) == MEMCUDA_ERR_INVALID_ARGUMENT && r == NULL);
}

static void* never_allocate(void* user_data, size_t bytes, int device) {
  (void)user_data, (void)bytes, (void)device;
  return NULL;
}
static void never_deallocate(void* user_data, void* p, size_t bytes, int device) {
  (void)user_data, (void)p, (void)bytes, (void)device;
}

/* Every pool field (PoolOptions) reaches the registry and reads back. */
static void test_pool_fields(void) {
  memcuda_registry_options o, got;
  memcuda_registry* r = NULL;
  static const memcuda_device_budget budgets[] = {{-1, 3u << 20}, {1, 5u << 20}};
  int marker = 0;
  memcuda_device_resource up;
  up.allocate = never_allocate;
  up.deallocate = never_deallocate;
  up.user_data = &marker;
  base_options(&o, 0);
  o.pool.slab_bytes = 8u << 20;
  o.pool.host_slab_bytes = 2u << 20;
  o.pool.dedicated_threshold = 600u << 10;
  o.pool.pack_batches_min_bytes = -1;
  o.pool.alignment = 1024;
  o.pool.retain_empty_slabs = -1;
  o.pool.budget_bytes = 7u << 20;
  o.pool.device_budgets = budgets;
  o.pool.device_budgets_count = 2;
  o.pool.upstream = &up;
  o.pool.poison = MEMCUDA_POISON_ON;
  CHECK_OK(memcuda_registry_open(&o, &r));
  if (!r) return;
  memcuda_registry_options_init(&got);
  CHECK_OK(memcuda_registry_get_options(r, &got));
  CHECK(got.pool.slab_bytes == (8u << 20) && got.pool.host_slab_bytes == (2u << 20));
  CHECK(got.pool.dedicated_threshold == (600u << 10));
  CHECK(got.pool.pack_batches_min_bytes == -1 && got.pool.retain_empty_slabs == -1);
  CHECK(got.pool.alignment == 1024 && got.pool.budget_bytes == (7u << 20));
  CHECK(got.pool.device_budgets_count == 2 && got.pool.device_budgets[0].device == -1 &&
        got.pool.device_budgets[0].bytes == (3u << 20) && got.pool.device_budgets[1].device == 1);
  CHECK(got.pool.upstream && got.pool.upstream->user_data == &marker && got.pool.upstream != &up);
  CHECK(got.pool.poison == MEMCUDA_POISON_ON);
  memcuda_registry_close(r);

  /* The defaults (the test runs without MEMCUDA_DEBUG_POISON). */
  base_options(&o, 0);
  CHECK_OK(memcuda_registry_open(&o, &r));
  if (!r) return;
  memcuda_registry_options_init(&got);
  CHECK_OK(memcuda_registry_get_options(r, &got));
  CHECK(got.pool.slab_bytes == (256u << 20) && got.pool.host_slab_bytes == (32u << 20));
  CHECK(got.pool.pack_batches_min_bytes == (64 << 20) && got.pool.retain_empty_slabs == 1);
  CHECK(got.pool.alignment == 256 && got.pool.budget_bytes == 0 && got.pool.device_budgets == NULL);
  CHECK(got.pool.upstream == NULL && got.pool.poison == MEMCUDA_POISON_OFF);
  memcuda_registry_close(r);

  /* Bad values: INVALID_ARGUMENT, no registry. */
  base_options(&o, 0);
  o.pool.alignment = 300;
  CHECK(memcuda_registry_open(&o, &r) == MEMCUDA_ERR_INVALID_ARGUMENT && r == NULL);
  base_options(&o, 0);
  o.pool.poison = 5;
  CHECK(memcuda_registry_open(&o, &r) == MEMCUDA_ERR_INVALID_ARGUMENT && r == NULL);
  base_options(&o, 0);
  o.pool.retain_empty_slabs = -2;
  CHECK(memcuda_registry_open(&o, &r) == MEMCUDA_ERR_INVALID_ARGUMENT && r == NULL);
}

/* A budget set through the C options is the allocator of record's: a create
 * past it is BUDGET_EXCEEDED, and fits again once memory is released. Its
 * own namespace, so that this registry is the allocator of record. */
static void test_budget_enforced(void) {
  memcuda_registry_options o;
  memcuda_registry* r = NULL;
  memcuda_tensor *a = NULL, *b = NULL, *c = NULL;
  int64_t shape[1] = {900 << 10};
  base_options(&o, 1);
  o.name_space = "copt-budget";
  o.pool.host_slab_bytes = 1u << 20;
  o.pool.budget_bytes = 2u << 20; /* two slabs */
  CHECK_OK(memcuda_registry_open(&o, &r));
  if (!r) return;
  CHECK_OK(memcuda_create(r, "a", MEMCUDA_DTYPE_U8, shape, 1, NULL, &a));
  CHECK_OK(memcuda_create(r, "b", MEMCUDA_DTYPE_U8, shape, 1, NULL, &b));
  CHECK(memcuda_create(r, "c", MEMCUDA_DTYPE_U8, shape, 1, NULL, &c) == MEMCUDA_ERR_BUDGET_EXCEEDED && c == NULL);
  CHECK(strstr(memcuda_last_error_message(), "budget 2097152") != NULL);
  memcuda_tensor_release(a);
  CHECK_OK(memcuda_flush(r, -1));
  CHECK_OK(memcuda_create(r, "c", MEMCUDA_DTYPE_U8, shape, 1, NULL, &c));
  memcuda_tensor_release(b);
  memcuda_tensor_release(c);
  memcuda_registry_close(r);
}

/* share_references as seen in Redis: on, a second get of a held name
 * shares the handle (one reference); off, it takes a second one. */
static void test_sharing(memcuda_registry* leader) {
  memcuda_registry_options o;
  memcuda_registry* off = NULL;
  memcuda_tensor *a = NULL, *b = NULL, *c = NULL, *d = NULL;
  int64_t shape[1] = {4};
  CHECK_OK(memcuda_create(leader, "s.t", MEMCUDA_DTYPE_F32, shape, 1, NULL, &a));
  CHECK_OK(memcuda_get(leader, "s.t", MEMCUDA_DTYPE_ANY, &b));
  CHECK_OK(memcuda_flush(leader, -1));
  CHECK(refcount_of(leader, "s.t") == 1); /* shared with the creator's handle */
  base_options(&o, 0);
  o.share_references = MEMCUDA_SHARING_OFF;
  CHECK_OK(memcuda_registry_open(&o, &off));
  if (!off) return;
  CHECK_OK(memcuda_get(off, "s.t", MEMCUDA_DTYPE_ANY, &c));
  CHECK_OK(memcuda_get(off, "s.t", MEMCUDA_DTYPE_ANY, &d));
  CHECK(refcount_of(leader, "s.t") == 3); /* one reference per get */
  memcuda_tensor_release(c);
  memcuda_tensor_release(d);
  CHECK_OK(memcuda_flush(off, -1));
  CHECK(refcount_of(leader, "s.t") == 1);
  memcuda_registry_close(off);
  memcuda_tensor_release(b);
  memcuda_tensor_release(a);
}

/* memcuda_get_many: the contract's cases. */
static void test_get_many_contract(memcuda_registry* r) {
  memcuda_tensor *made[3] = {NULL, NULL, NULL}, *got[4] = {NULL, NULL, NULL, NULL};
  const char* names[3] = {"g.c", "g.a", "g.b"};
  const char* bad[2] = {"g.a", "bad name"};
  const char* null_name[2] = {"g.a", NULL};
  const char* missing[4] = {"g.c", "g.z.missing", "g.a", "g.b.missing"};
  int64_t shape[1] = {1};
  int i;
  for (i = 0; i < 3; ++i) CHECK_OK(memcuda_create(r, names[i], MEMCUDA_DTYPE_F32, shape, 1, NULL, &made[i]));
  /* no names: OK, nothing written */
  CHECK_OK(memcuda_get_many(r, NULL, 0, NULL));
  /* the order given, not name order */
  CHECK_OK(memcuda_get_many(r, names, 3, got));
  for (i = 0; i < 3; ++i) CHECK(got[i] && strcmp(memcuda_tensor_name(got[i]), names[i]) == 0);
  for (i = 0; i < 3; ++i) memcuda_tensor_release(got[i]);
  /* a malformed or NULL name: the whole call fails, nothing taken */
  got[0] = got[1] = (memcuda_tensor*)&i;
  CHECK(memcuda_get_many(r, bad, 2, got) == MEMCUDA_ERR_PROTOCOL);
  CHECK(memcuda_error_parent(memcuda_last_error_code()) == MEMCUDA_ERR_INVALID_ARGUMENT);
  CHECK(got[0] == NULL && got[1] == NULL);
  CHECK(memcuda_get_many(r, null_name, 2, got) == MEMCUDA_ERR_INVALID_ARGUMENT);
  /* refused names: the first in the order given (g.b.missing in name order) */
  CHECK(memcuda_get_many(r, missing, 4, got) == MEMCUDA_ERR_NOT_FOUND);
  CHECK(strstr(memcuda_last_error_message(), "g.z.missing") != NULL);
  CHECK(got[0] == NULL && got[1] == NULL && got[2] == NULL && got[3] == NULL);
  CHECK_OK(memcuda_flush(r, -1));
  for (i = 0; i < 3; ++i) CHECK(refcount_of(r, names[i]) == 1);
  for (i = 0; i < 3; ++i) memcuda_tensor_release(made[i]); /* not persistent: freed with the last reference */
}

int main(void) {
  memcuda_registry_options o;
  memcuda_registry* leader = NULL;
  g_url = getenv("MEMCUDA_TEST_REDIS_URL");
  if (!g_url || !*g_url) {
    printf("SKIPPED: MEMCUDA_TEST_REDIS_URL is not set (run through tests/c_api_with_redis.sh)\n");
    return 77;
  }
  test_transfer_fields();
  base_options(&o, 1);
  o.lease_ttl_ms = 30000;
  if (memcuda_registry_open(&o, &leader) != MEMCUDA_OK) {
    fprintf(stderr, "memcuda_registry_open: %s\n", memcuda_last_error_message());
    return 1;
  }
  test_fields();
  test_struct_size();
  test_pool_fields();
  test_budget_enforced();
  test_sharing(leader);
  test_get_many_contract(leader);
  memcuda_registry_close(leader);
  printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
